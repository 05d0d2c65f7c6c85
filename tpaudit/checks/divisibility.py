"""TPA1xx: dimensions a rule splits that `tp_size` does not divide (heads, KV heads, intermediate, vocab, ...).

Each check looks only at parameters a rule actually shards (their placement in the shard map), and names the config
attribute behind the split dimension so the finding points at what to change.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..compat.styles import COLWISE_GATHER_OUTPUT
from ..metamodel import vocabulary as V
from ..model import Finding, FixOption, ParamGroup
from ._shapes import chunk, is_quant_companion, leaf_module, role
from .registry import CheckContext, rule


def _attr_for(ctx: CheckContext, size: int, hint: V.ConfigRole | None = None) -> str | None:
    """The config attribute whose value is `size`: a spelling of the role the parameter's place suggests first,
    then of every role that sizes a split dimension (`vocabulary.SPLIT_SIZES`, in its order)."""
    for name in V.attrs_of(*([hint] if hint else []), *V.SPLIT_SIZES):
        if ctx.facts.value(name) == size:
            return name
    return None


def _hint(g: ParamGroup) -> V.ConfigRole | None:
    """The role of the config attribute a parameter's split dimension usually comes from, by its place in the
    model."""
    name = g.generic_name
    if V.SHARED_EXPERT_PATH in name:
        return V.SHARED_EXPERT_INTERMEDIATE
    if V.EXPERTS_PATH in name:
        return V.EXPERT_INTERMEDIATE
    if leaf_module(g.first) in V.EMBEDDING:
        return V.VOCAB
    if any(mark in name for mark in V.MLP_PATHS):
        return V.INTERMEDIATE
    return None


def sharded_groups(ctx: CheckContext) -> list[ParamGroup]:
    """Parameter groups split by a rule (tied copies excluded)."""
    return [g for g in ctx.shard_map.groups if g.sharding == "sharded" and g.tied_to is None
            and g.first.shard_dim is not None]


def _ranks_text(sizes: list[int]) -> str:
    distinct = sorted(set(sizes), reverse=True)
    if len(distinct) <= 3:
        return " / ".join(str(s) for s in sizes) if len(sizes) <= 8 else ", ".join(str(s) for s in distinct)
    return f"{max(sizes)} .. {min(sizes)}"


def _splits_attention_heads(finding: Finding) -> bool:
    """TPA101 breaks the forward only for attention heads (its target a head-count attribute): a head split across
    ranks computes attention over fractions of a head. An uneven vocabulary or intermediate split computes correctly
    in transformers (its `EmbeddingParallel` and row/colwise pairs take matching `torch.chunk` slices); it only loads
    the worst rank more."""
    return finding.target.rpartition(".")[2] in V.ATTENTION_HEADS.attrs


@rule("TPA101", "indivisible_dim", severity="error", breaks_forward=_splits_attention_heads, suggest=None,
      counts_replicated=False, fails_load=False, points_at="config")
def check_indivisible_dim(ctx: CheckContext) -> Iterable[Finding]:
    """A dimension a rule splits that `tp_size` does not divide.

    **What it detects**
    A parameter sharded along a dimension whose size (or, for attention, whose head count) is not a multiple of
    `tp_size`: attention heads split by `q_proj`/`o_proj` rules, intermediate sizes split by MLP rules, the vocabulary
    split by `embed_tokens`/`lm_head` rules, experts' intermediate sizes. Only dimensions a rule actually splits are
    checked (KV heads have their own rule, TPA102), and only where the split output is not gathered back
    (`colwise_gather_output` keeps every head on every rank).

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
    from ..compat.logic import style_gathers_output

    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    heads_attr, heads_values = ctx.facts.role_values(V.ATTENTION_HEADS)
    heads_values = [h for h in heads_values if isinstance(h, int)]
    # name the spelling config.json uses (CodeGen's `n_head`), the file a user edits
    heads_attr = next((a for a in V.ATTENTION_HEADS.attrs if a in _raw_section(ctx)), heads_attr)
    bad_heads = [h for h in heads_values if h % tp]
    by_target: dict[str, dict] = {}
    for g in sharded_groups(ctx):
        p = g.first
        if is_quant_companion(p):
            continue  # packed weights, scales and metadata: judged on logical sizes by TPA2xx / TPA501
        r = role(p)
        if r == "kv":
            continue  # TPA102
        if r in ("q", "qkv", "o") and heads_values:
            if style_gathers_output(p.style):
                continue  # the output is gathered: every rank computes with every head
            if bad_heads:
                entry = by_target.setdefault(ctx.config_target(heads_attr),
                                             {"value": bad_heads[0], "params": set(), "sizes": None})
                entry["params"].add(g.generic_name)
            continue
        if p.plan == "ep":
            continue  # experts split by expert: MoEParamShard enforces divisibility itself
        size = p.global_shape[p.shard_dim] // max(1, p.split_factor)
        if size % tp == 0:
            continue
        attr = _attr_for(ctx, size, _hint(g))
        target = ctx.config_target(attr) if attr else g.generic_name
        entry = by_target.setdefault(target, {"value": size, "params": set(),
                                              "sizes": [chunk(size, tp, r) for r in range(tp)]})
        entry["params"].add(g.generic_name)
    for target, entry in sorted(by_target.items()):
        size = entry["value"]
        divisors = [d for d in range(2, min(size, 64) + 1) if size % d == 0 and d <= 16][:6]
        valid = ", ".join(str(d) for d in divisors) or "1"
        families = sorted(entry["params"])
        if entry["sizes"] is None:  # heads
            per_rank = [chunk(size, tp, r) for r in range(tp)]
            what = f"{size} attention heads split {size / tp:g} per rank"
        else:
            per_rank = entry["sizes"]
            what = f"size {size} splits {_ranks_text(per_rank)} across {tp} ranks"
        yield Finding(
            code="TPA101", kind="indivisible_dim", severity="error", target=target,
            message=(f"`{target}` = {size} is not divisible by tp_size {tp}: {what} "
                     f"(rules on {', '.join(f'`{f}`' for f in families[:3])}{' ...' if len(families) > 3 else ''})"),
            fix=f"Use a tp_size that divides {size} ({valid}), or pad `{target.rpartition('.')[2]}` to a multiple "
                f"of {tp}",
            facts={"value": size, "tp_size": tp, "per_rank": per_rank, "params": families},
            fix_options=size_fix_options(ctx, divisors, f"which divides {size}"),
            fix_fallback=f"Pad `{target.rpartition('.')[2]}` to a multiple of {tp}")


