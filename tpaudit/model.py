"""The data model: what flows from one stage to the next.

    ModelSource -> BuiltModel (+ facts) -> ResolvedPlan -> ShardMap -> list[Finding] -> Report -> renderer

Frozen dataclasses only; nothing here imports torch or transformers. Sizes are `int` bytes named `*_bytes`, counts
`*_count`, shapes `tuple[int, ...]`. Parameter names are runtime names (after the loader's renaming and merging); a
"generic" name has its layer/expert indices replaced by `*` as transformers'
`parallel_utils.replace_layer_number_by_wildcard` does (`compat.logic.generic_name`). On-disk names are
`checkpoint_name`. Every report section is a typed dataclass with `to_json()`; `Report.to_json()` is the
`tpaudit/check/v1` contract.

Longer than most modules on purpose: it is the one place every stage's values are declared (one section per stage),
so that no stage imports another's module to read its types.
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
        placements (`tuple[Placement, ...]`, *optional*): the placements per mesh dimension, as the seam describes
            them (`compat.Placement`); `None` for a plain tensor.
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
    placements: tuple[Any, ...] | None = None

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

    def param(self, name: str) -> ParamShard | None:
        """The parameter with concrete runtime name `name`, `None` when the model has none (indexed on first use)."""
        index = self.__dict__.get("_by_name")
        if index is None:
            index = {p.name: p for p in self.params}
            object.__setattr__(self, "_by_name", index)
        return index.get(name)

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


# ----------------------------------------------------------------------------------------------------------------------
# Load stage: what transformers' own load does with the checkpoint on every rank
# ----------------------------------------------------------------------------------------------------------------------
LoadIssueKind = Literal["raises", "shape", "metadata_lost"]


@dataclass(frozen=True)
class LoadIssue:
    """Something transformers' own load does wrong with one parameter family on some ranks, found by running its
    shard-on-read and converter operations for those ranks (`tpaudit.loading`).

    Attributes:
        kind (`"raises" | "shape" | "metadata_lost"`): a step raises (the load fails); the converted local shard does
            not have the parameter's local shape (the load fails on its size check or holds the wrong values); a
            small metadata tensor an operation reads (compressed-tensors `weight_shape`) arrives empty or partial.
        name (`str`): the generic runtime parameter (`model.layers.*.mlp.experts.gate_up_proj`).
        ranks (`tuple[int, ...]`): the ranks it happens on.
        stage (`"read" | "convert"`): shard-on-read, or a converter operation.
        op (`str`): the operation (`DtensorShardOperation.shard_tensor`, `CompressedTensorsDequantize`, ...).
        error (`str`, *optional*): the exception type and first line, for `raises`.
        source (`str`, *optional*): the generic checkpoint name involved (`...experts.*.gate_proj.weight_shape`).
        local_shape (`tuple[int, ...]`, *optional*): what the operations produced on `ranks[0]` (per expert for
            a per-expert merge: the leading dimension is the count of pieces the rank kept).
        expected_shape (`tuple[int, ...]`, *optional*): the parameter's local shape on `ranks[0]`.
        lost (`tuple[tuple[int, tuple[int, ...]], ...]`): for `metadata_lost`, `(rank, local shape)` of the metadata
            tensor on every rank that gets less than all of it.
        full_shape (`tuple[int, ...]`, *optional*): the metadata tensor's stored shape (`(2,)`).
        rebuilt (`tuple[tuple[int, int, int], ...]`): for `metadata_lost`, `(rank, rebuilt, true)` input sizes where
            the rank's piece is empty and the quantizer's operation rebuilds the input size from the packed width
            (compressed-tensors: `packed_cols * (32 // num_bits)`, exact only when `num_bits` divides 32).
    """

    kind: LoadIssueKind
    name: str
    ranks: tuple[int, ...]
    stage: str
    op: str
    error: str | None = None
    source: str | None = None
    local_shape: tuple[int, ...] | None = None
    expected_shape: tuple[int, ...] | None = None
    lost: tuple[tuple[int, tuple[int, ...]], ...] = ()
    full_shape: tuple[int, ...] | None = None
    rebuilt: tuple[tuple[int, int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "ranks": list(self.ranks), "stage": self.stage, "op": self.op,
                "error": self.error, "source": self.source,
                "local_shape": list(self.local_shape) if self.local_shape is not None else None,
                "expected_shape": list(self.expected_shape) if self.expected_shape is not None else None,
                "lost": [[r, list(s)] for r, s in self.lost],
                "full_shape": list(self.full_shape) if self.full_shape is not None else None,
                "rebuilt": [list(x) for x in self.rebuilt]}


@dataclass(frozen=True)
class LoadFamily:
    """Parameters (one generic name) whose checkpoint tensors a converter of the loader turns into the parameter:
    per-expert tensors merged into fused experts, a fused `wqkv` chunked, quantized tensors decompressed.

    Attributes:
        name (`str`): generic runtime parameter name.
        count (`int`): parameters of that name.
        tensor_count (`int`): checkpoint tensors that load into them (all `count` parameters).
        checkpoint_names (`tuple[str, ...]`): the generic checkpoint names that load into it, in the loader's order.
        operations (`tuple[str, ...]`): the converter's operations, in order (`CompressedTensorsDequantize`,
            `MergeModulelist`, `Concatenate`).
        decompressed (`bool`): one of them is the quantizer's own dequantize operation: the parameter holds
            decompressed values in `dtype`, not the stored quantized form.
        stored_dtypes (`tuple[str, ...]`): safetensors dtypes of the checkpoint tensors (`I32`, `BF16`).
        dtype (`str`): the parameter's dtype, what each rank holds.
        rank_stored_bytes (`tuple[int, ...]`): checkpoint bytes each rank reads for all `count` parameters.
        rank_resident_bytes (`tuple[int, ...]`): bytes each rank holds of them after the load.
        simulated (`bool`): the converter's operations ran on every rank's pieces; `False` when they could not here
            (`reason`), e.g. an operation that needs a GPU kernel.
        reason (`str`, *optional*): why not.
    """

    name: str
    count: int
    tensor_count: int
    checkpoint_names: tuple[str, ...]
    operations: tuple[str, ...]
    decompressed: bool
    stored_dtypes: tuple[str, ...]
    dtype: str
    rank_stored_bytes: tuple[int, ...]
    rank_resident_bytes: tuple[int, ...]
    simulated: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "tensor_count": self.tensor_count,
                "checkpoint_names": list(self.checkpoint_names),
                "operations": list(self.operations), "decompressed": self.decompressed,
                "stored_dtypes": list(self.stored_dtypes), "dtype": self.dtype,
                "rank_stored_bytes": list(self.rank_stored_bytes),
                "rank_resident_bytes": list(self.rank_resident_bytes), "simulated": self.simulated,
                "reason": self.reason}


@dataclass(frozen=True)
class LoadSection:
    """What transformers' own load does with the checkpoint on every rank (`tpaudit.loading.simulate_load`).

    Attributes:
        rank_stored_bytes (`tuple[int, ...]`, *optional*): checkpoint bytes each rank reads (its shards of every
            checkpoint tensor that loads into a parameter), in the stored dtypes; `None` without a checkpoint.
        rank_resident_bytes (`tuple[int, ...]`): parameter bytes each rank holds after the load (the shard map's).
        families (`tuple[LoadFamily, ...]`): the parameters a converter fills, by generic name.
        issues (`tuple[LoadIssue, ...]`): what goes wrong, by family.
        rank_first_forward_bytes (`tuple[int, ...]`, *optional*): parameter bytes each rank holds once
            compressed-tensors has decompressed every compressed module in place on the first forward pass (its
            `ct_decompress_hook`, transformers' default path); `None` when the load keeps no such hook.
    """

    rank_stored_bytes: tuple[int, ...] | None
    rank_resident_bytes: tuple[int, ...]
    families: tuple[LoadFamily, ...] = ()
    issues: tuple[LoadIssue, ...] = ()
    rank_first_forward_bytes: tuple[int, ...] | None = None

    @property
    def decompressed(self) -> tuple[LoadFamily, ...]:
        """The families the quantizer decompresses while loading."""
        return tuple(f for f in self.families if f.decompressed)

    def to_json(self) -> dict[str, Any]:
        return {"rank_stored_bytes": list(self.rank_stored_bytes) if self.rank_stored_bytes is not None else None,
                "rank_resident_bytes": list(self.rank_resident_bytes),
                "rank_first_forward_bytes": (list(self.rank_first_forward_bytes)
                                             if self.rank_first_forward_bytes is not None else None),
                "families": [f.to_json() for f in self.families], "issues": [i.to_json() for i in self.issues]}


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
class FindingSubject:
    """What a finding is about, as the stages after the checks need it (plan-file locations, `--suggest`, the tables):
    typed, so that no later stage reads a finding's JSON `facts`.

    Attributes:
        rule_key (`str`, *optional*): the `base_model_tp_plan` key (relative to the base model) a fix adds or edits,
            `layers.*.mlp.experts.gate_up_proj`.
        key_kind (`"module" | "parameter"`, *optional*): whether `rule_key` names a module or a parameter (a
            parameter rule of fused experts brings its module's rule).
        families (`tuple[str, ...]`): the generic parameter names the finding covers.
    """

    rule_key: str | None = None
    key_kind: Literal["module", "parameter"] | None = None
    families: tuple[str, ...] = ()


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
        subject (`FindingSubject`, *optional*): what the finding is about, typed, for the stages after the checks
            (not part of the JSON: `facts` says the same to JSON readers).
    """

    code: str
    kind: str
    severity: Severity
    target: str
    message: str
    fix: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    location: Location | None = None
    subject: FindingSubject | None = None

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

    @classmethod
    def from_json(cls, data: Any) -> "Finding":
        """A finding back from its `to_json()` (a report that crossed a process boundary, e.g. the guard's worker).

        Raises:
            ValueError: not a finding object: a field missing or of the wrong type, or an unknown severity.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a finding must be a JSON object, not {type(data).__name__}")
        fields = {k: data.get(k) for k in ("code", "kind", "severity", "target", "message")}
        if not all(isinstance(v, str) for v in fields.values()) or fields["severity"] not in SEVERITY_ORDER:
            raise ValueError(f"not a finding: {str(data)[:120]}")
        fix, facts = data.get("fix", ""), data.get("facts", {})
        if not isinstance(fix, str) or not isinstance(facts, dict):
            raise ValueError(f"not a finding: {str(data)[:120]}")
        return cls(fix=fix, facts=facts, **fields)


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
        remaining_errors (`list[str]`): every error finding the proposed plan still has (`CODE target`).
        tp_plan_override (`dict[str, str]`): the proposed rules with full keys, as
            `DistributedConfig(tp_plan=...)` takes them at load time (transformers merges them into the model's plan),
            for a user who cannot edit the config class.
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
    remaining_errors: list[str] = field(default_factory=list)
    tp_plan_override: dict[str, str] = field(default_factory=dict)

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
        loading (`LoadSection`, *optional*): what transformers' own load does on every rank, for a quantized
            checkpoint or one whose load fails (`None` otherwise, and for config-only sources).
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
    loading: LoadSection | None = None
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
        for key in ("kv_cache", "suggestion", "baseline", "parity", "loading"):
            section = getattr(self, key)
            if section is not None:
                out[key] = section.to_json()
        return out


# ----------------------------------------------------------------------------------------------------------------------
# Evidence stage: what the sharded forward of a small model showed (`tpaudit.evidence`)
# ----------------------------------------------------------------------------------------------------------------------
PARITY_TOLERANCE = 1e-4
"""Relative tolerance of the parity check: an output differs when `max |sharded - unsharded| > PARITY_TOLERANCE *
max(1, max |unsharded|)` (float32 reordering noise is a few 1e-6 in the small model; a wrong split moves an output by
the order of its own magnitude)."""


def _check(value, types, what: str):
    """`value` when it is one of `types` (bool is not an int here), else `ValueError` naming `what`."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ValueError(f"{what}: expected {types}, got a bool")
    if not isinstance(value, types):
        raise ValueError(f"{what}: expected {types}, got {type(value).__name__}")
    return value


def _opt(value, types, what: str):
    return None if value is None else _check(value, types, what)


def _pair(value) -> tuple[str, str]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, str) for x in value)):
        raise ValueError("verdict.fix_partners[]: expected [rule, style]")
    return value[0], value[1]


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
        cut (`"blocks" | "groups"`): the parts are blocks of the whole output (`[Q_all | K_all | V_all]`,
            `[gate | up]`), or repeat in groups of `period` features (`[head][q, k, v]`, CodeGen's 4 groups of
            `[q | v | k]`).
        op (`str`): the torch function that cut it (`split`, `chunk`, `slice`, ...).
        parts (`tuple[int, ...]`): the features each piece of that cut keeps.
        total (`int`): the features of the output the cut applies to (in the small model).
        period (`int`): features per group (`total` for blocks): the shard of a plain `colwise` split keeps the parts
            together only when it holds whole groups, i.e. when `tp_size` divides `groups`.
    """

    module: str
    rule: str
    style: str
    action: str
    cut: str = "blocks"
    op: str = ""
    parts: tuple[int, ...] = ()
    total: int = 0
    period: int = 0

    @property
    def groups(self) -> int:
        """Number of groups the output repeats its parts in (1 for blocks of the whole output)."""
        return self.total // self.period if self.period else 1

    def to_json(self) -> dict[str, Any]:
        out = {"module": self.module, "rule": self.rule, "style": self.style, "action": self.action}
        if self.total:
            out.update(cut=self.cut, op=self.op, parts=list(self.parts), total=self.total, period=self.period,
                       groups=self.groups)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "SplitOutput":
        """The inverse of `to_json`, validating every field.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        _check(d, dict, "split entry")
        parts = tuple(_check(p, int, "split.parts[]") for p in _check(d.get("parts", []), list, "split.parts"))
        cut = _check(d.get("cut", "blocks"), str, "split.cut")
        if cut not in ("blocks", "groups"):
            raise ValueError(f"split.cut: unknown value {cut!r}")
        return cls(module=_check(d.get("module"), str, "split.module"), rule=_check(d.get("rule"), str, "split.rule"),
                   style=_check(d.get("style"), str, "split.style"), action=_check(d.get("action"), str,
                                                                                   "split.action"),
                   cut=cut, op=_check(d.get("op", ""), str, "split.op"), parts=parts,
                   total=_check(d.get("total", 0), int, "split.total"),
                   period=_check(d.get("period", 0), int, "split.period"))


