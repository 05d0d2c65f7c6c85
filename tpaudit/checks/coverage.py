"""TPA0xx: plan coverage. Which weights no rule shards, which rules shard nothing, whether there is a plan at all."""

from __future__ import annotations

import difflib
from collections import defaultdict
from typing import Iterable, Literal

from ..compat.styles import is_embedding_style, is_experts_module_style
from ..metamodel import vocabulary as V
from ..metamodel.mapping import QUANT_LEAVES, QUANT_SUFFIXES, is_quant_tensor_name
from ..model import Finding, FindingSubject, FixOption, ParamGroup, why_unsharded
from .registry import CheckContext, rule

HINTS = 50


def kept_whole_by_design(ctx: CheckContext, g: ParamGroup) -> str | None:
    """Why serving engines and transformers keep this weight whole on purpose, or `None` for a weight the plan
    exists for. One policy for every architecture:

    - **router/gate**: the module's output is the expert count (any spelling of `vocabulary.EXPERTS`:
      `num_experts`, `num_local_experts`, `n_routed_experts`, ...) or a single score (`shared_expert_gate`), or its
      module is a router class;
    - **MLA down-projection**: the module's output is the low rank of DeepSeek-style attention (`q_lora_rank`, or
      `kv_lora_rank + qk_rope_head_dim` for `kv_a_proj_with_mqa`): small, and followed by a norm over the whole rank;
    - **convolution**: a `Conv1d/2d/3d` kernel.

    The sizes come from the config, not the parameter's name; the router module's name is a fallback for routers
    whose expert count the config names differently.
    """
    p = g.first
    facts = ctx.module_of(p.name)
    out_features = facts.out_features if facts is not None else (p.global_shape[-2] if p.ndim >= 2 else None)
    experts = {ctx.facts.value(n) for n in V.EXPERTS.attrs} - {None}
    if p.module_type.startswith("Conv") or any(f"Conv{d}d" in p.module_type for d in (1, 2, 3)):
        return "convolution"
    if experts and (out_features in experts or (out_features == 1 and p.ndim == 2)):
        return "router/gate"
    module_leaf = p.name.rsplit(".", 2)[-2] if p.name.count(".") >= 1 else ""
    if V.ROUTER_LEAF.search(module_leaf) or V.ROUTER_TYPE.search(p.module_type):
        return "router/gate"
    q_rank, kv_rank = ctx.facts.get(V.Q_LORA_RANK), ctx.facts.get(V.KV_LORA_RANK)
    rope = ctx.facts.get(V.MLA_ROPE_HEAD_DIM)
    ranks = {q_rank, kv_rank, (kv_rank + rope) if isinstance(kv_rank, int) and isinstance(rope, int) else None}
    if isinstance(kv_rank, int) and out_features in ranks - {None}:
        return "MLA low-rank down-projection"
    return None


def tower_root(ctx: CheckContext, name: str) -> str:
    """The top module outside the decoder that holds `name` (`model.visual`, `model.multi_modal_projector`)."""
    parts = name.split(".")
    prefix_parts = ctx.text_prefix.split(".") if ctx.text_prefix else []
    i = 0
    while i < len(prefix_parts) and i < len(parts) and parts[i] == prefix_parts[i]:
        i += 1
    return ".".join(parts[: i + 1])


def rule_key_for(generic: str) -> tuple[str, Literal["module", "parameter"]]:
    """`(generic key, "module" | "parameter")` of the rule that would shard a parameter: the module path for a
    module's `weight`/`bias` and its quantization tensors (`layers.*.self_attn.q_proj`, which they follow), the
    parameter path for a bare parameter (`layers.*.mlp.experts.gate_up_proj`; its `_scale_inv` follows it)."""
    module, _, leaf = generic.rpartition(".")
    if module and (leaf in ("weight", "bias") or leaf in QUANT_LEAVES or leaf.startswith("weight_")):
        return module, "module"
    for suffix in QUANT_SUFFIXES:
        if leaf.endswith(suffix) and len(leaf) > len(suffix):
            return f"{module}.{leaf[: -len(suffix)]}", "parameter"
    return generic, "parameter"


