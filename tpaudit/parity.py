"""The parity check: the sharded forward as evidence.

A static view of a plan cannot tell how a model's forward uses a projection's output: a fused QKV laid out per head
(`[head][q, k, v]`, GPT-NeoX's `query_key_value`) survives a plain `colwise` split when `tp_size` divides the heads,
one laid out as blocks (`[Q_all | K_all | V_all]`) does not, and nothing in either's name says which. The parity
check runs the forward instead:

1. **A small model of the same architecture** (`build_small_model`): the same model class and plan, the same head
   and KV-head counts and layer-type pattern as the real config, one decoder layer of each kind in the real order of
   first appearance, and every width (and the routed-expert count) scaled down so that each split `tp_size` makes of
   the real model keeps its structure (the shrink rule is in `shrink_config`). Random weights from a fixed seed, float32, CPU, eager
   attention and eager experts, written with `save_pretrained` to a temporary directory.
2. **The suspects** (`split_outputs`): one forward of the small unsharded model is traced with a
   `torch.overrides.TorchFunctionMode` that follows every tensor derived from the output of a module (or parameter)
   the plan splits on its output (`colwise`, `packed_colwise`). A `split` / `chunk` / `unbind` / `narrow` / slice of
   such a tensor along a dimension that came from `out_features` is recorded when it cuts the output into parts: along
   the outermost factor (the dimension a `colwise` shard cuts: `[Q_all | K_all | V_all]`, `[gate | up]`), or along an
   inner factor wider than any attention head of the config (a per-head row that packs several projections,
   `[head][q, k, v]`). A reshape into heads is not a cut, and the rotary halves of one head are not parts.
3. **The sharded run** (`run_parity`): the small model is loaded with `from_pretrained(dir,
   distributed_config=DistributedConfig(tp_size=..., ep_size=...))` on `tp_size` real ranks, run as threads of this
   process on torch's multi-threaded process group (`tpaudit.compat.parity`), and the same token ids go through it
   and through the unsharded model. Forward hooks on both record every module's input and output under the same
   names; a rank's output is compared with the unsharded one directly when it is whole, and with the rank's own
   slice when one dimension is sharded (`torch.chunk` order, as DTensor's `Shard`). The first module (in execution
   order) whose output differs beyond the tolerance, or the module running when a rank raised, is where the
   divergence shows. It is attributed to the split that caused it: that module's own rule when its input still
   matched (a colwise `o_proj` fed split heads, a rowwise `q_proj` fed a whole hidden state); a module with no rule
   that received a split input (a missing reduction); else a split weight the rank used inside that module, or since
   the last whole output that matched of a module above it: the last one before a crash, a fused or packed one
   first for wrong numbers.

The checkpoint's layout decides some verdicts: the loader slices what the checkpoint stores, so per-expert `gate_proj`
/ `up_proj` tensors split by a plain `colwise` still give each rank its share of both once fused, while a stored
fused `gate_up_proj` is cut in the middle. `run_parity(checkpoint_keys=...)` saves the small model the same way.

Threads or processes: measured on the 2-core reference machine, 4 gloo ranks under torchrun (as `tpaudit verify`
starts them) took 17 s for a tiny llama, almost all of it 4 imports of torch and transformers; 4 threaded ranks in
an already-importing process took 0.3 s. Cost per check (`scripts/benchmark_parity.py`): see the README.

Tolerance: float32 has a 2^-23 (1.2e-7) relative rounding step; a sharded forward changes only the order of the
sums a `rowwise` all-reduce adds up, over at most a few hundred terms of magnitude about one in the small model,
which moves a result by well under 1e-4 of its scale. A wrong split swaps whole rows and moves it by the order of its
own magnitude. A comparison fails when `max |sharded - unsharded| > 1e-4 * max(1, max |unsharded|)`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError, UsageError
from .model import Finding, generic_name

# Styles that split a module's output along `out_features` and leave it split (the colwise family). Gathered styles
# (`colwise_gather_output`, `colwise_rep`) hand every rank the whole output, so the model never sees a part.
SPLIT_OUTPUT_STYLES = frozenset({"colwise", "packed_colwise"})

# Parameter styles that shard the last dimension (`RowwiseParallel`, `PackedRowwiseParallel`): on an `[E, in, out]`
# experts tensor (gpt-oss) that is the output dimension.
ROW_STYLES = frozenset({"rowwise", "packed_rowwise"})

# Styles that shard a module's own weight and wrap its input/output (`ColwiseParallel`, `RowwiseParallel`,
# `EmbeddingParallel`, the packed styles): when such a module diverges while its input still matches, its own rule
# is the one that is wrong.
OWN_SPLIT_STYLES = frozenset({"colwise", "rowwise", "packed_colwise", "packed_rowwise", "colwise_gather_output",
                              "colwise_rep", "rowwise_split_input", "rowwise_rep", "embedding_rowwise",
                              "embedding_colwise"})

# The kernels on both sides: float32 eager attention, and the eager expert loop for tensor parallelism (the
# grouped-matmul experts need 16-byte-aligned strides that small or uneven CPU shards do not have). Expert parallelism
# runs transformers' default experts kernel, the one its EP dispatch is written for (gpt-oss's eager loop rejects the
# EP routing: "Class values must be smaller than num_classes").
KERNELS = {"attn_implementation": "eager", "experts_implementation": "eager"}
EP_KERNELS = {"attn_implementation": "eager"}

RTOL = 1e-4
SEQ_LEN = 8
BATCH = 2
SPECIAL_TOKEN_SLOTS = 16
MIN_VOCAB = 64



# ----------------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitOutput:
    """A module (or parameter) the plan splits on its output, whose output the forward then cuts into parts.

    Attributes:
        module (`str`): generic name, e.g. `model.layers.*.self_attn.qkv_proj` or
            `model.layers.*.mlp.experts.gate_up_proj` (a parameter with its own rule).
        rule (`str`): the plan key that splits it (generic, prefixed), as transformers looks it up.
        style (`str`): the rule's style: `colwise` or `packed_colwise` (for an `[E, in, out]` experts tensor, whose
            output is its last dimension, also `rowwise`).
        action (`str`): what the forward does to the output, in words (`"split into parts of [128, 128, 256, 256]
            features out of 768, per-head rows of 48 features, wider than any head (16): several projections packed
            per head"`).
    """

    module: str
    rule: str
    style: str
    action: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class ParityResult:
    """What the sharded forward showed.

    Attributes:
        ran (`bool`): the sharded forward was attempted.
        reason (`str`): why it ran (or did not) and how: the ranks, the layers kept, the checkpoint layout, and what
            it does not cover (quantized weights run unquantized; a composite model is checked through its text
            decoder; a subprocess when this process could not host the ranks).
        tp_size (`int`), ep_size (`int`): the `DistributedConfig` sizes the ranks loaded with.
        modules_compared (`int`): module calls whose output was compared on some rank (whole, or as the rank's slice).
        max_abs_error (`float`, *optional*): the largest `|sharded - unsharded|` over every compared output of every
            rank (logits included); `None` when nothing could be compared.
        first_divergent_module (`str`, *optional*): generic name of the module (or parameter) whose split made the
            forward diverge: the first module (in execution order) whose output differs or that raised when its own
            rule is at fault (its input still matched), else the split it consumed (`observed_at` says where it
            showed); `None` when nothing diverged.
        rule (`str`, *optional*), style (`str`, *optional*): the plan rule and style that split it (`None` when the
            module has no rule, e.g. one that receives a split input unreduced).
        observed_at (`str`, *optional*): generic name of the module where the divergence showed (the first whose
            output differed, or the one running when a rank raised).
        error (`str`, *optional*): the exception a rank raised, one line (`"rank 0: RuntimeError: ..."`).
        passed (`bool`, *optional*): `True` when every rank ran and every compared output matched; `None` when the
            check did not run.
        seconds (`float`): wall time of the check.
        fused (`bool`): the module blamed is one whose output the forward cuts into parts (a fused or packed
            projection, see `split_outputs`): a `packed_layout` error rather than a style mismatch.
        split (`tuple[SplitOutput, ...]`): the fused or packed projections the trace found.
        shrunk (`dict[str, list[int]]`): config attribute -> `[real, small]` for every attribute the small model
            scales (dotted for nested configs).
        layers (`tuple[int, ...]`): the real layer indices the small model keeps, one per kind, in order.
        model_class (`str`, *optional*): the class that was loaded.
        scope (`str`): `"whole model"`, or what part of a composite model was checked.
        tolerance (`float`): the relative tolerance: an output differs when its max abs error exceeds
            `tolerance * max(1, max |unsharded output|)`.
        rank (`int`, *optional*): the rank that raised or diverged first.
        observed_layer (`int`, *optional*): the real model's layer index (of the kept layer) where the divergence
            showed, e.g. 5 for Gemma 4's first global-attention layer.
        input_split (`bool`, *optional*): when the module blamed is where the divergence showed, whether its input
            reached it split (each rank a slice) or whole; `None` otherwise.
    """

    ran: bool
    reason: str
    tp_size: int
    ep_size: int = 1
    modules_compared: int = 0
    max_abs_error: float | None = None
    first_divergent_module: str | None = None
    rule: str | None = None
    style: str | None = None
    observed_at: str | None = None
    error: str | None = None
    passed: bool | None = None
    seconds: float = 0.0
    fused: bool = False
    split: tuple[SplitOutput, ...] = ()
    shrunk: dict[str, list[int]] = field(default_factory=dict)
    layers: tuple[int, ...] = ()
    model_class: str | None = None
    scope: str = "whole model"
    tolerance: float = RTOL
    rank: int | None = None
    input_split: bool | None = None
    observed_layer: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The report's `parity` section (JSON-serialisable)."""
        out = asdict(self)
        out["split"] = [s.to_json() for s in self.split]
        out["layers"] = list(self.layers)
        out["seconds"] = round(self.seconds, 3)
        return out


# ----------------------------------------------------------------------------------------------------------------------
# The small model
# ----------------------------------------------------------------------------------------------------------------------
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "n_embed")
INTERMEDIATE_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "ffn_hidden_size", "n_inner", "ffn_dim", "expert_intermediate_size", "dense_intermediate_size",
                     "expert_ffn_hidden_size")
