"""TPA2xx: quantized checkpoints under TP: metadata a rule shards although it carries no per-rank data (also when a
converter of the loader reads it), scales split to nothing, and shard widths that cut quantization groups or blocks.

The scheme comes from `quantization_config` (FP8 `weight_block_size`, AWQ/GPTQ `group_size` and `bits`,
compressed-tensors `config_groups`); the tensors from the checkpoint header. Alignment is judged on the logical axis a
style splits (colwise: output features, rowwise: input features), not on raw tensor dimensions: AWQ stores
`qweight` as `[in, out / 8]`, so transformers' `Shard(ndim - 2)` lands on its input rows.
"""

from __future__ import annotations

from typing import Iterable

from ..compat.styles import REPLICATE
from ..model import Finding, FindingSubject, FixOption
from ._shapes import OUT_STYLES, chunk, local_logical, quant_units
from .registry import CheckContext, rule


def _ranks(values: list[int]) -> str:
    return " / ".join(str(v) for v in values) if len(values) <= 8 else f"{values[0]} .. {values[-1]}"


@rule("TPA201", "quant_metadata_sharded", severity="error", breaks_forward=True, suggest="keep_whole",
      counts_replicated=False, fails_load=False)
def check_quant_metadata_sharded(ctx: CheckContext) -> Iterable[Finding]:
    """Quantization metadata that a rule shards although it carries no per-rank data.

    **What it detects**
    A module's rule applies to every parameter of the module (transformers falls back to the parent module's rule),
    so quantization tensors ride the weight's colwise/rowwise rule: compressed-tensors `weight_shape` (two ints: the
    logical `[out, in]`) is split 1/1/0/0 at tp 4; `weight_g_idx` (one group index per input feature) is split by a
    colwise rule although colwise keeps every input; per-tensor scales (one value) go to rank 0 only.

    **Why it matters**
    Ranks get an empty or partial `weight_shape` and cannot unpack their shard; for 3/5/6/7-bit weights the input
    size cannot even be recovered from the packed width. A split `g_idx` reorders the wrong inputs
    (huggingface/transformers#47956, follow-up to #47315).

    **Example**
    Llama-3.1-8B W4A16 (pack-quantized, group 128, `actorder: group`) at tp 4 with the shipped llama plan.

    **Fix**
    Give the metadata a `replicate` rule (`layers.*.self_attn.q_proj.weight_shape: replicate`, same for
    `weight_g_idx` under colwise rules), or have the quantizer's `update_parallel_plan` add them.

    **References**
    transformers `distributed/mixin.py` (`_expand_parallel_plan`), `quantizers/base.py` (`update_parallel_plan`).
    """
    world = ctx.shard_map.world_size
    if world <= 1:
        return
    scheme = ctx.facts.quant
    seen: dict = {}
    for unit in quant_units(ctx):
        for p in unit.members:
            if p.sharding != "sharded":
                continue
            leaf = p.name.rpartition(".")[2]
            numel = 1
            for d in p.global_shape:
                numel *= d
            if leaf.endswith("_shape"):
                why = (f"holds the logical [out, in] shape ({numel} ints) and is split "
                       f"{_ranks([s[0] if s else 1 for s in p.local_shapes])} across {world} ranks, so ranks get an "
                       "empty or partial shape")
                if scheme and not scheme.bits_divide_word:
                    why += f"; with {scheme.bits}-bit weights the input size cannot be recovered from the packed width"
            elif leaf.endswith("g_idx") and unit.style in OUT_STYLES:
                why = (f"indexes all {p.global_shape[-1]} input features, which `{unit.style}` keeps whole, but is "
                       f"split into {_ranks([s[-1] for s in p.local_shapes])}")
            elif numel < world and not leaf.endswith("g_idx"):
                why = f"has {numel} value(s) for {world} ranks: some ranks get none"
            else:
                continue
            seen.setdefault(p.generic_name, (p, why))
    for generic, (p, why) in sorted(seen.items()):
        yield Finding(
            code="TPA201", kind="quant_metadata_sharded", severity="error", target=generic,
            message=f"`{generic}` {why} (rule `{p.rule}: {p.style}`)",
            fix=f"Add rule `{ctx.relative_key(generic)}: {REPLICATE}`",
            fix_options=_keep_whole(ctx, generic), fix_fallback=_KEEP_WHOLE_FALLBACK,
            facts={"rule": p.rule, "style": p.style, "shape": list(p.global_shape),
                   "local_shapes": [list(s) for s in p.local_shapes]},
            subject=FindingSubject(rule_key=ctx.relative_key(generic), key_kind="parameter",
                                   families=(generic,)))
    yield from _lost_on_load(ctx, scheme)


