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
from ..units import shorten
from .shrink import MIN_VOCAB, key_of, shrink_config  # noqa: F401  (re-exported: the small model's shrink)

# The kernels on both sides: float32 eager attention, and the eager expert loop for tensor parallelism (the
# grouped-matmul experts need 16-byte-aligned strides that small or uneven CPU shards do not have). Expert parallelism
# runs transformers' default experts kernel, the one its EP dispatch is written for (gpt-oss's eager loop rejects the
# EP routing: "Class values must be smaller than num_classes").
KERNELS = {"attn_implementation": "eager", "experts_implementation": "eager"}
EP_KERNELS = {"attn_implementation": "eager"}

SEQ_LEN = 8
BATCH = 2
SPECIAL_TOKEN_SLOTS = 16
DEFAULT_TOP_K = 2
"""Experts per token for a config that names experts but leaves its router's top-k unset."""
MAX_PARAMETERS = 64_000_000
"""The most parameters a small model may hold (256 MB in float32; the ranks and the reference hold it about twice
more): a larger one is refused rather than risk a scan's memory bound."""


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
            why = shorten(f"{type(e).__name__}: {e}", 120, words=False)
            notes.append(f"attention head widths kept real: the model does not build with scaled ones ({why})")
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
            why = shorten(f"{type(e).__name__}: {e}", 160, words=False)
            raise ParityUnavailableError(f"the parity check cannot build a small {cls.__name__} from this config: "
                                         f"{why}") from None