RANK_KEYS = ("q_lora_rank", "kv_lora_rank")
VOCAB_KEYS = ("vocab_size", "vocab_size_per_layer_input")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "num_global_key_value_heads")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers")
ROTARY_FRACTION_KEYS = ("partial_rotary_factor", "rotary_pct")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "top_k_experts")
HEAD_DIM_FLOOR = 8
WIDTH_FLOOR = 8
HIDDEN_FLOOR = 16
EXPERT_FLOOR = 16


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
        found (`dict[str, SplitOutput]`): the split outputs the traced forward cuts into parts (set by `_trace`).
        traced (`bool`): whether `_trace` ran (`found` is its answer).
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
    found: dict[str, SplitOutput] = field(default_factory=dict)
    ep_plan: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, str] = field(default_factory=lambda: dict(KERNELS))
    traced: bool = False

    def cleanup(self) -> None:
        """Remove the temporary directory."""
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


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
        if k in ROTARY_FRACTION_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        elif isinstance(v, dict) and ("rope" in k or any(isinstance(x, dict) for x in v.values())):
            out.extend(_rotary_fractions(v))
    return out


def _rope_has_lists(d: dict) -> bool:
    """RoPE parameters with per-dimension lists (`mrope_section`, LongRoPE factors) are laid out for the real head
    dim: the small model keeps it."""
    for k, v in d.items():
        if ("rope" in k) and isinstance(v, dict):
            stack = [v]
            while stack:
                cur = stack.pop()
                for x in cur.values():
                    if isinstance(x, (list, tuple)) and len(x) > 1:
                        return True
                    if isinstance(x, dict):
                        stack.append(x)
    return False


