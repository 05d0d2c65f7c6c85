"""The KV cache a rank holds per token, layer by layer, as transformers' caches lay it out.

    ModelFacts + ShardMap -> KVLayer geometry, per-rank KV heads -> KVCacheSection

Per layer, from the model's facts (`BuiltModel.facts`, read at build time): KV heads and head_dim per layer as
transformers' `configuration_utils.get_head_shapes` gives them (per-layer overrides included: the shapes `generate()`
sizes its static cache with), the layer types (`full_attention`, `sliding_attention`, `chunked_attention`,
`linear_attention`/`mamba` whose state does not grow with tokens) and the MLA sizes of DeepSeek-style attention, whose
transformers cache stores every head's expanded key (`qk_nope_head_dim + qk_rope_head_dim`) and value
(`v_head_dim`). Attribute, layer-type and module names: `tpaudit.metamodel.vocabulary`.

Per rank, with transformers' semantics (`distributed.tensor_parallel.get_kv_heads_per_rank`): a layer whose key
projection is split on its output (`colwise`, `packed_colwise`) holds the rows of its shard, so `kv_heads x local
rows / rows` heads; a key projection whose output is gathered (`colwise_gather_output`) or not sharded keeps every head
on every rank. A layer whose key projection the vocabulary does not name is counted whole, and the build's notes say
so (`metamodel/facts.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..metamodel import vocabulary as V
from ..compat.logic import style_axis, style_gathers_output
from ..metamodel.facts import ModelFacts, has_attention_geometry, layer_index
from ..model import KVCacheSection

# Modules whose output carries a layer's keys: a separate key projection, else a fused one.
K_LEAVES = V.leaves_of(V.KEY)
KV_LEAVES = V.leaves_of(*V.KEY_CARRIERS) - K_LEAVES


@dataclass(frozen=True)
class KVLayer:
    """One decoder layer's cache geometry (whole model, before sharding).

    Attributes:
        index (`int`): layer number.
        kind (`str`): `full`, `sliding`, `chunked`, `mla` (per-token cache), or `none` (linear attention / state
            space: a fixed-size state, no per-token cache).
        kv_heads (`int`): key/value heads cached.
        key_dim (`int`), value_dim (`int`): per-head sizes of a cached key and value.
        window (`int`, *optional*): tokens kept by a sliding or chunked layer.
    """

    index: int
    kind: str
    kv_heads: int
    key_dim: int
    value_dim: int
    window: int | None = None

    def bytes_per_token(self, itemsize: int) -> int:
        """Whole-model cache bytes per token of this layer: `kv_heads * (key_dim + value_dim) * itemsize`."""
        if self.kind == "none":
            return 0
        return self.kv_heads * (self.key_dim + self.value_dim) * itemsize


def kv_layers(facts: ModelFacts) -> list[KVLayer]:
    """The cache geometry of every decoder layer (empty when the config describes no attention heads).

    Source: the model's facts (`LayerFacts`: transformers 5.23 `configuration_utils.get_head_shapes` and the config's
    `layer_types`), the MLA and window sizes its config gives.
    """
    if not has_attention_geometry(facts) or not facts.layers:
        return []
    mla = facts.get(V.KV_LORA_RANK) and facts.get(V.MLA_V_HEAD_DIM)
    out = []
    for layer in facts.layers:
        i, layer_type = layer.index, layer.layer_type
        if layer_type in V.NO_CACHE_LAYER_TYPES:
            out.append(KVLayer(i, "none", 0, 0, 0))
        elif mla:
            q_heads = int(facts.get(V.ATTENTION_HEADS))
            key_dim = int((facts.get(V.MLA_NOPE_HEAD_DIM) or 0) + (facts.get(V.MLA_ROPE_HEAD_DIM) or 0))
            out.append(KVLayer(i, "mla", q_heads, key_dim, int(facts.get(V.MLA_V_HEAD_DIM))))
        elif layer_type in V.WINDOW_LAYER_TYPES:
            window = facts.get(V.WINDOW_LAYER_TYPES[layer_type])
            out.append(KVLayer(i, layer_type.split("_")[0], int(layer.kv_heads), int(layer.head_dim),
                               int(layer.head_dim), int(window) if window else None))
        else:
            out.append(KVLayer(i, "full", int(layer.kv_heads), int(layer.head_dim), int(layer.head_dim)))
    return out


@dataclass(frozen=True)
class KeyProjection:
    """The module that produces one layer's keys, and what a rank keeps of its output.

    Attributes:
        layer (`int`): layer number.
        name (`str`): generic name of its weight.
        style (`str`, *optional*): the style splitting it.
        rows (`int`): output rows of the whole weight.
        local_rows (`tuple[int, ...]`): rows each rank holds.
        gathered (`bool`): the style gathers the output back to whole (every rank computes with every head).
        separate (`bool`): a key projection of its own (`k_proj`), not a fused one.
    """

    layer: int
    name: str
    style: str | None
    rows: int
    local_rows: tuple[int, ...]
    gathered: bool
    separate: bool = True

    def share(self, rank: int) -> float:
        """The fraction of the layer's KV heads rank `rank` holds."""
        if self.gathered or not self.rows or style_axis(self.style) != "out":
            return 1.0
        return self.local_rows[rank] / self.rows


