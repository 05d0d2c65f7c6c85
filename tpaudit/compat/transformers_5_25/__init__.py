"""The seam for the transformers 5.25 release line (5.25.x): the 5.23 line's calls, with what 5.25 changed.

What 5.25.0 changed that tpaudit calls or reports (read in its `distributed/`, `modeling_utils.py` and
`configuration_*.py`):

- `PreTrainedModel.get_init_context(dtype, is_quantized, _is_ds_init_called, allow_all_kernels, config)`: the config
  brings the fusion patches of its `fusion_config`; the meta model is built under the same contexts (`init_contexts`).
- Every style's `shard_param` / `install_forward` takes keyword-only `config` and `mesh_manager`;
  `apply_tensor_parallelism` reads `model._mesh_manager`, which `maybe_distribute_model` sets: tpaudit calls
  `maybe_distribute_model` itself, so nothing changes in `shard`, and the model is restored afterwards as before.
- New styles `unit_colwise` / `unit_rowwise`: whole attention heads per rank on a 2-D `(units, replicas)` view of the
  TP mesh (`TransformersDeviceMesh.get_unit_mesh`), heads duplicated when there are fewer than ranks. Their local
  shapes are read on that 2-D mesh like any DTensor's (`plans._coordinate`).
- `moe_identity_expert` is gone (a plan naming it is refused by `_validate_parallel_plan`); `moe_tp_experts` is
  deprecated, removal announced for 5.28 (`apply_tensor_parallelism` warns): `deprecated_styles`.
- `DistributedConfig(tp_plan={})` with `tp_size > 1` is accepted (expert parallelism alone across the ranks).
- The routed experts left the `base_model_tp_plan` of 69 MoE config classes: they are split by the EP plan alone.
  Nothing in the seam changes for that; the checks report it (TPA001 names the EP plan that would split them).
- `from_pretrained` uses Hub kernels by default (`use_kernels`): tpaudit's real loads pass `use_kernels=False`
  (accepted since 5.23) so that the forward is transformers' own and nothing is fetched.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .._probe import Capability
from .._types import Config, ModelClass, TorchDtype
from ..styles import MOE_IDENTITY_EXPERT, MOE_TP_EXPERTS, UNIT_COLWISE, UNIT_ROWWISE, StyleVocabulary
from ..transformers_5_23 import Transformers523

# The capabilities whose signature 5.25 changed, by name: the 5.23 line's entries are replaced, the others kept.
_CHANGED = (
    Capability("transformers", "PreTrainedModel.get_init_context",
               ("dtype", "is_quantized", "_is_ds_init_called", "allow_all_kernels", "config")),
)
_ADDED = (
    Capability("transformers.distributed.utils", "TransformersDeviceMesh.get_unit_mesh", ("unit_number",)),
    Capability("transformers.distributed.tensor_parallel", "UnitColwiseParallel"),
    Capability("transformers.distributed.tensor_parallel", "UnitRowwiseParallel"),
)


class StyleVocabulary525(StyleVocabulary):
    """5.25's styles: `unit_colwise` / `unit_rowwise` added (`UnitColwiseParallel` / `UnitRowwiseParallel`, kin of
    `ColwiseParallel` / `RowwiseParallel` on the unit mesh; in no family of the 5.23 line's), `moe_identity_expert` gone
    (`MoeIdentityParallel` removed: the loader refuses it), `moe_tp_experts` deprecated (removal announced for 5.28).

    Source: transformers 5.25 `distributed/tensor_parallel.py` (`ALL_PARALLEL_STYLES`)."""

    LINE = "5.25"
    REGISTERED = (StyleVocabulary.REGISTERED - {MOE_IDENTITY_EXPERT}) | {UNIT_COLWISE, UNIT_ROWWISE}
    REFUSED = frozenset({MOE_IDENTITY_EXPERT})
    DEPRECATED = frozenset({MOE_TP_EXPERTS})
    EXPLICIT_REPLICATE = StyleVocabulary.EXPLICIT_REPLICATE - {MOE_IDENTITY_EXPERT}


def _capabilities() -> tuple[Capability, ...]:
    changed = {c.path: c for c in _CHANGED}
    return tuple(changed.get(c.path, c) for c in Transformers523.CAPABILITIES) + _ADDED


class Transformers525(Transformers523):
    """transformers 5.25.x on torch 2.13-2.14 (see the module's docstring for what differs from 5.23/5.24)."""

    LINE: ClassVar[str] = "5.25"
    TESTED_RELEASES: ClassVar[tuple[str, ...]] = ("5.25",)
    SUPPORTED: ClassVar[str] = ">=5.25,<5.26"
    CAPABILITIES: ClassVar[tuple[Capability, ...]] = _capabilities()
    STYLES: ClassVar[type[StyleVocabulary]] = StyleVocabulary525

    def init_contexts(self, cls: ModelClass, dtype: TorchDtype, is_quantized: bool, config: Config) -> list[Any]:
        """The context managers `from_pretrained` builds a model under, the config's fusion patches included.

        Source: transformers 5.25 `PreTrainedModel.get_init_context(..., config)` (`fusion_config` ->
        `apply_patches(get_fusion_patch_mapping(...))`), as `from_pretrained` calls it."""
        return list(cls.get_init_context(dtype, is_quantized, False, None, config))

    def deprecated_styles(self) -> dict[str, str]:
        """Styles the installed release still applies but has announced the removal of, with its advice.

        Source: transformers 5.25 `tensor_parallel.apply_tensor_parallelism` (the `moe_tp_experts` warning)."""
        return {MOE_TP_EXPERTS: "deprecated in transformers 5.25 (removal announced for 5.28): split the experts "
                                  "by expert parallelism (the model's EP plan, `ep_size`) instead"}

    def removed_styles(self) -> dict[str, str]:
        """Styles earlier releases registered that the installed one refuses (`_validate_parallel_plan`), with why.

        Source: transformers 5.25 `distributed/tensor_parallel.py` (`MoeIdentityParallel` and its registration are
        gone; longcat_flash's plan dropped its `identity_expert` rule with its expert TP rules)."""
        return {MOE_IDENTITY_EXPERT: "transformers 5.25 removed it (it pre-divided LongCat-Flash's identity experts "
                                       "for the experts' TP split, which 5.25 replaced by expert parallelism): drop "
                                       "the rule and split the experts with --ep"}
