"""The KV cache a rank holds per token, layer by layer, as transformers' caches lay it out.

    BuiltModel + ResolvedPlan + ShardMap -> KVLayer geometry, per-rank KV heads -> KVCacheSection

Per layer, from the text config: `configuration_utils.get_head_shapes` (KV heads and head_dim per layer, per-layer
overrides included: the shapes `generate()` sizes its static cache with), `layer_types` (`full_attention`,
`sliding_attention`, `chunked_attention`, `linear_attention`/`mamba` whose state does not grow with tokens) and the MLA
sizes of DeepSeek-style attention, whose transformers cache stores every head's expanded key (`qk_nope_head_dim +
qk_rope_head_dim`) and value (`v_head_dim`).

Per rank, with transformers' semantics (`distributed.tensor_parallel.get_kv_heads_per_rank`): a layer whose key
projection is split on its output (`colwise`, `packed_colwise`) holds the rows of its shard, so `kv_heads x local
rows / rows` heads; a key projection whose output is gathered (`colwise_gather_output`) or not sharded keeps every head
on every rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .compat import backend
from .compat.logic import style_axis, style_gathers_output
from .model import KVCacheSection

_NO_CACHE_TYPES = {"linear_attention", "mamba", "conv", "recurrent", "rwkv"}
_WINDOW_TYPES = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}
# Modules whose output carries a layer's keys, by where the attention modules of transformers put them.
K_LEAVES = ("k_proj", "key", "wk")
V_LEAVES = ("v_proj", "value", "wv")
KV_LEAVES = ("kv_b_proj", "qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv")


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


def has_attention_geometry(text_config) -> bool:
    """Whether the config describes decoder attention heads (encoders-only or state-space configs may not)."""
    get = backend().config_value
    return isinstance(get(text_config, "num_attention_heads"), int) and isinstance(
        get(text_config, "num_hidden_layers"), int) and (
        isinstance(get(text_config, "hidden_size"), int) or isinstance(get(text_config, "head_dim"), int))


def kv_layers(text_config) -> list[KVLayer]:
    """The cache geometry of every decoder layer of `text_config` (empty when it describes no attention heads).

    Source: transformers 5.23 `configuration_utils.get_head_shapes` and the config's `layer_types`.
    """
    tf = backend()
    get = tf.config_value
    if not has_attention_geometry(text_config):
        return []
    n_layers = int(get(text_config, "num_hidden_layers") or 0)
    layer_types = list(get(text_config, "layer_types") or ["full_attention"] * n_layers)
    heads, dims = tf.head_shapes(text_config)
    heads = heads if isinstance(heads, list) else [heads] * n_layers
    dims = dims if isinstance(dims, list) else [dims] * n_layers
    mla = get(text_config, "kv_lora_rank") and get(text_config, "v_head_dim")
    out = []
    for i in range(n_layers):
        layer_type = layer_types[i] if i < len(layer_types) else "full_attention"
        if layer_type in _NO_CACHE_TYPES:
            out.append(KVLayer(i, "none", 0, 0, 0))
        elif mla:
            q_heads = int(get(text_config, "num_attention_heads"))
            key_dim = int((get(text_config, "qk_nope_head_dim") or 0) + (get(text_config, "qk_rope_head_dim") or 0))
            out.append(KVLayer(i, "mla", q_heads, key_dim, int(get(text_config, "v_head_dim"))))
        elif layer_type in _WINDOW_TYPES:
            window = get(text_config, _WINDOW_TYPES[layer_type])
            out.append(KVLayer(i, layer_type.split("_")[0], int(heads[i]), int(dims[i]), int(dims[i]),
                               int(window) if window else None))
        else:
            out.append(KVLayer(i, "full", int(heads[i]), int(dims[i]), int(dims[i])))
    return out


_LAYER = re.compile(r"\.layers\.(\d+)\.")


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
    """

    layer: int
    name: str
    style: str | None
    rows: int
    local_rows: tuple[int, ...]
    gathered: bool

    def share(self, rank: int) -> float:
        """The fraction of the layer's KV heads rank `rank` holds."""
        if self.gathered or not self.rows or style_axis(self.style) != "out":
            return 1.0
        return self.local_rows[rank] / self.rows


def key_projections(shard_map, text_prefix: str) -> dict[int, KeyProjection]:
    """Layer -> the projection whose output holds its keys (`k_proj`, or a fused `qkv_proj`/`query_key_value`/
    `kv_b_proj`), with its style and per-rank rows."""
    out: dict[int, KeyProjection] = {}
    prefix = text_prefix + "." if text_prefix else ""
    for p in shard_map.params:
        if not p.name.startswith(prefix) or not p.name.endswith(".weight") or p.ndim < 2:
            continue
        m = _LAYER.search(p.name[len(prefix) - 1:] if prefix else "." + p.name)
        if not m:
            continue
        leaf = p.name.rsplit(".", 2)[-2]
        if leaf not in K_LEAVES and leaf not in KV_LEAVES:
            continue
        layer = int(m.group(1))
        if layer in out and leaf not in K_LEAVES:
            continue  # a separate k_proj wins over a fused name in the same layer
        dim = p.shard_dim if p.shard_dim is not None else p.ndim - 2
        out[layer] = KeyProjection(layer, p.generic_name, p.style, p.global_shape[dim],
                                   tuple(s[dim] for s in p.local_shapes), style_gathers_output(p.style))
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
        heads, total, full, window, by_window = [], 0, 0, 0, {}
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


def kv_section(text_config, shard_map, text_prefix: str, dtype: str, itemsize: int) -> KVCacheSection | None:
    """The report's `kv_cache` section; `None` when the config describes no decoder attention heads."""
    layers = kv_layers(text_config)
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
        linear_state_bytes_per_sequence=linear_state_bytes_per_sequence(text_config, itemsize))


def _compact(values: list[float]):
    ints = [int(v) if float(v).is_integer() else round(v, 4) for v in values]
    if not ints:
        return 0
    return ints[0] if len(ints) == 1 else ints


def linear_state_bytes_per_sequence(text_config, itemsize: int) -> int:
    """Fixed-size state of the linear-attention layers (Gated DeltaNet) per sequence, whole model.

    Per layer: the convolution state `conv_dim x conv_kernel` in the cache dtype, `conv_dim = 2 * key_dim + value_dim`,
    and the recurrent state `num_v_heads x head_k_dim x head_v_dim` in float32, as transformers' Gated DeltaNet layers
    (qwen3_next, qwen3_5) keep them in `LinearAttentionCacheLayerMixin`. 0 for models without such layers.
    """
    get = backend().config_value
    n = sum(1 for t in (get(text_config, "layer_types") or []) if t == "linear_attention")
    kernel = get(text_config, "linear_conv_kernel_dim")
    if not n or not kernel:
        return 0
    k_heads, v_heads = get(text_config, "linear_num_key_heads"), get(text_config, "linear_num_value_heads")
    k_dim, v_dim = get(text_config, "linear_key_head_dim"), get(text_config, "linear_value_head_dim")
    if not all(isinstance(x, int) for x in (k_heads, v_heads, k_dim, v_dim)):
        return 0
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return n * (conv_dim * kernel * itemsize + v_heads * k_dim * v_dim * 4)
