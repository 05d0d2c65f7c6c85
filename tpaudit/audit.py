"""The pipeline behind `tpaudit check`: source -> meta model + resolved plan -> shard map -> findings -> Report."""

from __future__ import annotations

from collections import OrderedDict

from . import __version__
from .checks.registry import CheckContext, CheckOptions, run_checks
from .model import Finding, ModelSource, ParamGroup, ReplicatedFamily, Report, ShardMap


def audit_source(source: ModelSource, *, tp_size: int, ep_size: int = 1, plan_override: dict[str, str] | None = None,
                 architecture: str | None = None, trust_remote_code: bool = False, dtype: str | None = None,
                 options: CheckOptions | None = None, suggest: bool = False, config=None,
                 instance_plans: dict | None = None, dist_overrides: dict | None = None) -> Report:
    """Simulate `source` at (tp_size, ep_size) with the installed transformers and run every check.

    Args:
        source (`ModelSource`): from `sources.open_source`.
        tp_size (`int`): tensor-parallel size (ranks).
        ep_size (`int`, *optional*, defaults to 1): expert-parallel size (1 or `tp_size` in transformers 5.23).
        plan_override (`dict[str, str]`, *optional*): replaces the base model's `base_model_tp_plan` (`--plan`).
        architecture (`str`, *optional*): model class; default `config.architectures[0]`.
        trust_remote_code (`bool`, *optional*, defaults to `False`).
        dtype (`str`, *optional*): load dtype as passed to `from_pretrained` (default `"auto"`).
        options (`CheckOptions`, *optional*): budgets (`--max-replicated`).
        suggest (`bool`, *optional*, defaults to `False`): propose rules for replicated families from sibling
            architectures, re-simulate with them, and add the `suggestion` section (see `suggest.py`).
        config (`PretrainedConfig`, *optional*), instance_plans (`dict`, *optional*): see `build.build_model`.
        dist_overrides (`dict`, *optional*): `DistributedConfig` `tp_plan` / `ep_plan` overrides.

    Returns:
        `Report`.

    Raises:
        UnsupportedVersionError, ConfigError, PlanError, UsageError: see `build`, `plan`, `simulate`.
    """
    from ._compat import check_versions
    from .build import build_model
    from .plan import distributed_config, resolve_plan
    from .simulate import simulate

    versions = {"tpaudit": __version__, **check_versions()}
    distributed_config(tp_size, ep_size, dist_overrides)  # fail on bad sizes before building anything
    built = build_model(source, plan_override=plan_override, architecture=architecture,
                        trust_remote_code=trust_remote_code, dtype=dtype, config=config,
                        instance_plans=instance_plans)
    lm_head_names = _lm_head_names(built.model)
    modules = _module_facts(built.model)
    plan = resolve_plan(built, tp_size, ep_size, plan_override, dist_overrides)
    shard_map = simulate(built, plan)
    ctx = CheckContext(source=source, config=built.config, architecture=built.architecture,
                       text_prefix=built.text_prefix, plan_owner=built.plan_owner, lm_head_names=lm_head_names,
                       plan=plan, shard_map=shard_map, mapping=built.mapping, quantization=built.quantization,
                       modules=modules, options=options or CheckOptions())
    findings = run_checks(ctx)
    extra = {}
    kv = kv_section(ctx, built.dtype)
    if kv is not None:
        extra["kv_cache"] = kv
    report = build_report(source, built, plan, shard_map, findings, versions, ctx, extra)
    if suggest:
        owner = built.config if not built.plan_owner else getattr(built.config, built.plan_owner)
        base_plan = dict(getattr(owner, "base_model_tp_plan", None) or {})
        if instance_plans:  # a model object: its merged plan, not its config class's, is the one in force
            prefix = built.text_prefix + "." if built.text_prefix else ""
            base_plan = {k[len(prefix):]: v for k, v in plan.tp_rules.items()
                         if k.startswith(prefix) and k not in plan.injected_rules}
        from .model import generic_name

        layouts = {ctx.relative_key(generic_name(name)): f for name, f in modules.items()
                   if f.is_transposed or f.is_concatenated is False}
        extra["suggestion"] = suggestion_section(
            report, base_plan, built.text_prefix, type(owner).__name__, layouts,
            lambda plan: audit_source(source, tp_size=tp_size, ep_size=ep_size, plan_override=plan,
                                      architecture=architecture, trust_remote_code=trust_remote_code, dtype=dtype,
                                      options=options, config=config, dist_overrides=dist_overrides))
    return report


