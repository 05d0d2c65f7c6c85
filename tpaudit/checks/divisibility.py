"""TPA1xx: dimensions a rule splits that `tp_size` does not divide (heads, KV heads, intermediate, vocab, ...).

Each check looks only at parameters a rule actually shards (their placement in the shard map), and names the config
attribute behind the split dimension so the finding points at what to change.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..model import Finding, ParamShard
from ._shapes import chunk, is_quant_companion, leaf_module, role
from .registry import CheckContext, config_value, config_values, rule

# Config attributes that size a split dimension, in the order a name is preferred when several match.
_SIZE_ATTRS = ("moe_intermediate_size", "shared_expert_intermediate_size", "intermediate_size", "vocab_size",
               "hidden_size", "num_experts", "num_local_experts", "n_routed_experts", "linear_num_value_heads",
               "linear_num_key_heads")


def _attr_for(ctx: CheckContext, value: int, hint: str | None = None) -> str | None:
    cfg = ctx.text_config
    names = ([hint] if hint else []) + list(_SIZE_ATTRS)
    for name in names:
        if config_value(cfg, name) == value and isinstance(value, int):
            return name
    return None


def _hint(p: ParamShard) -> str | None:
    """The config attribute a parameter's split dimension usually comes from, by its place in the model."""
    name = p.name
    if ".shared_expert" in name:
        return "shared_expert_intermediate_size"
    if ".experts." in name:
        return "moe_intermediate_size"
    if leaf_module(p) in ("embed_tokens", "lm_head", "wte", "word_embeddings"):
        return "vocab_size"
    if ".mlp." in name or ".feed_forward." in name:
        return "intermediate_size"
    return None


def sharded_params(ctx: CheckContext) -> list[ParamShard]:
    """Parameters split by a rule (tied copies excluded)."""
    return [p for p in ctx.shard_map.params if p.sharding == "sharded" and p.tied_to is None
            and p.shard_dim is not None]


def _ranks_text(sizes: list[int]) -> str:
    distinct = sorted(set(sizes), reverse=True)
    if len(distinct) <= 3:
        return " / ".join(str(s) for s in sizes) if len(sizes) <= 8 else ", ".join(str(s) for s in distinct)
    return f"{max(sizes)} .. {min(sizes)}"


@rule("TPA101", "indivisible_dim")
def check_indivisible_dim(ctx: CheckContext) -> Iterable[Finding]:
    """A dimension a rule splits that `tp_size` does not divide.

    **What it detects**
    A parameter sharded along a dimension whose size (or, for attention, whose head count) is not a multiple of
    `tp_size`: attention heads split by `q_proj`/`o_proj` rules, intermediate sizes split by MLP rules, the vocabulary
    split by `embed_tokens`/`lm_head` rules, experts' intermediate sizes. Only dimensions a rule actually splits are
    checked (KV heads have their own rule, TPA102).

    **Why it matters**
    transformers 5.23 accepts uneven shards (`torch.chunk`: low ranks get `ceil(n / tp_size)`), so nothing fails at
    load. But a head split across ranks computes attention over fractions of a head, and uneven shards load the
    worst rank more than its share. granite-3.1-2b at tp 5: 32 heads of 64 give `q_proj` 410/410/410/410/408 rows,
    and intermediate 8192 splits 1639 x 4 + 1636 (huggingface/transformers#37051).

    **Example**
    `--tp 5` on a model with `num_attention_heads = 32` and the shipped `layers.*.self_attn.q_proj: colwise` rule.

    **Fix**
    Pick a `tp_size` that divides every split dimension (the message lists the ones that do), or pad the
    dimension to a multiple of `tp_size`.

    **References**
    transformers `distributed/tensor_parallel.py` (uneven shards allowed); huggingface/transformers#37051, #37220.
    """
    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    cfg = ctx.text_config
    heads_values = [h for h in config_values(cfg, "num_attention_heads") if isinstance(h, int)]
    bad_heads = [h for h in heads_values if h % tp]
    by_target: dict[str, dict] = {}
    for p in sharded_params(ctx):
        if is_quant_companion(p):
            continue  # packed weights, scales and metadata: judged on logical sizes by TPA2xx / TPA501
        r = role(p)
        if r == "kv":
            continue  # TPA102
        if r in ("q", "qkv", "o") and heads_values:
            if bad_heads:
                entry = by_target.setdefault(ctx.config_target("num_attention_heads"),
                                             {"value": bad_heads[0], "params": set(), "sizes": None})
                entry["params"].add(p.generic_name)
            continue
        if p.plan == "ep":
            continue  # experts split by expert: MoEParamShard enforces divisibility itself
        size = p.global_shape[p.shard_dim] // max(1, p.split_factor)
        if size % tp == 0:
            continue
        attr = _attr_for(ctx, size, _hint(p))
        target = ctx.config_target(attr) if attr else p.generic_name
        entry = by_target.setdefault(target, {"value": size, "params": set(),
                                              "sizes": [chunk(size, tp, r) for r in range(tp)]})
        entry["params"].add(p.generic_name)
    for target, entry in sorted(by_target.items()):
        value = entry["value"]
        divisors = [d for d in range(2, min(value, 64) + 1) if value % d == 0 and d <= 16][:6]
        valid = ", ".join(str(d) for d in divisors) or "1"
        families = sorted(entry["params"])
        if entry["sizes"] is None:  # heads
            per_rank = [chunk(value, tp, r) for r in range(tp)]
            what = f"{value} attention heads split {value / tp:g} per rank"
        else:
            per_rank = entry["sizes"]
            what = f"size {value} splits {_ranks_text(per_rank)} across {tp} ranks"
        yield Finding(
            code="TPA101", kind="indivisible_dim", severity="error", target=target,
            message=(f"`{target}` = {value} is not divisible by tp_size {tp}: {what} "
                     f"(rules on {', '.join(f'`{f}`' for f in families[:3])}{' ...' if len(families) > 3 else ''})"),
            fix=f"Use a tp_size that divides {value} ({valid}), or pad `{target.rpartition('.')[2]}` to a multiple "
                f"of {tp}",
            facts={"value": value, "tp_size": tp, "per_rank": per_rank, "params": families})


