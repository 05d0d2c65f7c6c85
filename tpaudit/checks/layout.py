"""TPA5xx: packed layouts a split breaks: fused projections split as if they were one, and quantized values packed
into int32 words split between words."""

from __future__ import annotations

from typing import Iterable

from ..model import Finding
from ._shapes import FUSED_GATE_UP, FUSED_QKV_LEAVES, chunk, leaf_module, local_logical, quant_scheme, quant_units
from .registry import CheckContext, rule


@rule("TPA501", "packed_layout")
def check_packed_layout(ctx: CheckContext) -> Iterable[Finding]:
    """A packed dimension that the rule splits without respecting its packing.

    **What it detects**
    (a) A fused projection (`gate_up_proj`, `qkv_proj`, `query_key_value`) split with plain `colwise`, whose
    `Shard` cuts the concatenation: with `[gate; up]` on two ranks, rank 0 gets all of `gate` and none of `up`.
    `packed_colwise` (a strided shard that splits each part) and `colwise_gather_output` (the output is gathered)
    are safe. (b) Quantized values packed into int32 words (AWQ along outputs, GPTQ and compressed-tensors
    pack-quantized along inputs) split where a rank's share is not a whole number of words, or packed with a bit
    width that does not divide 32 (3/5/6/7 bits), where any split cuts values.

    **Why it matters**
    The layer computes with the wrong halves (gate times gate), or a rank unpacks half a word: wrong outputs with no
    error at load.

    **Example**
    `"layers.*.mlp.experts.gate_up_proj": "colwise"` instead of `packed_colwise`; a 4-bit AWQ `up_proj` whose
    output share is not a multiple of 8.

    **Fix**
    Use `packed_colwise` for fused gate/up, `colwise_gather_output` for a fused qkv whose parts differ in size;
    choose a `tp_size` whose shares are whole words.

    **References**
    transformers `distributed/tensor_parallel.py` (`PackedColwiseParallel`); huggingface/transformers#46846.
    """
    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    seen = set()
    for p in ctx.shard_map.params:
        if p.sharding != "sharded" or p.tied_to is not None or p.generic_name in seen or p.plan == "ep":
            continue
        leaf = leaf_module(p)
        fused = leaf in FUSED_GATE_UP or leaf in FUSED_QKV_LEAVES
        packed_dim = p.ndim - 2 if p.ndim >= 2 else 0
        if fused and p.style == "colwise" and p.shard_dim == packed_dim and p.split_factor == 1:
            seen.add(p.generic_name)
            parts = "gate and up" if leaf in FUSED_GATE_UP else "q, k and v"
            yield Finding(
                code="TPA501", kind="packed_layout", severity="error", target=p.generic_name,
                message=(f"`{p.generic_name}` packs {parts} along dim {packed_dim} but rule `{p.rule}: colwise` cuts "
                         f"the concatenation: rank 0 gets rows 0..{p.local_shapes[0][packed_dim] - 1} of "
                         f"{p.global_shape[packed_dim]}, not its share of each part"),
                fix=(f"Use `{ctx.relative_key(p.rule or p.generic_name)}: packed_colwise`" if leaf in FUSED_GATE_UP
                     else f"Use `{ctx.relative_key(p.rule or p.generic_name)}: colwise_gather_output`"),
                facts={"style": p.style, "dim": packed_dim, "size": p.global_shape[packed_dim]})
    scheme = quant_scheme(ctx.config)
    if scheme is None or not scheme.packed_axis:
        return
    for unit in quant_units(ctx):
        if unit.axis != scheme.packed_axis or unit.weight.plan == "ep":
            continue
        sizes = local_logical(unit, tp)
        if scheme.bits_divide_word:
            bad = [(r, s) for r, s in enumerate(sizes) if scheme.pack_factor and s % scheme.pack_factor]
            if not bad:
                continue
            r, s = bad[0]
            why = (f"rank {r}'s {s} {'output' if unit.axis == 'out' else 'input'} features are not a whole number "
                   f"of int32 words ({scheme.pack_factor} x {scheme.bits}-bit values each)")
        else:
            why = (f"{scheme.bits}-bit values do not divide a 32-bit word, so any split of the packed "
                   f"{'output' if unit.axis == 'out' else 'input'} axis cuts values")
        whole = unit.out_features if unit.axis == "out" else unit.in_features
        ok = [t for t in range(1, tp) if scheme.pack_factor and all(
            chunk(whole, t, r) % scheme.pack_factor == 0 for r in range(t))]
        yield Finding(
            code="TPA501", kind="packed_layout", severity="error", target=unit.key,
            message=f"`{unit.key}` ({scheme.method}, packed along {unit.axis}put features, `{unit.style}`): {why}",
            fix=(f"Use tp_size {max(ok)} or less" if ok else "Keep this module whole") + ", or a format whose "
                "packing the split respects",
            facts={"axis": unit.axis, "bits": scheme.bits, "pack_factor": scheme.pack_factor, "per_rank": sizes})