@rule("TPA102", "kv_heads_per_rank", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False, points_at="config")
def check_kv_heads_per_rank(ctx: CheckContext) -> Iterable[Finding]:
    """KV heads that `tp_size` does not divide in a layer whose key projection the plan splits.

    **What it detects**
    A layer whose key projection is split on its output (`k_proj`, or a fused `qkv_proj`/`query_key_value`/
    `kv_b_proj`, `colwise` or `packed_colwise`) while the layer's number of KV heads is not a multiple of `tp_size`
    (`tp_size` greater than the KV heads included), so no rank holds a whole number of heads. A key projection whose
    output is gathered (`colwise_gather_output`) keeps every head on every rank, as transformers'
    `get_kv_heads_per_rank` says, and is never flagged; nor is one whose style keeps whole heads on every rank
    (transformers 5.25's `unit_colwise`, which duplicates heads when there are fewer than ranks: each rank's rows are
    read from the sharded parameter). Layers are checked one by one with their own KV-head count
    (per-layer overrides such as Gemma 4's global layers, set by `num_global_key_value_heads`), and the finding names
    the attribute that sets that count, with its value.

    **Why it matters**
    The KV cache and the sharded attention disagree: a paged cache sized for 4 KV heads meets attention that holds
    half a head per rank at tp 8 (Qwen3-VL-30B-A3B), and the first forward fails reshaping keys into heads
    (Gemma 4 31B at tp 8: its global layers have 4 KV heads of 512, split into 256-row halves).

    **Example**
    `--tp 8` on a model with `num_key_value_heads = 4` and `layers.*.self_attn.k_proj: colwise`.

    **Fix**
    Use a `tp_size` that divides the KV heads, or gather the key projection's output
    (`colwise_gather_output`) / keep `k_proj`/`v_proj` whole so every rank holds all KV heads (each rank then pays
    their full size).

    **References**
    transformers `distributed/tensor_parallel.py` (`get_kv_heads_per_rank`), `configuration_utils.py`
    (`get_head_shapes`), `generation/utils.py` (`_get_static_cache_init_shape`); tenstorrent/tt-xla#4881.
    """
    from ..shard.kvcache import key_projections, kv_layers

    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    layers = kv_layers(ctx.facts)
    keys = key_projections(ctx.shard_map, ctx.text_prefix)
    bad: dict[int, list[int]] = defaultdict(list)
    shares: dict[int, list[float]] = {}
    for layer in layers:
        key = keys.get(layer.index)
        if layer.kind in ("none", "mla") or key is None or key.gathered or key.style is None:
            continue
        local = [key.share(r) for r in range(ctx.shard_map.world_size)]
        if all(x == 1.0 for x in local):
            continue
        # a style that keeps whole heads per rank (transformers 5.25's `unit_colwise`: 2 KV heads at tp 4 give every
        # rank one whole head, duplicated) splits no head, whatever tp_size is: read from the ranks' rows
        whole = all(abs(layer.kv_heads * x - round(layer.kv_heads * x)) < 1e-9 and layer.kv_heads * x >= 1
                    for x in local)
        if layer.kv_heads % tp and not whole:
            bad[layer.kv_heads].append(layer.index)
            shares.setdefault(layer.kv_heads, [layer.kv_heads * x for x in local])
    for heads, indices in sorted(bad.items()):
        attr, attr_value = ctx.facts.attribute_for(V.KV_HEADS, heads, _raw_section(ctx), V.ATTENTION_HEADS)
        target = ctx.config_target(attr)
        exact = shares[heads]
        text = " / ".join(f"{h:.5g}" for h in exact) if len(exact) <= 8 else f"{max(exact):.5g} .. {min(exact):.5g}"
        valid = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        tf_answer = _transformers_kv_heads(ctx, heads, tp)
        yield Finding(
            code="TPA102", kind="kv_heads_per_rank", severity="error", target=target,
            message=(f"`{target}` = {attr_value} KV heads cannot be split across {tp} ranks: the ranks hold {text} "
                     f"heads' worth of key rows in {len(indices)} layer(s) ({_layers_text(indices)}), no rank a whole "
                     "number; the KV cache and the sharded attention disagree"),
            fix=f"Use a tp_size dividing {heads} ({valid}), or gather the key projection's output "
                f"({COLWISE_GATHER_OUTPUT}) so every rank holds all KV heads",
            fix_options=size_fix_options(ctx, [d for d in range(2, heads + 1) if heads % d == 0],
                                         f"which divides the {heads} KV heads"),
            fix_fallback=(f"Gather the key projection's output ({COLWISE_GATHER_OUTPUT}) so every rank holds all "
                          "KV heads"),
            facts={"kv_heads": heads, "tp_size": tp, "kv_heads_per_rank": heads / tp, "heads_by_rank": exact,
                   "layers": indices, "attribute": attr, "attribute_value": attr_value,
                   "transformers_kv_heads_per_rank": tf_answer})