def _key(d: dict, names) -> str | None:
    return next((k for k in names if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)


def shrink_config(config_dict: dict, tp_size: int) -> tuple[dict, dict[str, list[int]]]:
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

    The layer count is not changed here (`build_small_model` keeps one layer of each kind).

    Args:
        config_dict (`dict`): `PretrainedConfig.to_dict()` of the (text) config.
        tp_size (`int`): the tp_size whose splits must keep their structure.

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

    heads_key, kv_key, hidden_key = _key(d, HEAD_KEYS), _key(d, KV_HEAD_KEYS), _key(d, HIDDEN_KEYS)
    heads = d.get(heads_key) if heads_key else None
    kv_heads = d.get(kv_key) if kv_key else None
    hidden = d.get(hidden_key) if hidden_key else None
    fractions = _rotary_fractions(d)
    rotary_dim = d.get("rotary_dim") if isinstance(d.get("rotary_dim"), int) else None
    keep_heads = _rope_has_lists(d)

    def head_ok(v: int, real: int) -> bool:
        if any(not float(v * f).is_integer() or int(v * f) % 2 for f in fractions):
            return False
        return not (rotary_dim and (rotary_dim * v) % real or rotary_dim and (rotary_dim * v // real) % 2)

    derived_head = heads and hidden and (not isinstance(d.get("head_dim"), int) or d["head_dim"] * heads == hidden)
    real_head = d["head_dim"] if isinstance(d.get("head_dim"), int) else (hidden // heads if derived_head else None)

    # Every per-head width of the config (top level, and per-layer overrides such as Gemma 4's global layers), each
    # distinct real value to a distinct small one in the same order, so layers with wider heads keep wider heads.
    per_layer = d.get("per_layer_config") if isinstance(d.get("per_layer_config"), dict) else {}
    head_keys = [k for k in d if k.endswith("head_dim") and k != "qk_head_dim" and isinstance(d[k], int)]
    rope_keys = {"head_dim", "global_head_dim"} if keep_heads else set()
    reals = sorted({d[k] for k in head_keys if k not in rope_keys}
                   | {o["head_dim"] for o in per_layer.values() if isinstance(o, dict)
                      and isinstance(o.get("head_dim"), int) and not keep_heads})
    small_of: dict[int, int] = {}
    low = HEAD_DIM_FLOOR
    for real in reals:
        v = next((v for v in range(low, real) if v % m == real % m and head_ok(v, real)), real)
        small_of[real] = v
        low = v + 1
    for key in head_keys:
        if key not in rope_keys:
            put(d, key, small_of[d[key]], key)
    for layer, override in per_layer.items():
        if isinstance(override, dict) and isinstance(override.get("head_dim"), int) and not keep_heads:
            put(override, "head_dim", small_of[override["head_dim"]], f"per_layer_config.{layer}.head_dim")
    if isinstance(d.get("qk_head_dim"), int) and isinstance(d.get("qk_nope_head_dim"), int):
        put(d, "qk_head_dim", d["qk_nope_head_dim"] + d.get("qk_rope_head_dim", 0), "qk_head_dim")
    if derived_head and real_head:
        small_head = d["head_dim"] if isinstance(d.get("head_dim"), int) else small_of.get(real_head)
        if small_head is None:
            small_head = next((v for v in range(HEAD_DIM_FLOOR, real_head) if v % m == real_head % m
                               and head_ok(v, real_head)), real_head)
        put(d, hidden_key, heads * small_head, hidden_key)
    elif hidden_key:
        extra = [x for x in (heads, kv_heads, 2 * (heads or 0)) if x]
        put(d, hidden_key, _same_residue(hidden, m, HIDDEN_FLOOR, extra), hidden_key)
    if rotary_dim and real_head and derived_head:
        put(d, "rotary_dim", rotary_dim * (d[hidden_key] // heads) // real_head, "rotary_dim")

    def widths(target: dict, prefix: str) -> None:
        for k in INTERMEDIATE_KEYS + RANK_KEYS:
            if isinstance(target.get(k), int) and not isinstance(target.get(k), bool):
                put(target, k, _same_residue(target[k], m, WIDTH_FLOOR), prefix + k)
        for k, v in list(target.items()):
            if isinstance(v, dict) and k not in ("quantization_config", "id2label", "label2id") and "rope" not in k:
                widths(v, f"{prefix}{k}.")

    widths(d, "")
    _shrink_experts(d, m, put)
    for k in VOCAB_KEYS:
        if isinstance(d.get(k), int) and d[k] > MIN_VOCAB:
            put(d, k, _same_residue(d[k], m, MIN_VOCAB), k)
    return d, shrunk


def _shrink_experts(d: dict, m: int, put) -> None:
    """Scale the routed-expert count of a config dict down (see `shrink_config`), in place.

    The count `E` becomes the smallest `v >= max(EXPERT_FLOOR, 2 * top_k)` with `v % m == E % m`, so `tp_size` (and
    an `ep_size` up to it) divides `v` exactly when it divides `E`, the router still picks a strict subset of `v`
    experts, and group-limited routing (`n_group`, `topk_group`: DeepSeek-V3's) still has `n_group` equal groups of
    at least 2 experts whose `topk_group` best hold `top_k` of them. Only the counts whose top-k the config names
    (`num_experts_per_tok`, `top_k_experts`) are scaled; any other layout keeps its real count.
    """
    key, top_key = _key(d, EXPERT_KEYS), _key(d, TOP_K_KEYS)
    if not key or not top_key:
        return
    real, top_k = d[key], d[top_key]
    groups = d.get("n_group") if isinstance(d.get("n_group"), int) and d.get("n_group", 0) > 1 else 1
    top_groups = d.get("topk_group") if isinstance(d.get("topk_group"), int) else groups

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
        if not (k.endswith("_token_id") or k.endswith("_token_index") or k.endswith("_token_ids")):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            d[k] = slot(v)
        elif isinstance(v, list) and all(isinstance(x, int) for x in v):
            d[k] = [slot(x) for x in v]


def _resolve_class(model_class):
    import transformers
    from transformers import PreTrainedModel

    if isinstance(model_class, str):
        cls = getattr(transformers, model_class, None)
        if cls is None:
            raise UsageError(f"model class {model_class!r} is not a transformers class: the parity check cannot "
                             "build it. Pass the class itself or a name such as LlamaForCausalLM")
        model_class = cls
    if not (isinstance(model_class, type) and issubclass(model_class, PreTrainedModel)):
        raise UsageError(f"{model_class!r} is not a transformers model class: the parity check builds the model "
                         "with it. Pass a PreTrainedModel subclass")
    return model_class


def _text_route(config, model_class) -> tuple[Any, Any, str, str | None]:
    """`(config, class, scope, owner)`: the config and class the small model is built from. A composite model
    (whose plan lives in its decoder's text config) is checked through the text decoder alone: its causal LM class
    when transformers has one, else its base text model."""
    from transformers.models.auto import modeling_auto as auto

    try:
        text = config.get_text_config(decoder=True)
    except (ValueError, AttributeError):
        text = config
    if text is config:
        return config, model_class, "whole model", None
    import transformers

    for mapping in (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_MAPPING_NAMES):
        name = mapping.get(text.model_type)
        if name and hasattr(transformers, name):
            cls = getattr(transformers, name)
            return text, cls, (f"text decoder only ({name} built from the {type(text).__name__}, where the plan "
                               f"lives); the other towers of {model_class.__name__} are not run"), name
    raise UsageError(f"{model_class.__name__} is composite and transformers has no class for its text config "
                     f"{text.model_type!r}: the parity check cannot build its decoder alone")


def _decoder_layers(model):
    """The `nn.ModuleList` of decoder layers: the longest module list of the model."""
    import torch

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and (best is None or len(mod) > len(best[1])):
            best = (name, mod)
    return best


def _layer_signatures(model, config_dict: dict, n_layers: int) -> list[tuple] | None:
    """One signature per decoder layer: module classes, parameter names and shapes, and the layer's entry in every
    per-layer config list (`layer_types`, ...). Layers with equal signatures are of the same kind."""
    found = _decoder_layers(model)
    if found is None or len(found[1]) != n_layers:
        return None
    per_layer = {k: v for k, v in config_dict.items() if isinstance(v, list) and len(v) == n_layers}
    index_lists = {k: v for k, v in config_dict.items() if isinstance(v, list) and "layer" in k
                   and k not in per_layer and all(isinstance(x, int) for x in v)}
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
    raw = d.get("per_layer_config")
    if not isinstance(raw, dict):
        return {}
    return {int(k): v for k, v in raw.items() if str(k).strip().isdigit()}


def _subset_layers(d: dict, keep: list[int], n_layers: int, layer_key: str) -> dict:
    """The config dict with only the layers `keep` (real indices, increasing)."""
    out = copy.deepcopy(d)
    out[layer_key] = len(keep)
    overrides = _per_layer_overrides(d)
    if overrides:
        out["per_layer_config"] = {str(pos): copy.deepcopy(overrides[i]) for pos, i in enumerate(keep)
                                   if i in overrides}
    for k, v in d.items():
        if isinstance(v, list) and len(v) == n_layers and k != layer_key:
            out[k] = [v[i] for i in keep]
        elif isinstance(v, list) and "layer" in k and all(isinstance(x, int) for x in v):
            out[k] = [pos for pos, i in enumerate(keep) if i in v]
        elif k in ("first_k_dense_replace",) and isinstance(v, int):
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
    layer_key = _key(d, LAYER_KEYS)
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
            got = _layer_signatures(_meta_model(cls, config_cls, sub), sub, len(candidate))
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


@contextlib.contextmanager
def _no_progress_bars():
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _tail(generic: str) -> str:
    """The part of a generic name after its first layer index (`model.language_model.layers.*.mlp.x` -> `mlp.x`), so
    that checkpoint and runtime names compare across composite prefixes."""
    return generic.split(".*.", 1)[1] if ".*." in generic else generic


def _checkpoint_layout(model, checkpoint_keys) -> str:
    """`"runtime"` when the checkpoint stores every decoder-layer parameter under its runtime name (fused experts
    as one `gate_up_proj` tensor, ...), `"original"` when it does not (per-expert `gate_proj` / `up_proj` that
    the loader fuses, quantized companions): the layout `save_pretrained` must write for the small model to load
    the way the real one does. Unknown keys: `"runtime"`."""
    if checkpoint_keys is None:
        return "runtime"
    have = {_tail(generic_name(k)) for k in checkpoint_keys}
    need = {_tail(generic_name(k)) for k in model.state_dict() if ".*." in generic_name(k)}
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

    from .compat import backend

    quiet_libraries = backend().quiet

    cls = _resolve_class(model_class)
    work, cls, scope, _ = _text_route(config, cls)
    notes: list[str] = []
    d = work.to_dict()
    if d.pop("quantization_config", None) is not None:
        notes.append("quantized model: parity ran on the unquantized small model (the split of quantized weights is "
                     "checked statically, not here)")
    d, shrunk = shrink_config(d, tp_size)
    vocab_key = _key(d, ("vocab_size",))
    if vocab_key:
        _remap_special_tokens(d, d[vocab_key])
    d["dtype"] = "float32"
    d["use_cache"] = False
    for k in ("torch_dtype", "_name_or_path", "architectures", "transformers_version"):
        d.pop(k, None)
    if tp_plan is not None:
        d["base_model_tp_plan"] = dict(tp_plan)
    kernels = dict(KERNELS if kernels is None else kernels)
    d.update(kernels)
    config_cls = type(work)
    with quiet_libraries(), _no_progress_bars():
        d, layers, layer_notes = _choose_layers(cls, config_cls, d)
        notes += layer_notes
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
                                        **kernels).eval()
    vocab = d.get(vocab_key, MIN_VOCAB) if vocab_key else MIN_VOCAB
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, max(2, vocab - SPECIAL_TOKEN_SLOTS), (BATCH, SEQ_LEN), generator=g)
    widths = {v for k, v in d.items() if k.endswith("head_dim") and isinstance(v, int) and v > 0}
    widths |= {o["head_dim"] for o in _per_layer_overrides(d).values() if isinstance(o.get("head_dim"), int)}
    if not isinstance(d.get("head_dim"), int) and _key(d, HIDDEN_KEYS) and _key(d, HEAD_KEYS):
        widths.add(d[_key(d, HIDDEN_KEYS)] // d[_key(d, HEAD_KEYS)])
    return SmallModel(path=tmp.name, model_class=cls, config=small_cfg, reference=reference, input_ids=input_ids,
                      plan=dict(reference.tp_plan or {}), ep_plan=dict(reference.ep_plan or {}), shrunk=shrunk,
                      layers=layers, scope=scope, notes=notes, head_widths=tuple(sorted(widths)), tmp=tmp,
                      kernels=kernels)


# ----------------------------------------------------------------------------------------------------------------------
# Plan lookup (as transformers' `parallel_utils._get_parameter_plan`)
# ----------------------------------------------------------------------------------------------------------------------
def rule_for(plan: dict[str, str], name: str, is_param: bool) -> tuple[str | None, str | None]:
    """`(rule key, style)` for a concrete module or parameter name: its generic name (layer numbers as `*`), and for a
    parameter its module's key when it has none of its own. `(None, None)` when no rule applies."""
    generic = generic_name(name)
    if generic in plan:
        return generic, plan[generic]
    if is_param and "." in generic and (parent := generic.rsplit(".", 1)[0]) in plan:
        return parent, plan[parent]
    return None, None


# ----------------------------------------------------------------------------------------------------------------------
# The suspects: which split outputs the forward cuts into parts
# ----------------------------------------------------------------------------------------------------------------------
# Same tensor, other dtype or memory: the index is unchanged.
_KEEP_OPS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as", "contiguous", "clone", "detach",
                       "cpu"})
_SHAPE_OPS = frozenset({
    "view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "squeeze", "unsqueeze", "expand", "expand_as",
    "transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis", "t", "__get__", "repeat",
    "repeat_interleave", "flip",
    "__getitem__", "split", "split_with_sizes", "chunk", "tensor_split", "unbind", "narrow", "select", "index_select",
})
_CUT_OPS = frozenset({"__getitem__", "split", "split_with_sizes", "chunk", "tensor_split", "unbind", "narrow", "select",
                      "index_select"})
_JOIN_OPS = frozenset({"cat", "concat", "concatenate", "stack"})
_MATMUL_OPS = frozenset({"linear", "matmul", "__matmul__", "mm", "bmm"})


def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


class _Tracer:
    """Follows the out-feature index of every element derived from a split output through one forward.

    Each tracked tensor carries, per source, an int tensor of its own shape holding the index (in `[0, N)`, `N` the
    source's `out_features`) of the output feature each element came from (`-1` where it came from elsewhere). Shape
    ops (view, reshape, transpose, slicing, split, cat, ...) are replayed on that index tensor; elementwise ops keep
    it (for at most `MAX_HOPS` of them in a row: a cut comes right after the projection); a linear / matmul whose
    weight is tracked along its output dimension starts a new one; anything else drops it.

    A cut (split, chunk, unbind, narrow, slice, select) that hands a piece only some of the features is a cut into
    parts when the features a piece keeps do not repeat with a period of one head or less: blocks of the whole output
    (`[Q_all | K_all | V_all]`, `[gate | up]`, period `N`) or per-head rows wider than any attention head of the
    config (`[head][q, k, v]`, period `3 * head_dim`). The rotary halves of a head repeat every head and are not parts.
    """

    MAX_HOPS = 4

    def __init__(self, head_widths: tuple[int, ...]):
        from torch.utils.weak import WeakIdKeyDictionary

        self.tags = WeakIdKeyDictionary()
        self.total: dict[str, int] = {}
        self.found: dict[str, str] = {}
        self.dead: set[str] = set()   # contracted by a matmul: the split is on the input features, not the output
        self.max_head = max(head_widths) if head_widths else 0

    def track(self, tensor, source: str, dim: int) -> None:
        import torch

        n = tensor.shape[dim]
        view = [1] * tensor.ndim
        view[dim] = n
        self.total[source] = n
        self.tags[tensor] = {source: (torch.arange(n).view(view).expand(tensor.shape), 0)}

    def _live(self, t) -> dict:
        tags = self.tags.get(t)
        return {s: v for s, v in tags.items() if s not in self.found and s not in self.dead} if tags else {}

    # -- propagation ---------------------------------------------------------------------------------------------------
    def propagate(self, func, args, kwargs, out) -> None:
        import torch

        name = getattr(func, "__name__", "")
        if name in _MATMUL_OPS:
            self._matmul(name, args, out)
            return
        tagged = [t for t in _tensors(list(args) + list(kwargs.values())) if self._live(t)]
        if not tagged:
            return
        if name in _JOIN_OPS and args and isinstance(args[0], (list, tuple)):
            self._join(func, args, kwargs, out)
            return
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in _KEEP_OPS and src is not None and isinstance(out, torch.Tensor) and out.shape == src.shape:
            self.tags[out] = self._live(src)
            return
        if name in _SHAPE_OPS and src is not None and self._live(src):
            outs = list(_tensors(out))
            results: dict[int, tuple] = {}
            for source, (idx, hops) in self._live(src).items():
                pieces = list(_tensors(func(idx, *args[1:], **kwargs)))
                if any(p.is_floating_point() for p in pieces):
                    continue
                if len(pieces) != len(outs) or any(p.shape != o.shape for p, o in zip(pieces, outs)):
                    continue
                if name in _CUT_OPS:
                    self._check_cut(name, source, idx, pieces)
                for o, piece in zip(outs, pieces):
                    results.setdefault(id(o), (o, {}))[1][source] = (piece, hops)
            for o, tags in results.values():
                self.tags[o] = tags
            return
        for o in _tensors(out):
            for t in tagged:
                if o in self.tags:
                    break
                if t.shape == o.shape:
                    kept = {s: (idx, hops + 1) for s, (idx, hops) in self._live(t).items() if hops < self.MAX_HOPS}
                elif t.ndim == o.ndim:
                    kept = {s: (v, hops + 1) for s, (idx, hops) in self._live(t).items()
                            if hops < self.MAX_HOPS and (v := self._along(idx, o.shape)) is not None}
                else:
                    kept = {}
                if kept:
                    self.tags[o] = kept

    @staticmethod
    def _along(idx, shape):
        """The index for an output of another length along dimensions the index does not vary on (a depthwise
        convolution over the sequence keeps the channels): `None` when a dimension it varies on changed size."""
        for d in range(idx.ndim):
            if idx.shape[d] != shape[d]:
                first = idx.narrow(d, 0, 1)
                if not bool((first == idx).all()):
                    return None
                idx = first
        return idx.expand(shape)

    def _join(self, func, args, kwargs, out) -> None:
        import torch

        parts = list(args[0])
        live = [self._live(t) if isinstance(t, torch.Tensor) else {} for t in parts]
        tags = {}
        for source in {s for tags_ in live for s in tags_}:
            idx = [tags_[source][0] if source in tags_ else torch.full(t.shape, -1, dtype=torch.long)
                   for t, tags_ in zip(parts, live)]
            tags[source] = (func(idx, *args[1:], **kwargs), max(t[source][1] for t in live if source in t))
        if isinstance(out, torch.Tensor):
            self.tags[out] = tags

    def _matmul(self, name, args, out) -> None:
        import torch

        if not isinstance(out, torch.Tensor) or len(args) < 2 or not isinstance(args[1], torch.Tensor):
            return
        weight = args[1]
        out_dim = 0 if name == "linear" else weight.ndim - 1   # linear: y = x W^T, the output is W's dim 0
        tags = {}
        for source, (idx, _) in self._live(weight).items():
            line = idx.movedim(out_dim, -1).reshape(-1, idx.shape[out_dim])
            if (line[:1] == line).all() and (line[0] >= 0).all():   # the index varies along the output dim only
                shape = [1] * out.ndim
                shape[-1] = out.shape[-1]
                tags[source] = (line[0].view(shape).expand(out.shape), 0)
            elif source in self.total and source not in self.found:
                self.dead.add(source)
        if tags:
            self.tags[out] = tags

    # -- the verdict ---------------------------------------------------------------------------------------------------
    def _period(self, keep, support, n: int) -> int:
        """Smallest `p` dividing `n` such that, where both `x` and `x + p` are features of the input, a piece keeps
        `x` exactly when it keeps `x + p`; `n` when none."""
        for p in range(1, n):
            if n % p:
                continue
            both = support[:-p] & support[p:]
            if bool((keep[:-p][both] == keep[p:][both]).all()):
                return p
        return n

    @staticmethod
    def _values(idx):
        """The distinct feature indices in `idx`, without sorting the copies a broadcast made."""
        for d in range(idx.ndim):
            if idx.shape[d] > 1 and (idx.stride(d) == 0 or bool((idx == idx.narrow(d, 0, 1)).all())):
                idx = idx.narrow(d, 0, 1)
        flat = idx.reshape(-1)
        return flat[flat >= 0].unique()

    def _check_cut(self, name, source, idx, pieces) -> None:
        import torch

        if source in self.found:
            return
        n = self.total[source]
        support = torch.zeros(n, dtype=torch.bool)
        values = self._values(idx)
        support[values] = True
        for piece in pieces:
            kept = self._values(piece)
            if kept.numel() == values.numel():
                continue
            keep = torch.zeros(n, dtype=torch.bool)
            keep[kept] = True
            period = self._period(keep, support, n)
            if period <= self.max_head and period < n:
                return   # a cut inside each head (rotary halves): not parts
            widths = [int(p[p >= 0].unique().numel()) for p in pieces]
            op = "slice" if name == "__getitem__" else name
            where = ("blocks of the whole output" if period >= n else
                     f"per-head rows of {period} features, wider than any head ({self.max_head}): several "
                     "projections packed per head")
            self.found[source] = f"{op} into parts of {widths} features out of {int(values.numel())}, {where}"
            return


def _trace(small: SmallModel, tp_plan_styles=SPLIT_OUTPUT_STYLES) -> tuple[dict[str, SplitOutput], list[str]]:
    """Run one traced forward of `small.reference` and return `{generic source name: SplitOutput}` for the split
    outputs the forward cuts into parts, and the generic names of every split output it followed."""
    import torch
    from torch.overrides import TorchFunctionMode

    model = small.reference
    tracer = _Tracer(small.head_widths)
    sources: dict[str, tuple[str, str]] = {}
    handles = []
    params = dict(model.named_parameters())
    for pname, p in params.items():
        rule, style = rule_for(small.plan, pname, is_param=True)
        if generic_name(pname) != rule or p.ndim < 2:
            continue
        # a parameter with its own rule (experts): follow the dimension its style shards, and see whether it
        # becomes the output of a matmul (`[E, out, in]` colwise, `[E, in, out]` rowwise) or is contracted away
        dim = p.ndim - 2 if style in tp_plan_styles else p.ndim - 1 if style in ROW_STYLES else None
        if dim is not None:
            g = generic_name(pname)
            sources[g] = (rule, style)
            tracer.track(p, g, dim)
    for mname, mod in model.named_modules():
        rule, style = rule_for(small.plan, mname, is_param=False)
        if style not in tp_plan_styles or not hasattr(mod, "weight") or getattr(mod.weight, "ndim", 0) != 2:
            continue
        g = generic_name(mname)
        sources[g] = (rule, style)

        def hook(module, inputs, output, g=g):
            t = next(_tensors(output if isinstance(output, (tuple, list)) else (output,)), None)
            if t is not None:
                tracer.track(t, g, t.ndim - 1)

        handles.append(mod.register_forward_hook(hook))

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            try:
                tracer.propagate(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - following a tensor must never change the forward
                pass
            return out

    try:
        with torch.no_grad(), Mode():
            model(input_ids=small.input_ids)
    finally:
        for h in handles:
            h.remove()
    found = {g: SplitOutput(module=g, rule=sources[g][0], style=sources[g][1], action=tracer.found[g])
             for g in sorted(sources) if g in tracer.found}
    small.found, small.traced = found, True
    return found, sorted(sources)


def small_model(config, model_class, tp_plan: dict | None, tp_size: int, *, seed: int = 0,
                checkpoint_keys=None) -> SmallModel:
    """`build_small_model` with the kernels a tensor-parallel run loads with (`KERNELS`), for `split_outputs` and
    then `run_parity` (at `ep_size` 1) to share one build: the caller calls `cleanup()`.

    Raises:
        UsageError: `model_class` is not a transformers model class, or `tp_size < 1`.
        ConfigError: the small model cannot be built from this config (no evidence either way).
    """
    if tp_size < 1:
        raise UsageError(f"tp_size {tp_size} is invalid: the parity check needs tp_size >= 1. Pass --tp 2 or more")
    cls = _resolve_class(model_class)
    with one_thread():
        try:
            return build_small_model(config, cls, tp_plan, tp_size, seed=seed, checkpoint_keys=checkpoint_keys)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - reported as what it is: no small model, no evidence
            raise ConfigError(f"the parity check cannot build a small {cls.__name__} from this config: "
                              f"{_short(f'{type(e).__name__}: {e}', 160)}. Skip it with --no-parity") from None


def split_outputs(config, model_class, tp_plan: dict | None, tp_size: int, *, seed: int = 0,
                  checkpoint_keys=None, small: SmallModel | None = None) -> list[SplitOutput]:
    """The modules (or parameters) `tp_plan` splits on their output whose output the model's forward then cuts into
    parts: the projections a static check cannot judge and the parity check should.

    Found from evidence, not names: one forward of the small unsharded model (see `build_small_model`) is traced
    (see `_Tracer`): `q_proj: colwise` viewed into heads is not a cut; GPT-NeoX's `query_key_value` viewed per head
    and chunked into q, k, v is; phi3's `qkv_proj` sliced into `[Q | K | V]` is; `packed_colwise` experts'
    `gate_up_proj` chunked into gate and up is. Gathered styles (`colwise_gather_output`) hand every rank the whole
    output and are not suspects. Costs one build and one forward of the small model (about a second).

    Args:
        config (`PretrainedConfig`): the real config.
        model_class (`type | str`): the class the real model uses.
        tp_plan (`dict[str, str]`, *optional*): `base_model_tp_plan` under review; `None` = what the config ships.
        tp_size (`int`): the tp_size under review (the small model keeps its divisibility).
        seed (`int`): seed of the small model's weights and input.
        checkpoint_keys (`Iterable[str]`, *optional*): the real checkpoint's tensor names (see `build_small_model`).
        small (`SmallModel`, *optional*): one `small_model` built from the same arguments, traced instead of a new
            build (and left for the caller to clean up, so that `run_parity` can reuse it).

    Returns:
        `list[SplitOutput]`, sorted by name; empty when the forward cuts no split output into parts.

    Raises:
        UsageError: `model_class` is not a transformers model class, or `tp_size < 1`.
        ConfigError: the small model cannot be built or run from this config (no evidence either way).
    """
    own = small is None
    with one_thread():
        if own:
            small = small_model(config, model_class, tp_plan, tp_size, seed=seed, checkpoint_keys=checkpoint_keys)
        try:
            found, _ = _trace(small)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"the parity check cannot run a small {small.model_class.__name__}: "
                              f"{_short(f'{type(e).__name__}: {e}', 160)}. Skip it with --no-parity") from None
        finally:
            if own:
                small.cleanup()
    return list(found.values())


# ----------------------------------------------------------------------------------------------------------------------
# The sharded run
# ----------------------------------------------------------------------------------------------------------------------
def _first_tensor(x):
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        return x.to_local()
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _first_tensor(y)
            if t is not None:
                return t
    return None


class _Recorder:
    """Forward hooks on every module: each call's first input and first output tensor (by module name and call
    index), the order calls end in, the module running when an exception leaves, and (for a rank) the sharded
    parameters each op touched."""

    def __init__(self, model):
        self.outputs: dict[tuple[str, int], Any] = {}
        self.inputs: dict[tuple[str, int], Any] = {}
        self.exits: list[tuple[int, tuple[str, int]]] = []
        self.enters: dict[tuple[str, int], int] = {}
        self.param_uses: list[tuple[int, str]] = []
        self.stack: list[tuple[str, int]] = []
        self.counts: dict[str, int] = {}
        self.seq = 0
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post(name), with_kwargs=True))

    def _pre(self, name):
        def hook(module, args, kwargs):
            idx = self.counts.get(name, 0)
            self.counts[name] = idx + 1
            self.stack.append((name, idx))
            self.enters[(name, idx)] = self.seq
            t = _first_tensor(list(args) + list(kwargs.values()))
            if t is not None:
                self.inputs[(name, idx)] = t.detach().clone()
            self.seq += 1
        return hook

    def _post(self, name):
        def hook(module, args, kwargs, output):
            key = self.stack.pop() if self.stack and self.stack[-1][0] == name else (name, self.counts[name] - 1)
            t = _first_tensor(output)
            if t is not None:
                self.outputs[key] = t.detach().clone()
            self.exits.append((self.seq, key))
            self.seq += 1
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _param_ranges(model) -> list[tuple[int, int, str]]:
    """`(start, end, concrete name)` of the local storage of every parameter a rule shards on this rank."""
    from torch.distributed.tensor import DTensor, Replicate

    out = []
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) and any(not isinstance(pl, Replicate) for pl in p.placements):
            local = p.to_local()
            if local.numel():
                start = local.data_ptr()
                out.append((start, start + local.numel() * local.element_size(), name))
    return sorted(out)


