"""Parallel style names: the keys of transformers' `ALL_PARALLEL_STYLES`, and the groups tpaudit reasons with.

This module is the only place a style name is written (a test fails on a style literal anywhere else in tpaudit).
Each name is a constant with the transformers class it registers (`distributed/tensor_parallel.py` and
`distributed/expert_parallel.py`, which fill `distributed.parallel_utils.ALL_PARALLEL_STYLES` at import). The groups
live on a vocabulary class per release line (`StyleVocabulary` for 5.23.x / 5.24.x); a line that adds, removes or
regroups styles subclasses it, overrides the sets that differ, and sets its backend's `STYLES` to the subclass. The
rest of tpaudit asks the predicates below (`is_split_output(style)`, ...), which read the vocabulary of the release
line in use (`vocabulary()`).

Example:
```python
from tpaudit.compat.styles import COLWISE, PACKED_COLWISE, is_split_output

rule = {"layers.*.mlp.experts.gate_up_proj": PACKED_COLWISE}
assert is_split_output(COLWISE) and is_split_output(PACKED_COLWISE)
```
"""

from __future__ import annotations

from typing import Any, ClassVar

# ----------------------------------------------------------------------------------------------------------------------
# Names. Source: transformers 5.23-5.25 `distributed/tensor_parallel.py` and `distributed/expert_parallel.py`
# (`ALL_PARALLEL_STYLES[name] = Class(...)`); the class each name registers is in its comment.
# ----------------------------------------------------------------------------------------------------------------------
# The colwise family: `ColwiseParallel` and kin wrap a linear weight in `Shard(ndim - 2)` (output features)
COLWISE = "colwise"                                  # ColwiseParallel(): the output stays split across the ranks
COLWISE_GATHER_OUTPUT = "colwise_gather_output"      # ColwiseParallel(gather_output=True): output gathered to whole
COLWISE_REP = "colwise_rep"                          # ColwiseParallel(gather_output=True): output replicated
PACKED_COLWISE = "packed_colwise"                    # PackedColwiseParallel: `_StridedShard(split_factor=2)`
UNIT_COLWISE = "unit_colwise"                        # UnitColwiseParallel (5.25+): whole heads per rank, duplicated
# The rowwise family: `RowwiseParallel` and kin wrap it in `Shard(-1)` (input features; bias replicated)
ROWWISE = "rowwise"                                  # RowwiseParallel(): its input arrives split, output all-reduced
ROWWISE_SPLIT_INPUT = "rowwise_split_input"          # RowwiseParallel(split_input=True): splits a whole input first
ROWWISE_REP = "rowwise_rep"                          # RowwiseParallel(...): output replicated
PACKED_ROWWISE = "packed_rowwise"                    # PackedRowwiseParallel: `_StridedShard(split_factor=2)`
UNIT_ROWWISE = "unit_rowwise"                        # UnitRowwiseParallel (5.25+): whole heads per rank
# Embeddings
EMBEDDING_ROWWISE = "embedding_rowwise"              # EmbeddingParallel(embedding_dim_sharding=0): vocabulary rows
EMBEDDING_COLWISE = "embedding_colwise"              # EmbeddingParallel(embedding_dim_sharding=1): hidden columns
EMBEDDING_PREFIX = "embedding"                       # every embedding style's name starts with it
# Styles whose `shard_param` keeps the parameters whole
REPLICATE = "replicate"                              # TensorParallelLayer (the base class: no sharding at all)
REPLICATED_WITH_GRAD_ALLREDUCE = "replicated_with_grad_allreduce"  # ReplicatedWithGradAllReduce
SEQUENCE_PARALLEL = "sequence_parallel"              # SequenceParallel
MLA_KV_A_PROJ = "mla_kv_a_proj"                      # MlaKvAProjParallel
ALL_REDUCE = "all_reduce"                            # AllReduceParallel
MOE_IDENTITY_EXPERT = "moe_identity_expert"          # MoeIdentityParallel (gone in 5.25: the loader refuses it)
# Experts
MOE_TP_EXPERTS = "moe_tp_experts"                    # MoeExpertsParallel (deprecated in 5.25, removal announced 5.28)
LOCAL_PARAMS = "local_params"                        # LocalParamsParallel
GROUPED_GEMM = "grouped_gemm"                        # MoEParamShard (expert_parallel.py): experts split by index
EP_DISPATCH_EXPERTS = "ep_dispatch_experts"          # EpDispatchExpertsParallel (expert_parallel.py)