def size_fix_options(ctx: CheckContext, sizes: list[int], why: str) -> tuple[FixOption, ...]:
    """The tp sizes a size fix names, for the run stage to re-check: of `sizes` (each > 1), the nearest below and
    the nearest above the checked tp size, each also with the ep size transformers accepts on its ranks when the
    model has an expert-parallel plan (its experts then split by expert)."""
    from ..compat import backend

    tp = ctx.shard_map.tp_size
    below = [t for t in sizes if 1 < t < tp][-1:]
    above = [t for t in sizes if t > tp][:1]
    options = []
    for t in below + above:
        options.append(FixOption(f"Use --tp {t}, {why}", t, 1))
        if ctx.plan.ep_rules:
            options += [FixOption(f"Use --tp {t} --ep {ep}, {why}, with the experts split by expert", t, ep)
                        for ep in backend().accepted_ep_sizes(t, range(2, t + 1))]
    return tuple(options)


def _raw_section(ctx: CheckContext) -> dict:
    """The `config.json` section of the config that owns the plan (`text_config` of a composite model)."""
    raw = ctx.source.config.get(ctx.plan_owner) if ctx.plan_owner else ctx.source.config
    return raw if isinstance(raw, dict) else {}


def _layers_text(indices: list[int]) -> str:
    if len(indices) <= 6:
        return "layers " + ", ".join(map(str, indices))
    return f"layers {indices[0]}, {indices[1]}, ..., {indices[-1]}"


def _transformers_kv_heads(ctx: CheckContext, heads: int, tp: int):
    """What transformers' own `get_kv_heads_per_rank` says for the applied plan (`None`: cannot be split)."""
    from ..compat import backend

    applied = {k: v for k, v in ctx.plan.applied_tp.items()}
    return backend().kv_heads_per_rank(applied, heads, tp)