def _use_tracker(recorder: _Recorder, ranges):
    """A `TorchFunctionMode` that logs, in the recorder's sequence, the sharded parameters each op reads."""
    import bisect

    import torch
    from torch.distributed.tensor import DTensor
    from torch.overrides import TorchFunctionMode

    starts = [r[0] for r in ranges]

    class Tracker(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for t in _tensors(list(args) + list(kwargs.values())):
                try:
                    local = t.to_local() if isinstance(t, DTensor) else t
                    ptr = local.data_ptr()
                except Exception:  # noqa: BLE001 - tensors without storage
                    continue
                i = bisect.bisect_right(starts, ptr) - 1
                if i >= 0 and ptr < ranges[i][1]:
                    name = ranges[i][2]
                    if not recorder.param_uses or recorder.param_uses[-1][1] != name:
                        recorder.param_uses.append((recorder.seq, name))
            recorder.seq += 1
            return func(*args, **kwargs)

    del torch
    return Tracker()


@dataclass
class _RankRun:
    rank: int
    recorder: _Recorder | None = None
    error: str | None = None
    phase: str | None = None        # "load" | "forward"
    woken: bool = False
    crash_site: tuple[str, int] | None = None
    done: bool = False


def _short(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).strip().split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _run_ranks(small: SmallModel, tp_size: int, ep_size: int, timeout: float) -> tuple[list[_RankRun], bool]:
    """Load `small` on `max(tp_size, ep_size)` threaded ranks and run its input through each. Returns every rank's
    run and whether the ranks finished within `timeout`."""
    import torch
    from transformers.distributed import DistributedConfig

    from .compat import backend

    quiet_libraries = backend().quiet
    from .compat import parity as compat

    world = max(tp_size, ep_size)
    runs = [_RankRun(rank=r) for r in range(world)]

    def main(run: _RankRun, store, lock) -> None:
        try:
            run.phase = "load"
            compat.init_rank(run.rank, world, store)
            try:
                model = small.model_class.from_pretrained(
                    small.path, config=small.config, dtype=torch.float32, **small.kernels,
                    distributed_config=DistributedConfig(tp_size=tp_size, ep_size=ep_size)).eval()
            finally:
                lock.release()
            run.phase = "forward"
            run.recorder = _Recorder(model)
            tracker = _use_tracker(run.recorder, _param_ranges(model))
            with torch.no_grad(), tracker:
                model(input_ids=small.input_ids)
            run.recorder.remove()
            run.done = True
        except SystemExit as e:
            if str(e) == compat.TERMINATED:
                run.woken = True
            else:
                run.error = _short(f"SystemExit: {e}")
                compat.wake_ranks(e)
        except BaseException as e:  # noqa: BLE001 - a rank's failure is the evidence
            run.error = _short(f"{type(e).__name__}: {e}")
            if run.recorder is not None and run.recorder.stack:
                run.crash_site = run.recorder.stack[-1]
            compat.wake_ranks(e)
        finally:
            compat.leave_rank()

    finished = True
    with quiet_libraries(), compat.threaded_world() as store, compat.serialized_loading(small.model_class) as lock:
        threads = [threading.Thread(target=main, args=(run, store, lock), daemon=True,
                                    name=f"tpaudit-rank{run.rank}") for run in runs]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            finished = False
            compat.wake_ranks(TimeoutError(f"parity ranks did not finish within {timeout:g} s"))
            for t in threads:
                t.join(5.0)
    return runs, finished


def _compare(ref, loc, rank: int, world: int) -> tuple[bool, float | None, float]:
    """`(comparable, max abs error, tolerance)` of one rank's tensor against the unsharded one: directly when the
    shapes are equal, as the rank's `torch.chunk` slice (or its slice of each half, for a packed output) when one
    dimension is sharded."""
    import torch

    if ref is None or loc is None or ref.ndim != loc.ndim:
        return False, None, 0.0
    if not ref.is_floating_point() or not loc.is_floating_point():
        if ref.shape == loc.shape:
            return True, 0.0 if torch.equal(ref, loc) else math.inf, 0.0
        return False, None, 0.0
    tol = RTOL * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0)
    if ref.shape == loc.shape:
        return True, _err(ref, loc), tol
    diff = [d for d in range(ref.ndim) if ref.shape[d] != loc.shape[d]]
    if len(diff) != 1:
        return False, None, tol
    d = diff[0]
    n, size = ref.shape[d], loc.shape[d]
    errs = []
    chunk = -(-n // world)
    start = rank * chunk
    if size == max(0, min(chunk, n - start)) and size:
        errs.append(_err(ref.narrow(d, start, size), loc))
    if n % 2 == 0 and size % 2 == 0 and size:
        half, piece = n // 2, size // 2
        chunk = -(-half // world)
        start = rank * chunk
        if piece == max(0, min(chunk, half - start)):
            expected = torch.cat([ref.narrow(d, start, piece), ref.narrow(d, half + start, piece)], dim=d)
            errs.append(_err(expected, loc))
    if not errs:
        return False, None, tol
    return True, min(errs), tol


def _err(a, b) -> float:
    diff = (a.float() - b.float()).abs()
    if diff.numel() == 0:
        return 0.0
    value = float(diff.max())
    return math.inf if math.isnan(value) else value


def _layer_index(name: str) -> int | None:
    """The first layer index in a concrete module name (`model.layers.1.self_attn` -> 1)."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return None


def _rule(small: SmallModel, name: str, is_param: bool, ep_size: int) -> tuple[str | None, str | None]:
    """The rule that applies at load: the EP plan's first when `ep_size > 1` (EP rules replace TP rules on the same
    modules), else the TP plan's."""
    if ep_size > 1:
        rule, style = rule_for(small.ep_plan, name, is_param)
        if rule is not None:
            return rule, style
    return rule_for(small.plan, name, is_param)


def _analyse(small: SmallModel, ref: _Recorder, runs: list[_RankRun], world: int,
             found: dict[str, SplitOutput], ep_size: int = 1) -> dict[str, Any]:
    """Compare every rank with the unsharded run and attribute the first divergence (see the module docstring)."""
    compared: set[tuple[str, int]] = set()
    max_err: float | None = None
    observations = []
    ep_scopes = [name for name, _ in small.reference.named_modules()
                 if ep_size > 1 and name and rule_for(small.ep_plan, name, is_param=False)[0] is not None]
    for run in runs:
        rec = run.recorder
        if rec is None:
            continue
        first = None
        for seq, key in rec.exits:
            if run.done and rec.counts.get(key[0]) != ref.counts.get(key[0]):
                continue   # called another number of times (an expert loop over this rank's experts): no pairing
            if any(key[0].startswith(scope + ".") for scope in ep_scopes):
                continue   # inside an expert-parallel module each rank computes other tokens: only its output pairs
            ok, err, tol = _compare(ref.outputs.get(key), rec.outputs.get(key), run.rank, world)
            if not ok:
                continue
            compared.add(key)
            max_err = err if max_err is None else max(max_err, err)
            diverged = err > tol
            if diverged and first is None:
                first = (seq, key, err)
        if first is not None:
            observations.append((first[0], run.rank, first[1], first[2], None))
        elif run.error and run.phase == "forward":
            observations.append((rec.seq, run.rank, run.crash_site, None, run.error))
    load_errors = [run for run in runs if run.error and run.phase == "load"]
    out: dict[str, Any] = {"modules_compared": len(compared), "max_abs_error": max_err}
    if not observations:
        if load_errors:
            run = load_errors[0]
            out.update(error=f"rank {run.rank}: {run.error}", rank=run.rank, observed_at="from_pretrained",
                       passed=False)
        else:
            out["passed"] = all(run.done for run in runs)
        return out
    seq, rank, site, err, error = min(observations, key=lambda o: (o[0], o[1]))
    run = runs[rank]
    rec = run.recorder
    out.update(passed=False, rank=rank)
    if error:
        out["error"] = f"rank {rank}: {error}"
    if site is None:
        out["observed_at"] = "the forward (outside any module)"
        return out
    name = site[0]
    out["observed_at"] = generic_name(name) or type(small.reference).__name__
    found_layer = _layer_index(name)
    if found_layer is not None and found_layer < len(small.layers):
        out["observed_layer"] = small.layers[found_layer]
    culprit = _attribute(small, ref, rec, rank, world, site, seq, crashed=bool(error), ep_size=ep_size)
    out.update(culprit)
    out["fused"] = bool(culprit.get("first_divergent_module") in found)
    return out


def _attribute(small: SmallModel, ref: _Recorder, rec: _Recorder, rank: int, world: int, site, seq: int,
               crashed: bool, ep_size: int = 1) -> dict:
    """The split to blame for a divergence seen at module call `site` (sequence `seq` of this rank)."""
    name = site[0]
    rule, style = _rule(small, name, False, ep_size)
    ok, err, tol = _compare(ref.inputs.get(site), rec.inputs.get(site), rank, world)
    input_ok = ok and err is not None and err <= tol
    input_split = input_ok and ref.inputs.get(site) is not None and rec.inputs.get(site) is not None and \
        tuple(ref.inputs[site].shape) != tuple(rec.inputs[site].shape)
    if input_ok and style in OWN_SPLIT_STYLES:
        return {"first_divergent_module": generic_name(name), "rule": rule, "style": style,
                "input_split": input_split}
    if input_split and style is None:
        return {"first_divergent_module": generic_name(name), "rule": None, "style": None, "input_split": True}

    def suspect(param: str) -> bool:
        # a weight whose split reaches the model split: a parameter with its own rule (experts), or the weight of a
        # module whose output stays split (colwise, packed_colwise); a gathered or reduced output is whole again
        prule, pstyle = _rule(small, param, True, ep_size)
        return prule == generic_name(param) or pstyle in SPLIT_OUTPUT_STYLES

    inside = [p for s, p in rec.param_uses if rec.enters.get(site, seq) <= s <= seq and suspect(p)]
    if inside:
        used = inside
    else:
        # since the last whole output that matched, of a module shallower than the site (a sibling's clean output
        # does not clear a split output the site is still to consume)
        depth = name.count(".")
        clean = 0
        for s, key in rec.exits:
            if s >= seq:
                break
            if key[0].count(".") >= depth or not key[0]:
                continue
            r, o = ref.outputs.get(key), rec.outputs.get(key)
            if r is not None and o is not None and tuple(r.shape) == tuple(o.shape):
                ok, e, t = _compare(r, o, rank, world)
                if ok and e is not None and e <= t:
                    clean = s
        used = [p for s, p in rec.param_uses if clean < s <= seq and suspect(p)]
    if not used:
        return {"first_divergent_module": generic_name(name), "rule": rule, "style": style}
    pick = None
    if not crashed:   # wrong numbers: a fused or packed projection first, its split is the one the forward cuts
        for p in reversed(used):
            g = generic_name(p)
            if g in small.found or g.rsplit(".", 1)[0] in small.found:
                pick = p
                break
    pick = pick or used[-1]   # a crash: the last split weight the rank used before it
    prule, pstyle = _rule(small, pick, True, ep_size)
    g = generic_name(pick)
    module = g if prule == g else g.rsplit(".", 1)[0]
    return {"first_divergent_module": module, "rule": prule, "style": pstyle}


def _isolate() -> str | None:
    """Why the ranks cannot run as threads of this process (`None` when they can): a process group already
    initialised here (under torchrun, or inside `strict_tp`), or an accelerator transformers would place the ranks
    on."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "this process already belongs to a process group"
    if getattr(torch, "accelerator", None) is not None and torch.accelerator.is_available():
        return "an accelerator is visible (the check runs on the CPU)"
    return None


def run_parity(config, model_class, tp_plan: dict | None, tp_size: int, ep_size: int = 1, *, seed: int = 0,
               timeout: float = 120, checkpoint_keys=None, isolate: bool | None = None,
               small: SmallModel | None = None) -> ParityResult:
    """Load a small model of `config`'s architecture on `tp_size` real ranks with the plan under review, run the same
    tokens through it and through the unsharded model, and compare (see the module docstring).

    The ranks are threads of this process on torch's multi-threaded process group; when this process already belongs
    to a process group, or an accelerator is visible, the same check runs in a subprocess on the CPU instead
    (`python -m tpaudit._parity_worker`, one more import).

    Args:
        config (`PretrainedConfig`): the model's real config (a composite model is checked through its text decoder,
            where its plan lives; the result's `scope` says so).
        model_class (`type | str`): the class the real model uses, or its name in `transformers`.
        tp_plan (`dict[str, str]`, *optional*): the `base_model_tp_plan` under review, keys relative to the base
            model (`layers.*.self_attn.q_proj`); `None` = what the config ships. The class-level `_tp_plan`
            (`lm_head`) and the `embed_tokens` rule transformers adds stay as transformers merges them.
        tp_size (`int`): ranks to split over (>= 2 to split anything).
        ep_size (`int`, *optional*, defaults to 1): the `DistributedConfig` `ep_size`.
        seed (`int`, *optional*, defaults to 0): seed of the small model's weights and input.
        timeout (`float`, *optional*, defaults to 120): seconds before hung ranks are woken and reported.
        checkpoint_keys (`Iterable[str]`, *optional*): the real checkpoint's tensor names, so that the small model is
            stored the same way (see `build_small_model`: a plain `colwise` on fused experts is right for a
            checkpoint of per-expert tensors and wrong for one that stores them fused).
        isolate (`bool`, *optional*): `True` runs the ranks in a subprocess (a hard timeout, nothing of this
            process touched); `None` does so only when needed (see above).
        small (`SmallModel`, *optional*): the `small_model` that `split_outputs` traced for the same arguments, used
            instead of a second build when the run loads with its kernels (`ep_size` 1) in this process; the caller
            cleans it up.

    Returns:
        `ParityResult`. A plan that crashes or diverges is a result (`passed=False`), never an exception.

    Raises:
        UsageError: `tp_size` or `ep_size` < 1, sizes `DistributedConfig` rejects (`ep_size` not a multiple of
            `tp_size`), or `model_class` is not a transformers model class.
    """
    if tp_size < 1 or ep_size < 1:
        raise UsageError(f"tp_size {tp_size} / ep_size {ep_size} is invalid: the parity check needs sizes >= 1. "
                         "Pass --tp 2 or more")
    _resolve_class(model_class)
    from transformers.distributed import DistributedConfig

    try:
        DistributedConfig(tp_size=tp_size, ep_size=ep_size)
    except ValueError as e:
        raise UsageError(f"tp_size {tp_size}, ep_size {ep_size} is rejected by transformers: {e} Pass ep_size 1 or "
                         f"one DistributedConfig accepts with tp_size {tp_size}") from None
    start = time.perf_counter()
    if tp_size == 1 and ep_size == 1:
        return ParityResult(ran=False, reason="tp_size 1 and ep_size 1 split nothing: no sharded forward to compare",
                            tp_size=tp_size, ep_size=ep_size)
    why = "asked for" if isolate else _isolate() if isolate is None else None
    if why is not None:
        from ._parity_worker import run_in_subprocess

        result = run_in_subprocess(config, model_class, tp_plan, tp_size, ep_size, seed=seed, timeout=timeout,
                                   checkpoint_keys=checkpoint_keys)
        return _replace(result, reason=f"{result.reason} (ran in a subprocess: {why})",
                        seconds=time.perf_counter() - start)
    kernels = EP_KERNELS if ep_size > 1 else KERNELS
    with one_thread():
        return _run_parity_here(config, model_class, tp_plan, tp_size, ep_size, seed, timeout, start,
                                checkpoint_keys, small if small is not None and small.kernels == kernels else None)


def _replace(result: ParityResult, **changes) -> ParityResult:
    import dataclasses

    return dataclasses.replace(result, **changes)


def _run_parity_here(config, model_class, tp_plan, tp_size, ep_size, seed, timeout, start,
                     checkpoint_keys=None, given: SmallModel | None = None) -> ParityResult:
    import torch

    base = {"tp_size": tp_size, "ep_size": ep_size}
    small = given
    if small is None:
        try:
            small = build_small_model(config, model_class, tp_plan, tp_size, seed=seed,
                                      checkpoint_keys=checkpoint_keys, kernels=EP_KERNELS if ep_size > 1 else KERNELS)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - our limit, not the plan's: say so and do not judge
            return ParityResult(ran=False, reason=f"the small model could not be built here: "
                                f"{_short(f'{type(e).__name__}: {e}')}", seconds=time.perf_counter() - start, **base)
    own = given is None
    if not small.plan and not (ep_size > 1 and small.ep_plan):
        if own:
            small.cleanup()
        return ParityResult(ran=False, reason=f"the plan shards nothing in {small.model_class.__name__} (no TP rule "
                            "applies): there is no sharded forward to compare", seconds=time.perf_counter() - start,
                            shrunk=small.shrunk, layers=small.layers, model_class=small.model_class.__name__,
                            scope=small.scope, **base)
    try:
        try:
            found = small.found if small.traced else _trace(small)[0]
            ref = _Recorder(small.reference)
            try:
                with torch.no_grad():
                    small.reference(input_ids=small.input_ids)
            finally:
                ref.remove()
        except Exception as e:  # noqa: BLE001 - the unsharded small model itself does not run: nothing to compare
            return ParityResult(ran=False, reason=f"the small unsharded {small.model_class.__name__} does not run "
                                f"here: {_short(f'{type(e).__name__}: {e}')}", seconds=time.perf_counter() - start,
                                shrunk=small.shrunk, layers=small.layers, model_class=small.model_class.__name__,
                                scope=small.scope, **base)
        runs, finished = _run_ranks(small, tp_size, ep_size, timeout)
        world = max(tp_size, ep_size)
        facts = _analyse(small, ref, runs, world, found, ep_size)
        if not finished:
            hung = [run.rank for run in runs if not (run.done or run.error or run.woken)]
            facts.setdefault("error", f"rank {hung[0] if hung else 0}: did not finish within {timeout:g} s (hung)")
            facts["passed"] = False
        reasons = [f"ran the plan on {world} threaded ranks (tp_size {tp_size}, ep_size {ep_size}) with a small "
                   f"{small.model_class.__name__} (layers {list(small.layers)} of the real model, one per kind)"]
        reasons += small.notes
        if found:
            reasons.append("the forward cuts into parts the output of " + ", ".join(sorted(found)))
        return ParityResult(
            ran=True, reason="; ".join(reasons), seconds=time.perf_counter() - start,
            modules_compared=facts.get("modules_compared", 0), max_abs_error=facts.get("max_abs_error"),
            first_divergent_module=facts.get("first_divergent_module"), rule=facts.get("rule"),
            style=facts.get("style"), observed_at=facts.get("observed_at"), error=facts.get("error"),
            passed=facts.get("passed"), fused=facts.get("fused", False),
            split=tuple(found[k] for k in sorted(found)), shrunk=small.shrunk, layers=small.layers,
            model_class=small.model_class.__name__, scope=small.scope, rank=facts.get("rank"),
            input_split=facts.get("input_split"), observed_layer=facts.get("observed_layer"), **base)
    finally:
        if own:
            small.cleanup()


# ----------------------------------------------------------------------------------------------------------------------
# Findings
# ----------------------------------------------------------------------------------------------------------------------
def _relative(key: str | None, text_prefix: str) -> str | None:
    if key and text_prefix and key.startswith(text_prefix + "."):
        return key[len(text_prefix) + 1:]
    return key


def _packed_fix(split: SplitOutput | None, key: str) -> str:
    """What to write instead, from what the forward does to the output."""
    if split is not None and "per-head rows" in split.action:
        return (f"Split whole heads only: keep `{key}` on a tp_size that divides its heads, or use "
                f"`{key}: colwise_gather_output`")
    if split is not None and "parts of [" in split.action:
        widths = split.action.split("parts of [", 1)[1].split("]", 1)[0].split(", ")
        if len(widths) == 2 and widths[0] == widths[1]:
            return f"Use `{key}: packed_colwise` (two equal halves, each split across ranks)"
    return f"Use `{key}: colwise_gather_output` (every rank keeps the whole output) and split the next module's input"


def parity_findings(result: ParityResult, *, text_prefix: str = "") -> list[Finding]:
    """The findings a parity result is evidence for.

    A passed (or skipped) result gives none: a valid split of a suspected projection is cleared, and the caller drops
    its static suspicion (`result.split` lists the projections the forward cuts into parts; `result.passed` says they
    survived the split). A failed one gives one error:

    - `TPA501` `packed_layout` when the split blamed is one whose output the forward cuts into parts (`result.fused`):
      a fused or packed projection split as if it were one matrix;
    - `TPA502` `style_mismatch` otherwise: a style that does not fit how the model uses the module (a colwise-colwise
      chain with no reduction, a rowwise module fed a whole input, a module left without a rule between split ones,
      a projection split through a head), or a plan transformers cannot load.

    Both carry `facts = {"evidence": "parity", "module", "rule", "style", "max_abs_error" | "exception",
    "observed_at", "tp_size", "ep_size", "rank"}` (`module`, `rule`: generic names with the base model's prefix).

    Args:
        result (`ParityResult`): from `run_parity`.
        text_prefix (`str`, *optional*): the base model's module path (`model`, `model.language_model`); fixes then
            name plan keys relative to it, as a `--plan` file writes them.

    Returns:
        `list[Finding]` (zero or one).
    """
    if not result.ran or result.passed is not False:
        return []
    module = result.first_divergent_module
    facts: dict[str, Any] = {"evidence": "parity", "module": module, "rule": result.rule, "style": result.style,
                             "observed_at": result.observed_at, "tp_size": result.tp_size,
                             "ep_size": result.ep_size, "rank": result.rank}
    if result.error:
        facts["exception"] = result.error
        how = f"a rank raised {result.error.split(': ', 1)[-1]}"
    else:
        facts["max_abs_error"] = result.max_abs_error
        how = (f"outputs differ from the unsharded model by up to {result.max_abs_error:.3g} (tolerance "
               f"{result.tolerance:g} of their scale)")
    where = f"at `{result.observed_at}`" if result.observed_at else "while loading"
    small = f"a small {result.model_class or 'model'} on {max(result.tp_size, result.ep_size)} ranks"
    key = _relative(result.rule or module, text_prefix) or "the rule"
    if module is None:
        return [Finding(
            code="TPA502", kind="style_mismatch", severity="error", target=result.model_class or "tp_plan",
            message=f"the sharded forward of {small} fails {where}: {how}",
            fix="Make the plan loadable: every style must fit the module it names", facts=facts)]
    if result.fused:
        split = next((s for s in result.split if s.module == module), None)
        cut = f" the forward cuts its output into parts ({split.action})" if split else ""
        return [Finding(
            code="TPA501", kind="packed_layout", severity="error", target=result.rule or module,
            message=(f"`{module}` is split by `{key}: {result.style}` as one matrix, but"
                     f"{cut or ' its output holds parts'}: the sharded forward of {small} diverges {where} ({how})"),
            fix=_packed_fix(split, key), facts=facts)]
    if result.rule is None and result.input_split:
        message = (f"`{module}` receives a split input but no rule splits it (no reduction): the sharded forward of "
                   f"{small} diverges {where} ({how})")
        fix = f"Add `{_relative(module, text_prefix)}: rowwise` so that it reduces the split input"
    elif result.rule is None:
        message = (f"the sharded forward of {small} diverges {where} ({how}), in `{module}`, which no rule splits "
                   "and which used no split weight: a parameter it reads per head or per feature is not split "
                   "with the rest")
        fix = "Give the module's own parameters (attention sinks, per-head scales) the rule its inputs need"
    else:
        message = (f"`{key}: {result.style}` does not fit how the model uses `{module}`: the sharded forward of "
                   f"{small} diverges {where} ({how})")
        if result.input_split is True:
            fix = f"Use `{key}: rowwise`: its input arrives split by the colwise projections before it"
        elif result.input_split is False and result.style and result.style.startswith("rowwise"):
            fix = f"Use `{key}: colwise` (its input arrives whole), or `rowwise_split_input` to split it first"
        else:
            fix = ("Pair the styles: a colwise projection feeds a rowwise one that reduces it; a module fed a whole "
                   "input is colwise (or rowwise_split_input); split heads only where tp_size divides them")
    return [Finding(code="TPA502", kind="style_mismatch", severity="error", target=result.rule or module,
                    message=message, fix=fix, facts=facts)]