# A one-rule plan as JSON text, for error messages that show what a plan looks like
EXAMPLE_PLAN_JSON = f'{{"layers.*.self_attn.q_proj": "{COLWISE}"}}'


class StyleVocabulary:
    """The styles of the 5.23 release line (transformers 5.23.x and 5.24.x register the same 20), grouped by meaning.

    A later line subclasses this and overrides the sets that differ (`REGISTERED`, `REFUSED`, `DEPRECATED`, a family
    that gains a member); the sets derived from others are spelled out per class, so an override is explicit.

    Attributes:
        REGISTERED (`frozenset[str]`): every key of the release's `ALL_PARALLEL_STYLES` (pinned by a test).
        REFUSED (`frozenset[str]`): names an earlier line registered that this release's loader refuses.
        DEPRECATED (`frozenset[str]`): names the release still runs but warns about.
        SPLIT_OUTPUT (`frozenset[str]`): split a module's output along `out_features` and leave it split
            (`ColwiseParallel()`, `PackedColwiseParallel`): the model's forward sees one part per rank.
        GATHERED_OUTPUT (`frozenset[str]`): colwise styles whose output is made whole again on every rank.
        COLWISE_FAMILY (`frozenset[str]`): every style that shards a linear weight's output features.
        ROWWISE_FAMILY (`frozenset[str]`): every style that shards a linear weight's input features.
        LAST_DIM (`frozenset[str]`): parameter styles that shard the last dimension (`RowwiseParallel`,
            `PackedRowwiseParallel`); on an `[E, in, out]` experts tensor (gpt-oss) that is the output dimension.
        EMBEDDING (`frozenset[str]`): `EmbeddingParallel` styles.
        OWN_SPLIT (`frozenset[str]`): styles that shard a module's own weight and wrap its input/output: when such a
            module diverges while its input still matches, its own rule is the wrong one.
        NO_OP (`frozenset[str]`): styles that neither shard nor change the forward's values (`replicate` is what the
            parity check's repairs write).
        EXPLICIT_REPLICATE (`frozenset[str]`): styles whose `shard_param` is a no-op: a rule with one of them is an
            explicit replication, not a gap in the plan (`moe_tp_experts`, `local_params` are not among them: their
            parameters need rules of their own).
        EXPERTS_MODULE (`frozenset[str]`): styles for an experts container module (its parameters have their own
            rules).
    """

    LINE: ClassVar[str] = "5.23"
    REGISTERED: ClassVar[frozenset[str]] = frozenset({
        COLWISE, COLWISE_GATHER_OUTPUT, COLWISE_REP, PACKED_COLWISE, ROWWISE, ROWWISE_SPLIT_INPUT, ROWWISE_REP,
        PACKED_ROWWISE, EMBEDDING_ROWWISE, EMBEDDING_COLWISE, REPLICATE, REPLICATED_WITH_GRAD_ALLREDUCE,
        SEQUENCE_PARALLEL, MLA_KV_A_PROJ, ALL_REDUCE, MOE_IDENTITY_EXPERT, MOE_TP_EXPERTS, LOCAL_PARAMS, GROUPED_GEMM,
        EP_DISPATCH_EXPERTS})
    REFUSED: ClassVar[frozenset[str]] = frozenset()
    DEPRECATED: ClassVar[frozenset[str]] = frozenset()
    SPLIT_OUTPUT: ClassVar[frozenset[str]] = frozenset({COLWISE, PACKED_COLWISE})
    GATHERED_OUTPUT: ClassVar[frozenset[str]] = frozenset({COLWISE_GATHER_OUTPUT, COLWISE_REP})
    COLWISE_FAMILY: ClassVar[frozenset[str]] = frozenset({COLWISE, PACKED_COLWISE, COLWISE_REP, COLWISE_GATHER_OUTPUT})
    ROWWISE_FAMILY: ClassVar[frozenset[str]] = frozenset({ROWWISE, PACKED_ROWWISE, ROWWISE_REP, ROWWISE_SPLIT_INPUT})
    LAST_DIM: ClassVar[frozenset[str]] = frozenset({ROWWISE, PACKED_ROWWISE})
    EMBEDDING: ClassVar[frozenset[str]] = frozenset({EMBEDDING_ROWWISE, EMBEDDING_COLWISE})
    OWN_SPLIT: ClassVar[frozenset[str]] = COLWISE_FAMILY | ROWWISE_FAMILY | EMBEDDING
    NO_OP: ClassVar[frozenset[str]] = frozenset({REPLICATE, REPLICATED_WITH_GRAD_ALLREDUCE})
    EXPLICIT_REPLICATE: ClassVar[frozenset[str]] = frozenset({
        REPLICATE, REPLICATED_WITH_GRAD_ALLREDUCE, SEQUENCE_PARALLEL, MLA_KV_A_PROJ, ALL_REDUCE, MOE_IDENTITY_EXPERT})
    EXPERTS_MODULE: ClassVar[frozenset[str]] = frozenset({MOE_TP_EXPERTS, EP_DISPATCH_EXPERTS})


