"""TPA0xx: plan coverage. Which weights no rule shards, which rules shard nothing, whether there is a plan at all."""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from typing import Iterable

from ..model import Finding, ParamShard
from .registry import CheckContext, rule

_ROUTER_LEAF = re.compile(r"(^|_)(gate|router)$")
_ROUTER_TYPE = re.compile(r"Router|TopK|Topk|MoeGate|MoEGate")


def is_router(p: ParamShard) -> bool:
    """A MoE router/gate weight (`mlp.gate`, `mlp.router`, `shared_expert_gate`): transformers keeps them whole."""
    module_leaf = p.name.rsplit(".", 2)[-2] if p.name.count(".") >= 1 else ""
    return bool(_ROUTER_LEAF.search(module_leaf) or _ROUTER_TYPE.search(p.module_type))


def is_conv(p: ParamShard) -> bool:
    """A convolution kernel (`Conv1d/2d/3d` modules): transformers keeps them whole."""
    return p.module_type.startswith("Conv") or "Conv1d" in p.module_type or "Conv2d" in p.module_type \
        or "Conv3d" in p.module_type


def is_projection(ctx: CheckContext, p: ParamShard) -> bool:
    """A weight whose size the plan exists for: 2-D or more, in the decoder stack or the `lm_head`, not a router
    and not a convolution kernel (severity convention of ../shared/cases/README.md)."""
    return p.ndim >= 2 and ctx.in_decoder(p.name) and not is_router(p) and not is_conv(p)


def replicated_params(ctx: CheckContext) -> list[ParamShard]:
    """Parameters every rank holds whole because nothing shards them (tied copies excluded). Empty at world size 1."""
    if ctx.shard_map.world_size == 1:
        return []
    return [p for p in ctx.shard_map.params if p.sharding == "unsharded" and p.tied_to is None]


def tower_root(ctx: CheckContext, name: str) -> str:
    """The top module outside the decoder that holds `name` (`model.visual`, `model.multi_modal_projector`)."""
    parts = name.split(".")
    prefix_parts = ctx.text_prefix.split(".") if ctx.text_prefix else []
    i = 0
    while i < len(prefix_parts) and i < len(parts) and parts[i] == prefix_parts[i]:
        i += 1
    return ".".join(parts[: i + 1])


def rule_key_for(p: ParamShard) -> tuple[str, str]:
    """`(generic key, "module" | "parameter")` of the rule that would shard `p`: the module path for a module's
    `weight`/`bias` and its quantization tensors (`layers.*.self_attn.q_proj`, which they follow), the parameter path
    for a bare parameter (`layers.*.mlp.experts.gate_up_proj`; its `_scale_inv` follows it the same way)."""
    from ._shapes import QUANT_LEAVES, QUANT_SUFFIXES

    module, _, leaf = p.generic_name.rpartition(".")
    if module and (leaf in ("weight", "bias") or leaf in QUANT_LEAVES or leaf.startswith("weight_")):
        return module, "module"
    for suffix in QUANT_SUFFIXES:
        if leaf.endswith(suffix) and len(leaf) > len(suffix):
            return f"{module}.{leaf[: -len(suffix)]}", "parameter"
    return p.generic_name, "parameter"


def _why(p: ParamShard) -> str:
    if p.rule is None:
        return "no rule matches"
    return f"rule `{p.rule}: {p.style}` does not shard parameters"


def _groups(params: Iterable[ParamShard]) -> dict[str, list[ParamShard]]:
    out: dict[str, list[ParamShard]] = defaultdict(list)
    for p in params:
        out[p.generic_name].append(p)
    return out


