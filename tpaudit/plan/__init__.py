"""The plan as transformers resolves it for a given `tp_size` / `ep_size` (stage 3).

    BuiltModel + ParallelSizes -> ResolvedPlan

Source: transformers 5.23 `DistributedMixin.init_parallel_plans` (class `_tp_plan` + config `base_model_tp_plan`,
children prefixed by their attribute path, `embed_tokens: embedding_rowwise` injected into a non-empty base plan) and
`DistributedMixin._resolve_parallel_plans` (overrides merged; EP rules win over TP rules on the same modules; `*`
expanded into layer numbers; a parameter takes its own rule, else its module's), called through the seam.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..compat import EmptyPlanError, PlanRejectedError, backend
from ..compat.logic import ep_dropped_rules, generic_name, unused_rules
from ..errors import UsageError
from ..model import ParallelSizes


@dataclass(frozen=True)
class ResolvedPlan:
    """The model's merged plans and what applying them for (tp_size, ep_size) means.

    Attributes:
        sizes (`ParallelSizes`): the sizes resolved for.
        tp_rules (`dict[str, str]`): merged TP plan, full generic keys
            (`model.language_model.layers.*.self_attn.q_proj`), `DistributedConfig` overrides included.
        ep_rules (`dict[str, str]`): merged EP plan.
        applied_tp (`dict[str, str]`): concrete module/parameter name -> style, as `apply_tensor_parallelism` receives
            it (empty when `tp_size == 1`).
        applied_ep (`dict[str, str]`): likewise for `apply_expert_parallelism` (empty when `ep_size == 1`).
        unused_tp_rules (`tuple[str, ...]`): TP rule keys that name no module and no parameter of the model.
        unused_ep_rules (`tuple[str, ...]`): EP rule keys that name nothing (only when `ep_size > 1`).
        dropped_tp_rules (`tuple[str, ...]`): TP rules dropped because an EP rule covers their module.
        injected_rules (`dict[str, str]`): rules transformers added itself (`embed_tokens: embedding_rowwise`).
        override (`dict[str, str]`, *optional*): the plan under review when it is not the one transformers ships (a
            `--plan`, a candidate of `--suggest`), keys relative to the base model.
        base_plan (`dict[str, str]`): the `base_model_tp_plan` in force for this resolution (relative keys): the
            candidate, else the plan the model was built with.
        text_prefix (`str`): path of the base model the plan keys are relative to (`model.language_model`).
        plan_owner (`str`): the config that owns `base_model_tp_plan` (`text_config`, or `""` for the top config).
        loader_errors (`tuple[str, ...]`): what `from_pretrained` itself would raise for this plan (an empty TP plan).
        dist_overrides (`dict`, *optional*): `DistributedConfig(tp_plan=..., ep_plan=...)` overrides that were merged.
        resolution (`tuple`, *optional*): transformers' own return value, handed to the simulation (opaque).
        deprecated_rules (`dict[str, str]`): TP rules in force whose style the installed transformers has announced
            the removal of (`moe_tp_experts` in 5.25), key -> the release's advice (`compat` `deprecated_styles`).
    """

    sizes: ParallelSizes
    tp_rules: dict[str, str]
    ep_rules: dict[str, str]
    applied_tp: dict[str, str]
    applied_ep: dict[str, str]
    unused_tp_rules: tuple[str, ...]
    unused_ep_rules: tuple[str, ...]
    dropped_tp_rules: tuple[str, ...]
    injected_rules: dict[str, str]
    override: dict[str, str] | None
    text_prefix: str
    plan_owner: str
    loader_errors: tuple[str, ...] = field(default=())
    dist_overrides: dict | None = None
    resolution: tuple | None = field(default=None, repr=False, compare=False)
    base_plan: dict[str, str] = field(default_factory=dict)
    deprecated_rules: dict[str, str] = field(default_factory=dict)

    @property
    def tp_size(self) -> int:
        return self.sizes.tp_size

    @property
    def ep_size(self) -> int:
        return self.sizes.ep_size

    @functools.cached_property
    def rules_in_force(self) -> list[tuple[str, dict[str, str]]]:
        """`[("ep", EP rules), ("tp", TP rules without the ones EP drops)]` in lookup order (EP only when
        `ep_size > 1`)."""
        plans = []
        if self.ep_size > 1:
            plans.append(("ep", self.ep_rules))
        plans.append(("tp", {k: v for k, v in self.tp_rules.items() if k not in self.dropped_tp_rules}))
        return plans

    def rule_for(self, name: str) -> tuple[str | None, str | None, str | None]:
        """`(rule key, style, "tp" | "ep")` that applies to the concrete parameter `name`: its own generic name, else
        its module's (`compat.logic.parameter_rule`, a pinned copy of `parallel_utils._get_parameter_plan`); EP
        rules first when `ep_size > 1`. All `None` when no rule applies."""
        for kind, rules in self.rules_in_force:
            key = _parameter_rule(name, rules)
            if key is not None:
                return key, rules[key], kind
        return None, None, None

    def relative(self, key: str) -> str:
        """A full (prefixed) rule key as a key of `base_model_tp_plan`."""
        prefix = self.text_prefix + "." if self.text_prefix else ""
        return key[len(prefix):] if prefix and key.startswith(prefix) else key

    def to_json(self) -> dict:
        return {"text_prefix": self.text_prefix, "plan_owner": self.plan_owner or "config",
                "tp_rules": self.tp_rules, "ep_rules": self.ep_rules, "override": self.override,
                "injected_rules": self.injected_rules, "dropped_tp_rules": list(self.dropped_tp_rules),
                "loader_errors": list(self.loader_errors)}


def _parameter_rule(name: str, rules: dict[str, str]) -> str | None:
    from ..compat.logic import parameter_rule

    return parameter_rule(name, rules)


def resolve_plan(built, sizes: ParallelSizes, dist_overrides: dict | None = None, *,
                 plan: dict[str, str] | None = None) -> ResolvedPlan:
    """Resolve `built.model`'s plans for `sizes` with transformers' own code.

    Args:
        built (`BuiltModel`): from `metamodel.build_model`; not changed (a candidate plan is merged for this resolution
            only, `compat` `plan_in_force`).
        sizes (`ParallelSizes`): validated sizes.
        dist_overrides (`dict`, *optional*): `DistributedConfig` `tp_plan` / `ep_plan` overrides (merged by
            transformers into the model's plans, as at load).
        plan (`dict[str, str]`, *optional*): a `base_model_tp_plan` to resolve instead of the one the model was built
            with (relative keys); it comes back as `ResolvedPlan.base_plan` and `.override`.

    Returns:
        `ResolvedPlan`. An empty TP plan at `tp_size > 1` is not an exception: `loader_errors` carries what
        `from_pretrained` would raise, and TPA003 reports it.

    Raises:
        UsageError: transformers refuses the sizes or the plan (an `ep_size` without an EP plan, an EP size it does not
            accept, a removed style), quoting it.
    """
    if plan is not None:
        from ..metamodel import validate_plan

        validate_plan(plan)
    tf = backend()
    with tf.plan_in_force(built.model, built.owner_config, plan, built.quantizer):
        return _resolve(built, sizes, dist_overrides, plan)


def _resolve(built, sizes: ParallelSizes, dist_overrides: dict | None, plan: dict[str, str] | None) -> ResolvedPlan:
    tf = backend()
    model = built.model
    try:
        dc = tf.distributed_config(sizes.tp_size, sizes.ep_size, dist_overrides)
    except PlanRejectedError as e:
        raise UsageError(f"tp_size={sizes.tp_size}, ep_size={sizes.ep_size} (--tp {sizes.tp_size} --ep {sizes.ep_size}) "
                         f"is rejected by transformers: {e.detail.rstrip('.')}. Without FSDP, pass "
                         + ("ep_size 1" if sizes.tp_size == 1 else f"ep_size 1 or {sizes.tp_size}")) from None
    applied_tp: dict[str, str] = {}
    applied_ep: dict[str, str] = {}
    loader_errors: list[str] = []
    tp_rules, ep_rules = tf.merged_plans(model)
    resolution = None
    if sizes.parallel:
        try:
            applied_tp, applied_ep, tp_rules, ep_rules, resolution = tf.resolve_plans(model, dc)
        except EmptyPlanError as e:
            if e.plan != "tp":
                raise UsageError(f"transformers refuses ep_size={sizes.ep_size} for {built.architecture}: "
                                 f"{e.detail} Pass ep_size 1 (--ep 1)") from None
            loader_errors.append(f"from_pretrained raises ValueError: {e.detail}")
        except PlanRejectedError as e:
            raise UsageError(f"transformers rejects this plan at tp_size {sizes.tp_size}, ep_size {sizes.ep_size}: "
                             f"{e.detail}") from None
    names = tf.model_names(model)
    unused_tp = unused_rules(tp_rules, names)
    unused_ep = unused_rules(ep_rules, names) if sizes.ep_size > 1 else ()
    dropped = ep_dropped_rules(tp_rules, ep_rules) if sizes.ep_size > 1 and not loader_errors else ()

    deprecated_styles = tf.deprecated_styles() if sizes.tp_size > 1 and not loader_errors else {}
    # the rules transformers applies (expanded to layer numbers), by generic name: a merged key that matches nothing
    # (Llama 4's plan prefixed twice) is TPA002's, not this
    deprecated = {generic_name(k): deprecated_styles[s] for k, s in applied_tp.items() if s in deprecated_styles}

    prefix = built.text_prefix
    injected = {}
    key = f"{prefix}.embed_tokens" if prefix else "embed_tokens"
    base = dict(plan) if plan is not None else dict(built.original_plan)
    if key in tp_rules and "embed_tokens" not in base:
        injected[key] = tp_rules[key]
    return ResolvedPlan(sizes=sizes, tp_rules=tp_rules, ep_rules=ep_rules, applied_tp=applied_tp,
                        applied_ep=applied_ep, unused_tp_rules=unused_tp, unused_ep_rules=unused_ep,
                        dropped_tp_rules=dropped, injected_rules=injected,
                        override=dict(plan) if plan is not None else built.build_override,
                        text_prefix=prefix, plan_owner=built.plan_owner, loader_errors=tuple(loader_errors),
                        dist_overrides=dist_overrides, resolution=resolution, base_plan=base,
                        deprecated_rules=deprecated)


__all__ = ["ResolvedPlan", "resolve_plan", "generic_name"]