def key_projections(shard_map, text_prefix: str) -> dict[int, KeyProjection]:
    """Layer -> the projection whose output holds its keys (`k_proj`, or a fused `qkv_proj`/`query_key_value`/
    `kv_b_proj`/`kv_proj`: `vocabulary.KEY_CARRIERS`), with its style and per-rank rows. A separate key projection wins
    over a fused one; of two fused ones, the one nearer the layer (DeepSeek-V4's `self_attn.kv_proj` over its
    compressor's `self_attn.compressor.kv_proj`)."""
    out: dict[int, KeyProjection] = {}
    for p in shard_map.params:
        # the parameter that carries the projection's rows: `weight`, or compressed-tensors' `weight_packed` (packed
        # along the input: its rows are the output features, split as the weight's would be)
        if not p.name.endswith((".weight", ".weight_packed")) or p.ndim < 2:
            continue
        leaf = p.name.rsplit(".", 2)[-2]
        if leaf not in K_LEAVES and leaf not in KV_LEAVES:
            continue
        layer = layer_index(p.name, text_prefix)
        if layer is None:
            continue
        current = out.get(layer)
        if current is not None and leaf not in K_LEAVES and (
                current.separate or current.name.count(".") <= p.generic_name.count(".")):
            continue  # a separate k_proj wins over a fused name in the same layer; of fused ones, the nearer
        dim = p.shard_dim if p.shard_dim is not None else p.ndim - 2
        out[layer] = KeyProjection(layer, p.generic_name, p.style, p.global_shape[dim],
                                   tuple(s[dim] for s in p.local_shapes), style_gathers_output(p.style),
                                   leaf in K_LEAVES)
    return out


@dataclass(frozen=True)
class RankKV:
    """What one rank caches per token.

    Attributes:
        heads_per_layer (`tuple[float, ...]`): KV heads the rank holds in each cached layer (fractional when a head
            is split).
        bytes_per_token (`int`): over all layers with a per-token cache.
        full_bytes_per_token (`int`): of those, the layers whose cache grows with the whole context.
        window_bytes_per_token (`int`): of those, sliding/chunked layers (they stop growing at their window).
        by_window (`dict[int, int]`): `window_bytes_per_token` split by window size.
    """

    heads_per_layer: tuple[float, ...]
    bytes_per_token: int
    full_bytes_per_token: int
    window_bytes_per_token: int
    by_window: dict[int, int]