@rule("TPA001", "replicated_weight")
def check_replicated_weight(ctx: CheckContext) -> Iterable[Finding]:
    """A weight of the decoder stack that no rule shards, so every rank holds it whole.

    **What it detects**
    A 2-D (or larger) projection weight of the text model or the `lm_head` (attention, linear attention, MLP, routed
    or shared experts, input embedding) that is a plain tensor after transformers applies the plan: no rule names
    the parameter or its module, or the rule that does has a style that does not shard parameters (`moe_tp_experts`
    on the experts module). Routers, norms, biases, convolution kernels and vision/audio towers are reported as
    notes: transformers keeps them whole by design.

    **Why it matters**
    Each rank pays the weight's full size at any `tp_size`. Qwen3-VL-30B-A3B with no `mlp.experts.*` rules keeps all
    48 x 128 experts (54.00 GiB of its 57.87 GiB) on every rank: 55.74 GiB per rank at tp 4 instead of 15.24 GiB,
    and training OOMs (huggingface/transformers#48308).

    **Example**
    `base_model_tp_plan` has `layers.*.mlp.gate_proj/up_proj/down_proj` rules while every layer is a MoE block whose
    experts live at `layers.*.mlp.experts.gate_up_proj` / `down_proj`.

    **Fix**
    Add rules for the replicated parameters (`layers.*.mlp.experts.gate_up_proj: packed_colwise`,
    `layers.*.mlp.experts.down_proj: rowwise`, `layers.*.mlp.experts: moe_tp_experts`); `tpaudit check --suggest`
    proposes them from sibling architectures and re-simulates.

    **References**
    transformers `distributed/mixin.py` (`_expand_parallel_plan`), `distributed/parallel_utils.py`
    (`_get_parameter_plan`); huggingface/transformers#48308, #48354.
    """
    world = ctx.shard_map.world_size
    params = replicated_params(ctx)
    errors = [p for p in params if is_projection(ctx, p)]
    for generic, members in sorted(_groups(errors).items()):
        total = sum(p.global_bytes for p in members)
        first = members[0]
        full_key, key_kind = rule_key_for(first)
        key = ctx.relative_key(full_key)
        yield Finding(
            code="TPA001", kind="replicated_weight", severity="error", target=generic,
            message=(f"`{generic}` replicated on {world} ranks: {len(members)} x {_shape(first)} "
                     f"{first.dtype} = {ctx.size(total)} on every rank ({_why(first)})"),
            fix=f"Add a rule for `{key}` to {_owner(ctx)} base_model_tp_plan (tpaudit check --suggest proposes one)",
            facts={"count": len(members), "bytes": total, "bytes_per_rank": total, "shape": list(first.global_shape),
                   "dtype": first.dtype, "rule": first.rule, "style": first.style, "relative_key": key,
                   "key_kind": key_kind})
    # Routers and convolutions of the decoder: one note per generic name.
    others = [p for p in params if p.ndim >= 2 and ctx.in_decoder(p.name) and not is_projection(ctx, p)]
    for generic, members in sorted(_groups(others).items()):
        total = sum(p.global_bytes for p in members)
        what = "router/gate" if is_router(members[0]) else "convolution"
        yield Finding(
            code="TPA001", kind="replicated_weight", severity="note", target=generic,
            message=(f"`{generic}` ({what}) held whole on every rank: {ctx.size(total)}; transformers keeps "
                     f"{what} weights replicated by design"),
            facts={"count": len(members), "bytes": total, "bytes_per_rank": total})
    # Towers outside the decoder: one note per tower.
    towers: dict[str, list[ParamShard]] = defaultdict(list)
    for p in params:
        if not ctx.in_decoder(p.name):
            towers[tower_root(ctx, p.name)].append(p)
    for root, members in sorted(towers.items()):
        total = sum(p.global_bytes for p in members)
        yield Finding(
            code="TPA001", kind="replicated_weight", severity="note", target=f"{root}.*",
            message=(f"`{root}` ({len(members)} tensors, {ctx.size(total)}) is held whole on every rank: "
                     "transformers' TP plans do not cover vision/audio towers and projectors"),
            facts={"count": len(members), "bytes": total, "bytes_per_rank": total})


@rule("TPA002", "unused_rule", severity="warning")
def check_unused_rule(ctx: CheckContext) -> Iterable[Finding]:
    """A plan rule that names no module and no parameter of the runtime model.

    **What it detects**
    A rule key (after transformers prefixes it with the submodule that owns the plan) that matches no module and no
    parameter name of the model as built, with layer indices as `*`. Rules are matched against runtime names, after
    the loader's renaming, never against checkpoint keys.

    **Why it matters**
    The rule does nothing; usually the weight it was written for is replicated under another name. Mixtral's
    `layers.*.block_sparse_moe.experts.*.w1` rules stopped matching when transformers renamed the module to
    `mlp.experts` and fused the experts, and every rank kept all experts (huggingface/transformers#42236).

    **Example**
    `"layers.*.mlp.gate_proj": "colwise"` in a model whose layers are all sparse MoE blocks.

    **Fix**
    Remove the rule, or rewrite its key to the runtime module path it was meant for (see the replicated weights of
    the same report).

    **References**
    transformers `distributed/mixin.py` (`_validate_parallel_plan` logs the same set only at load time and only on
    rank 0).
    """
    from ..model import generic_name

    names = sorted({generic_name(m) for m in ctx.modules if m} | {p.generic_name for p in ctx.shard_map.params})
    for kind, rules, unused in (("tp", ctx.plan.tp_rules, ctx.plan.unused_tp_rules),
                                ("ep", ctx.plan.ep_rules, ctx.plan.unused_ep_rules)):
        for key in unused:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
            hint = f" (closest runtime name: `{close[0]}`)" if close else ""
            yield Finding(
                code="TPA002", kind="unused_rule", severity="warning", target=key,
                message=f"{kind} rule `{key}: {rules[key]}` matches no module or parameter of {ctx.architecture}{hint}",
                fix=f"Remove `{ctx.relative_key(key)}` or rewrite it to a runtime module path",
                facts={"plan": kind, "style": rules[key], "closest": close[0] if close else None,
                       "relative_key": ctx.relative_key(key)})


