"""The small model: the same architecture, class and plan as the real config, every width scaled down so that each
split `tp_size` makes keeps its structure, one decoder layer of each kind in the real order.

Random weights from a fixed seed, float32, CPU, eager attention and eager experts, written with `save_pretrained` to
a temporary directory in the layout the real checkpoint stores (the loader slices what the checkpoint stores:
per-expert `gate_proj` / `up_proj` tensors split by a plain `colwise` still give each rank its share of both once
fused, a stored fused `gate_up_proj` is cut in the middle). Config attribute names come from
`tpaudit.metamodel.vocabulary`, the one table of them.
"""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..compat import parity as seam
from ..compat.logic import generic_name
from ..errors import ParityUnavailableError, UsageError
from ..metamodel import vocabulary as V

# The kernels on both sides: float32 eager attention, and the eager expert loop for tensor parallelism (the
# grouped-matmul experts need 16-byte-aligned strides that small or uneven CPU shards do not have). Expert parallelism
# runs transformers' default experts kernel, the one its EP dispatch is written for (gpt-oss's eager loop rejects the
# EP routing: "Class values must be smaller than num_classes").
KERNELS = {"attn_implementation": "eager", "experts_implementation": "eager"}
EP_KERNELS = {"attn_implementation": "eager"}

SEQ_LEN = 8
BATCH = 2
SPECIAL_TOKEN_SLOTS = 16
MIN_VOCAB = 64
HEAD_DIM_FLOOR = 8
WIDTH_FLOOR = 8
HIDDEN_FLOOR = 16
EXPERT_FLOOR = 16
DEFAULT_TOP_K = 2
"""Experts per token for a config that names experts but leaves its router's top-k unset."""
MAX_PARAMETERS = 16_000_000
"""The most parameters a small model may hold (64 MB in float32; the ranks and the reference hold it about twice
more): a larger one is refused rather than risk a scan's memory bound."""
"""Experts per token for a config that names experts but leaves its router's top-k unset."""


@dataclass
class SmallModel:
    """The small model `run_parity` and `split_outputs` use (see `build_small_model`).

    Attributes:
        path (`str`): the directory `save_pretrained` wrote (config + safetensors).
        model_class (`type`): the class loaded (the real one, or the text decoder's for a composite model).
        config (`PretrainedConfig`): the small config.
        reference (`PreTrainedModel`): the unsharded model loaded back from `path` (float32, CPU, eval).
        input_ids (`torch.Tensor`): `[BATCH, SEQ_LEN]` token ids, the same for every run.
        plan (`dict[str, str]`): the merged TP plan of the small model (`model.tp_plan`, generic prefixed keys).
        ep_plan (`dict[str, str]`): the merged EP plan (`model.ep_plan`).
        kernels (`dict[str, str]`): the `from_pretrained` kernel choices both sides load with.
        shrunk (`dict[str, list[int]]`), layers (`tuple[int, ...]`), scope (`str`), notes (`list[str]`).
        head_widths (`tuple[int, ...]`): every per-head width of the small config (`head_dim`, `global_head_dim`,
            linear-attention and MLA head dims).
        found (`dict[str, SplitOutput]`): the split outputs the traced forward cuts into parts (set by the trace).
        traced (`bool`): whether the trace ran (`found` is its answer).
        cut_sites (`dict[str, CutSite]`): where the trace saw each of them cut, and the unsharded parts.
    """

    path: str
    model_class: Any
    config: Any
    reference: Any
    input_ids: Any
    plan: dict[str, str]
    shrunk: dict[str, list[int]]
    layers: tuple[int, ...]
    scope: str
    notes: list[str]
    head_widths: tuple[int, ...]
    tmp: Any = None
    found: dict = field(default_factory=dict)
    ep_plan: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, str] = field(default_factory=lambda: dict(KERNELS))
    traced: bool = False
    cut_sites: dict = field(default_factory=dict)

    def cleanup(self) -> None:
        """Remove the temporary directory."""
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


# ----------------------------------------------------------------------------------------------------------------------
# Shrinking the config
# ----------------------------------------------------------------------------------------------------------------------
def _same_residue(x: int, modulus: int, floor: int, extra=()) -> int:
    """Smallest `v` with `floor <= v <= x`, `v % modulus == x % modulus` and, for every divisor `d` in `extra`,
    `v % d == 0` exactly when `x % d == 0`; `x` itself when no smaller value qualifies."""
    if x <= floor:
        return x
    for v in range(floor, x):
        if v % modulus == x % modulus and all((v % d == 0) == (x % d == 0) for d in extra if d > 0):
            return v
    return x


