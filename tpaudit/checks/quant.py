"""TPA2xx: quantized checkpoints under TP: metadata a rule shards although it carries no per-rank data, and shard
widths that cut quantization groups or blocks.

The scheme comes from `quantization_config` (FP8 `weight_block_size`, AWQ/GPTQ `group_size` and `bits`,
compressed-tensors `config_groups`); the tensors from the checkpoint header. Alignment is judged on the logical axis a
style splits (colwise: output features, rowwise: input features), not on raw tensor dimensions: AWQ stores
`qweight` as `[in, out / 8]`, so transformers' `Shard(ndim - 2)` lands on its input rows.
"""

from __future__ import annotations

from typing import Iterable

from ..model import Finding
from ._shapes import OUT_STYLES, chunk, local_logical, quant_scheme, quant_units
from .registry import CheckContext, rule


def _ranks(values: list[int]) -> str:
    return " / ".join(str(v) for v in values) if len(values) <= 8 else f"{values[0]} .. {values[-1]}"


@rule("TPA201", "quant_metadata_sharded")
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
    scheme = quant_scheme(ctx.config)
    seen = {}
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
            fix=f"Add rule `{ctx.relative_key(generic)}: replicate`",
            facts={"rule": p.rule, "style": p.style, "shape": list(p.global_shape),
                   "local_shapes": [list(s) for s in p.local_shapes]})


@rule("TPA202", "quant_block_misaligned")
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
    scheme = quant_scheme(ctx.config)
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
                   "largest_aligned_tp_size": max(aligned), "aligned_tp_sizes": aligned})
    del world
