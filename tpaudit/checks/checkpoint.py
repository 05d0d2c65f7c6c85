"""TPA3xx: the checkpoint against the model: tensors that load into nothing, parameters nothing loads."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..model import Finding, generic_name  # noqa: F401
from .registry import CheckContext, rule


@rule("TPA301", "unmapped_checkpoint_tensor", severity="warning")
def check_unmapped_checkpoint_tensor(ctx: CheckContext) -> Iterable[Finding]:
    """A checkpoint tensor that maps to no parameter of the model.

    **What it detects**
    After the loader's own renaming (`conversion_mapping`, base-model prefix), a checkpoint key that names no
    parameter and no module of the runtime model, so `from_pretrained` reports it as unexpected and drops it.

    **Why it matters**
    No plan rule can shard what is never loaded, and its bytes are not on any rank; often it is a part of the
    published model that transformers does not implement (DeepSeek-V3's multi-token-prediction layer 61: 1,564
    tensors, 14.36 GiB),
    or a sign that the checkpoint belongs to another model class or revision.

    **Example**
    `model.layers.61.eh_proj.weight` in DeepSeek-V3, whose `DeepseekV3ForCausalLM` has 61 layers (0-60).

    **Fix**
    Nothing to do for TP if the part is unused at inference; otherwise load the model class that has it, or check
    the checkpoint revision.

    **References**
    transformers `core_model_loading.py` (`rename_source_key`, unexpected keys).
    """
    mapping = ctx.mapping
    if mapping is None or not mapping.unmapped:
        return
    groups = defaultdict(list)
    for tensor, renamed in mapping.unmapped:
        groups[_missing_root(ctx, renamed)].append((tensor, renamed))
    for root, members in sorted(groups.items()):
        total = sum(t.nbytes for t, _ in members)
        first = members[0][0]
        target = first.name if len(members) == 1 else f"{root}.*"
        yield Finding(
            code="TPA301", kind="unmapped_checkpoint_tensor", severity="warning", target=target,
            message=(f"{len(members)} checkpoint tensor(s) under `{root}` ({ctx.size(total)}, e.g. `{first.name}`) "
                     f"map to no parameter of {ctx.architecture}: `{root}` does not exist in the model, so the loader "
                     "drops them"),
            fix="Check that the checkpoint matches the model class; ignore if the part is unused at inference",
            facts={"count": len(members), "bytes": total, "root": root,
                   "examples": [t.name for t, _ in members[:5]]})


def _missing_root(ctx: CheckContext, renamed: str) -> str:
    """The shortest prefix of `renamed` that is not a module of the model (`model.layers.61`, `mtp`); the full
    name when every module on the path exists (a tensor the module does not have)."""
    parts = renamed.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if prefix not in ctx.modules:
            return prefix
    return renamed


@rule("TPA302", "missing_checkpoint_tensor", severity="warning")
def check_missing_checkpoint_tensor(ctx: CheckContext) -> Iterable[Finding]:
    """A model parameter that no checkpoint tensor loads.

    **What it detects**
    A parameter of the runtime model (not a tied copy) that none of the checkpoint's tensors maps to after the
    loader's renaming, so `from_pretrained` initialises it at random and warns.

    **Why it matters**
    Its bytes are counted on the ranks, but its values are not the published weights: a wrong revision, a missing
    shard, or a renamed module.

    **Example**
    A checkpoint saved before a module rename whose conversion mapping does not cover it.

    **Fix**
    Check the checkpoint revision and the model class; re-save the checkpoint with the current transformers.

    **References**
    transformers `core_model_loading.py` (missing keys).
    """
    mapping = ctx.mapping
    if mapping is None or not mapping.missing:
        return
    groups = defaultdict(list)
    for name in mapping.missing:
        groups[generic_name(name)].append(name)
    for generic, names in sorted(groups.items()):
        yield Finding(
            code="TPA302", kind="missing_checkpoint_tensor", severity="warning", target=generic,
            message=f"{len(names)} parameter(s) `{generic}` have no checkpoint tensor: the loader initialises them",
            fix="Check the checkpoint revision and the model class",
            facts={"count": len(names), "example": names[0]})
