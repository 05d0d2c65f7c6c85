"""A config that makes no model is bad input: the plausibility rules a config passes before anything is built.

transformers' own validators accept many values no model can have (`hidden_size: 0`, `num_hidden_layers: 0`,
`rms_norm_eps: NaN`, `sliding_window: -1`, eight routed experts per token out of three, `dtype: 7`, a
`base_model_tp_plan` that is a string). Built on the meta device they make a model of empty or absurd tensors whose
report would pass; tpaudit refuses them instead, with exit 2 and one line naming the attribute (dotted from the
top-level config: `text_config.num_key_value_heads`).

One rule per role, the same for every attribute of that role:

- **widths** (`WIDTHS`: hidden, intermediate, vocab, head dims, MLA ranks, ...): integers from 1 (0 for the
  optional ones) to `MAX_WIDTH`; a width given per layer (gemma3n's `intermediate_size`) holds for every layer;
- **counts** (`COUNTS`: heads, layers, experts): integers from 1 (0 for the optional ones) to `MAX_COUNT`, layers
  to `MAX_LAYERS`; KV heads at most the attention heads, routed experts per token at most the experts, expert
  groups per token at most the groups;
- **epsilons** (every attribute named `*eps` or `*epsilon`): finite numbers from 0 to 1;
- `sliding_window`: null, 0 (off) or a positive number of tokens;
- `dtype`: null or the name of a floating torch dtype;
- the plans (`base_model_tp_plan`, `base_model_ep_plan`): null or a map of rule -> style strings.

They apply to the top-level config and to the config that owns the base model's plan (the text config of a
composite model). Once the model is built on the meta device, its parameter count must be at most `MAX_PARAMETERS`
(`check_plausible_total`): sizes each within their bound can still multiply into a model no one has. transformers' default config of every model type passes them (`tests/test_plausible.py`).
"""

from __future__ import annotations

import math
import re

from . import vocabulary as V
from ..compat import backend
from ..compat.styles import EXAMPLE_PLAN_JSON
from ..errors import ConfigError
from ..units import shorten

FIX_CONFIG = "Fix the config"  # as `build.FIX_CONFIG`
MAX_LAYERS = 4096
"""Deepest decoder accepted: every layer is built on the meta device (the deepest real ones have ~128)."""
MAX_WIDTH = 2**24
"""Widest size accepted (16,777,216): real hidden sizes stay below 32,768 and vocabularies below 2,000,000."""
MAX_COUNT = 2**20
"""Most heads or experts accepted (1,048,576): real models have up to a few hundred of either."""
MAX_PARAMETERS = 10**14
"""Most parameters accepted in the whole model (100 trillion): the largest published checkpoints hold about 1 to 2
trillion (Kimi K2: 1.04 T, DeepSeek-V3: 671 B), so this leaves a factor of 50. Each size can be plausible alone
while their product is not: hidden, intermediate and vocab at `MAX_WIDTH` with `MAX_LAYERS` layers make 8 * 10^18
parameters (a 16-exabyte model in bfloat16)."""

# The attribute names come from the one vocabulary table (`metamodel/vocabulary.py`), by role. The canonical spelling of
# the roles every model has must be positive when set; every other spelling (and the optional roles: shared experts, MLA
# ranks, ...) may be 0, a part switched off.
_REQUIRED = (V.HIDDEN, V.INTERMEDIATE, V.VOCAB, V.HEAD_DIM, V.EXPERT_INTERMEDIATE, V.ATTENTION_HEADS, V.KV_HEADS,
             V.LAYERS)
_WIDTH_ROLES = (V.HIDDEN, V.INTERMEDIATE, V.VOCAB, V.HEAD_DIM, V.EXPERT_INTERMEDIATE, V.SHARED_EXPERT_INTERMEDIATE,
                V.Q_LORA_RANK, V.KV_LORA_RANK, V.MLA_ROPE_HEAD_DIM, V.MLA_NOPE_HEAD_DIM, V.MLA_V_HEAD_DIM,
                V.LINEAR_KEY_HEAD_DIM, V.LINEAR_VALUE_HEAD_DIM)
_COUNT_ROLES = (V.ATTENTION_HEADS, V.KV_HEADS, V.LAYERS, V.EXPERTS, V.SHARED_EXPERTS, V.EXPERTS_TOP_K,
                V.FIRST_DENSE_LAYERS, V.LINEAR_KEY_HEADS, V.LINEAR_VALUE_HEADS, V.EXPERT_GROUPS,
                V.EXPERT_GROUPS_PICKED)


def _table(roles) -> dict[str, bool]:
    """attribute name -> must be positive (`True`) or may be 0 (`False`), for every spelling of `roles`."""
    required = {role.canonical for role in _REQUIRED}
    return {attr: attr in required for role in roles for attr in role.attrs}


