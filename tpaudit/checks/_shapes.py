"""Shared reading of the shard map for the dimension, layout and quantization checks: the role of a projection (by
the leaf names of `tpaudit.metamodel.vocabulary`), the logical axis a style splits, each rank's logical shard size, and
the quantized linear maps (the checkpoint's scheme is a fact of the build: `ctx.facts.quant`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..metamodel import vocabulary as V
from ..compat.logic import linear_styles, style_axis
from ..model import ParamShard

# Leaf names by the role of the projection (the table: `tpaudit.metamodel.vocabulary`).
Q_LEAVES = V.leaves_of(V.QUERY, V.MLA_KV_UP)        # split per attention head (query side; MLA's kv_b_proj too)
KV_LEAVES = V.leaves_of(V.KEY, V.VALUE, V.FUSED_KV)  # split per KV head (TPA102)
FUSED_QKV_LEAVES = V.leaves_of(V.FUSED_QKV)
O_LEAVES = V.leaves_of(V.OUTPUT)
FUSED_GATE_UP = V.leaves_of(V.FUSED_GATE_UP)

# Styles by the logical axis of a linear layer they split: a pinned copy of transformers' placements.
OUT_STYLES = {s for s in linear_styles() if style_axis(s) == "out"}
IN_STYLES = {s for s in linear_styles() if style_axis(s) == "in"}


def chunk(n: int, parts: int, rank: int) -> int:
    """`torch.chunk` piece of `n` for `rank` of `parts`: `ceil(n / parts)` on the low ranks, the rest last (maybe 0)."""
    size = -(-n // parts)
    return max(0, min(size, n - rank * size))


def leaf_module(p: ParamShard) -> str:
    """`model.layers.0.self_attn.q_proj.weight` -> `q_proj`; a bare parameter (`experts.gate_up_proj`) -> its name."""
    module, _, leaf = p.name.rpartition(".")
    if leaf in ("weight", "bias") or leaf.startswith("weight_") or leaf in ("qweight", "qzeros", "scales", "g_idx"):
        return module.rpartition(".")[2]
    return leaf


def parent_module(p: ParamShard) -> str:
    """`model.layers.0.self_attn.o_proj.weight` -> `self_attn`: the module above the parameter's module."""
    parts = p.name.split(".")
    return parts[-3] if len(parts) >= 3 else ""


def role(p: ParamShard) -> str | None:
    """`q`, `kv`, `qkv`, `o` for attention projections, else `None`."""
    leaf = leaf_module(p)
    if leaf in Q_LEAVES:
        return "q"
    if leaf in KV_LEAVES:
        return "kv"
    if leaf in FUSED_QKV_LEAVES:
        return "qkv"
    if leaf in O_LEAVES or (leaf in V.GENERIC_OUTPUT and parent_module(p) in V.ATTENTION_BLOCK):
        return "o"
    return None


from ..metamodel.mapping import QUANT_LEAVES, QUANT_SUFFIXES  # noqa: E402


@dataclass(frozen=True)
class QuantUnit:
    """A quantized linear map: a module (`q_proj`) or a fused experts parameter (`experts.gate_up_proj`).

    Attributes:
        key (`str`): generic name of the module or experts parameter.
        members (`list[ParamShard]`): every parameter that belongs to it (weight, scales, metadata), all layers.
        weight (`ParamShard`): the parameter that carries the weight values (first layer's).
        out_features (`int`), in_features (`int`): logical sizes (per expert for 3-D experts).
        style (`str`, *optional*): the style that shards it.
        split_factor (`int`): 2 for `packed_*` styles.
    """

    key: str
    members: list
    weight: ParamShard
    out_features: int
    in_features: int
    style: str | None
    split_factor: int

    @property
    def axis(self) -> str | None:
        """The logical axis the style splits: `out` (colwise family), `in` (rowwise family), or `None`."""
        if self.style in OUT_STYLES:
            return "out"
        if self.style in IN_STYLES:
            return "in"
        return None


_MODULE_LEAVES = {"weight", "bias", "qweight", "qzeros", "scales", "g_idx", "input_scale", "activation_scale"}


def is_quant_companion(p: ParamShard) -> bool:
    """A quantization tensor beside (or instead of) a weight: scales, packed values, zero points, metadata."""
    leaf = p.name.rpartition(".")[2]
    return leaf in QUANT_LEAVES or any(leaf.endswith(s) for s in QUANT_SUFFIXES)


_is_companion = is_quant_companion


def _unit_key(p: ParamShard) -> tuple[str, bool]:
    """(generic key, is a module-level linear): `...q_proj.weight_scale_inv` -> (`...q_proj`, True);
    `...experts.gate_up_proj_scale_inv` -> (`...experts.gate_up_proj`, False)."""
    from ..model import generic_name

    module, _, leaf = p.name.rpartition(".")
    if leaf in _MODULE_LEAVES or leaf.startswith("weight_"):
        return generic_name(module), True
    base = next((leaf[: -len(s)] for s in QUANT_SUFFIXES + ("_bias",) if leaf.endswith(s)), leaf)
    return generic_name(f"{module}.{base}"), False


def quant_units(ctx) -> Iterator[QuantUnit]:
    """Every quantized linear map of the model (a module with quantization tensors, or a fused experts parameter with
    its scales), grouped by generic name, with its logical sizes and the style that shards it."""
    groups: dict[tuple[str, bool], list[ParamShard]] = {}
    for g in ctx.shard_map.groups:  # one representative (the first layer's) per generic name
        groups.setdefault(_unit_key(g.first), []).append(g.first)
    for (key, module_level), members in groups.items():
        if not any(_is_companion(m) for m in members):
            continue
        if module_level:
            facts = ctx.modules.get(members[0].name.rpartition(".")[0])
            if facts is None or not facts.in_features or not facts.out_features:
                continue
            out_f, in_f = facts.out_features, facts.in_features
            weight = next((m for m in members if m.name.rpartition(".")[2] in ("weight", "weight_packed", "qweight")),
                          members[0])
        else:
            base = key.rpartition(".")[2]
            weight = next((m for m in members if m.name.rpartition(".")[2] == base and m.ndim >= 2), None)
            if weight is None:
                continue
            out_f, in_f = weight.global_shape[-2], weight.global_shape[-1]
        style = weight.style or next((m.style for m in members if m.style), None)
        sf = max([m.split_factor for m in members if m.shard_dim is not None] + [1])
        if style and style.startswith("packed_"):
            sf = max(sf, 2)
        yield QuantUnit(key=key, members=members, weight=weight, out_features=out_f, in_features=in_f,
                        style=style, split_factor=sf)


def local_logical(unit: QuantUnit, world: int) -> list[int]:
    """Each rank's share of the logical axis the unit's style splits (per packed block for `packed_*`)."""
    size = unit.out_features if unit.axis == "out" else unit.in_features
    size //= unit.split_factor if unit.split_factor > 1 else 1
    return [chunk(size, world, r) for r in range(world)]
