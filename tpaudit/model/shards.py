"""The simulation stage's values: every parameter's shard on every rank, grouped by family."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

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