WIDTHS: dict[str, bool] = _table(_WIDTH_ROLES)
"""Widths (hidden, intermediate, vocab, head dims, MLA ranks, ...) -> whether they must be positive."""
COUNTS: dict[str, bool] = _table(_COUNT_ROLES)
"""Counts (heads, layers, experts, top-k, groups) -> whether they must be positive."""
PER_LAYER = V.attrs_of(V.INTERMEDIATE, V.EXPERT_INTERMEDIATE, V.KV_HEADS, V.HEAD_DIM, V.ATTENTION_HEADS)
"""Attributes a config may give as one value per layer (a list)."""
EXPERT_COUNTS = V.EXPERTS.attrs
TOP_K = V.EXPERTS_TOP_K.attrs
PLANS = ("base_model_tp_plan", "base_model_ep_plan")
_EPSILON = re.compile(r"(^|_)(eps|epsilon)$")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value) -> str:
    """A config value in a message: a string quoted, at most 40 characters."""
    return shorten(repr(value) if isinstance(value, str) else value, 40, words=False)


def check_plausible(config, owner, owner_path: str, where: str, path: str | None) -> None:
    """Refuse a config whose values no model has, before any layer is built (see the module docstring).

    Args:
        config: the top-level transformers config.
        owner: the config that owns the base model's plan (`config` itself, or its text config).
        owner_path (`str`): the owner's dotted path from the top-level config (`"text_config"`, or `""`).
        where (`str`): the config's path or reference, for the message.
        path (`str`, *optional*): `config.json`'s path (the error's `path`).

    Raises:
        ConfigError: naming the attribute (dotted from the top-level config) and its value: a width or count that
            is not an integer, out of range, KV heads above attention heads, more experts per token than experts,
            an epsilon that is not a finite number from 0 to 1, a negative `sliding_window`, a `dtype` that names
            no floating torch dtype, or a plan that is not a map of rule -> style strings.
    """
    configs = [("", config)] + ([(owner_path, owner)] if owner is not config else [])
    for prefix, cfg in configs:
        _check_one(cfg, prefix, where, path)


class _Judged:
    """One config under judgement: its values (through the seam, as transformers' config attributes read) and the
    refusal that names an attribute dotted from the top-level config."""

    def __init__(self, cfg, prefix: str, where: str, path: str | None):
        self.cfg, self.prefix, self.where, self.path = cfg, prefix, where, path
        self._tf = backend()

    def value(self, attr: str):
        return self._tf.config_value(self.cfg, attr)

    def name(self, attr: str) -> str:
        return f"{self.prefix}.{attr}" if self.prefix else attr

    def refuse(self, attr: str, value, why: str):
        """Raises: ConfigError: `<where>: <dotted attr> = <value> <why>`."""
        raise ConfigError(f"{self.where}: {self.name(attr)} = {_shown(value)} {why}", fix=FIX_CONFIG, path=self.path)


def _check_one(cfg, prefix: str, where: str, path: str | None) -> None:
    """Every rule of the module docstring on one config, in this order (the first broken one raises)."""
    c = _Judged(cfg, prefix, where, path)
    _check_sizes(c)
    _check_relations(c)
    _check_sliding_window(c)
    _check_epsilons(c)
    _check_dtype(c)
    _check_plans(c)


def _check_sizes(c: _Judged) -> None:
    """Widths and counts: integers in range (per layer where a config lists one value per layer)."""
    # MLA configs spell the rotary part of a head `head_dim` (GLM-5-Next's config sets head_dim = qk_rope_head_dim
    # whatever config.json says), and a head with no rotary part is a model transformers builds: 0 is allowed there
    mla = any(c.value(a) is not None for a in V.MLA_NOPE_HEAD_DIM.attrs)
    for table, high in ((WIDTHS, MAX_WIDTH), (COUNTS, MAX_COUNT)):
        what = "size" if table is WIDTHS else "count"
        for attr, positive in table.items():
            value = c.value(attr)
            if value is None:
                continue
            positive = positive and not (mla and attr in V.HEAD_DIM.attrs)
            values = value if isinstance(value, (list, tuple)) and value and attr in PER_LAYER else [value]
            for v in values:
                _check_size(c, attr, value, v, positive, what, MAX_LAYERS if attr == "num_hidden_layers" else high)