_KEEP_WHOLE_FALLBACK = ("Keep the quantization metadata whole on every rank another way: the quantizer's "
                        "`update_parallel_plan`, or a checkpoint stored without it")


def _keep_whole(ctx: CheckContext, generic: str) -> tuple[FixOption, ...]:
    """The `replicate` rule for one metadata parameter, re-checked together with the report's other such rules (see
    `FixOption.together`)."""
    key = ctx.relative_key(generic)
    sizes = ctx.shard_map
    return (FixOption(label=f"Add rule `{key}: {REPLICATE}`", tp_size=sizes.tp_size, ep_size=sizes.ep_size,
                      plan_edits=((key, REPLICATE),), together=True),)


def _lost_on_load(ctx: CheckContext, scheme) -> Iterable[Finding]:
    """Metadata that is not a parameter but a checkpoint tensor a converter reads (the per-expert `weight_shape` of
    compressed-tensors experts merged into fused experts): the load simulation (`tpaudit.shard.load`) saw what each rank
    receives of it, and what the quantizer's operation made of the rank's pieces."""
    from ..units import ranks_text

    load = ctx.load
    if load is None:
        return
    by_family: dict[str, list] = {}
    for issue in load.issues:
        by_family.setdefault(issue.name, []).append(issue)
    for issue in load.issues:
        if issue.kind != "metadata_lost":
            continue
        member = next((q for q in ctx.shard_map.params if q.generic_name == issue.name), None)
        facts = ctx.module_of(member.name) if member is not None else None
        partial = [r for r, shape in issue.lost if 0 < _numel(shape)]
        empty = [r for r, shape in issue.lost if _numel(shape) == 0]
        got = []
        if partial:
            got.append(f"{ranks_text(partial)} get {_numel(issue.lost[0][1]) if issue.lost[0][0] in partial else 1} "
                       f"of its {_numel(issue.full_shape)} values")
        if empty:
            got.append(f"{ranks_text(empty)} get none")
        outcomes = []
        for other in by_family.get(issue.name, []):
            if other.kind == "raises" and other.stage == "convert":
                outcomes.append(f"`{other.op}` raises on {ranks_text(other.ranks)} (`{other.error}`)")
            elif other.kind == "shape":
                axis = -2 if facts is not None and facts.is_transposed else -1
                outcomes.append(f"on {ranks_text(other.ranks)} the input size rebuilt from the packed width is "
                                f"{other.local_shape[axis]}, the true one {other.expected_shape[axis]}")
        by_size: dict[tuple[int, int], list[int]] = {}
        for r, size, true in issue.rebuilt:
            by_size.setdefault((size, true), []).append(r)
        for (size, true), ranks in sorted(by_size.items()):
            verdict = "right" if size == true else "wrong"
            outcomes.insert(0, f"on {ranks_text(ranks)} the loader rebuilds the input size from the packed width: "
                               f"{size}, the true one {true} ({verdict})")
        rule_text = f" (rule `{member.rule}: {member.style}`)" if member is not None and member.rule else ""
        yield Finding(
            code="TPA201", kind="quant_metadata_sharded", severity="error", target=issue.source,
            message=(f"`{issue.source}` (the logical [out, in] of each stored weight, {_numel(issue.full_shape)} "
                     f"values) is read with the placement of `{issue.name}`{rule_text}: {'; '.join(got)}"
                     + (f"; {'; '.join(outcomes)}" if outcomes else "")),
            fix=(f"Keep `{ctx.relative_key(member.rule) if member is not None and member.rule else issue.name}` "
                 "whole, or store the checkpoint without per-expert metadata (decompressed or in the fused layout)"),
            facts={"parameter": issue.name, "ranks": list(issue.ranks), "full_shape": list(issue.full_shape or ()),
                   "local_shapes": {str(r): list(s) for r, s in issue.lost},
                   "rule": member.rule if member is not None else None})


def _numel(shape) -> int:
    n = 1
    for d in shape or ():
        n *= d
    return n


_SCALE_LEAVES = ("scales", "qzeros")
_SCALE_SUFFIXES = ("_scale", "_zero_point", "_global_scale")