def _units(groups: Iterable[ParamGroup]) -> dict[str, list[ParamGroup]]:
    """Groups by the rule key that would shard them: a weight and its quantization tensors are one unit."""
    out: dict[str, list[ParamGroup]] = defaultdict(list)
    for g in groups:
        out[rule_key_for(g.generic_name)[0]].append(g)
    return out


def _lead(members: list[ParamGroup]) -> ParamGroup:
    """The group that names a unit: its weight, not a scale or a bias."""
    for g in members:
        leaf = g.generic_name.rpartition(".")[2]
        if not is_quant_tensor_name(leaf) and leaf != "bias":
            return g
    return members[0]


@rule("TPA001", "replicated_weight", severity="error", breaks_forward=False, suggest="vote",
      counts_replicated=True, fails_load=False)
def check_replicated_weight(ctx: CheckContext) -> Iterable[Finding]:
    """A weight of the decoder stack that no rule shards, so every rank holds it whole.

    **What it detects**
    A 2-D (or larger) projection weight of the text model or the `lm_head` (attention, linear attention, MLP, routed
    or shared experts, input embedding) that is a plain tensor after transformers applies the plan: no rule names
    the parameter or its module, or the rule that does has a style that does not shard parameters (`moe_tp_experts`
    on the experts module). A weight's quantization tensors (`weight_scale_inv`, `weight_packed`, ...) are part of
    its finding, not findings of their own.

    Weights kept whole by design are **notes**, with their bytes, under one policy for every architecture: MoE
    routers and gates (their output is the expert count or one score), the low-rank down-projections of MLA attention
    (`q_a_proj`, `kv_a_proj_with_mqa`: their output is `q_lora_rank` / `kv_lora_rank + qk_rope_head_dim`, which
    serving engines replicate on purpose) and their norms, convolution kernels, and vision/audio towers and
    projectors (transformers' plans never cover them). Norms, biases and other vectors are listed in the report's
    `replicated` section without a finding.

    **Why it matters**
    Each rank pays the weight's full size at any `tp_size`. Qwen3-VL-30B-A3B with no `mlp.experts.*` rules keeps all
    48 x 128 experts (54.00 GiB of its 57.87 GiB) on every rank: 55.74 GiB per rank at tp 4 instead of 15.24 GiB,
    and training OOMs (huggingface/transformers#48308).

    **Example**
    `base_model_tp_plan` has `layers.*.mlp.gate_proj/up_proj/down_proj` rules while every layer is a MoE block whose
    experts live at `layers.*.mlp.experts.gate_up_proj` / `down_proj`.

    **Fix**
    Routed experts that the model's expert-parallel plan covers: split them by expert, `--ep N` with `N = tp_size`
    (`DistributedConfig(tp_size=N, ep_size=N)`); this is what transformers 5.25 expects, since it took the experts
    out of most MoE TP plans, and the finding's fix names it only after re-checking it. Other weights: add a rule
    for them (`layers.*.self_attn.q_proj: colwise`, `layers.*.mlp.shared_expert.down_proj: rowwise`);
    `tpaudit check --suggest` proposes rules from sibling architectures whose parameters have the same layout, or
    the ep size, and prints them only once their whole re-check (load stage and parity included) is clean.

    **References**
    transformers `distributed/mixin.py` (`_expand_parallel_plan`), `distributed/parallel_utils.py`
    (`_get_parameter_plan`); huggingface/transformers#48308, #48354.
    """
    world = ctx.shard_map.world_size
    groups = ctx.shard_map.replicated_groups()
    decoder = [g for g in groups if ctx.in_decoder(g.first.name)]
    for key, members in sorted(_units(g for g in decoder if g.first.ndim >= 2).items()):
        lead = _lead(members)
        total = sum(g.total_bytes for g in members)
        names = [g.generic_name for g in members]
        design = kept_whole_by_design(ctx, lead)
        relative, key_kind = ctx.relative_key(key), rule_key_for(lead.generic_name)[1]
        shape = "[" + ", ".join(str(d) for d in lead.global_shape) + "]"
        extra = f" (+ {len(members) - 1} quantization tensor(s))" if len(members) > 1 else ""
        if design is None:
            fix = (f"Add a rule for `{relative}` to {ctx.owner_class} base_model_tp_plan (tpaudit check --suggest "
                   "proposes one)")
            by_expert, options = _expert_parallel_fix(ctx, lead.first.name, relative)
            yield Finding(
                code="TPA001", kind="replicated_weight", severity="error", target=lead.generic_name,
                message=(f"`{lead.generic_name}`{extra} replicated on {world} ranks: {lead.count} x {shape} "
                         f"{lead.dtype} = {ctx.size(total)} on every rank ({why_unsharded(lead.first)})"
                         + by_expert),
                fix=fix, fix_options=options, fix_fallback=fix,
                facts={"count": lead.count, "bytes": total, "bytes_per_rank": total, "shape": list(lead.global_shape),
                       "dtype": lead.dtype, "rule": lead.rule, "style": lead.style, "relative_key": relative,
                       "key_kind": key_kind, "families": names},
                subject=FindingSubject(rule_key=relative, key_kind=key_kind, families=tuple(names),
                                       shape=tuple(lead.global_shape)))
        else:
            yield Finding(
                code="TPA001", kind="replicated_weight", severity="note", target=lead.generic_name,
                message=(f"`{lead.generic_name}`{extra} ({design}) held whole on every rank: {ctx.size(total)}; "
                         f"kept whole by design (see tpaudit explain TPA001)"),
                facts={"count": lead.count, "bytes": total, "bytes_per_rank": total, "why": design,
                       "relative_key": relative, "families": names},
                subject=FindingSubject(rule_key=relative, families=tuple(names)))
    towers: dict[str, list[ParamGroup]] = defaultdict(list)
    for g in groups:
        if not ctx.in_decoder(g.first.name):
            towers[tower_root(ctx, g.first.name)].append(g)
    for root, members in sorted(towers.items()):
        total = sum(g.total_bytes for g in members)
        count = sum(g.count for g in members)
        yield Finding(
            code="TPA001", kind="replicated_weight", severity="note", target=f"{root}.*",
            message=(f"`{root}` ({count} tensors, {ctx.size(total)}) is held whole on every rank: "
                     "transformers' TP plans do not cover vision/audio towers and projectors"),
            facts={"count": count, "bytes": total, "bytes_per_rank": total, "why": "tower",
                   "families": [g.generic_name for g in members]},
            subject=FindingSubject(families=tuple(g.generic_name for g in members)))