def _rotary_fractions(d: dict) -> list[float]:
    """Every rotary fraction (`partial_rotary_factor`, `rotary_pct`) in a config dict, nested RoPE dicts included."""
    out = []
    for k, v in d.items():
        if k in V.ROTARY_FRACTION.attrs and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        elif isinstance(v, dict) and (V.ROPE_MARK in k or any(isinstance(x, dict) for x in v.values())):
            out.extend(_rotary_fractions(v))
    return out


def _rope_has_lists(d: dict) -> bool:
    """RoPE parameters with per-dimension lists (`mrope_section`, LongRoPE factors) are laid out for the real head
    dim: the small model keeps it."""
    for k, v in d.items():
        if (V.ROPE_MARK in k) and isinstance(v, dict):
            stack = [v]
            while stack:
                cur = stack.pop()
                for x in cur.values():
                    if isinstance(x, (list, tuple)) and len(x) > 1:
                        return True
                    if isinstance(x, dict):
                        stack.append(x)
    return False


def key_of(d: dict, names) -> str | None:
    """The first of `names` that `d` holds as an int (not a bool)."""
    return next((k for k in names if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)


def shrink_config(config_dict: dict, tp_size: int, *, keep_head_widths: bool = False
                  ) -> tuple[dict, dict[str, list[int]]]:
    """Scale a config dict down so that every split `tp_size` makes of the real model keeps its structure.

    The rule (`m = 2 * tp_size`): a width `x` becomes the smallest `v >= floor` with `v % m == x % m`, so `v` is
    divisible by `tp_size` (and by 2) exactly when `x` is, and leaves the same remainder when it is not. Head and
    KV-head counts, layer types and every ratio the forward reads (rotary fractions) are kept. Scaled:

    - head dims (`head_dim`, `global_head_dim`, `linear_key_head_dim`, `linear_value_head_dim`, MLA's
      `qk_rope_head_dim`, `qk_nope_head_dim`, `v_head_dim`, and `head_dim` overrides in `per_layer_config`): each
      distinct real width to a distinct small one in the same order (floor 8), so wider heads stay wider, and a
      rotary fraction of it stays an even integer; attention head dims stay real when the RoPE parameters carry
      per-dimension lists such as `mrope_section`;
    - `hidden_size` (`n_embd`, `d_model`): `heads * head_dim` when the real config has `hidden == heads * head_dim`
      (its head dim is derived), else scaled on its own (floor 16) keeping divisibility by the head counts;
    - intermediate sizes (`intermediate_size`, `moe_intermediate_size`, `shared_expert_intermediate_size`,
      `ffn_hidden_size`, `n_inner`, ...; floor 8), MLA ranks (`q_lora_rank`, `kv_lora_rank`; floor 8),
      `vocab_size` (floor 64), nested sub-config dicts (DBRX's `ffn_config`) included;
    - the routed-expert count (`num_experts`, `num_local_experts`, `n_routed_experts`) when the config names its top-k
      (floor 16 and twice the top-k; see `_shrink_experts`): every expert costs a load and a loop step on each rank,
      and 256 of them cost DeepSeek-V3's check seconds for no more evidence than 16 give.

    The layer count is not changed here (`build_small_model` keeps one layer of each kind). Attribute names:
    `tpaudit.metamodel.vocabulary`.

    Args:
        config_dict (`dict`): `PretrainedConfig.to_dict()` of the (text) config.
        tp_size (`int`): the tp_size whose splits must keep their structure.
        keep_head_widths (`bool`, *optional*, defaults to `False`): keep the attention head widths real (as for
            per-dimension RoPE lists), for a model whose code lays RoPE out for its real head width without the
            config saying so (Ernie-4.5-VL-MoE's default `mrope_section` `[22, 22, 20]` lives in its RoPE code).

    Returns:
        `(small_dict, shrunk)`: the new dict and `{attribute: [real, small]}` for what changed.
    """
    d = copy.deepcopy(config_dict)
    m = 2 * tp_size
    shrunk: dict[str, list[int]] = {}

    def put(target: dict, key: str, value: int, label: str) -> None:
        if target.get(key) != value:
            shrunk[label] = [target[key], value]
            target[key] = value

    def put_new(target: dict, key: str, value: int, label: str, real: int) -> None:
        if target.get(key, real) != value:
            shrunk[label] = [real, value]
            target[key] = value

    heads_key, kv_key = key_of(d, V.ATTENTION_HEADS.attrs), key_of(d, V.KV_HEADS.attrs)
    hidden_key = key_of(d, V.HIDDEN.attrs)
    heads = d.get(heads_key) if heads_key else None
    kv_heads = d.get(kv_key) if kv_key else None
    hidden = d.get(hidden_key) if hidden_key else None
    fractions = _rotary_fractions(d)
    rotary_dim_key = V.ROTARY_DIM.canonical
    rotary_dim = d.get(rotary_dim_key) if isinstance(d.get(rotary_dim_key), int) else None
    keep_heads = keep_head_widths or _rope_has_lists(d)
    head_dim = V.HEAD_DIM_SUFFIX

    def head_ok(v: int, real: int) -> bool:
        if any(not float(v * f).is_integer() or int(v * f) % 2 for f in fractions):
            return False
        return not (rotary_dim and (rotary_dim * v) % real or rotary_dim and (rotary_dim * v // real) % 2)

    derived_head = heads and hidden and (not isinstance(d.get(head_dim), int) or d[head_dim] * heads == hidden)
    real_head = d[head_dim] if isinstance(d.get(head_dim), int) else (hidden // heads if derived_head else None)
    if keep_head_widths and derived_head and real_head and not isinstance(d.get(head_dim), int):
        # the real head width named, so that the hidden size can still shrink (transformers reads `head_dim` first)
        d[head_dim], derived_head = real_head, False

    # Every per-head width of the config (top level, and per-layer overrides such as Gemma 4's global layers), each
    # distinct real value to a distinct small one in the same order, so layers with wider heads keep wider heads.
    per_layer_key, derived_key = V.PER_LAYER_CONFIG.canonical, V.MLA_QK_HEAD_DIM.canonical
    per_layer = d.get(per_layer_key) if isinstance(d.get(per_layer_key), dict) else {}
    head_keys = [k for k in d if k.endswith(head_dim) and k != derived_key and isinstance(d[k], int)]
    nope, rope = V.MLA_NOPE_HEAD_DIM.canonical, V.MLA_ROPE_HEAD_DIM.canonical
    # per-dimension RoPE lists (`mrope_section`) are laid out for the rotary head width: MLA's rope part included
    rope_keys = {head_dim, "global_" + head_dim, rope} if keep_heads else set()

    def layer_heads(override: dict) -> list[str]:
        return [k for k, v in override.items() if k.endswith(head_dim) and k != derived_key and k not in rope_keys
                and isinstance(v, int) and not isinstance(v, bool)]

    reals = sorted({d[k] for k in head_keys if k not in rope_keys}
                   | {o[k] for o in per_layer.values() if isinstance(o, dict) for k in layer_heads(o)})
    # a width kept real for the RoPE lists is a fixed point: a wider head stays wider than it (Hunyuan-V4's indexer
    # head holds the rope part: `index_head_dim >= qk_rope_head_dim`)
    kept = {d[k] for k in head_keys if k in rope_keys}
    small_of: dict[int, int] = {}
    low = HEAD_DIM_FLOOR
    for real in reals:
        low = max([low] + [k + 1 for k in kept if k < real])
        v = next((v for v in range(low, real) if v % m == real % m and head_ok(v, real)), real)
        small_of[real] = v
        low = v + 1
    for key in head_keys:
        if key not in rope_keys:
            put(d, key, small_of[d[key]], key)
    real_top = {k: config_dict[k] for k in (head_dim, nope, rope) if isinstance(config_dict.get(k), int)}
    for layer, override in per_layer.items():
        if not isinstance(override, dict):
            continue
        real_override = (config_dict.get(per_layer_key) or {}).get(layer) or {}
        real_layer = {**real_top, **{k: real_override[k] for k in (head_dim, nope, rope)
                                     if isinstance(real_override.get(k), int)}}
        for key in layer_heads(override):
            put(override, key, small_of[override[key]], f"{per_layer_key}.{layer}.{key}")
        _keep_mla_sum(real_layer, {**d, **override}, lambda v, o=override, lay=layer: put_new(
            o, head_dim, v, f"{per_layer_key}.{lay}.{head_dim}", real_layer[head_dim]))
    _keep_mla_sum(real_top, d, lambda v: put(d, head_dim, v, head_dim))
    if isinstance(d.get(derived_key), int) and isinstance(d.get(nope), int):
        put(d, derived_key, d[nope] + d.get(rope, 0), derived_key)
    if derived_head and real_head:
        small_head = d[head_dim] if isinstance(d.get(head_dim), int) else small_of.get(real_head)
        if small_head is None and keep_head_widths:
            small_head = real_head
        if small_head is None:
            small_head = next((v for v in range(HEAD_DIM_FLOOR, real_head) if v % m == real_head % m
                               and head_ok(v, real_head)), real_head)
        put(d, hidden_key, heads * small_head, hidden_key)
    elif hidden_key:
        extra = [x for x in (heads, kv_heads, 2 * (heads or 0)) if x]
        put(d, hidden_key, _same_residue(hidden, m, HIDDEN_FLOOR, extra), hidden_key)
    if rotary_dim and real_head and derived_head:
        put(d, rotary_dim_key, rotary_dim * (d[hidden_key] // heads) // real_head, rotary_dim_key)

    def widths(target: dict, prefix: str) -> None:
        for k in V.attrs_of(*V.SCALED_WIDTHS):
            if isinstance(target.get(k), int) and not isinstance(target.get(k), bool):
                put(target, k, _same_residue(target[k], m, WIDTH_FLOOR), prefix + k)
            elif isinstance(target.get(k), list) and target[k] and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in target[k]):
                # one width per expert kind (Ernie-4.5-VL-MoE's text and vision experts): each scaled alone
                small = [_same_residue(x, m, WIDTH_FLOOR) for x in target[k]]
                for i, (x, v) in enumerate(zip(target[k], small)):
                    if x != v:
                        shrunk[f"{prefix}{k}.{i}"] = [x, v]
                target[k] = small
        for k, v in list(target.items()):
            if isinstance(v, dict) and k not in V.UNSCALED_SUBCONFIGS and V.ROPE_MARK not in k:
                widths(v, f"{prefix}{k}.")

    widths(d, "")
    _shrink_experts(d, m, put)
    for k in V.attrs_of(*V.EMBEDDING_ROWS):
        if isinstance(d.get(k), int) and d[k] > MIN_VOCAB:
            put(d, k, _same_residue(d[k], m, MIN_VOCAB), k)
    return d, shrunk


def _keep_mla_sum(real: dict, small: dict, set_head) -> None:
    """A head width the real config (or one layer of it) defines as the sum of MLA's parts (`head_dim ==
    qk_nope_head_dim + qk_rope_head_dim`, which Dots 3's validator requires of its sliding layers) stays their sum in
    the small config: `set_head` is called with the small sum. Each part keeps its residue, so the sum does too."""
    head_dim, nope, rope = V.HEAD_DIM_SUFFIX, V.MLA_NOPE_HEAD_DIM.canonical, V.MLA_ROPE_HEAD_DIM.canonical
    if all(isinstance(real.get(k), int) for k in (head_dim, nope, rope)) and real[head_dim] == real[nope] + real[rope] \
            and all(isinstance(small.get(k), int) for k in (nope, rope)):
        set_head(small[nope] + small[rope])


def _shrink_experts(d: dict, m: int, put) -> None:
    """Scale the routed-expert count of a config dict down (see `shrink_config`), in place.

    The count `E` becomes the smallest `v >= max(EXPERT_FLOOR, 2 * top_k)` with `v % m == E % m`, so `tp_size` (and
    an `ep_size` up to it) divides `v` exactly when it divides `E`, the router still picks a strict subset of `v`
    experts, and group-limited routing (`n_group`, `topk_group`: DeepSeek-V3's) still has `n_group` equal groups of
    at least 2 experts whose `topk_group` best hold `top_k` of them. Only the counts whose top-k the config names
    (`num_experts_per_tok`, `top_k_experts`) are scaled; any other layout keeps its real count.
    """
    key, top_key = key_of(d, V.EXPERTS.attrs), key_of(d, V.EXPERTS_TOP_K.attrs)
    if not key or not top_key:
        return
    real, top_k = d[key], d[top_key]
    group_key, top_group_key = V.EXPERT_GROUPS.canonical, V.EXPERT_GROUPS_PICKED.canonical
    groups = d.get(group_key) if isinstance(d.get(group_key), int) and d.get(group_key, 0) > 1 else 1
    top_groups = d.get(top_group_key) if isinstance(d.get(top_group_key), int) else groups

    def fits(v: int) -> bool:
        return (v % m == real % m and v % groups == 0 and (groups == 1 or v // groups >= 2)
                and top_groups * (v // groups) >= top_k)

    floor = max(EXPERT_FLOOR, 2 * top_k)
    # past one period of every residue the rule asks about, no new value can fit: search no further (a config with
    # contradictory groups and a count of 10^12 keeps its count instead of scanning to it)
    stop = min(real, floor + math.lcm(m, groups) * (top_k + 2))
    if real > floor:
        put(d, key, next((v for v in range(floor, stop) if fits(v)), real), key)


def _remap_special_tokens(d: dict, vocab: int) -> None:
    """Token ids in the config (`bos_token_id`, `image_token_id`, ...) land in the top `SPECIAL_TOKEN_SLOTS` ids of
    the small vocabulary, one slot per distinct id, so the embedding holds them and the input ids never hit them."""
    slots: dict[int, int] = {}

    def slot(v: int) -> int:
        if v not in slots:
            slots[v] = vocab - 1 - (len(slots) % SPECIAL_TOKEN_SLOTS)
        return slots[v]

    for k, v in list(d.items()):
        if not k.endswith(V.SPECIAL_TOKEN_SUFFIXES):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            d[k] = slot(v)
        elif isinstance(v, list) and all(isinstance(x, int) for x in v):
            d[k] = [slot(x) for x in v]


# ----------------------------------------------------------------------------------------------------------------------
# The model class and the layers kept
# ----------------------------------------------------------------------------------------------------------------------
def resolve_class(model_class):
    """The transformers model class `model_class` names (the class, or its name in `transformers`).

    Raises:
        UsageError: it is not a transformers model class.
    """
    cls = seam.model_class(model_class)
    if cls is None and isinstance(model_class, str):
        raise UsageError(f"model class {model_class!r} is not a transformers class: the parity check cannot "
                         "build it. Pass the class itself or a name such as LlamaForCausalLM")
    if cls is None:
        raise UsageError(f"{model_class!r} is not a transformers model class: the parity check builds the model "
                         "with it. Pass a PreTrainedModel subclass")
    return cls


def _text_route(config, model_class) -> tuple[Any, Any, str]:
    """`(config, class, scope)`: the config and class the small model is built from. A composite model (whose plan
    lives in its decoder's text config) is checked through the text decoder alone: its causal LM class when
    transformers has one, else its base text model."""
    text, composite = seam.text_route(config)
    if not composite:
        return config, model_class, "whole model"
    for name in seam.decoder_class_names(text, near=model_class):
        cls = seam.model_class(name)
        if cls is not None:
            return text, cls, (f"text decoder only ({name} built from the {type(text).__name__}, where the plan "
                               f"lives); the other towers of {model_class.__name__} are not run")
    raise ParityUnavailableError(f"{model_class.__name__} is composite and transformers has no class for its text "
                                 f"config {text.model_type!r}: the parity check cannot build its decoder alone")


def _refuse_unrunnable(cls, d: dict) -> None:
    """Raise `ParityUnavailableError` with the specific reason when no forward of this class on token ids alone can
    run, whatever the widths: its `forward` requires other inputs (PI0's robot `state`), or every decoder layer reuses
    KV states another model computes (an assistant whose `num_kv_shared_layers` is all of its layers reads its target
    model's `shared_kv_states`)."""
    required = seam.required_forward_inputs(cls)
    if required:
        raise ParityUnavailableError(
            f"{cls.__name__}.forward requires {', '.join(f'`{r}`' for r in required)}, which the parity check's "
            "token-id input does not give: there is no sharded forward of it to compare")
    layers_key, shared = key_of(d, V.LAYERS.attrs), d.get(V.KV_SHARED_LAYERS.canonical)
    if layers_key and isinstance(shared, int) and shared >= d[layers_key] > 0:
        raise ParityUnavailableError(
            f"every decoder layer of {cls.__name__} reuses KV states another model computes "
            f"({V.KV_SHARED_LAYERS.canonical} = {shared} of {d[layers_key]} layers: an assistant reads its target "
            "model's): its forward does not run alone, so there is no sharded forward of it to compare")


def _decoder_layers(model):
    """The `nn.ModuleList` of decoder layers: the longest module list of the model."""
    import torch

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and (best is None or len(mod) > len(best[1])):
            best = (name, mod)
    return best


def _index_list(k: str, v) -> bool:
    return isinstance(v, list) and V.LAYER_LIST_MARK in k and all(isinstance(x, int) for x in v)


def _layer_lists(d: dict, n_layers: int) -> tuple[dict[str, list], dict[str, list]]:
    """The config's per-layer lists (one entry per layer: `layer_types`, Llama 4's `no_rope_layers` flags) and its
    layer-index lists (`mlp_only_layers`, Llama 4's `moe_layers`). An index list that names every layer is as long as
    a per-layer list: it is told apart by its values, `0 .. n_layers - 1` in order (Llama-4-Scout's `moe_layers`, all
    48 layers), which read as per-layer values would make every layer a kind of its own."""
    per_layer, index_lists = {}, {}
    for k, v in d.items():
        if _index_list(k, v) and (len(v) != n_layers or v == list(range(n_layers))):
            index_lists[k] = v
        elif isinstance(v, list) and len(v) == n_layers:
            per_layer[k] = v
    return per_layer, index_lists


def _layer_signatures(model, config_dict: dict, n_layers: int, keys=None) -> list[tuple] | None:
    """One signature per decoder layer: module classes, parameter names and shapes, and the layer's entry in every
    per-layer config list (`layer_types`, ...). Layers with equal signatures are of the same kind. `keys`: the
    per-layer lists to read (those of the full config, for a subset whose length other lists may happen to have:
    Ernie-4.5-VL-MoE's two `moe_intermediate_size` entries, one per expert kind, are not per layer)."""
    found = _decoder_layers(model)
    if found is None or len(found[1]) != n_layers:
        return None
    per_layer, index_lists = _layer_lists(config_dict, n_layers)
    if keys is not None:
        per_layer = {k: v for k, v in per_layer.items() if k in keys}
    overrides = _per_layer_overrides(config_dict)
    sigs = []
    for i, layer in enumerate(found[1]):
        mods = tuple((n, type(m).__name__) for n, m in layer.named_modules())
        params = tuple((n, tuple(p.shape)) for n, p in layer.named_parameters())
        conf = tuple((k, repr(v[i])) for k, v in sorted(per_layer.items())) + (repr(overrides.get(i)),)
        marks = tuple((k, i in v) for k, v in sorted(index_lists.items()))
        sigs.append((mods, params, conf, marks))
    return sigs


def _per_layer_overrides(d: dict) -> dict[int, dict]:
    """`per_layer_config` (transformers' heterogeneous configs, e.g. Gemma 4's global layers with their own
    `head_dim` and `num_key_value_heads`) keyed by int layer index."""
    raw = d.get(V.PER_LAYER_CONFIG.canonical)
    if not isinstance(raw, dict):
        return {}
    return {int(k): v for k, v in raw.items() if str(k).strip().isdigit()}


def _subset_layers(d: dict, keep: list[int], n_layers: int, layer_key: str) -> dict:
    """The config dict with only the layers `keep` (real indices, increasing)."""
    out = copy.deepcopy(d)
    out[layer_key] = len(keep)
    overrides = _per_layer_overrides(d)
    if overrides:
        out[V.PER_LAYER_CONFIG.canonical] = {str(pos): copy.deepcopy(overrides[i]) for pos, i in enumerate(keep)
                                if i in overrides}
    per_layer, index_lists = _layer_lists(d, n_layers)
    for k, v in d.items():
        if k in per_layer and k != layer_key:
            out[k] = [v[i] for i in keep]
        elif k in index_lists:
            out[k] = [pos for pos, i in enumerate(keep) if i in v]
        elif k == V.FIRST_DENSE_LAYERS.canonical and isinstance(v, int):
            out[k] = sum(1 for i in keep if i < v)
    return out


def _meta_model(cls, config_cls, d: dict):
    import torch

    cfg = config_cls.from_dict(d)
    with torch.device("meta"):
        return cls(cfg)


def _choose_layers(cls, config_cls, d: dict) -> tuple[dict, tuple[int, ...], list[str]]:
    """One layer of each kind, in the real order of first appearance; validated by rebuilding (on the meta
    device) and comparing the layers' signatures. Falls back to the shortest prefix of layers that holds every kind,
    then to every layer."""
    layer_key = key_of(d, V.LAYERS.attrs)
    notes: list[str] = []
    if layer_key is None:
        return d, (), ["the config names no layer count: every layer is kept"]
    n = d[layer_key]
    full = _meta_model(cls, config_cls, d)
    sigs = _layer_signatures(full, d, n)
    if sigs is None:
        return d, tuple(range(n)), [f"decoder layers not found as one module list: all {n} layers kept"]
    keep, seen = [], set()
    for i, s in enumerate(sigs):
        if s not in seen:
            seen.add(s)
            keep.append(i)
    for candidate in (keep, list(range(max(keep) + 1))):
        sub = _subset_layers(d, candidate, n, layer_key)
        try:
            got = _layer_signatures(_meta_model(cls, config_cls, sub), sub, len(candidate),
                                    keys=set(_layer_lists(d, n)[0]))
        except Exception:  # noqa: BLE001 - a config that cannot take the subset: try the next candidate
            got = None
        if got is not None and [g[:2] for g in got] == [sigs[i][:2] for i in candidate] and \
                [g[2] for g in got] == [sigs[i][2] for i in candidate]:
            if candidate is not keep:
                notes.append(f"one layer per kind did not rebuild the same layers; kept the first "
                             f"{len(candidate)} of {n}")
            return sub, tuple(candidate), notes
    return d, tuple(range(n)), notes + [f"no subset of layers rebuilt the same layers: all {n} kept"]


def _randomize(model, seed: int) -> None:
    """Fixed-seed random weights with a healthy scale: matrices `N(0, 1/fan_in)`, vectors (norms, biases, gates)
    their init plus `N(0, 0.1)`, so that no projection or bias is zero and every split shows in the output."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.ndim >= 2:
                p.copy_(noise / math.sqrt(max(1, p.shape[-1])))
            else:
                p.add_(0.1 * noise)


@contextlib.contextmanager
def one_thread():
    """One intra-op thread for the block: the small model's ops take microseconds, and a thread pool on a loaded
    2-core machine made each of them take milliseconds (measured: `F.linear` on `[16, 32]` 0.34 ms with 2 threads,
    0.03 ms with 1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def layer_tail(generic: str) -> str:
    """The part of a generic name after its first layer index (`model.language_model.layers.*.mlp.x` -> `mlp.x`), so
    that checkpoint and runtime names, and the real model's and the small model's names, compare across composite
    prefixes."""
    return generic.split(".*.", 1)[1] if ".*." in generic else generic


def _checkpoint_layout(model, checkpoint_keys) -> str:
    """`"runtime"` when the checkpoint stores every decoder-layer parameter under its runtime name (fused experts
    as one `gate_up_proj` tensor, ...), `"original"` when it does not (per-expert `gate_proj` / `up_proj` that
    the loader fuses, quantized companions): the layout `save_pretrained` must write for the small model to load
    the way the real one does. Unknown keys: `"runtime"`."""
    if checkpoint_keys is None:
        return "runtime"
    have = {layer_tail(generic_name(k)) for k in checkpoint_keys}
    need = {layer_tail(generic_name(k)) for k in model.state_dict() if ".*." in generic_name(k)}
    return "runtime" if need <= have else "original"


def build_small_model(config, model_class, tp_plan: dict | None, tp_size: int, *, seed: int = 0,
                      checkpoint_keys=None, kernels: dict | None = None) -> SmallModel:
    """Build, randomise and save the small model of `config`'s architecture (see the module docstring).

    Args:
        config (`PretrainedConfig`): the real config (composite configs are checked through their text decoder).
        model_class (`type | str`): the class the real model uses.
        tp_plan (`dict[str, str]`, *optional*): `base_model_tp_plan` under review (keys relative to the base model);
            `None` keeps the one the config ships.
        tp_size (`int`): the tp_size whose splits the shrink preserves.
        seed (`int`): the weights' and input's seed.
        checkpoint_keys (`Iterable[str]`, *optional*): the real checkpoint's tensor names. The loader slices what the
            checkpoint stores: per-expert `gate_proj` / `up_proj` tensors are each split before it fuses them (so a
            plain `colwise` on the fused `gate_up_proj` still gives every rank its share of both), a stored fused
            tensor is split as one. The small model is saved in the same layout: transformers' original format
            (`save_pretrained`'s default) when the checkpoint lacks runtime names, else the runtime format. Unknown
            (`None`): the runtime format, where a split that cuts a fused tensor shows.
        kernels (`dict`, *optional*): `from_pretrained` kernel choices (default `KERNELS`: eager attention and
            experts).

    Returns:
        `SmallModel` (call `cleanup()` when done).

    Raises:
        UsageError: `model_class` is not a transformers model class.
    """
    import torch

    from ..compat import backend

    quiet_libraries = backend().quiet

    cls = resolve_class(model_class)
    work, cls, scope = _text_route(config, cls)
    notes: list[str] = []
    real = work.to_dict()
    _refuse_unrunnable(cls, real)
    top_k = next((k for k in V.EXPERTS_TOP_K.attrs if k in real and real[k] is None), None)
    if top_k and key_of(real, V.EXPERTS.attrs):
        # transformers' default DeepSeek-V2 config leaves its router's top-k unset: no forward runs at any size
        real[top_k] = DEFAULT_TOP_K
        notes.append(f"the config leaves {top_k} unset (None): the small model's router picks {DEFAULT_TOP_K} experts "
                     "per token")
    if real.pop(V.QUANTIZATION.canonical, None) is not None:
        notes.append("quantized model: parity ran on the unquantized small model (the split of quantized weights is "
                     "checked statically, not here)")
    kernels = dict(KERNELS if kernels is None else kernels)
    vocab_key = key_of(real, (V.VOCAB.canonical,))

    def prepare(keep_head_widths: bool) -> tuple[dict, dict]:
        d, shrunk = shrink_config(real, tp_size, keep_head_widths=keep_head_widths)
        if vocab_key:
            _remap_special_tokens(d, d[vocab_key])
        d["dtype"] = "float32"
        d["use_cache"] = False
        for k in V.DROPPED_KEYS:
            d.pop(k, None)
        if tp_plan is not None:
            d["base_model_tp_plan"] = dict(tp_plan)
        d.update(kernels)
        return d, shrunk

    config_cls = type(work)
    d, shrunk = prepare(False)
    with quiet_libraries(), seam.no_progress_bars():
        try:
            d, layers, layer_notes = _choose_layers(cls, config_cls, d)
        except Exception as e:  # noqa: BLE001 - retried with real head widths; a second failure is the caller's
            d, shrunk = prepare(True)
            d, layers, layer_notes = _choose_layers(cls, config_cls, d)
            notes.append("attention head widths kept real: the model does not build with scaled ones "
                         f"({short(f'{type(e).__name__}: {e}', 120)})")
        notes += layer_notes
        count = sum(p.numel() for p in _meta_model(cls, config_cls, d).parameters())
        if count > MAX_PARAMETERS:
            raise ParityUnavailableError(
                f"the small {cls.__name__} would hold {count:,} parameters ({count * 4:,} B in float32, more than the "
                f"{MAX_PARAMETERS:,} the parity check allows itself): widths it cannot shrink keep it large")
        small_cfg = config_cls.from_dict(d)
        if tp_plan is not None:
            small_cfg.base_model_tp_plan = dict(tp_plan)
        torch.manual_seed(seed)
        model = cls(small_cfg).to(torch.float32)
        _randomize(model, seed)
        tmp = tempfile.TemporaryDirectory(prefix="tpaudit-parity-")
        layout = _checkpoint_layout(model, checkpoint_keys)
        model.save_pretrained(tmp.name, save_original_format=layout == "original")
        notes.append("checkpoint layout: " + (
            "the real checkpoint's (tensors stored as transformers' original format, fused by the loader)"
            if layout == "original" else
            "fused tensors under their runtime names" + (" as the real checkpoint stores them"
                                                          if checkpoint_keys is not None else
                                                          " (the real checkpoint's names were not given)")))
        # the config object travels with the load: `base_model_tp_plan` under review is an attribute of this instance
        # only (config.json does not bring it back)
        reference = cls.from_pretrained(tmp.name, config=small_cfg, dtype=torch.float32,
                                        use_kernels=False, **kernels).eval()
    vocab = d.get(vocab_key, MIN_VOCAB) if vocab_key else MIN_VOCAB
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, max(2, vocab - SPECIAL_TOKEN_SLOTS), (BATCH, SEQ_LEN), generator=g)
    widths = {v for k, v in d.items() if k.endswith(V.HEAD_DIM_SUFFIX) and isinstance(v, int) and v > 0}
    widths |= {o[V.HEAD_DIM_SUFFIX] for o in _per_layer_overrides(d).values()
               if isinstance(o.get(V.HEAD_DIM_SUFFIX), int)}
    hidden_key, heads_key = key_of(d, V.HIDDEN.attrs), key_of(d, V.ATTENTION_HEADS.attrs)
    if not isinstance(d.get(V.HEAD_DIM_SUFFIX), int) and hidden_key and heads_key:
        widths.add(d[hidden_key] // d[heads_key])
    return SmallModel(path=tmp.name, model_class=cls, config=small_cfg, reference=reference, input_ids=input_ids,
                      plan=dict(reference.tp_plan or {}), ep_plan=dict(reference.ep_plan or {}), shrunk=shrunk,
                      layers=layers, scope=scope, notes=notes, head_widths=tuple(sorted(widths)), tmp=tmp,
                      kernels=kernels)


def small_model(config, model_class, tp_plan: dict | None, tp_size: int, *, seed: int = 0,
                checkpoint_keys=None) -> SmallModel:
    """`build_small_model` with the kernels a tensor-parallel run loads with (`KERNELS`), for `split_outputs` and
    then `run_parity` (at `ep_size` 1) to share one build: the caller calls `cleanup()`.

    Raises:
        UsageError: `model_class` is not a transformers model class, or `tp_size < 1`.
        ParityUnavailableError: the small model cannot be built from this config (no evidence either way).
    """
    if tp_size < 1:
        raise UsageError(f"tp_size {tp_size} is invalid: the parity check needs tp_size >= 1. Pass --tp 2 or more")
    cls = resolve_class(model_class)
    with one_thread():
        try:
            return build_small_model(config, cls, tp_plan, tp_size, seed=seed, checkpoint_keys=checkpoint_keys)
        except (UsageError, ParityUnavailableError):
            raise
        except Exception as e:  # noqa: BLE001 - reported as what it is: no small model, no evidence
            raise ParityUnavailableError(f"the parity check cannot build a small {cls.__name__} from this config: "
                                         f"{short(f'{type(e).__name__}: {e}', 160)}") from None


def short(text: str, limit: int = 240) -> str:
    """`text` on one line, at most `limit` characters."""
    line = " ".join(str(text).strip().split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