VERDICT_STATUSES = ("error", "cleared", "not_exercised")
VERDICT_KINDS = ("packed_layout", "style_mismatch")


@dataclass(frozen=True)
class RuleVerdict:
    """What the parity check decided about one rule of the plan (or one module that lacks a rule).

    Attributes:
        rule (`str`, *optional*): the plan key (generic, prefixed: `model.layers.*.self_attn.o_proj`); `None` for a
            module that no rule splits but that receives a split input (a missing reduction).
        style (`str`, *optional*): the rule's style (`None` with `rule`).
        module (`str`): generic name of the module (or parameter) the rule applies to.
        status (`"error" | "cleared" | "not_exercised"`): the rule breaks the sharded forward (alone, or together with
            the rest of its block); it held in a run whose outputs matched the unsharded model; or the check could not
            run it (`why` says why).
        kind (`"packed_layout" | "style_mismatch"`, *optional*): for an error, whether the split scrambles the parts
            of an output the forward cuts into parts (`split` holds that cut) or is a style that does not fit how
            the model uses an unfused module.
        why (`str`): how the verdict was reached, in words (`"held in a run whose 84 compared outputs matched"`,
            `"module never reached by the forward"`, `"inside an expert-parallel module (EP scope)"`).
        observed_at (`str`, *optional*): generic module name where the failure showed (the first output that
            differed, or the module running when a rank raised).
        observed_layer (`int`, *optional*): the real layer index (of the small model's kept layer) it showed in.
        exception (`str`, *optional*): what a rank raised, one line (`"rank 0: RuntimeError: ..."`).
        max_abs_error (`float`, *optional*): the largest `|sharded - unsharded|` where the outputs differed.
        rank (`int`, *optional*): the rank where the failure showed first.
        input_split (`bool`, *optional*): whether the module's input reached it split (each rank a slice).
        fix_style (`str`, *optional*): a style for this rule with which the sharded forward matched the unsharded
            model (re-run with it; `None` when none was found).
        together_with (`tuple[str, ...]`): other rules of the same block that fail with this one.
        split (`SplitOutput`, *optional*): for a `packed_layout` error, the cut of its output.
        fix_partners (`tuple[tuple[str, str], ...]`): `(rule, style)` of the partners `fix_style` needs (the
            rowwise projection that reduced this rule's split output takes the whole one), re-run with it.
        tp_sizes_ok (`tuple[int, ...]`): smaller tp sizes at which the rule, as the plan has it, ran clean (re-run on
            the same small model): for an output cut in groups, a size that divides the number of groups.
    """

    rule: str | None
    style: str | None
    module: str
    status: str
    kind: str | None = None
    why: str = ""
    observed_at: str | None = None
    observed_layer: int | None = None
    exception: str | None = None
    max_abs_error: float | None = None
    rank: int | None = None
    input_split: bool | None = None
    fix_style: str | None = None
    together_with: tuple[str, ...] = ()
    split: SplitOutput | None = None
    fix_partners: tuple[tuple[str, str], ...] = ()
    tp_sizes_ok: tuple[int, ...] = ()

    @property
    def target(self) -> str:
        """What a finding about it points at: the rule key, else the module."""
        return self.rule or self.module

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["together_with"] = list(self.together_with)
        out["split"] = self.split.to_json() if self.split is not None else None
        out["fix_partners"] = [list(p) for p in self.fix_partners]
        out["tp_sizes_ok"] = list(self.tp_sizes_ok)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "RuleVerdict":
        """The inverse of `to_json`, validating every field.

        Raises:
            ValueError: a field is missing, of the wrong type, or an unknown status or kind.
        """
        _check(d, dict, "verdict")
        status = _check(d.get("status"), str, "verdict.status")
        kind = _opt(d.get("kind"), str, "verdict.kind")
        if status not in VERDICT_STATUSES or (kind is not None and kind not in VERDICT_KINDS):
            raise ValueError(f"verdict: unknown status {status!r} or kind {kind!r}")
        err = d.get("max_abs_error")
        split = d.get("split")
        return cls(rule=_opt(d.get("rule"), str, "verdict.rule"), style=_opt(d.get("style"), str, "verdict.style"),
                   module=_check(d.get("module"), str, "verdict.module"), status=status, kind=kind,
                   why=_check(d.get("why", ""), str, "verdict.why"),
                   observed_at=_opt(d.get("observed_at"), str, "verdict.observed_at"),
                   observed_layer=_opt(d.get("observed_layer"), int, "verdict.observed_layer"),
                   exception=_opt(d.get("exception"), str, "verdict.exception"),
                   max_abs_error=None if err is None else float(_check(err, (int, float), "verdict.max_abs_error")),
                   rank=_opt(d.get("rank"), int, "verdict.rank"),
                   input_split=_opt(d.get("input_split"), bool, "verdict.input_split"),
                   fix_style=_opt(d.get("fix_style"), str, "verdict.fix_style"),
                   together_with=tuple(_check(x, str, "verdict.together_with[]")
                                       for x in _check(d.get("together_with", []), list, "verdict.together_with")),
                   split=None if split is None else SplitOutput.from_json(split),
                   fix_partners=tuple(_pair(p) for p in _check(d.get("fix_partners", []), list,
                                                                "verdict.fix_partners")),
                   tp_sizes_ok=tuple(_check(x, int, "verdict.tp_sizes_ok[]")
                                     for x in _check(d.get("tp_sizes_ok", []), list, "verdict.tp_sizes_ok")))