def _expert_parallel_fix(ctx: CheckContext, name: str, relative: str) -> tuple[str, tuple[FixOption, ...]]:
    """For a replicated parameter that the model's expert-parallel plan covers, at tp > 1 without EP: the message's
    plain statement when the release's shipped plan leaves it to expert parallelism alone (transformers 5.25
    dropped the routed experts' TP rules), and the `--ep` alternatives transformers accepts on the same ranks, for
    the run stage to re-check. `("", ())` otherwise."""
    from ..compat import backend, installed_version
    from ..compat.logic import parameter_rule

    sizes = ctx.shard_map
    if sizes.ep_size != 1 or sizes.tp_size < 2 or not ctx.plan.ep_rules:
        return "", ()
    ep_key = parameter_rule(name, ctx.plan.ep_rules)
    if ep_key is None:
        return "", ()
    tf = backend()
    tp = sizes.tp_size
    options = tuple(FixOption(f"Use expert parallelism, --tp {tp} --ep {ep}: the model's expert-parallel plan "
                              f"(`{ctx.relative_key(ep_key)}: {ctx.plan.ep_rules[ep_key]}`) splits these experts by "
                              "expert", tp, ep)
                    for ep in tf.accepted_ep_sizes(tp, range(2, tp + 1)))
    if ctx.plan.override is not None or ctx.plan.dist_overrides:  # the plan in force is the user's, not the shipped one
        return ("; the plan in force has no rule for them, while the model's expert-parallel plan does: expert "
                "parallelism splits them"), options
    shipped = tf.base_plan(type(ctx.built.owner_config))
    if shipped and parameter_rule(relative, shipped) is None:
        return (f"; transformers {installed_version('transformers')} splits these experts by expert parallelism "
                f"only: {ctx.owner_class}'s shipped base_model_tp_plan has no rule for them, its expert-parallel "
                f"plan does, so a load with tp_size alone holds them whole"), options
    return "", options