@rule("TPA003", "no_plan")
def check_no_plan(ctx: CheckContext) -> Iterable[Finding]:
    """The plan shards nothing of the base model.

    **What it detects**
    `tp_size > 1` while no rule applies to any parameter of the text base model: the model has no
    `base_model_tp_plan` (or it is empty), and at most a class-level rule such as `lm_head` exists. When the merged
    plan is entirely empty, `from_pretrained` itself raises; a lone class-level rule defeats that guard.

    **Why it matters**
    Every rank holds the whole decoder. gpt-oss-120b in transformers 5.23 has only `base_model_ep_plan`: with
    `tp_size=8` alone, everything but the `lm_head` is replicated on all 8 ranks.

    **Example**
    `GptOssConfig.base_model_tp_plan = None` with `GptOssForCausalLM._tp_plan = {"lm_head": "colwise_gather_output"}`.

    **Fix**
    Add a `base_model_tp_plan` to the config class (`tpaudit check --suggest` proposes one), or use the model's
    expert-parallel plan (`--ep` equal to `--tp`) where it ships one.

    **References**
    transformers `distributed/mixin.py` (`_resolve_parallel_plans`: "has no `tp_plan`" only fires for an empty plan).
    """
    sm = ctx.shard_map
    if sm.tp_size <= 1 and sm.ep_size <= 1:
        return
    decoder = [p for p in sm.params if p.tied_to is None and ctx.in_decoder(p.name) and p.name not in ctx.lm_head_names]
    covered = [p for p in decoder if p.sharding != "unsharded"]
    if decoder and not covered or ctx.plan.loader_errors:
        total = sum(p.global_bytes for p in decoder)
        why = "; ".join(ctx.plan.loader_errors) if ctx.plan.loader_errors else (
            f"no rule of the merged plan applies to `{ctx.text_prefix or 'the base model'}`"
            + (f" (only {', '.join(f'`{k}`' for k in sorted(ctx.plan.tp_rules))})" if ctx.plan.tp_rules else ""))
        ep_hint = ""
        if ctx.plan.ep_rules and sm.ep_size == 1:
            ep_hint = f"; this model ships base_model_ep_plan: try --ep {sm.tp_size}"
        yield Finding(
            code="TPA003", kind="no_plan", severity="error", target=ctx.text_prefix or ctx.architecture,
            message=(f"{ctx.architecture} has no tensor-parallel plan for its base model at tp_size {sm.tp_size}: "
                     f"{why}; {ctx.size(total)} of decoder weights are held whole on every rank"),
            fix=f"Add base_model_tp_plan to {_owner(ctx)} (tpaudit check --suggest){ep_hint}",
            facts={"decoder_bytes": total, "loader_errors": list(ctx.plan.loader_errors),
                   "has_ep_plan": bool(ctx.plan.ep_rules)})


@rule("TPA004", "replicated_budget")
def check_replicated_budget(ctx: CheckContext) -> Iterable[Finding]:
    """More bytes replicated per rank than `--max-replicated` allows.

    **What it detects**
    The bytes every rank holds whole (unsharded parameters, tied pairs once) exceed the budget given with
    `--max-replicated BYTES` (e.g. `2GiB`) or `--max-replicated PCT%` (a share of the whole model).

    **Why it matters**
    A CI gate on size catches a plan regression that keeps every individual weight legal (norms, vision towers,
    routers) but grows what each rank must hold.

    **Example**
    `tpaudit check Qwen/Qwen3-VL-30B-A3B-Instruct --tp 4 --max-replicated 1%`: the vision tower alone is 1.77% of
    the model.

    **Fix**
    Shard the largest replicated families (see the report's replicated list), or raise the budget deliberately.

    **References**
    tpaudit `--max-replicated`.
    """
    opts = ctx.options
    if opts.max_replicated_bytes is None and opts.max_replicated_share is None:
        return
    replicated = sum(p.global_bytes for p in replicated_params(ctx))
    total = ctx.shard_map.total_param_bytes
    share = replicated / total if total else 0.0
    over_bytes = opts.max_replicated_bytes is not None and replicated > opts.max_replicated_bytes
    over_share = opts.max_replicated_share is not None and share > opts.max_replicated_share
    if over_bytes or over_share:
        limit = (ctx.size(opts.max_replicated_bytes) if over_bytes
                 else f"{opts.max_replicated_share:.2%} of the model")
        yield Finding(
            code="TPA004", kind="replicated_budget", severity="error", target="replicated",
            message=(f"{ctx.size(replicated)} ({share:.2%} of the model) is replicated on every rank, over the "
                     f"--max-replicated budget of {limit}"),
            fix="Shard the largest replicated families, or raise --max-replicated",
            facts={"replicated_bytes": replicated, "share": share, "max_bytes": opts.max_replicated_bytes,
                   "max_share": opts.max_replicated_share})


def _shape(p: ParamShard) -> str:
    return "[" + ", ".join(str(d) for d in p.global_shape) + "]"


def _owner(ctx: CheckContext) -> str:
    config = ctx.config if not ctx.plan_owner else getattr(ctx.config, ctx.plan_owner, ctx.config)
    return f"{type(config).__name__}"