def suggestion_section(report: Report, base_plan: dict[str, str], text_prefix: str, owner_class: str,
                       layouts: dict, rerun) -> dict:
    """Propose rules (`suggest.suggest_rules`), re-simulate with them (`rerun(plan) -> Report`) and compare.

    A second round proposes rules for what the first left replicated (transformers adds `embed_tokens:
    embedding_rowwise` by itself once a plan exists, so the input embedding is only proposed when that did not
    happen)."""
    from .suggest import snippet, suggest_rules

    suggestions, unresolved = suggest_rules(report, base_plan, text_prefix, layouts, defer={"embed_tokens"})

    def summary(r: Report) -> dict:
        return {"worst_rank_param_bytes": r.worst_rank_param_bytes, "replicated_bytes": r.replicated_bytes,
                "errors": r.count("error"), "warnings": r.count("warning")}

    prefix = text_prefix + "." if text_prefix else ""
    dead = {k[len(prefix):] if k.startswith(prefix) else k for k in report.unused_rules}
    dead = {k for k in dead if k in base_plan}  # rules that match nothing leave the suggested plan
    base_plan = {k: v for k, v in base_plan.items() if k not in dead}
    section = {"rules": {s.key: s.style for s in suggestions}, "unresolved": unresolved, "removed": sorted(dead),
               "voters": {s.key: {"matched": s.matched, "votes": s.votes, "examples": s.voters}
                          for s in suggestions},
               "before": summary(report), "after": None, "plan": None, "snippet": None, "new_errors": []}
    if suggestions:
        plan = {**base_plan, **{s.key: s.style for s in suggestions}}
        after = rerun(plan)
        more, unresolved_more = suggest_rules(after, plan, text_prefix, layouts)
        if more:
            suggestions += more
            plan.update({s.key: s.style for s in more})
            after = rerun(plan)
        section["unresolved"] = sorted(set(unresolved) | set(unresolved_more))
        section["rules"] = {s.key: s.style for s in suggestions}
        section["voters"] = {s.key: {"matched": s.matched, "votes": s.votes, "examples": s.voters}
                             for s in suggestions}
        before_errors = {f.fingerprint for f in report.findings if f.severity == "error"}
        section.update(after=summary(after), plan=plan,
                       snippet=snippet(owner_class, base_plan, suggestions, sorted(dead)),
                       new_errors=[f.to_json() for f in after.findings
                                   if f.severity == "error" and f.fingerprint not in before_errors])
    return section


def kv_section(ctx: CheckContext, dtype: str, kv_dtype: str | None = None) -> dict | None:
    """The report's `kv_cache` section (`None` when the model has no decoder attention the config describes)."""
    import torch

    from .kvcache import kv_summary

    name = kv_dtype or dtype
    try:
        itemsize = torch.empty((), dtype=getattr(torch, name)).element_size()
        return kv_summary(ctx.text_config, ctx.shard_map, ctx.text_prefix, itemsize, name)
    except Exception:  # noqa: BLE001 - configs without head shapes (encoders, exotic layouts): no KV section
        return None


def _lm_head_names(model) -> tuple[str, ...]:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is None:
        return ()
    for name, module in model.named_modules():
        if module is out:
            return tuple(f"{name}.{leaf}" for leaf in module._parameters)
    return ()