def _is_scale(leaf: str) -> bool:
    """A scale or zero point: `weight_scale`, `weight_zero_point`, `weight_global_scale`, `input_scale`, AWQ/GPTQ
    `scales` / `qzeros`, `gate_up_proj_scale` (not FP8's block `weight_scale_inv`, whose blocks TPA202 judges)."""
    return leaf in _SCALE_LEAVES or leaf.endswith(_SCALE_SUFFIXES)


@rule("TPA203", "quant_scale_split", severity="error", breaks_forward=True, suggest="keep_whole",
      counts_replicated=False, fails_load=False)
def check_quant_scale_split(ctx: CheckContext) -> Iterable[Finding]:
    """A quantization scale or zero point split on an axis it does not vary along: some ranks get none of it.

    **What it detects**
    A module's rule applies to every parameter of the module, so a scale rides the weight's split. A per-channel
    scale is `[out, 1]` (compressed-tensors `weight_scale` with strategy `channel`): a rowwise rule shards the last
    axis, whose size is 1, so rank 0 gets `[out, 1]` and every other rank `[out, 0]` next to a non-empty `[out, in /
    tp_size]` weight shard. The same holds for zero points and for any scale whose split axis is shorter than the
    world.

    **Why it matters**
    The rank cannot dequantize its shard: a real 2-rank load of a W8A16 checkpoint gets `weight_scale [64, 0]` next
    to a `[64, 32]` weight, and dequantizing it raises (or, in a fused kernel, reads garbage). The load itself
    succeeds, so nothing fails until the first forward.

    **Example**
    A compressed-tensors W8A16 or FP8-dynamic checkpoint (per-channel scales) with `layers.*.self_attn.o_proj:
    rowwise` or `layers.*.mlp.down_proj: rowwise`.

    **Fix**
    Give the scale a `replicate` rule (`layers.*.self_attn.o_proj.weight_scale: replicate`): a per-output-channel
    scale belongs whole to every rowwise shard. Or keep the module whole.

    **References**
    transformers `distributed/mixin.py` (`_expand_parallel_plan`: a parameter falls back to its module's rule),
    compressed-tensors `QuantizationStrategy.CHANNEL` (`weight_scale` `[out, 1]`).
    """
    world = ctx.shard_map.world_size
    if world <= 1:
        return
    seen: set[str] = set()
    for unit in quant_units(ctx):
        weight = unit.weight
        for p in unit.members:
            leaf = p.name.rpartition(".")[2]
            if p is weight or p.generic_name in seen or not _is_scale(leaf) or p.sharding != "sharded":
                continue
            if p.shard_dim is None or p.global_shape[p.shard_dim] != 1 or _numel(p.global_shape) < world:
                continue  # a per-tensor scale (fewer values than ranks) is TPA201's
            empty = [r for r in range(world) if _numel(p.local_shapes[r]) == 0
                     and _numel(weight.local_shapes[r]) > 0]
            if not empty:
                continue
            seen.add(p.generic_name)
            from ..units import ranks_text

            yield Finding(
                code="TPA203", kind="quant_scale_split", severity="error", target=p.generic_name,
                message=(f"`{p.generic_name}` {list(p.global_shape)} is split on its axis {p.shard_dim} of size 1 by "
                         f"`{p.rule}: {p.style}`: {ranks_text(empty)} {'gets' if len(empty) == 1 else 'get'} an empty {list(p.local_shapes[empty[0]])} "
                         f"scale next to a {list(weight.local_shapes[empty[0]])} `{weight.name.rpartition('.')[2]}` "
                         f"shard, which {'it' if len(empty) == 1 else 'they'} cannot dequantize"),
                fix=f"Add rule `{ctx.relative_key(p.generic_name)}: {REPLICATE}`",
                fix_options=_keep_whole(ctx, p.generic_name), fix_fallback=_KEEP_WHOLE_FALLBACK,
                subject=FindingSubject(rule_key=ctx.relative_key(p.generic_name), key_kind="parameter",
                                       families=(p.generic_name,)),
                facts={"rule": p.rule, "style": p.style, "shape": list(p.global_shape), "axis": p.shard_dim,
                       "empty_ranks": empty, "local_shapes": [list(s) for s in p.local_shapes],
                       "weight": weight.generic_name, "weight_local_shapes": [list(s) for s in weight.local_shapes]})