def _ep_options(ctx: CheckContext, why: str) -> tuple[FixOption, ...]:
    """`--ep N` on the same ranks, for each ep size transformers accepts there, as alternatives to re-check."""
    from ..compat import backend

    tp = ctx.shard_map.tp_size
    return tuple(FixOption(f"Use --tp {tp} --ep {ep}: {why}", tp, ep)
                 for ep in backend().accepted_ep_sizes(tp, range(2, tp + 1)))


@rule("TPA002", "unused_rule", severity="warning", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False)
def check_unused_rule(ctx: CheckContext) -> Iterable[Finding]:
    """A plan rule that names no module and no parameter of the runtime model.

    **What it detects**
    A rule key (after transformers prefixes it with the submodule that owns the plan) that matches no module and no
    parameter name of the model as built, with layer indices as `*`. Rules are matched against runtime names, after
    the loader's renaming, never against checkpoint keys. The hint names the closest runtime module of the same kind
    (a dense projection is never pointed at a MoE router or an expert).

    **Why it matters**
    The rule does nothing; usually the weight it was written for is replicated under another name. Mixtral's
    `layers.*.block_sparse_moe.experts.*.w1` rules stopped matching when transformers renamed the module to
    `mlp.experts` and fused the experts, and every rank kept all experts (huggingface/transformers#42236).

    **Example**
    `layers.*.mlp.gate_proj: colwise` in a model whose layers are all sparse MoE blocks.

    **Fix**
    Remove the rule, or rewrite its key to the runtime module path it was meant for (see the replicated weights of
    the same report). A rule of the plan transformers ships (Qwen3-MoE's dense `mlp.*` rules, for configs whose
    `mlp_only_layers` are dense) is often for layers this config does not have: nothing to edit unless a weight of
    its kind is replicated (TPA001), when `--suggest` gives a load-time override.

    **References**
    transformers `distributed/mixin.py` (`_validate_parallel_plan` logs the same set only at load time and only on
    rank 0).
    """
    from ..compat.logic import generic_name

    candidates = _hint_candidates(ctx, generic_name)
    hinted = 0
    # the plan under review is transformers' own (no --plan, no --suggest candidate, no DistributedConfig override):
    # a user cannot remove its rules, only override the plan at load time
    shipped = ctx.plan.override is None and not ctx.plan.dist_overrides
    for kind, rules, unused in (("tp", ctx.plan.tp_rules, ctx.plan.unused_tp_rules),
                                ("ep", ctx.plan.ep_rules, ctx.plan.unused_ep_rules)):
        for key in unused:
            # The spelling search costs time per rule: a plan of thousands of dead rules (generated, or hostile) gets
            # hints on its first HINTS, and stays linear.
            close = _closest(key, rules[key], candidates) if hinted < HINTS or shipped else None
            hinted += 1
            hint = f" (closest runtime module of that kind: `{close}`)" if close else ""
            # a shipped rule whose kind of layer the model lacks: no runtime module of its kind and leaf, or only an
            # expert's (a dense `mlp.down_proj` rule in a model whose every MLP is a sparse MoE block)
            absent = shipped and (close is None or _inside_experts(close, key, candidates))
            why = (f"; transformers ships it for a kind of layer {ctx.architecture} does not have, so it is a note"
                   if absent else "")
            yield Finding(
                code="TPA002", kind="unused_rule", severity="note" if absent else "warning", target=key,
                message=f"{kind} rule `{key}: {rules[key]}` matches no module or parameter of {ctx.architecture}"
                        f"{hint}{why}",
                fix=(f"Remove `{ctx.relative_key(key)}` or rewrite it to a runtime module path" if not shipped else
                     f"Nothing to edit unless a weight it was meant for is replicated (TPA001): the rule ships in "
                     f"transformers' `{ctx.owner_class}.base_model_{kind}_plan`, often for layers this config does "
                     f"not have; when one is, `--suggest` proposes a load-time override"),
                facts={"plan": kind, "style": rules[key], "closest": close, "relative_key": ctx.relative_key(key)},
                subject=FindingSubject(rule_key=ctx.relative_key(key)))