def _module_facts(model) -> dict:
    """Concrete module name -> `ModuleFacts` (type, logical linear sizes, attention head_dim), read before the
    simulation turns parameters into DTensors."""
    from .model import ModuleFacts

    out = {}
    for name, m in model.named_modules():
        in_f, out_f = getattr(m, "in_features", None), getattr(m, "out_features", None)
        head_dim = getattr(m, "head_dim", None)
        flags = {k: getattr(m, k) for k in ("is_transposed", "is_concatenated") if isinstance(getattr(m, k, None), bool)}
        out[name] = ModuleFacts(type=type(m).__name__, in_features=in_f if isinstance(in_f, int) else None,
                                out_features=out_f if isinstance(out_f, int) else None,
                                head_dim=head_dim if isinstance(head_dim, int) else None, **flags)
    return out


def group_params(shard_map: ShardMap) -> tuple[ParamGroup, ...]:
    """Group `shard_map.params` by generic name, in model order (tied copies carry 0 bytes)."""
    buckets: OrderedDict[str, list] = OrderedDict()
    for p in shard_map.params:
        buckets.setdefault(p.generic_name, []).append(p)
    world = shard_map.world_size
    out = []
    for generic, members in buckets.items():
        first = members[0]
        counted = [p for p in members if p.tied_to is None]
        out.append(ParamGroup(
            generic_name=generic, count=len(members), global_shape=first.global_shape, dtype=first.dtype,
            style=first.style, rule=first.rule, placement=first.placement, sharding=first.sharding,
            local_shape_rank0=first.local_shapes[0], local_shape_last=first.local_shapes[world - 1],
            total_bytes=sum(p.global_bytes for p in counted),
            rank_bytes=tuple(sum(p.rank_bytes(r) for p in counted) for r in range(world)),
            module_type=first.module_type, origin=first.origin, tied_to=first.tied_to))
    return tuple(out)


def replicated_families(ctx: CheckContext, findings: list[Finding]) -> tuple[ReplicatedFamily, ...]:
    """Families that no rule shards, largest first, with the severity of the finding that covers them."""
    from .checks.coverage import _why, replicated_params, tower_root

    severity = {f.target: f.severity for f in findings if f.kind == "replicated_weight"}
    buckets: OrderedDict[str, list] = OrderedDict()
    for p in replicated_params(ctx):
        buckets.setdefault(p.generic_name, []).append(p)
    out = []
    for generic, members in buckets.items():
        sev = severity.get(generic)
        if sev is None and not ctx.in_decoder(members[0].name) and members[0].ndim >= 2:
            sev = severity.get(f"{tower_root(ctx, members[0].name)}.*")
        out.append(ReplicatedFamily(name=generic, count=len(members), bytes=sum(p.global_bytes for p in members),
                                    reason=_why(members[0]), severity=sev))
    return tuple(sorted(out, key=lambda f: (-f.bytes, f.name)))


def build_report(source: ModelSource, built, plan, shard_map: ShardMap, findings: list[Finding],
                 versions: dict[str, str], ctx: CheckContext, extra: dict | None = None) -> Report:
    """Assemble the `Report` from the stages' outputs (no computation beyond grouping and totals)."""
    tensors = source.tensors
    model_info = {
        "ref": source.ref, "kind": source.kind, "repo_id": source.repo_id, "revision": source.revision,
        "commit": source.commit, "model_type": getattr(built.config, "model_type", None),
        "architecture": built.architecture, "dtype": built.dtype, "config_only": source.config_only,
        "checkpoint_tensor_count": len(tensors) if tensors is not None else None,
        "checkpoint_bytes": source.checkpoint_bytes, "quantization": built.quantization,
        "config_path": source.config_path,
    }
    plan_info = {
        "text_prefix": plan.text_prefix, "plan_owner": plan.plan_owner or "config",
        "tp_rules": plan.tp_rules, "ep_rules": plan.ep_rules, "override": plan.override,
        "injected_rules": plan.injected_rules, "dropped_tp_rules": list(plan.dropped_tp_rules),
        "loader_errors": list(plan.loader_errors),
    }
    unused = tuple(plan.unused_tp_rules) + tuple(plan.unused_ep_rules)
    return Report(model=model_info, shard_map=shard_map, groups=group_params(shard_map),
                  replicated=replicated_families(ctx, findings), unused_rules=unused, findings=tuple(findings),
                  plan=plan_info, notes=tuple(built.notes), versions=versions, extra=extra or {})