def rank_kv(layers: list[KVLayer], shard_map, text_prefix: str, itemsize: int) -> list[RankKV]:
    """Per-token cache of every rank, following each layer's key projection (see `KeyProjection.share`).

    Args:
        layers (`list[KVLayer]`): from `kv_layers`.
        shard_map (`ShardMap`): the simulation.
        text_prefix (`str`): module path of the decoder base model (`model.language_model`).
        itemsize (`int`): bytes per cached element (2 for bf16/fp16, 1 for fp8).

    Returns:
        One `RankKV` per rank.
    """
    keys = key_projections(shard_map, text_prefix)
    out = []
    for r in range(shard_map.world_size):
        heads, total, full, window = [], 0, 0, 0
        by_window: dict = {}
        for layer in layers:
            if layer.kind == "none":
                continue
            share = keys[layer.index].share(r) if layer.index in keys else 1.0
            h = layer.kv_heads * share
            heads.append(h)
            b = int(round(h * (layer.key_dim + layer.value_dim) * itemsize))
            total += b
            if layer.window:
                window += b
                by_window[layer.window] = by_window.get(layer.window, 0) + b
            else:
                full += b
        out.append(RankKV(tuple(heads), total, full, window, by_window))
    return out


def kv_section(facts: ModelFacts, shard_map, text_prefix: str, dtype: str, itemsize: int) -> KVCacheSection | None:
    """The report's `kv_cache` section; `None` when the config describes no decoder attention heads."""
    layers = kv_layers(facts)
    if not layers:
        return None
    ranks = rank_kv(layers, shard_map, text_prefix, itemsize)
    kinds: dict[str, int] = {}
    for layer in layers:
        kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    cached = [layer for layer in layers if layer.kind != "none"]
    heads_whole = sorted({layer.kv_heads for layer in cached})
    per_rank_heads = sorted({h for rk in ranks for h in rk.heads_per_layer}) if ranks else []
    windows = sorted({layer.window for layer in cached if layer.window})
    return KVCacheSection(
        dtype=dtype, itemsize=itemsize, layers=kinds,
        kv_heads=heads_whole[0] if len(heads_whole) == 1 else heads_whole,
        kv_heads_per_rank=_compact(per_rank_heads),
        bytes_per_token_per_rank=[rk.bytes_per_token for rk in ranks],
        full_context_bytes_per_token_per_rank=[rk.full_bytes_per_token for rk in ranks],
        window_bytes_per_token_per_rank=[rk.window_bytes_per_token for rk in ranks],
        windows=windows,
        window_bytes_per_token_by_window={str(w): [rk.by_window.get(w, 0) for rk in ranks] for w in windows},
        bytes_per_token_whole_model=sum(layer.bytes_per_token(itemsize) for layer in layers),
        linear_state_bytes_per_sequence=linear_state_bytes_per_sequence(facts, itemsize))


def _compact(values: list[float]):
    ints = [int(v) if float(v).is_integer() else round(v, 4) for v in values]
    if not ints:
        return 0
    return ints[0] if len(ints) == 1 else ints


def linear_state_bytes_per_sequence(facts: ModelFacts, itemsize: int) -> int:
    """Fixed-size state of the linear-attention layers (Gated DeltaNet) per sequence, whole model.

    Per layer: the convolution state `conv_dim x conv_kernel` in the cache dtype, `conv_dim = 2 * key_dim + value_dim`,
    and the recurrent state `num_v_heads x head_k_dim x head_v_dim` in float32, as transformers' Gated DeltaNet layers
    (qwen3_next, qwen3_5) keep them in `LinearAttentionCacheLayerMixin`. 0 for models without such layers.
    """
    n = sum(1 for t in (facts.get(V.LAYER_TYPES) or []) if t == "linear_attention")
    kernel = facts.get(V.LINEAR_CONV_KERNEL)
    if not n or not kernel:
        return 0
    k_heads, v_heads = facts.get(V.LINEAR_KEY_HEADS), facts.get(V.LINEAR_VALUE_HEADS)
    k_dim, v_dim = facts.get(V.LINEAR_KEY_HEAD_DIM), facts.get(V.LINEAR_VALUE_HEAD_DIM)
    if not all(isinstance(x, int) for x in (k_heads, v_heads, k_dim, v_dim)):
        return 0
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return n * (conv_dim * kernel * itemsize + v_heads * k_dim * v_dim * 4)
