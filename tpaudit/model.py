"""The data model: what flows from one stage to the next.

    ModelSource -> BuiltModel (+ facts) -> ResolvedPlan -> ShardMap -> list[Finding] -> Report -> renderer

Frozen dataclasses only; nothing here imports torch or transformers. Sizes are `int` bytes named `*_bytes`, counts
`*_count`, shapes `tuple[int, ...]`. Parameter names are runtime names (after the loader's renaming and merging); a
"generic" name has its layer/expert indices replaced by `*` as transformers'
`parallel_utils.replace_layer_number_by_wildcard` does (`compat.logic.generic_name`). On-disk names are
`checkpoint_name`. Every report section is a typed dataclass with `to_json()`; `Report.to_json()` is the
`tpaudit/check/v1` contract.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property, partial
from operator import itemgetter, mul
from typing import Any, Literal, NamedTuple

from .compat._types import ModuleFacts, QuantizationInfo  # noqa: F401  (re-exported: part of the data model)
from .compat.logic import generic_name  # noqa: F401  (re-exported)
from .errors import UsageError

# Bits per element of each safetensors dtype tpaudit sizes (safetensors' `Dtype::bitsize`): `F4` packs two values
# per byte. The F6 formats are refused by the header reader (no transformers quantizer stores them).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "F4": 4, "U16": 16, "I16": 16, "F16": 16, "BF16": 16, "U32": 32, "I32": 32, "F32": 32, "U64": 64, "I64": 64,
    "F64": 64, "C64": 64,
}
SAFETENSORS_DTYPE_BYTES = SAFETENSORS_DTYPE_BITS  # the dtype names tpaudit knows (kept for readers of the table)


# ----------------------------------------------------------------------------------------------------------------------
# Source stage
# ----------------------------------------------------------------------------------------------------------------------
class CheckpointTensor(NamedTuple):
    """One tensor of a safetensors checkpoint, as its header describes it (no data). A named tuple: checkpoints hold
    hundreds of thousands of them, and a tuple is built several times faster than a frozen dataclass.

    Attributes:
        name (`str`): the on-disk name (`checkpoint_name`), e.g. `model.layers.0.block_sparse_moe.experts.3.w1.weight`.
        dtype (`str`): the safetensors dtype name, e.g. `"BF16"`, `"F8_E4M3"`, `"I32"`.
        shape (`tuple[int, ...]`): the stored shape.
        file (`str`, *optional*): the shard file holding it, `None` when the listing did not say.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data: `prod(shape) * bits / 8` (two `F4` values per byte). Raises `KeyError` for an
        unknown dtype name."""
        return math.prod(self.shape) * SAFETENSORS_DTYPE_BITS[self.dtype] // 8


def checkpoint_tensors(names, dtypes, shapes, files) -> tuple[CheckpointTensor, ...]:
    """`CheckpointTensor`s from four parallel sequences of equal length (names, safetensors dtype names, shapes as
    tuples of ints, shard files or `None`), built at C speed: `tuple.__new__` is what a named tuple's own constructor
    calls, minus the Python frame per tensor (a checkpoint has up to 208,550). Nothing is validated here: the readers
    check every row first."""
    return tuple(map(partial(tuple.__new__, CheckpointTensor), zip(names, dtypes, shapes, files)))


def total_bytes(tensors) -> int:
    """Bytes of `tensors` together: `sum(t.nbytes for t in tensors)`, summed per dtype with C-level `map`s (no Python
    frame per tensor); dtypes that pack several values per byte (`F4`) round per tensor, as `nbytes` does.

    Args:
        tensors (`Iterable[CheckpointTensor]`): any number, any mix of dtypes (`()` gives 0).

    Returns:
        `int`: bytes.

    Raises:
        KeyError: a dtype name that `SAFETENSORS_DTYPE_BITS` does not know (the readers refuse those first).
    """
    tensors = tensors if isinstance(tensors, (list, tuple)) else list(tensors)
    dtypes = list(map(itemgetter(1), tensors))
    bits = {d: SAFETENSORS_DTYPE_BITS[d] for d in set(dtypes)}
    if any(b % 8 for b in bits.values()):
        return sum(t.nbytes for t in tensors)
    numels = map(math.prod, map(itemgetter(2), tensors))
    if len(bits) == 1:
        return sum(numels) * next(iter(bits.values())) // 8
    size = {d: b // 8 for d, b in bits.items()}
    return sum(map(mul, numels, map(size.__getitem__, dtypes)))


SourceKind = Literal["local", "snapshot", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """What a source read: the model's `config.json` and, when there is one, its checkpoint's tensor table.

    Attributes:
        ref (`str`): what the user passed as MODEL.
        kind (`"local" | "snapshot" | "hub"`): which source read it.
        config (`dict`): the parsed `config.json`, unchanged.
        tensors (`tuple[CheckpointTensor, ...]`, *optional*): every checkpoint tensor, `None` for a config-only model
            (shapes then come from the meta model and bytes from the config's dtype).
        repo_id (`str`, *optional*): the Hub repo, when known (Hub source, or recorded in a snapshot).
        revision (`str`, *optional*): the revision asked for (branch, tag or commit).
        commit (`str`, *optional*): the resolved commit sha, when known.
        config_path (`str`, *optional*): the file a user edits to change the config (a local `config.json`, the
            snapshot file), used as the location of findings in SARIF.
        config_dir (`str`, *optional*): a local directory holding `config.json` (and remote code, if any).
        notes (`tuple[str, ...]`): facts about how the input was read that the report must repeat.
    """

    ref: str
    kind: SourceKind
    config: dict[str, Any]
    tensors: tuple[CheckpointTensor, ...] | None = None
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    config_path: str | None = None
    config_dir: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def config_only(self) -> bool:
        return self.tensors is None

    @cached_property
    def generic_tensor_names(self) -> frozenset[str] | None:
        """Every checkpoint tensor name with its layer and expert indices as `*` (`generic_name`), each once; `None`
        for a config-only model. Computed once per source (91,991 DeepSeek-V3 names give 43)."""
        if self.tensors is None:
            return None
        return frozenset(generic_name(t.name) for t in self.tensors)

    @cached_property
    def checkpoint_bytes(self) -> int | None:
        """Sum of every checkpoint tensor's bytes, `None` for a config-only model (computed once per source)."""
        if self.tensors is None:
            return None
        return total_bytes(self.tensors)

    @property
    def display_name(self) -> str:
        """`repo_id@commit[:12]` for Hub models, else the reference as given."""
        if self.repo_id:
            rev = self.commit[:12] if self.commit else self.revision
            return f"{self.repo_id}@{rev}" if rev else self.repo_id
        return self.ref


# ----------------------------------------------------------------------------------------------------------------------
# Sizes: validated once, then passed along
# ----------------------------------------------------------------------------------------------------------------------
MAX_WORLD_SIZE = 1024


@dataclass(frozen=True)
class ParallelSizes:
    """The parallel degrees of one simulation, validated once (`ParallelSizes.of`).

    Attributes:
        tp_size (`int`): tensor-parallel ranks sharing each layer.
        ep_size (`int`): expert-parallel ranks sharing the experts (1 or `tp_size` in transformers 5.23/5.24 without
            FSDP; transformers itself is the judge, at plan resolution).
    """

    tp_size: int
    ep_size: int = 1

    @classmethod
    def of(cls, tp_size, ep_size=1, *, names: tuple[str, str] = ("tp_size", "ep_size")) -> "ParallelSizes":
        """Validate and build.

        Args:
            tp_size, ep_size: the sizes as given.
            names (`tuple[str, str]`): how the caller calls them in messages: the API's `("tp_size", "ep_size")`, the
                CLI's `("--tp", "--ep")`.

        Raises:
            UsageError: a size that is not an `int` (`True`, `"2"`, `2.0` included), below 1, or more ranks than
                tpaudit simulates (`MAX_WORLD_SIZE`).
        """
        def given(name: str, value) -> str:
            return f"{name} {value}" if name.startswith("--") else f"{name}={value!r}"

        for name, field_name, value in ((names[0], "tp_size", tp_size), (names[1], "ep_size", ep_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{given(name, value)} is not a number of ranks: {field_name} must be a positive "
                                 "integer such as 2, 4 or 8")
            if value < 1:
                raise UsageError(f"{given(name, value)} is invalid: {field_name} must be a positive integer such as 2, "
                                 "4 or 8")
        if max(tp_size, ep_size) > MAX_WORLD_SIZE:
            raise UsageError(f"{given(names[0], tp_size)}, {given(names[1], ep_size)} is more ranks than tpaudit "
                             f"simulates (at most {MAX_WORLD_SIZE}): the fake process group builds a mesh of that many "
                             "ranks")
        return cls(tp_size, ep_size)

    @property
    def world_size(self) -> int:
        return max(self.tp_size, self.ep_size)

    @property
    def parallel(self) -> bool:
        """More than one rank: something may be sharded."""
        return self.world_size > 1


# ----------------------------------------------------------------------------------------------------------------------
# Simulation stage
# ----------------------------------------------------------------------------------------------------------------------
ParamOrigin = Literal["checkpoint", "model", "companion"]
Sharding = Literal["sharded", "replicated_by_rule", "unsharded"]


@dataclass(frozen=True)
class ParamShard:
    """One runtime parameter and what every rank holds of it.

    Attributes:
        name (`str`): concrete runtime name, `model.layers.3.self_attn.q_proj.weight`.
        generic_name (`str`): `model.layers.*.self_attn.q_proj.weight`.
        global_shape (`tuple[int, ...]`): the full shape, e.g. weight `(out_features, in_features)`.
        dtype (`str`): torch dtype name without the `torch.` prefix, e.g. `"bfloat16"`.
        itemsize (`int`): bytes per element.
        local_shapes (`tuple[tuple[int, ...], ...]`): the shape each rank holds, indexed by rank. Colwise on a
            `(out, in)` weight gives `(ceil(out / tp_size), in)` on the low ranks and less (maybe 0) on the last.
        style (`str`, *optional*): the transformers style applied to it (`colwise`, `grouped_gemm`, ...), `None`
            when no rule matches the parameter or its module.
        rule (`str`, *optional*): the (generic, prefixed) plan key that gave the style: the parameter's own name or
            its module's.
        plan (`"tp" | "ep"`, *optional*): which plan the rule came from.
        placement (`str`): the DTensor placement, e.g. `"Shard(dim=0)"`, `"_StridedShard(dim=1, sf=2)"`,
            `"Replicate()"`, or `"whole"` for a plain tensor.
        sharding (`"sharded" | "replicated_by_rule" | "unsharded"`): `sharded` when a rank holds less than the
            whole; `replicated_by_rule` when a rule keeps it whole on purpose (rowwise bias, `replicate`,
            `replicated_with_grad_allreduce`); `unsharded` when nothing shards it (no rule, or a module rule whose
            style does not shard parameters).
        origin (`"checkpoint" | "model" | "companion"`): `checkpoint` when the checkpoint holds it under this
            (runtime) name, `model` when only the meta model has it (config-only input, or missing from the
            checkpoint), `companion` when the checkpoint holds a tensor the meta model lacks (quantization scales,
            packed weights) and tpaudit added it to its module.
        checkpoint_names (`tuple[str, ...]`): the on-disk tensors that load into it (several for merged experts).
        tied_to (`str`, *optional*): the parameter this one is tied to; a tied copy adds no bytes.
        module_type (`str`): class name of the owning module (`Linear`, `Embedding`, `Qwen3VLMoeTextExperts`, ...).
        shard_dim (`int`, *optional*): the (non-negative) dimension a `Shard`/`_StridedShard` placement splits.
        split_factor (`int`): 1 for `Shard`; the number of packed blocks (`sf`) for `_StridedShard`, whose every block
            is split across the ranks (`packed_colwise` on `gate_up_proj`: gate and up each split).
        floating (`bool`): a floating-point parameter (trainable; quantized integer data and metadata are not).
    """

    name: str
    generic_name: str
    global_shape: tuple[int, ...]
    dtype: str
    itemsize: int
    local_shapes: tuple[tuple[int, ...], ...]
    style: str | None
    rule: str | None
    plan: Literal["tp", "ep"] | None
    placement: str
    sharding: Sharding
    origin: ParamOrigin
    checkpoint_names: tuple[str, ...] = ()
    tied_to: str | None = None
    module_type: str = ""
    shard_dim: int | None = None
    split_factor: int = 1
    floating: bool = True

    @property
    def global_bytes(self) -> int:
        """Bytes of the whole parameter."""
        return math.prod(self.global_shape) * self.itemsize

    def rank_bytes(self, rank: int) -> int:
        """Bytes rank `rank` holds (0 for a tied copy, whose bytes the tied parameter carries)."""
        if self.tied_to is not None:
            return 0
        return math.prod(self.local_shapes[rank]) * self.itemsize

    def rank_elements(self, rank: int) -> int:
        """Elements rank `rank` holds (0 for a tied copy)."""
        if self.tied_to is not None:
            return 0
        return math.prod(self.local_shapes[rank])

    @property
    def ndim(self) -> int:
        return len(self.global_shape)

    @property
    def module_name(self) -> str:
        """`model.layers.3.self_attn.q_proj` for `model.layers.3.self_attn.q_proj.weight`."""
        return self.name.rpartition(".")[0]


@dataclass(frozen=True)
class ParamGroup:
    """Parameters sharing one generic name (layer and expert indices -> `*`): the unit checks and tables walk.

    Attributes:
        generic_name (`str`), count (`int`): the name and how many parameters share it.
        first (`ParamShard`): the first member (model order); every member has its style, placement and shape kind.
        total_bytes (`int`): all members, tied copies excluded.
        rank_bytes (`tuple[int, ...]`): bytes of all members each rank holds.
    """

    generic_name: str
    count: int
    first: ParamShard
    total_bytes: int
    rank_bytes: tuple[int, ...]

    # The first member's facts, for tables and checks.
    @property
    def global_shape(self) -> tuple[int, ...]:
        return self.first.global_shape

    @property
    def dtype(self) -> str:
        return self.first.dtype

    @property
    def style(self) -> str | None:
        return self.first.style

    @property
    def rule(self) -> str | None:
        return self.first.rule

    @property
    def placement(self) -> str:
        return self.first.placement

    @property
    def sharding(self) -> Sharding:
        return self.first.sharding

    @property
    def local_shape_rank0(self) -> tuple[int, ...]:
        return self.first.local_shapes[0]

    @property
    def local_shape_last(self) -> tuple[int, ...]:
        return self.first.local_shapes[-1]

    @property
    def module_type(self) -> str:
        return self.first.module_type

    @property
    def origin(self) -> ParamOrigin:
        return self.first.origin

    @property
    def tied_to(self) -> str | None:
        return self.first.tied_to

    @property
    def worst_rank_bytes(self) -> int:
        return max(self.rank_bytes) if self.rank_bytes else 0

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.generic_name, "count": self.count, "shape": list(self.global_shape), "dtype": self.dtype,
               "style": self.style, "rule": self.rule, "placement": self.placement, "sharding": self.sharding,
               "local_shape": list(self.local_shape_rank0), "local_shape_last_rank": list(self.local_shape_last),
               "bytes": self.total_bytes, "rank_bytes": list(self.rank_bytes), "origin": self.origin}
        if self.tied_to:
            out["tied_to"] = self.tied_to
        return out


@dataclass(frozen=True)
class ModuleFamily:
    """The parameters of one module block (`model.layers.*.mlp`), summed.

    Attributes:
        name (`str`), params (`int`): the block and how many generic parameter names it has.
        styles (`tuple[str, ...]`): the styles that split them (`-` for none).
        worst_rank_bytes (`int`), total_bytes (`int`), replicated_bytes (`int`): on the worst rank, whole, and whole on
            every rank because nothing shards them.
    """

    name: str
    params: int
    styles: tuple[str, ...]
    worst_rank_bytes: int
    total_bytes: int
    replicated_bytes: int


@dataclass(frozen=True)
class ShardMap:
    """Every parameter of the model and its shard on every rank, and the groupings every later stage reads.

    Attributes:
        tp_size (`int`), ep_size (`int`): the sizes simulated; `world_size = max(tp_size, ep_size)` (in transformers
            5.23/5.24 without FSDP, `ep_size` is 1 or `tp_size`, so the EP ranks are the TP ranks).
        params (`tuple[ParamShard, ...]`): in the model's `named_parameters()` order, tied copies included.
        rank_param_bytes (`tuple[int, ...]`): bytes of parameters resident on each rank (tied pairs once).
        total_param_bytes (`int`): bytes of the whole model (tied pairs once).
        groups (`tuple[ParamGroup, ...]`): parameters by generic name, in model order.
    """

    tp_size: int
    ep_size: int
    params: tuple[ParamShard, ...]
    rank_param_bytes: tuple[int, ...] = field(init=False)
    total_param_bytes: int = field(init=False)
    groups: tuple[ParamGroup, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        world = self.world_size
        buckets: OrderedDict[str, list[ParamShard]] = OrderedDict()
        for p in self.params:
            buckets.setdefault(p.generic_name, []).append(p)
        groups, ranks, total = [], [0] * world, 0
        for name, members in buckets.items():
            counted = [p for p in members if p.tied_to is None]
            group_total = sum(p.global_bytes for p in counted)
            per_rank = tuple(sum(p.rank_bytes(r) for p in counted) for r in range(world))
            total += group_total
            for r in range(world):
                ranks[r] += per_rank[r]
            groups.append(ParamGroup(name, len(members), members[0], group_total, per_rank))
        object.__setattr__(self, "rank_param_bytes", tuple(ranks))
        object.__setattr__(self, "total_param_bytes", total)
        object.__setattr__(self, "groups", tuple(groups))

    @property
    def world_size(self) -> int:
        return max(self.tp_size, self.ep_size)

    @property
    def worst_rank(self) -> int:
        """The rank holding the most bytes (the lowest such rank: `torch.chunk` gives low ranks the larger shards)."""
        return max(range(self.world_size), key=lambda r: (self.rank_param_bytes[r], -r))

    @property
    def worst_rank_param_bytes(self) -> int:
        return self.rank_param_bytes[self.worst_rank]

    def module_families(self) -> list["ModuleFamily"]:
        """Parameters by the module block they sit in (`model.layers.*.self_attn` for
        `model.layers.*.self_attn.q_proj.weight`), largest on the worst rank first: the terminal's collapsed table."""
        worst = self.worst_rank
        buckets: OrderedDict[str, list[ParamGroup]] = OrderedDict()
        for g in self.groups:
            parts = g.generic_name.split(".")
            buckets.setdefault(".".join(parts[:-2]) if len(parts) > 2 else parts[0], []).append(g)
        out = []
        for name, groups in buckets.items():
            counted = [g for g in groups if g.tied_to is None]
            out.append(ModuleFamily(
                name=name, params=len(groups), styles=tuple(sorted({g.style or "-" for g in groups})),
                worst_rank_bytes=sum(g.rank_bytes[worst] for g in counted),
                total_bytes=sum(g.total_bytes for g in counted),
                replicated_bytes=sum(g.total_bytes for g in counted if g.sharding == "unsharded")
                if self.world_size > 1 else 0))
        return sorted(out, key=lambda f: (-f.worst_rank_bytes, f.name))

    def members(self, group: ParamGroup) -> list[ParamShard]:
        """Every parameter of `group` (model order)."""
        return [p for p in self.params if p.generic_name == group.generic_name]

    def replicated_groups(self) -> list[ParamGroup]:
        """Groups every rank holds whole because nothing shards them (tied copies excluded). Empty at world size 1."""
        if self.world_size == 1:
            return []
        return [g for g in self.groups if g.sharding == "unsharded" and g.tied_to is None]


# ----------------------------------------------------------------------------------------------------------------------
# Findings
# ----------------------------------------------------------------------------------------------------------------------
Severity = Literal["error", "warning", "note"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "note": 2}


@dataclass(frozen=True)
class Location:
    """Where a finding points, worked out before rendering (SARIF reads it as is).

    Attributes:
        path (`str`, *optional*): the file a user edits (the `--plan` file, `config.json`, a snapshot), or a URL for
            a Hub config.
        line (`int`, *optional*): the line in that file that names the rule key or config attribute.
        logical (`str`): the parameter, rule key or config attribute the finding is about.
        uri (`str`, *optional*): `path` as a SARIF artifact URI (percent-encoded; relative to `uri_base` when set,
            else a `file:` or `https:` URI), worked out by `audit.artifact_uri`.
        uri_base (`str`, *optional*): `"%SRCROOT%"` when `uri` is relative to the root of the git repository that
            holds the file, `None` otherwise.
    """

    path: str | None
    line: int | None
    logical: str
    uri: str | None = None
    uri_base: str | None = None


@dataclass(frozen=True)
class Finding:
    """One problem a check found.

    Attributes:
        code (`str`): stable rule code, `TPA` + 3 digits (`TPA001`).
        kind (`str`): snake_case JSON name of the finding family (`replicated_weight`).
        severity (`"error" | "warning" | "note"`): `error` makes `check` exit 1.
        target (`str`): what it is about: a generic parameter name, a full rule key, or a config attribute
            (`text_config.num_key_value_heads`).
        message (`str`): what is wrong, with the numbers.
        fix (`str`): an imperative fix title ("Add rule `layers.*.mlp.experts.gate_up_proj: packed_colwise`").
        facts (`dict`): the values behind the message (bytes, sizes, rank), JSON-serialisable.
        location (`Location`, *optional*): set by the report stage from the rule's declaration.
    """

    code: str
    kind: str
    severity: Severity
    target: str
    message: str
    fix: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    location: Location | None = None

    @property
    def fingerprint(self) -> str:
        """Identity used by `--baseline`: code and target (messages carry numbers that may move)."""
        return f"{self.code}:{self.target}"

    def to_json(self) -> dict[str, Any]:
        out = {"code": self.code, "kind": self.kind, "severity": self.severity, "target": self.target,
               "message": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.facts:
            out["facts"] = self.facts
        return out


@dataclass(frozen=True)
class ReplicatedFamily:
    """Parameters of one generic name that every rank holds whole because nothing shards them.

    Attributes:
        name (`str`): generic runtime name (`model.language_model.layers.*.mlp.experts.gate_up_proj`).
        count (`int`): how many parameters share it.
        bytes (`int`): their bytes together, which every rank holds.
        reason (`str`): `"no rule matches"` or the rule whose style does not shard parameters.
        severity (`str`, *optional*): the severity of the TPA001 finding that covers it (`None` for norms, biases,
            vectors, which no finding covers).
    """

    name: str
    count: int
    bytes: int
    reason: str
    severity: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "count": self.count, "bytes": self.bytes, "reason": self.reason}
        if self.severity:
            out["severity"] = self.severity
        return out


def why_unsharded(p: ParamShard) -> str:
    """Why nothing shards `p`: `"no rule matches"` or the rule whose style does not shard parameters."""
    if p.rule is None:
        return "no rule matches"
    return f"rule `{p.rule}: {p.style}` does not shard parameters"


# ----------------------------------------------------------------------------------------------------------------------
# Report sections (each optional, each typed)
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVCacheSection:
    """The KV cache a rank holds per token, layer by layer (see `kvcache.py`).

    Attributes:
        dtype (`str`): cache dtype; `itemsize` its bytes per element.
        layers (`dict[str, int]`): layer kind (`full`, `sliding`, `chunked`, `mla`, `none`) -> count.
        kv_heads (`int | list[int]`): KV heads of the whole model (a list when layers differ).
        kv_heads_per_rank (`float | list[float]`): KV heads one rank holds (as transformers'
            `get_kv_heads_per_rank` counts them: a gathered key projection keeps every head on every rank).
        bytes_per_token_per_rank (`list[int]`): per rank, all cached layers.
        full_context_bytes_per_token_per_rank (`list[int]`): of those, layers that keep the whole context.
        window_bytes_per_token_by_window (`dict[str, list[int]]`): window (tokens) -> per-rank bytes per token of the
            layers with that window.
        bytes_per_token_whole_model (`int`), linear_state_bytes_per_sequence (`int`).
    """

    dtype: str
    itemsize: int
    layers: dict[str, int]
    kv_heads: Any
    kv_heads_per_rank: Any
    bytes_per_token_per_rank: list[int]
    full_context_bytes_per_token_per_rank: list[int]
    window_bytes_per_token_per_rank: list[int]
    windows: list[int]
    window_bytes_per_token_by_window: dict[str, list[int]]
    bytes_per_token_whole_model: int
    linear_state_bytes_per_sequence: int

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class SuggestionSection:
    """`--suggest`: proposed rules, re-simulated (see `suggest.py`).

    Attributes:
        rules (`dict[str, str]`): proposed key (relative to the base model) -> style.
        removed (`list[str]`): rules of the current plan that match nothing, dropped from the proposal.
        unresolved (`list[str]`): families no sibling shards, with the reason.
        voters (`dict`): key -> `{"matched", "votes", "examples"}`.
        before (`dict`), after (`dict`, *optional*): worst-rank bytes, replicated bytes, errors, warnings.
        plan (`dict`, *optional*): the whole proposed `base_model_tp_plan`.
        snippet (`str`, *optional*): it as Python, ready to paste.
        new_errors (`list[dict]`): error findings the proposed plan has that the current one does not.
    """

    rules: dict[str, str]
    removed: list[str]
    unresolved: list[str]
    voters: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any] | None = None
    plan: dict[str, str] | None = None
    snippet: str | None = None
    new_errors: list[dict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class BaselineSection:
    """`--baseline FILE`: how many known findings were accepted (and not shown)."""

    file: str
    suppressed: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "suppressed": self.suppressed}


REPORT_SCHEMA = "tpaudit/check/v1"


@dataclass(frozen=True)
class Report:
    """Everything `tpaudit check` knows about one model at one (tp_size, ep_size): the object every renderer draws and
    `tpaudit.check()` returns. `to_json()` is the versioned contract (`tpaudit/check/v1`).

    Attributes:
        model (`dict`): provenance: `ref`, `kind`, `repo_id`, `revision`, `commit`, `model_type`, `architecture`,
            `dtype`, `config_only`, `checkpoint_tensor_count`, `checkpoint_bytes`, `quantization`, `config_path`.
        shard_map (`ShardMap`): every parameter on every rank.
        replicated (`tuple[ReplicatedFamily, ...]`): families no rule shards, largest first.
        unused_rules (`tuple[str, ...]`): full rule keys that match nothing.
        findings (`tuple[Finding, ...]`): sorted by severity, code, target; each with its `location`.
        plan (`dict`): `tp_rules`, `ep_rules`, `override`, `injected_rules`, `dropped_tp_rules`, `text_prefix`.
        notes (`tuple[str, ...]`): how the input was read (config only, quantizer fallback, casts, untested release).
        versions (`dict[str, str]`): tpaudit, transformers, torch, huggingface_hub.
        kv_cache (`KVCacheSection`, *optional*), suggestion (`SuggestionSection`, *optional*),
        baseline (`BaselineSection`, *optional*), parity (`ParityResult`, *optional*): report sections.
    """

    model: dict[str, Any]
    shard_map: ShardMap
    replicated: tuple[ReplicatedFamily, ...]
    unused_rules: tuple[str, ...]
    findings: tuple[Finding, ...]
    plan: dict[str, Any]
    notes: tuple[str, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)
    kv_cache: KVCacheSection | None = None
    suggestion: SuggestionSection | None = None
    baseline: BaselineSection | None = None
    parity: Any = None
    schema: str = REPORT_SCHEMA

    @property
    def groups(self) -> tuple[ParamGroup, ...]:
        """Parameters grouped by generic name, in model order."""
        return self.shard_map.groups

    @property
    def tp_size(self) -> int:
        return self.shard_map.tp_size

    @property
    def ep_size(self) -> int:
        return self.shard_map.ep_size

    @property
    def total_param_bytes(self) -> int:
        return self.shard_map.total_param_bytes

    @property
    def rank_param_bytes(self) -> tuple[int, ...]:
        return self.shard_map.rank_param_bytes

    @property
    def worst_rank(self) -> int:
        return self.shard_map.worst_rank

    @property
    def worst_rank_param_bytes(self) -> int:
        return self.shard_map.worst_rank_param_bytes

    @property
    def replicated_bytes(self) -> int:
        """Bytes every rank holds whole because nothing shards them."""
        return sum(f.bytes for f in self.replicated)

    @property
    def replicated_share(self) -> float:
        """`replicated_bytes / total_param_bytes` (0.0 for an empty model)."""
        return self.replicated_bytes / self.total_param_bytes if self.total_param_bytes else 0.0

    def count(self, severity: str) -> int:
        """Number of findings of `severity` (`"error"`, `"warning"` or `"note"`)."""
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def has_errors(self) -> bool:
        """True when an error-severity finding exists (`check` exits 1)."""
        return self.count("error") > 0

    def summary(self) -> dict[str, int]:
        """`{"errors", "warnings", "notes"}` counts."""
        return {"errors": self.count("error"), "warnings": self.count("warning"), "notes": self.count("note")}

    def to_json(self) -> dict[str, Any]:
        """The `tpaudit/check/v1` JSON object (all sizes in bytes, as integers)."""
        sm = self.shard_map
        out = {
            "schema": self.schema,
            "tool": {"name": "tpaudit", "version": self.versions.get("tpaudit")},
            "versions": dict(self.versions),
            "model": dict(self.model),
            "tp_size": sm.tp_size,
            "ep_size": sm.ep_size,
            "world_size": sm.world_size,
            "ranks": [{"rank": r, "param_bytes": b} for r, b in enumerate(sm.rank_param_bytes)],
            "total_param_bytes": sm.total_param_bytes,
            "worst_rank": sm.worst_rank,
            "worst_rank_param_bytes": sm.worst_rank_param_bytes,
            "replicated_bytes": self.replicated_bytes,
            "replicated_share": round(self.replicated_share, 6),
            "replicated": [f.to_json() for f in self.replicated],
            "unused_rules": list(self.unused_rules),
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary(),
            "params": [g.to_json() for g in self.groups],
            "plan": self.plan,
            "notes": list(self.notes),
        }
        for key in ("kv_cache", "suggestion", "baseline", "parity"):
            section = getattr(self, key)
            if section is not None:
                out[key] = section.to_json()
        return out
