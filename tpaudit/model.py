"""The data model: what flows from one stage to the next.

    ModelSource -> (meta model + ResolvedPlan) -> ShardMap -> list[Finding] -> Report -> renderer

Frozen dataclasses only; nothing here imports torch or transformers. Sizes are `int` bytes named `*_bytes`, counts
`*_count`, shapes `tuple[int, ...]`. Parameter names are runtime names (after the loader's renaming and merging); a
"generic" name has its layer/expert indices replaced by `*` as transformers'
`parallel_utils.replace_layer_number_by_wildcard` does. On-disk names are `checkpoint_name`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

# Bytes per element of each safetensors dtype (https://huggingface.co/docs/safetensors/index#format). Sub-byte
# formats are stored packed in one of these by every quantizer, so a whole-byte table is complete for headers.
SAFETENSORS_DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "F8_E8M0": 1,
    "F4": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
    "C64": 8,
}

_LAYER_NUMBER = re.compile(r"\.\d+(\.|$)")


def generic_name(name: str) -> str:
    """`model.layers.3.mlp.experts.7.w1.weight` -> `model.layers.*.mlp.experts.*.w1.weight`.

    Numbers between dots (or between a dot and the end) become `*`; digits inside a name (`w1`) stay.

    Source: transformers 5.23 `distributed.parallel_utils.replace_layer_number_by_wildcard` (same regex; kept here
    so that sources and renderers need not import transformers).
    """
    return _LAYER_NUMBER.sub(lambda m: ".*" + m.group(1), name)


# ----------------------------------------------------------------------------------------------------------------------
# Source stage
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointTensor:
    """One tensor of a safetensors checkpoint, as its header describes it (no data).

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
        """Bytes of the tensor's data: `prod(shape) * itemsize`. Raises `KeyError` for an unknown dtype name."""
        return math.prod(self.shape) * SAFETENSORS_DTYPE_BYTES[self.dtype]


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
        notes (`tuple[str, ...]`): facts about how the input was read that the report must repeat (e.g. "config
            only: ...").
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

    @property
    def checkpoint_bytes(self) -> int | None:
        """Sum of every checkpoint tensor's bytes, `None` for a config-only model."""
        if self.tensors is None:
            return None
        return sum(t.nbytes for t in self.tensors)

    @property
    def display_name(self) -> str:
        """`repo_id@commit[:12]` for Hub models, else the reference as given."""
        if self.repo_id:
            rev = self.commit[:12] if self.commit else self.revision
            return f"{self.repo_id}@{rev}" if rev else self.repo_id
        return self.ref


# ----------------------------------------------------------------------------------------------------------------------
# Plan and simulation stage
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
        placement (`str`): the DTensor placement, e.g. `"Shard(0)"`, `"_StridedShard(dim=1, sf=2)"`,
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


@dataclass(frozen=True)
class ShardMap:
    """Every parameter of the model and its shard on every rank.

    Attributes:
        tp_size (`int`), ep_size (`int`): the sizes simulated; `world_size = max(tp_size, ep_size)` (in transformers
            5.23 without FSDP, `ep_size` is 1 or `tp_size`, so the EP ranks are the TP ranks).
        params (`tuple[ParamShard, ...]`): in the model's `named_parameters()` order, tied copies included.
        rank_param_bytes (`tuple[int, ...]`): bytes of parameters resident on each rank (tied pairs once).
        total_param_bytes (`int`): bytes of the whole model (tied pairs once).
    """

    tp_size: int
    ep_size: int
    params: tuple[ParamShard, ...]
    rank_param_bytes: tuple[int, ...] = field(init=False)
    total_param_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        ranks = [0] * self.world_size
        total = 0
        for p in self.params:
            if p.tied_to is not None:
                continue
            total += p.global_bytes
            for r in range(self.world_size):
                ranks[r] += p.rank_bytes(r)
        object.__setattr__(self, "rank_param_bytes", tuple(ranks))
        object.__setattr__(self, "total_param_bytes", total)

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


@dataclass(frozen=True)
class ModuleFacts:
    """What the checks need to know about one module of the meta model.

    Attributes:
        type (`str`): class name.
        in_features (`int`, *optional*), out_features (`int`, *optional*): the logical sizes of a linear layer, also
            when a quantizer stores its weight packed or transposed.
        head_dim (`int`, *optional*): for attention modules.
        is_transposed (`bool`, *optional*), is_concatenated (`bool`, *optional*): for fused experts modules, the
            layout flags transformers' experts integration reads (`[E, in, out]` storage; `[gate; up]` concatenated
            rather than interleaved).
    """

    type: str
    in_features: int | None = None
    out_features: int | None = None
    head_dim: int | None = None
    is_transposed: bool | None = None
    is_concatenated: bool | None = None


@dataclass(frozen=True)
class ParamGroup:
    """Parameters sharing one generic name (layer and expert indices -> `*`), as the report's table shows them."""

    generic_name: str
    count: int
    global_shape: tuple[int, ...]
    dtype: str
    style: str | None
    rule: str | None
    placement: str
    sharding: Sharding
    local_shape_rank0: tuple[int, ...]
    local_shape_last: tuple[int, ...]
    total_bytes: int
    rank_bytes: tuple[int, ...]
    module_type: str
    origin: ParamOrigin
    tied_to: str | None = None

    @property
    def worst_rank_bytes(self) -> int:
        return max(self.rank_bytes) if self.rank_bytes else 0


# ----------------------------------------------------------------------------------------------------------------------
# Findings and the report
# ----------------------------------------------------------------------------------------------------------------------
Severity = Literal["error", "warning", "note"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "note": 2}


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
    """

    code: str
    kind: str
    severity: Severity
    target: str
    message: str
    fix: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

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
        severity (`str`, *optional*): the severity of the finding about it (`None` for norms, biases, vectors).
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


REPORT_SCHEMA = "tpaudit/check/v1"


@dataclass(frozen=True)
class Report:
    """Everything `tpaudit check` knows about one model at one (tp_size, ep_size): the object every renderer draws and
    `tpaudit.check()` returns. `to_json()` is the versioned contract (`tpaudit/check/v1`).

    Attributes:
        model (`dict`): provenance: `ref`, `kind`, `repo_id`, `revision`, `commit`, `model_type`, `architecture`,
            `dtype`, `config_only`, `checkpoint_tensor_count`, `checkpoint_bytes`.
        shard_map (`ShardMap`): every parameter on every rank.
        groups (`tuple[ParamGroup, ...]`): parameters grouped by generic name, in model order.
        replicated (`tuple[ReplicatedFamily, ...]`): families no rule shards, largest first.
        unused_rules (`tuple[str, ...]`): full rule keys that match nothing.
        findings (`tuple[Finding, ...]`): sorted by severity, code, target.
        plan (`dict`): `tp_rules`, `ep_rules`, `override`, `injected_rules`, `dropped_tp_rules`, `text_prefix`.
        notes (`tuple[str, ...]`): how the input was read (config only, quantizer fallback, casts).
        versions (`dict[str, str]`): tpaudit, transformers, torch, huggingface_hub.
        extra (`dict`): further sections (e.g. `kv_cache`), serialised as they are.
    """

    model: dict[str, Any]
    shard_map: ShardMap
    groups: tuple[ParamGroup, ...]
    replicated: tuple[ReplicatedFamily, ...]
    unused_rules: tuple[str, ...]
    findings: tuple[Finding, ...]
    plan: dict[str, Any]
    notes: tuple[str, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    schema: str = REPORT_SCHEMA

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

    def to_json(self) -> dict[str, Any]:
        """The `tpaudit/check/v1` JSON object (all sizes in bytes, as integers)."""
        sm = self.shard_map
        return {
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
            "summary": {"errors": self.count("error"), "warnings": self.count("warning"), "notes": self.count("note")},
            "params": [_group_json(g) for g in self.groups],
            "plan": self.plan,
            "notes": list(self.notes),
            **self.extra,
        }


def _group_json(g: ParamGroup) -> dict[str, Any]:
    out = {"name": g.generic_name, "count": g.count, "shape": list(g.global_shape), "dtype": g.dtype,
           "style": g.style, "rule": g.rule, "placement": g.placement, "sharding": g.sharding,
           "local_shape": list(g.local_shape_rank0), "local_shape_last_rank": list(g.local_shape_last),
           "bytes": g.total_bytes, "rank_bytes": list(g.rank_bytes), "origin": g.origin}
    if g.tied_to:
        out["tied_to"] = g.tied_to
    return out