@rule("TPA204", "quant_config_mismatch", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="config")
def check_quant_config_mismatch(ctx: CheckContext) -> Iterable[Finding]:
    """The quantization config quantizes modules that the checkpoint stores unquantized.

    **What it detects**
    transformers' quantizer lays out every module the `quantization_config` targets (and does not `ignore`) in its
    quantized form (`weight_packed`, `weight_scale`, `weight_shape` for compressed-tensors) before any weight is
    read. When the checkpoint stores such a module as a plain `weight`, that tensor matches no parameter (the loader
    drops it as unexpected) and the quantized parameters get no checkpoint tensor (the loader initialises them).

    **Why it matters**
    The module computes with garbage: the published weights of a whole tower are silently replaced. Kimi-K2.5's
    config targets every `Linear` and ignores only attention, shared experts, dense MLPs and `lm_head`, while its
    checkpoint stores the vision tower and projector in bfloat16: all 164 of their Linears load uninitialised.

    **Example**
    `quantization_config = {"config_groups": {"group_0": {"targets": ["Linear"], ...}}, "ignore": ["lm_head"]}` on a
    checkpoint whose `vision_tower.*` tensors are `weight` in BF16.

    **Fix**
    Add the modules to the config's `ignore` list (Kimi-K2.6 adds `re:vision_tower.*` and `re:mm_projector.*`), or
    narrow `targets`.

    **References**
    transformers `quantizers/quantizer_compressed_tensors.py` (`_process_model_before_weight_loading`),
    compressed-tensors `apply_quantization_config` (`targets`, `ignore`).
    """
    mapping = ctx.mapping
    if mapping is None or ctx.quantization is None or not ctx.quantization.ran:
        return
    from ..model import generic_name

    groups: dict[str, list] = {}
    for module, items in mapping.stored_unquantized.items():
        groups.setdefault(generic_name(module), []).extend(items)
    for generic, items in sorted(groups.items()):
        tensor, missing = items[0]
        stored_bytes = sum(t.nbytes for t, _ in items)
        leaves = sorted({m.rpartition(".")[2] for _, ms in items for m in ms})
        modules = sorted({generic_name(m.rpartition(".")[0]).rpartition(".")[2] for _, ms in items for m in ms})
        what = f"`{generic}`" if len(modules) == 1 else \
            f"`{generic}` (with {', '.join(f'`{x}`' for x in modules if not generic.endswith('.' + x))}, filled " \
            "from the same stored tensor)"
        yield Finding(
            code="TPA204", kind="quant_config_mismatch", severity="error", target=generic,
            message=(f"{what}, {len(items)} module(s): the quantization config makes transformers' "
                     f"{ctx.quantization.quantizer or ctx.quantization.method} store it as "
                     f"{', '.join(f'`{x}`' for x in leaves)}, but the checkpoint holds it unquantized "
                     f"(`{tensor.name}` {tensor.dtype} {list(tensor.shape)}, {ctx.size(stored_bytes)} in all): the load "
                     "drops the stored tensors and leaves the quantized parameters uninitialised"),
            fix=f"Add `{_ignore_pattern(generic, ctx.text_prefix)}` to the quantization config's `ignore` list "
                "(compressed-tensors matches it against the runtime module names), or narrow its `targets`",
            facts={"modules": len(items), "stored_bytes": stored_bytes, "example": tensor.name,
                   "missing": leaves})


def _ignore_pattern(generic: str, text_prefix: str) -> str:
    """A compressed-tensors `ignore` entry covering a module family: `re:.*vision_tower.*` for
    `model.vision_tower.layers.*.attn.proj` (the first part of the path below the model's own prefix), the module
    itself (`re:.*mm_projector\\.in_proj$`) when that part is the module."""
    import re

    parts = [p for p in generic.split(".") if p not in ("model", "*") and not p.isdigit()]
    if text_prefix and generic.startswith(text_prefix + "."):
        parts = [p for p in generic[len(text_prefix) + 1:].split(".") if p != "*"]
    if len(parts) >= 3:
        return f"re:.*{re.escape(parts[0])}.*"
    return "re:.*" + re.escape(".".join(parts)) + "$"


@rule("TPA202", "quant_block_misaligned", severity="error", breaks_forward=True, suggest=None,
      counts_replicated=False, fails_load=False)