def _check_size(c: _Judged, attr: str, value, v, positive: bool, what: str, limit: int) -> None:
    """One value `v` of a width or count `attr` (`value`: the whole attribute, shown when `v` is no integer)."""
    if not _is_int(v):
        if positive or not isinstance(v, (int, float)) or isinstance(v, bool):
            c.refuse(attr, value, "is not an integer")
        return  # an optional count written as a float is transformers' business
    if positive and v <= 0:
        c.refuse(attr, v, "must be a positive integer")
    if v < 0:
        c.refuse(attr, v, "must not be negative")
    if attr == "num_hidden_layers" and v > limit:
        c.refuse(attr, v, f"is not a plausible depth (1 to {limit}): tpaudit builds every layer on the meta device")
    if v > limit:
        c.refuse(attr, v, f"is not a plausible {what} (at most {limit:,})")


def _check_relations(c: _Judged) -> None:
    """KV heads at most the attention heads, experts per token at most the experts, groups per token at most the
    groups."""
    heads, kv = c.value("num_attention_heads"), c.value("num_key_value_heads")
    if _is_int(heads) and _is_int(kv) and kv > heads:
        c.refuse("num_key_value_heads", kv, f"exceeds {c.name('num_attention_heads')} = {heads}: each KV head serves "
                                            "a group of attention heads")
    top_attr = next((a for a in TOP_K if _is_int(c.value(a))), None)
    top_k = c.value(top_attr) if top_attr else None
    if _is_int(top_k) and top_k > 0:
        for attr in EXPERT_COUNTS:
            experts = c.value(attr)
            if _is_int(experts) and top_k > experts:
                c.refuse(top_attr, top_k, f"exceeds {c.name(attr)} = {experts}: a token cannot be routed to more "
                                          "experts than there are")
    groups, top_groups = c.value("n_group"), c.value("topk_group")
    if _is_int(groups) and _is_int(top_groups) and top_groups > groups > 0:
        c.refuse("topk_group", top_groups, f"exceeds {c.name('n_group')} = {groups}: a token cannot pick more expert "
                                           "groups than there are")


def _check_sliding_window(c: _Judged) -> None:
    window = c.value("sliding_window")
    if window is not None and (not _is_int(window) or window < 0):
        c.refuse("sliding_window", window, "is not a window: give a positive number of tokens, 0 or null (none)")


def _check_epsilons(c: _Judged) -> None:
    for attr in _epsilon_names(c.cfg):
        eps = c.value(attr)
        if eps is None:
            continue
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or not 0 <= eps <= 1:
            c.refuse(attr, eps, "is not a usable epsilon: a finite number from 0 to 1, such as 1e-05")


def _check_dtype(c: _Judged) -> None:
    dtype = c.value("dtype")
    if dtype is not None and not _is_float_dtype(dtype):
        c.refuse("dtype", dtype, 'is not a floating torch dtype: write a name such as "bfloat16", or leave it out')


def _check_plans(c: _Judged) -> None:
    for attr in PLANS:
        plan = c.value(attr)
        if plan is not None and (not isinstance(plan, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in plan.items())):
            what = "a map with a key or style that is not a string" if isinstance(plan, dict) else \
                f"a {type(plan).__name__}"
            raise ConfigError(f"{c.where}: {c.name(attr)} is {what} ({_shown(plan)}), not a map of rule -> style "
                              f"such as {EXAMPLE_PLAN_JSON}", fix=FIX_CONFIG, path=c.path)


def _epsilon_names(cfg) -> list[str]:
    """The config's own attributes named like an epsilon (`rms_norm_eps`, `layer_norm_epsilon`, ...)."""
    try:
        names = list(vars(cfg))
    except TypeError:
        return []
    return [n for n in names if _EPSILON.search(n)]


def _is_float_dtype(value) -> bool:
    """A `torch.dtype` or the name of one (`"bfloat16"`, `"torch.float16"`) that is floating point."""
    import torch

    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), None)
    return isinstance(value, torch.dtype) and value.is_floating_point


def check_plausible_total(parameter_shapes, where: str, path: str | None) -> None:
    """Refuse a model with more parameters than any real one (`MAX_PARAMETERS`).

    Args:
        parameter_shapes (`Iterable[tuple[int, ...]]`): the shape of every parameter of the model built on the meta
            device, tied copies once (from `backend().parameter_table`, i.e. `model.named_parameters()`, less the
            copies `backend().tied_keys` names).
        where (`str`): the config's path or reference, for the message.
        path (`str`, *optional*): `config.json`'s path (the error's `path`).

    Raises:
        ConfigError: the parameters number more than `MAX_PARAMETERS`; the message gives the count and the bound.
    """
    total = sum(math.prod(shape) for shape in parameter_shapes)
    if total > MAX_PARAMETERS:
        raise ConfigError(f"{where}: the config makes a model of {total:,} parameters ({total:.2g}), more than any "
                          f"real model (tpaudit's bound: {MAX_PARAMETERS:,}, 100 trillion); its sizes are each "
                          "plausible, their product is not", fix=FIX_CONFIG, path=path)
