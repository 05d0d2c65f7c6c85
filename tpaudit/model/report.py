"""The report and its typed sections (each optional); `Report.to_json()` is the `tpaudit/check/v1` contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .evidence import ParityResult
from .findings import Finding, ReplicatedFamily
from .load import LoadSection
from .shards import ParamGroup, ShardMap


@dataclass(frozen=True)
class KVCacheSection:
    """The KV cache a rank holds per token, layer by layer (see `shard/kvcache.py`).

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
    """`--suggest`: proposed rules, re-simulated (see `plan/suggest.py`).

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
        tp_size (`int`, *optional*), ep_size (`int`, *optional*): the sizes of the proposed configuration.
        expert_parallel (`dict`, *optional*): when the proposal changes the ep size: `ep_size`, the rule keys of the
            routed experts it splits by expert (`families`) and `why`.
        clean (`bool`, *optional*): the proposal's re-check (load stage and parity included) has no error; only
            then is `snippet` set (and printed).
        fixed (`dict[str, int]`): error findings of the checked option the proposal no longer has, by code.
        remaining_why (`list[str]`): each remaining error finding with its message (`CODE target: message`).
    """

    rules: dict[str, str]
    removed: list[str]
    unresolved: list[str]
    voters: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any] | None = None
    plan: dict[str, str] | None = None
    snippet: str | None = None
    new_errors: list[dict[str, Any]] = field(default_factory=list)
    remaining_errors: list[str] = field(default_factory=list)
    tp_plan_override: dict[str, str] = field(default_factory=dict)
    tp_size: int | None = None
    ep_size: int | None = None
    expert_parallel: dict[str, Any] | None = None
    clean: bool | None = None
    fixed: dict[str, int] = field(default_factory=dict)
    remaining_why: list[str] = field(default_factory=list)

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
    parity: ParityResult | None = None
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