def check_quant_block_misaligned(ctx: CheckContext) -> Iterable[Finding]:
    """A shard width that is not a whole number of quantization groups or blocks.

    **What it detects**
    For a quantized linear map that a rule splits, each rank's share of the split axis (output features under
    colwise, input features under rowwise, each packed half under `packed_colwise`) must be a multiple of the
    quantization block along that axis: FP8 `weight_block_size` (128 x 128), compressed-tensors block structure,
    and the `group_size` of group-wise formats (AWQ, GPTQ, compressed-tensors) along the input axis.

    **Why it matters**
    A rank boundary then cuts a block or group in two: its scale belongs to two ranks. vLLM refuses such a
    model; a naive split dequantizes with the wrong scales. InternVL3-78B-AWQ at tp 2: `down_proj` gets 29568 / 2 =
    14784 input rows per rank = 115.5 groups of 128 (vllm-project/vllm#21695). Qwen3.6-35B-A3B-FP8 at tp 8:
    512 / 8 = 64 rows of a 128-row block for every expert and the shared expert.

    **Example**
    A 128 x 128 FP8 checkpoint with `moe_intermediate_size = 512` at `--tp 8`.

    **Fix**
    Use a `tp_size` that keeps whole blocks (the message lists those below the one checked: a smaller size is not
    always one, e.g. 768 rows of 128-row blocks stay whole at tp 1, 2, 3, 6, not 4 or 5), keep the module whole,
    or re-quantize with a block/group size that divides the shard.

    **References**
    transformers `integrations/finegrained_fp8.py`; vllm-project/vllm#21695, #52997; sgl-project/sglang#3345.
    """
    world = ctx.shard_map.world_size
    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    scheme = ctx.facts.quant
    if scheme is None:
        return
    for unit in quant_units(ctx):
        axis = unit.axis
        if axis is None or unit.weight.plan == "ep":
            continue
        block = None
        if scheme.block:
            block = scheme.block[0] if axis == "out" else scheme.block[1]
            what, unit_name = f"{scheme.block[0]} x {scheme.block[1]} {scheme.method} block", "block"
        elif scheme.group_size and axis == "in":
            block = scheme.group_size
            what, unit_name = f"{scheme.method} group of {scheme.group_size} input features", "group"
        if not block:
            continue
        sizes = local_logical(unit, tp)
        bad = [(r, s) for r, s in enumerate(sizes) if s % block]
        if not bad:
            continue
        whole = unit.out_features if axis == "out" else unit.in_features
        whole //= unit.split_factor if unit.split_factor > 1 else 1
        aligned = [t for t in range(1, tp) if all(chunk(whole, t, r) % block == 0 for r in range(t))] or [1]
        axis_text = "output features" if axis == "out" else "input features"
        per = " of each packed half" if unit.split_factor > 1 else ""
        r, s = bad[0]
        yield Finding(
            code="TPA202", kind="quant_block_misaligned", severity="error", target=unit.key,
            message=(f"`{unit.key}` ({unit.style}) gives rank {r} {s} {axis_text}{per} = {s / block:g} x the "
                     f"{what}: a rank boundary cuts a {unit_name} ({whole} / {tp} ranks)"),
            fix=(f"Use a tp_size that keeps its {unit_name}s whole ({', '.join(map(str, aligned))}; a smaller size "
                 f"that is not listed cuts one too), or keep `{ctx.relative_key(unit.key)}` whole"),
            facts={"axis": axis, "size": whole, "block": block, "per_rank": sizes, "style": unit.style,
                   "largest_aligned_tp_size": max(aligned), "aligned_tp_sizes": aligned},
            fix_options=_block_fix_options(ctx, unit, unit_name, [t for t in aligned if t > 1]),
            fix_fallback=(f"Keep `{ctx.relative_key(unit.key)}` whole, or re-quantize with a {unit_name} size that "
                          "divides the shard"))
    del world


def _block_fix_options(ctx: CheckContext, unit, unit_name: str, aligned: list[int]) -> tuple[FixOption, ...]:
    """TPA202's concrete alternatives for the run stage to re-check: each tp size (> 1) that keeps the unit's
    blocks or groups whole, and, for experts the model's expert-parallel plan covers, the ep sizes transformers accepts
    on the same ranks (EP keeps every expert's blocks whole)."""
    from ..compat.logic import parameter_rule

    tp = ctx.shard_map.tp_size
    options = [FixOption(f"Use --tp {t}, which keeps its {unit_name}s whole", t, 1) for t in aligned]
    if ctx.shard_map.ep_size == 1 and ctx.plan.ep_rules and parameter_rule(unit.weight.name, ctx.plan.ep_rules):
        from ..compat import backend

        options += [FixOption(f"Use expert parallelism, --tp {tp} --ep {ep}, which splits the experts by expert and "
                              f"keeps every expert's {unit_name}s whole", tp, ep)
                    for ep in backend().accepted_ep_sizes(tp, range(2, tp + 1))]
    return tuple(options)