def _hint_candidates(ctx: CheckContext, generic_name) -> dict[str, str]:
    """Generic runtime name -> its kind, for the unused-rule hint: `linear` (a linear module, or a bare 2-D+ weight
    such as fused experts' `gate_up_proj`), `experts` (an experts container), `embedding`, `router`."""
    out = {}
    for name, facts in ctx.modules.items():
        if not name:
            continue
        g = generic_name(name)
        if g in out:
            continue
        if V.ROUTER_TYPE.search(facts.type) or V.ROUTER_LEAF.search(name.rpartition(".")[2]):
            out[g] = "router"
        elif "Expert" in facts.type:
            out[g] = "experts"
        elif facts.type.endswith("Embedding"):
            out[g] = "embedding"
        elif facts.in_features is not None and facts.out_features is not None:
            out[g] = "linear"
    for g in ctx.shard_map.groups:
        leaf = g.generic_name.rpartition(".")[2]
        if g.first.ndim >= 2 and leaf not in ("weight", "bias") and not is_quant_tensor_name(leaf):
            out.setdefault(g.generic_name, "linear")
    return out


def _inside_experts(name: str, key: str, candidates: dict[str, str]) -> bool:
    """`name` lies inside an experts container and the rule `key` names none (a dense rule's closest match is an
    expert's projection)."""
    parts = name.split(".")
    inside = any(candidates.get(".".join(parts[:i])) == "experts" for i in range(1, len(parts)))
    return inside and not any(candidates.get(".".join(key.split(".")[:i])) == "experts"
                              for i in range(1, key.count(".") + 1))


def _closest(key: str, style: str, candidates: dict[str, str]) -> str | None:
    """The runtime name a rule was most likely meant for: one of the same kind as the rule's style (a linear style
    never points at a router or an experts container, an embedding style only at embeddings) whose last component
    is the rule's (`mlp.down_proj` -> `mlp.experts.down_proj`); the closest such by spelling, else none."""
    if is_embedding_style(style):
        kinds = {"embedding"}
    elif is_experts_module_style(style):
        kinds = {"experts"}
    else:
        kinds = {"linear"}
    leaf = key.rpartition(".")[2]
    pool = [name for name, kind in candidates.items() if kind in kinds and name.rpartition(".")[2] == leaf]
    close = difflib.get_close_matches(key, pool, n=1, cutoff=0.5)
    return close[0] if close else None


