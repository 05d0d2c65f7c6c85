"""TPA3xx: the checkpoint against the model: tensors that load into nothing, parameters nothing loads."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..model import Finding, generic_name, total_bytes
from .registry import CheckContext, rule


@rule("TPA301", "unmapped_checkpoint_tensor", severity="warning", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="checkpoint")
def check_unmapped_checkpoint_tensor(ctx: CheckContext) -> Iterable[Finding]:
    """A checkpoint tensor that maps to no parameter of the model.

    **What it detects**
    After the loader's own renaming (`conversion_mapping`, base-model prefix), a checkpoint key that names no
    parameter of the runtime model, so `from_pretrained` reports it as unexpected and drops it: a part the model
    class does not implement, or a stray tensor (a `q_proj.bias` in a bias-free model). Such tensors are never added
    to the model (only the quantization tensors of a quantized checkpoint whose quantizer cannot run here are), so
    they change no byte count.

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
    # one finding per family of missing roots: per-layer, per-expert roots (`layers.3.mlp.experts.7`) group under
    # their generic name, so 23,040 unmapped experts are one finding, not 23,040
    groups = mapping.unmapped_by_root(ctx.modules)
    missing_modules = mapping.generic_missing_modules
    explained = _explained_by_quant_config(ctx)
    for generic, members in sorted(groups.items()):
        members = [(t, r) for t, r in members if t.name not in explained]
        if not members:
            continue
        total = total_bytes([t for t, _ in members])
        first, root = members[0]
        roots = sorted({r for _, r in members})
        if len(members) == 1:
            target = first.name
        elif len(roots) == 1:
            target = f"{root}.*"
        else:
            target = f"{generic}.*"
        where = f"`{roots[0]}`" if len(roots) == 1 else f"{len(roots):,} parts like `{generic}`"
        yield Finding(
            code="TPA301", kind="unmapped_checkpoint_tensor", severity="warning", target=target,
            message=(f"{len(members):,} checkpoint tensor(s) under {where} ({ctx.size(total)}, e.g. `{first.name}`) "
                     f"map to no parameter of {ctx.architecture}: "
                     f"{where + ' does not exist' if len(roots) == 1 else 'none of these parts exists'} in the "
                     "model, so the loader drops them"),
            fix=("These tensors sit in a module whose parameters have no checkpoint tensor (TPA302): they are likely "
                 "those parameters in a stored form that is not mapped here (a quantization format whose quantizer "
                 "cannot run here, or a layout the loader converts); the bytes of those parameters are the "
                 "model dtype's" if generic.rsplit(".", 1)[0] in missing_modules else
                 "Check that the checkpoint matches the model class; ignore if the part is unused at inference"),
            facts={"count": len(members), "bytes": total, "root": roots[0] if len(roots) == 1 else generic,
                   "roots": len(roots), "examples": [t.name for t, _ in members[:5]]})


@rule("TPA302", "missing_checkpoint_tensor", severity="warning", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="checkpoint")
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
    explained = {m for items in mapping.stored_unquantized.values() for _, ms in items for m in ms} \
        if _explained_by_quant_config(ctx) else set()
    for name in mapping.missing:
        if name in explained:
            continue  # TPA204: the quantization config, not the checkpoint, is what is wrong there
        groups[generic_name(name)].append(name)
    # the checkpoint's unmapped tensors under the same module may be these parameters in a form the loader (or
    # tpaudit's quantization fallback) does not map, e.g. per-expert packed int4 next to fused experts
    unmapped_under = mapping.generic_unmapped_modules
    for generic, names in sorted(groups.items()):
        module = generic.rsplit(".", 1)[0]
        stored_elsewhere = any(u == module or u.startswith(module + ".") for u in unmapped_under)
        message = f"{len(names)} parameter(s) `{generic}` have no checkpoint tensor: the loader initialises them"
        if stored_elsewhere:
            message += (f"; unmapped checkpoint tensors under `{module}` (TPA301) may be their stored form, so their "
                        "bytes here are the parameters' own dtype and shape, not the checkpoint's")
        yield Finding(
            code="TPA302", kind="missing_checkpoint_tensor", severity="warning", target=generic, message=message,
            fix="Check the checkpoint revision and the model class",
            facts={"count": len(names), "example": names[0], "unmapped_tensors_under_module": stored_elsewhere})


@rule("TPA303", "checkpoint_shape_mismatch", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="checkpoint")
def check_checkpoint_shape_mismatch(ctx: CheckContext) -> Iterable[Finding]:
    """A checkpoint tensor whose shape, after the loader's conversions, is not its parameter's.

    **What it detects**
    The checkpoint's tensors for a parameter, run through transformers' own conversion ops (per-expert merges,
    transposes) on meta tensors, give a shape other than the one the config builds: the classic "I edited
    config.json, the checkpoint is the old one". `from_pretrained` stops on it ("size mismatch", unless
    `ignore_mismatched_sizes`).

    **Why it matters**
    The model cannot load as configured, and every byte and shard the report predicts is for a model that does not
    match its weights: `tpaudit verify` would fail on the same input.

    **Example**
    `config.json` says `intermediate_size: 14336` while the checkpoint's `mlp.gate_proj.weight` is `[11008, 4096]`.

    **Fix**
    Restore the config that matches the checkpoint (or re-save the checkpoint from the model the config describes).

    **References**
    transformers `core_model_loading.py` (`set_param_for_module`: mismatched keys).
    """
    mapping = ctx.mapping
    if mapping is None or not mapping.shape_mismatches:
        return
    by_family = defaultdict(list)
    for m in mapping.shape_mismatches:
        by_family[generic_name(m.name)].append(m)
    for family, items in sorted(by_family.items()):
        m = items[0]
        yield Finding(
            code="TPA303", kind="checkpoint_shape_mismatch", severity="error", target=family,
            message=(f"`{family}`: the checkpoint gives shape {list(m.checkpoint_shape)} (from `{m.checkpoint_names[0]}`"
                     f"{' and more' if len(m.checkpoint_names) > 1 else ''}) but the config builds "
                     f"{list(m.model_shape)}; from_pretrained stops with a size mismatch"),
            fix="Use the config.json that matches this checkpoint",
            facts={"checkpoint_shape": list(m.checkpoint_shape), "model_shape": list(m.model_shape),
                   "example": m.checkpoint_names[0]})


def _explained_by_quant_config(ctx: CheckContext) -> set[str]:
    """Checkpoint names TPA204 reports (modules the quantization config quantizes but the checkpoint stores plain)."""
    mapping = ctx.mapping
    if ctx.quantization is None or not ctx.quantization.ran:
        return set()
    return {t.name for items in mapping.stored_unquantized.values() for t, _ in items}