def vocabulary() -> type[StyleVocabulary]:
    """The style vocabulary of the release line in use (`backend().STYLES`; the backend is probed once per process,
    and every caller of these predicates simulates with it anyway).

    Raises:
        UnsupportedVersionError: the installed transformers has no release line (see `compat.backend`).
    """
    global _COMPAT
    if _COMPAT is None:
        import tpaudit.compat as compat  # the package; it does not import this module

        _COMPAT = compat
    active = _COMPAT._ACTIVE
    styles: type[StyleVocabulary] = (active if active is not None else _COMPAT.backend()).STYLES
    return styles


_COMPAT: Any = None  # `tpaudit.compat`, once `vocabulary()` first ran (a predicate may run once per parameter)


# ----------------------------------------------------------------------------------------------------------------------
# Predicates (each reads `vocabulary()`; `None` is no style and answers False)
# ----------------------------------------------------------------------------------------------------------------------
def is_split_output(style: str | None) -> bool:
    """The style splits the module's output and leaves it split (`colwise`, `packed_colwise`)."""
    return style in vocabulary().SPLIT_OUTPUT


def is_colwise_family(style: str | None) -> bool:
    """The style shards a linear weight's output features (split or gathered afterwards)."""
    return style in vocabulary().COLWISE_FAMILY


def is_rowwise_family(style: str | None) -> bool:
    """The style shards a linear weight's input features (`rowwise`, `packed_rowwise`, `rowwise_rep`, ...)."""
    return style in vocabulary().ROWWISE_FAMILY


def is_rowwise_named(style: str | None) -> bool:
    """The style's name starts with `rowwise` (`rowwise`, `rowwise_split_input`, `rowwise_rep`): a `RowwiseParallel`
    that expects a split input unless told to split it."""
    return bool(style) and str(style).startswith(ROWWISE)


def shards_last_dim(style: str | None) -> bool:
    """A parameter rule with this style shards the parameter's last dimension (`RowwiseParallel`,
    `PackedRowwiseParallel`)."""
    return style in vocabulary().LAST_DIM


def is_embedding_style(style: str | None) -> bool:
    """An `EmbeddingParallel` style (`embedding_rowwise`, `embedding_colwise`)."""
    return bool(style) and str(style).startswith(EMBEDDING_PREFIX)


def is_own_split(style: str | None) -> bool:
    """The style shards the module's own weight and wraps its input or output (see `StyleVocabulary.OWN_SPLIT`)."""
    return style in vocabulary().OWN_SPLIT


def is_no_op(style: str | None) -> bool:
    """The style neither shards nor changes the forward (`replicate`, `replicated_with_grad_allreduce`)."""
    return style in vocabulary().NO_OP


def is_explicit_replicate(style: str | None) -> bool:
    """A rule with this style keeps its parameters whole on purpose (see `StyleVocabulary.EXPLICIT_REPLICATE`)."""
    return style in vocabulary().EXPLICIT_REPLICATE


def is_experts_module_style(style: str | None) -> bool:
    """A style for an experts container module (`moe_tp_experts`, `ep_dispatch_experts`)."""
    return style in vocabulary().EXPERTS_MODULE