@rule("TPA102", "kv_heads_per_rank")
def check_kv_heads_per_rank(ctx: CheckContext) -> Iterable[Finding]:
    """KV heads that `tp_size` does not divide, so a rank holds a fraction of a head.

    **What it detects**
    A layer whose key/value projections are sharded (`k_proj`/`v_proj`/fused `qkv` colwise) while its number of
    KV heads is not a multiple of `tp_size`, including `tp_size` greater than the KV heads. transformers'
    `get_kv_heads_per_rank` returns `None` for such a plan, so `generate()` cannot size a static cache per rank.

    **Why it matters**
    The KV cache and the sharded attention disagree: a paged cache sized for 4 KV heads meets attention that holds
    half a head per rank at tp 8 (Qwen3-VL-30B-A3B). `k_proj` of 4 x 128 rows splits into 64 rows per rank: no rank
    has a whole head.

    **Example**
    `--tp 8` on a model with `num_key_value_heads = 4` and `layers.*.self_attn.k_proj: colwise`.

    **Fix**
    Use a `tp_size` that divides the KV heads, or keep `k_proj`/`v_proj` whole (no colwise rule) so every rank
    holds all KV heads (each rank then pays their full size).

    **References**
    transformers `distributed/tensor_parallel.py` (`get_kv_heads_per_rank`), `generation/utils.py`
    (`_get_static_cache_init_shape`).
    """
    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    from ..kvcache import kv_layers

    try:
        layers = kv_layers(ctx.text_config)
    except Exception:  # noqa: BLE001 - a config without head shapes has no KV cache to check
        return
    kv_sharded_layers = set()
    from ..kvcache import _local_rows

    rows = _local_rows(ctx.shard_map, ctx.text_prefix)
    for (index, r), (whole, local) in rows.items():
        if r in ("k", "kv") and any(x != whole for x in local):
            kv_sharded_layers.add(index)
    bad: dict[int, list[int]] = defaultdict(list)
    by_rank: dict[int, list[float]] = {}
    for layer in layers:
        if layer.kind in ("none", "mla") or layer.index not in kv_sharded_layers:
            continue
        if layer.kv_heads % tp:
            bad[layer.kv_heads].append(layer.index)
            whole, local = rows.get((layer.index, "k")) or rows.get((layer.index, "kv"))
            by_rank.setdefault(layer.kv_heads, [layer.kv_heads * x / whole for x in local])
    cfg = ctx.text_config
    for heads, indices in sorted(bad.items()):
        attr = next((n for n in ("num_key_value_heads", *sorted(vars(cfg)))
                     if "key_value_heads" in n and heads in config_values(cfg, n)), "num_key_value_heads")
        target = ctx.config_target(attr)
        per_rank = heads / tp
        exact = by_rank[heads]
        shares = " / ".join(f"{h:.3g}" for h in exact) if len(exact) <= 8 else f"{max(exact):.3g} .. {min(exact):.3g}"
        valid = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        yield Finding(
            code="TPA102", kind="kv_heads_per_rank", severity="error", target=target,
            message=(f"`{target}` = {heads} KV heads cannot be split across {tp} ranks: the ranks hold {shares} "
                     f"heads' worth of key rows in {len(indices)} layer(s), no rank a whole number; the KV cache and "
                     "the sharded attention disagree (transformers' get_kv_heads_per_rank returns None)"),
            fix=f"Use a tp_size dividing {heads} ({valid}), or drop the colwise k_proj/v_proj rules so every rank "
                "holds all KV heads",
            facts={"kv_heads": heads, "tp_size": tp, "kv_heads_per_rank": per_rank, "heads_by_rank": exact,
                   "layers": indices})
