"""The data model: what flows from one stage to the next.

    ModelSource -> BuiltModel (+ facts) -> ResolvedPlan -> ShardMap -> list[Finding] -> Report -> renderer

Frozen dataclasses only; nothing here imports torch or transformers. Sizes are `int` bytes named `*_bytes`, counts
`*_count`, shapes `tuple[int, ...]`. Parameter names are runtime names (after the loader's renaming and merging); a
"generic" name has its layer/expert indices replaced by `*` as transformers'
`parallel_utils.replace_layer_number_by_wildcard` does (`compat.logic.generic_name`). On-disk names are
`checkpoint_name`. Every report section is a typed dataclass with `to_json()`; `Report.to_json()` is the
`tpaudit/check/v1` contract.

One package declares every stage's values, one module per stage (`source`, `sizes`, `shards`, `load`, `findings`,
`evidence`, `report`), so that no stage imports another stage's code to read its types. Import them from here.
"""

from __future__ import annotations

from ..compat._types import ModuleFacts, QuantizationInfo  # noqa: F401  (part of the data model)
from ..compat.logic import generic_name  # noqa: F401  (re-exported)
from .evidence import (  # noqa: F401
    PARITY_TOLERANCE,
    VERDICT_KINDS,
    VERDICT_STATUSES,
    ParityResult,
    RuleVerdict,
    SplitOutput,
)
from .findings import (  # noqa: F401
    SEVERITY_ORDER,
    Finding,
    FindingSubject,
    FixOption,
    Location,
    ReplicatedFamily,
    Severity,
    why_unsharded,
)
from .load import LoadFamily, LoadIssue, LoadIssueKind, LoadSection  # noqa: F401
from .report import REPORT_SCHEMA, BaselineSection, KVCacheSection, Report, SuggestionSection  # noqa: F401
from .shards import ModuleFamily, ParamGroup, ParamOrigin, ParamShard, Sharding, ShardMap  # noqa: F401
from .sizes import MAX_WORLD_SIZE, ParallelSizes  # noqa: F401
from .source import (  # noqa: F401
    SAFETENSORS_DTYPE_BITS,
    SAFETENSORS_DTYPE_BYTES,
    CheckpointTensor,
    ModelSource,
    SourceKind,
    checkpoint_tensors,
    total_bytes,
)