@rule("TPA003", "no_plan", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False)
def check_no_plan(ctx: CheckContext) -> Iterable[Finding]:
    """The TP plan shards nothing inside the decoder layers.

    **What it detects**
    `tp_size > 1` while no TP rule shards any parameter inside the text model's repeated layers: the model has no
    `base_model_tp_plan`, or an empty one, or one whose rules only reach outside the layers (a class-level
    `lm_head` rule, an `embed_tokens: embedding_rowwise` rule), or only an expert-parallel plan shards the experts.
    When the merged plan is entirely empty, `from_pretrained` itself raises; any rule at all defeats that guard. The
    message says what does get sharded.

    **Why it matters**
    Attention and MLP stay whole on every rank. gpt-oss-120b in transformers 5.23 has only `base_model_ep_plan`: with
    `tp_size=8` alone, everything but the `lm_head` is replicated on all 8 ranks; transformers 5.24 adds
    `embed_tokens: embedding_rowwise` to its plan, which shards the embedding and nothing else.

    **Example**
    `GptOssConfig.base_model_tp_plan` holding only `embed_tokens: embedding_rowwise`, with
    `GptOssForCausalLM._tp_plan` holding only `lm_head: colwise_gather_output`.

    **Fix**
    Add attention and MLP rules to the config class's `base_model_tp_plan` (`tpaudit check --suggest` proposes
    them), or use the model's expert-parallel plan (`--ep` equal to `--tp`) where it ships one and accept the dense
    layers whole.

    **References**
    transformers `distributed/mixin.py` (`_resolve_parallel_plans`: "has no `tp_plan`" only fires for an empty plan).
    """
    sm = ctx.shard_map
    if sm.tp_size <= 1:
        return
    layer_groups = [g for g in sm.groups if g.tied_to is None and ctx.in_decoder(g.first.name)
                    and ".*." in ctx.relative_key(g.generic_name)]
    tp_sharded = [g for g in layer_groups if g.sharding == "sharded" and g.first.plan == "tp"]
    if layer_groups and tp_sharded and not ctx.plan.loader_errors:
        return
    if not layer_groups and not ctx.plan.loader_errors:
        return
    sharded_elsewhere = [g for g in sm.groups if g.sharding == "sharded" and g.tied_to is None]
    what = ", ".join(f"`{g.generic_name}` ({g.first.plan} {g.style})" for g in sharded_elsewhere[:4])
    if len(sharded_elsewhere) > 4:
        what += f" and {len(sharded_elsewhere) - 4} more"
    layer_bytes = sum(g.total_bytes for g in layer_groups if g.sharding != "sharded")
    ep_in_layers = [g for g in layer_groups if g.sharding == "sharded" and g.first.plan == "ep"]
    if ctx.plan.loader_errors:
        why = "; ".join(ctx.plan.loader_errors)
    elif ep_in_layers:
        why = (f"inside the layers only the expert-parallel plan shards (ep_size {sm.ep_size}: "
               f"{', '.join(f'`{g.generic_name}`' for g in ep_in_layers[:3])}), so attention and any dense MLP stay "
               "whole")
    elif sharded_elsewhere:
        why = f"the plan shards only {what}"
    else:
        why = "no rule of the merged plan shards anything"
    ep_hint = ""
    if ctx.plan.ep_rules and sm.ep_size == 1:
        ep_hint = f"; this model ships base_model_ep_plan: --ep {sm.tp_size} shards its experts by expert"
    yield Finding(
        code="TPA003", kind="no_plan", severity="error", target=ctx.text_prefix or ctx.architecture,
        message=(f"{ctx.architecture}'s tensor-parallel plan shards nothing inside its decoder layers at tp_size "
                 f"{sm.tp_size}: {why}; {ctx.size(layer_bytes)} of layer weights are held whole on every rank"),
        fix=f"Add attention and MLP rules to {ctx.owner_class} base_model_tp_plan (tpaudit check --suggest){ep_hint}",
        fix_options=_ep_options(ctx, "the model's expert-parallel plan shards its experts by expert") if ep_hint
        else (),
        fix_fallback=f"Add attention and MLP rules to {ctx.owner_class} base_model_tp_plan (tpaudit check --suggest)",
        facts={"layer_bytes": layer_bytes, "loader_errors": list(ctx.plan.loader_errors),
               "sharded": [g.generic_name for g in sharded_elsewhere], "has_ep_plan": bool(ctx.plan.ep_rules)})


@rule("TPA004", "replicated_budget", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False)
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
    replicated = sum(g.total_bytes for g in ctx.shard_map.replicated_groups())
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