@dataclass(frozen=True)
class ParityResult:
    """What the sharded forward showed (the report's `parity` section).

    Attributes:
        ran (`bool`): the sharded forward was attempted.
        reason (`str`): why it ran (or did not) and how: the ranks, the layers kept, the checkpoint layout, and what
            it does not cover (quantized weights run unquantized; a composite model is checked through its text
            decoder; a subprocess when this process could not host the ranks).
        tp_size (`int`), ep_size (`int`): the `DistributedConfig` sizes the ranks loaded with.
        modules_compared (`int`): module calls whose output was compared on some rank (whole, or as the rank's slice)
            in the run of the plan as given.
        max_abs_error (`float`, *optional*): the largest `|sharded - unsharded|` over every compared output of every
            rank (logits included); `None` when nothing could be compared.
        first_divergent_module (`str`, *optional*): generic name of the module (or parameter) whose split made the
            forward diverge first: the first module (in execution order) whose output differs or that raised when
            its own rule is at fault (its input still matched), else the split it consumed (`observed_at` says
            where it showed); `None` when nothing diverged.
        rule (`str`, *optional*), style (`str`, *optional*): the plan rule and style that split it (`None` when the
            module has no rule, e.g. one that receives a split input unreduced).
        observed_at (`str`, *optional*): generic name of the module where the divergence showed (the first whose
            output differed, or the one running when a rank raised).
        error (`str`, *optional*): the exception a rank raised, one line (`"rank 0: RuntimeError: ..."`).
        passed (`bool`, *optional*): `True` when every rank ran, at least one module output was compared and every
            compared output matched; `False` when a rank raised or an output differed; `None` when the check did not
            run or compared nothing (no evidence either way).
        seconds (`float`): wall time of the check (the isolation re-runs included).
        fused (`bool`): the module blamed first is one whose output the forward cuts into parts (a fused or packed
            projection, see `split`): a `packed_layout` error rather than a style mismatch.
        split (`tuple[SplitOutput, ...]`): the fused or packed projections the trace found.
        shrunk (`dict[str, list[int]]`): config attribute -> `[real, small]` for every attribute the small model
            scales (dotted for nested configs).
        layers (`tuple[int, ...]`): the real layer indices the small model keeps, one per kind, in order.
        model_class (`str`, *optional*): the class that was loaded.
        scope (`str`): `"whole model"`, or what part of a composite model was checked.
        tolerance (`float`): the relative tolerance (`PARITY_TOLERANCE`).
        rank (`int`, *optional*): the rank that raised or diverged first.
        input_split (`bool`, *optional*): when the module blamed is where the divergence showed, whether its input
            reached it split (each rank a slice) or whole; `None` otherwise.
        observed_layer (`int`, *optional*): the real model's layer index (of the kept layer) where the divergence
            showed, e.g. 5 for Gemma 4's first global-attention layer.
        verdicts (`tuple[RuleVerdict, ...]`): one per rule of the small model's plans (and per module found to lack a
            rule), errors first: what the run of the plan and the isolation re-runs decided.
        reruns (`int`): sharded runs after the first, to isolate the rules that broke it.
        isolation_seconds (`float`): wall time of those re-runs.
        cached (`bool`): the result was read from the parity cache (`tpaudit.evidence.cache`), not computed now.
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
    tolerance: float = PARITY_TOLERANCE
    rank: int | None = None
    input_split: bool | None = None
    observed_layer: int | None = None
    verdicts: tuple[RuleVerdict, ...] = ()
    reruns: int = 0
    isolation_seconds: float = 0.0
    cached: bool = False

    _EXTRA = ("verdicts", "reruns", "isolation_seconds", "cached")

    def verdict(self, target: str) -> RuleVerdict | None:
        """The verdict whose rule (or, for a missing rule, module) is `target`."""
        return next((v for v in self.verdicts if v.target == target or v.module == target), None)

    def errors(self) -> tuple[RuleVerdict, ...]:
        """The verdicts with status `"error"`."""
        return tuple(v for v in self.verdicts if v.status == "error")

    def to_json(self) -> dict[str, Any]:
        """The report's `parity` section (JSON-serialisable). The per-rule keys (`verdicts`, `reruns`,
        `isolation_seconds`) appear once the check ran; `cached` only for a result read from the cache."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in self._EXTRA}
        out["split"] = [s.to_json() for s in self.split]
        out["shrunk"] = {k: list(v) for k, v in self.shrunk.items()}
        out["layers"] = list(self.layers)
        out["seconds"] = round(self.seconds, 3)
        if self.ran and self.verdicts:
            out["verdicts"] = [v.to_json() for v in self.verdicts]
            out["reruns"] = self.reruns
            out["isolation_seconds"] = round(self.isolation_seconds, 3)
        if self.cached:
            out["cached"] = True
        return out

    @classmethod
    def from_json(cls, d: dict) -> "ParityResult":
        """The inverse of `to_json` (the parity subprocess's answer, a cache entry), validating every field: a value
        of the wrong type is refused, never trusted.

        Raises:
            ValueError: a field is missing, unknown or of the wrong type.
        """
        _check(d, dict, "parity")
        known = set(cls.__dataclass_fields__)
        if unknown := set(d) - known:
            raise ValueError(f"parity: unknown keys {sorted(unknown)}")
        num = (int, float)

        def opt_float(key):
            v = d.get(key)
            return None if v is None else float(_check(v, num, f"parity.{key}"))

        shrunk = _check(d.get("shrunk", {}), dict, "parity.shrunk")
        for k, v in shrunk.items():
            if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in v)):
                raise ValueError(f"parity.shrunk[{k!r}]: expected [real, small]")
        return cls(
            ran=_check(d.get("ran"), bool, "parity.ran"), reason=_check(d.get("reason"), str, "parity.reason"),
            tp_size=_check(d.get("tp_size"), int, "parity.tp_size"),
            ep_size=_check(d.get("ep_size", 1), int, "parity.ep_size"),
            modules_compared=_check(d.get("modules_compared", 0), int, "parity.modules_compared"),
            max_abs_error=opt_float("max_abs_error"),
            first_divergent_module=_opt(d.get("first_divergent_module"), str, "parity.first_divergent_module"),
            rule=_opt(d.get("rule"), str, "parity.rule"), style=_opt(d.get("style"), str, "parity.style"),
            observed_at=_opt(d.get("observed_at"), str, "parity.observed_at"),
            error=_opt(d.get("error"), str, "parity.error"), passed=_opt(d.get("passed"), bool, "parity.passed"),
            seconds=float(_check(d.get("seconds", 0.0), num, "parity.seconds")),
            fused=_check(d.get("fused", False), bool, "parity.fused"),
            split=tuple(SplitOutput.from_json(s) for s in _check(d.get("split", []), list, "parity.split")),
            shrunk={k: list(v) for k, v in shrunk.items()},
            layers=tuple(_check(x, int, "parity.layers[]") for x in _check(d.get("layers", []), list,
                                                                            "parity.layers")),
            model_class=_opt(d.get("model_class"), str, "parity.model_class"),
            scope=_check(d.get("scope", "whole model"), str, "parity.scope"),
            tolerance=float(_check(d.get("tolerance", PARITY_TOLERANCE), num, "parity.tolerance")),
            rank=_opt(d.get("rank"), int, "parity.rank"),
            input_split=_opt(d.get("input_split"), bool, "parity.input_split"),
            observed_layer=_opt(d.get("observed_layer"), int, "parity.observed_layer"),
            verdicts=tuple(RuleVerdict.from_json(v) for v in _check(d.get("verdicts", []), list, "parity.verdicts")),
            reruns=_check(d.get("reruns", 0), int, "parity.reruns"),
            isolation_seconds=float(_check(d.get("isolation_seconds", 0.0), num, "parity.isolation_seconds")),
            cached=_check(d.get("cached", False), bool, "parity.cached"))
