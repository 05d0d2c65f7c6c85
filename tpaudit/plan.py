"""The plan as transformers resolves it for a given `tp_size` / `ep_size`.

Source: transformers 5.23 `DistributedMixin.init_parallel_plans` (class `_tp_plan` + config `base_model_tp_plan`,
children prefixed by their attribute path, `embed_tokens: embedding_rowwise` injected into a non-empty base plan) and
`DistributedMixin._resolve_parallel_plans` (EP rules win over TP rules on the same modules; `*` expanded into layer
numbers; a parameter takes its own rule, else its module's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import UsageError
from .model import generic_name

# Styles that keep a module's parameters whole on purpose (transformers 5.23 `tensor_parallel.py`): a rule with one of
# them is an explicit replication, not a gap in the plan. `moe_tp_experts` and `local_params` are not among them:
# their parameters need rules of their own, and one that lacks it is replicated by accident.
EXPLICIT_REPLICATE_STYLES = frozenset({"replicate", "replicated_with_grad_allreduce", "sequence_parallel",
                                       "mla_kv_a_proj", "all_reduce", "moe_identity_expert"})


@dataclass(frozen=True)
class ResolvedPlan:
    """The model's merged plans and what applying them for (tp_size, ep_size) means.

    Attributes:
        tp_size (`int`), ep_size (`int`).
        tp_rules (`dict[str, str]`): merged TP plan, full generic keys (`model.language_model.layers.*.self_attn.q_proj`).
        ep_rules (`dict[str, str]`): merged EP plan.
        applied_tp (`dict[str, str]`): concrete module/parameter name -> style, as `apply_tensor_parallelism` receives
            it (empty when `tp_size == 1`).
        applied_ep (`dict[str, str]`): likewise for `apply_expert_parallelism` (empty when `ep_size == 1`).
        unused_tp_rules (`tuple[str, ...]`): TP rule keys that name no module and no parameter of the model.
        unused_ep_rules (`tuple[str, ...]`): EP rule keys that name nothing (only when `ep_size > 1`).
        dropped_tp_rules (`tuple[str, ...]`): TP rules dropped because an EP rule covers their module.
        injected_rules (`dict[str, str]`): rules transformers added itself (`embed_tokens: embedding_rowwise`).
        override (`dict[str, str]`, *optional*): the `--plan` rules as given, keys relative to the base model.
        text_prefix (`str`): path of the base model the plan keys are relative to (`model.language_model`).
        plan_owner (`str`): the config that owns `base_model_tp_plan` (`text_config`, or `""` for the top config).
        loader_errors (`tuple[str, ...]`): what `from_pretrained` itself would raise for this plan (an empty plan).
        dist_overrides (`dict`, *optional*): `DistributedConfig(tp_plan=..., ep_plan=...)` overrides that were merged.
    """

    tp_size: int
    ep_size: int
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

    def rule_for(self, name: str) -> tuple[str | None, str | None, str | None]:
        """`(rule key, style, "tp" | "ep")` that applies to the concrete parameter `name`: its own generic name, else
        its module's (`parallel_utils._get_parameter_plan`); EP rules first when `ep_size > 1`. All `None` when no
        rule applies."""
        generic = generic_name(name)
        parent = generic.rsplit(".", 1)[0] if "." in generic else None
        plans = []
        if self.ep_size > 1:
            plans.append(("ep", self.ep_rules))
        plans.append(("tp", {k: v for k, v in self.tp_rules.items() if k not in self.dropped_tp_rules}))
        for kind, rules in plans:
            if generic in rules:
                return generic, rules[generic], kind
            if parent is not None and parent in rules:
                return parent, rules[parent], kind
        return None, None, None


MAX_WORLD_SIZE = 1024


def distributed_config(tp_size: int, ep_size: int = 1, overrides: dict | None = None):
    """`DistributedConfig(tp_size, ep_size, **overrides)`, its own validation turned into a one-line `UsageError`.

    `overrides` may hold `tp_plan` / `ep_plan` dicts, which transformers merges into the model's plans.

    Raises:
        UsageError: a size < 1, or an `ep_size` transformers rejects (in 5.23 without FSDP: 1 or equal to `tp_size`).
    """
    if tp_size < 1:
        raise UsageError(f"--tp {tp_size} is invalid: tp_size must be a positive integer. Pass --tp 2, 4 or 8")
    if ep_size < 1:
        raise UsageError(f"--ep {ep_size} is invalid: ep_size must be a positive integer. Pass --ep 1 or --ep {tp_size}")
    if max(tp_size, ep_size) > MAX_WORLD_SIZE:
        raise UsageError(f"--tp {tp_size} --ep {ep_size} is more ranks than tpaudit simulates (at most "
                         f"{MAX_WORLD_SIZE}): the fake process group builds a mesh of that many ranks")
    from transformers.distributed import DistributedConfig

    try:
        return DistributedConfig(tp_size=tp_size, ep_size=ep_size, **(overrides or {}))
    except ValueError as e:
        raise UsageError(f"--tp {tp_size} --ep {ep_size} is rejected by transformers: {e} Without FSDP, "
                         f"pass --ep 1 or --ep {tp_size}") from None


def resolve_plan(built, tp_size: int, ep_size: int = 1, override: dict[str, str] | None = None,
                 dist_overrides: dict | None = None) -> ResolvedPlan:
    """Resolve `built.model`'s plans for (tp_size, ep_size) with transformers' own code.

    Args:
        built (`BuiltModel`): from `build.build_model`.
        tp_size (`int`), ep_size (`int`): the sizes asked for.
        override (`dict`, *optional*): the `--plan` rules (already applied to the config; kept for the report).
        dist_overrides (`dict`, *optional*): `DistributedConfig` `tp_plan` / `ep_plan` overrides (merged by
            transformers into the model's plans, as at load).

    Returns:
        `ResolvedPlan`.

    Raises:
        UsageError: the sizes are invalid, or transformers rejects the resolved plan (e.g. a removed EP style).
    """
    from itertools import chain

    from ._compat import quiet_libraries

    model = built.model
    dc = distributed_config(tp_size, ep_size, dist_overrides)
    applied_tp: dict[str, str] = {}
    applied_ep: dict[str, str] = {}
    loader_errors = []
    if tp_size > 1 or ep_size > 1:
        try:
            with quiet_libraries():
                applied_tp, applied_ep, _ = model._resolve_parallel_plans(dc)
        except ValueError as e:
            if "was requested, but" not in str(e):  # an empty plan: from_pretrained itself refuses, a finding
                raise UsageError(f"transformers rejects this plan at tp_size {tp_size}, ep_size {ep_size}: "
                                 f"{e}") from None
            loader_errors.append(f"from_pretrained raises ValueError: {str(e).split(' Pass ')[0]}")
    tp_rules = dict(model.tp_plan or {})  # merged with the DistributedConfig overrides, as transformers does
    ep_rules = dict(model.ep_plan or {})
    names = {generic_name(n) for n, _ in chain(model.named_modules(), model.named_parameters())}
    unused_tp = tuple(sorted(k for k in tp_rules if k not in names))
    unused_ep = tuple(sorted(k for k in ep_rules if k not in names)) if ep_size > 1 else ()
    dropped: tuple[str, ...] = ()
    if ep_size > 1 and ep_rules and not loader_errors:
        is_expert = re.compile(rf"(?:{'|'.join(map(re.escape, ep_rules))})(?:\..+)?").fullmatch
        dropped = tuple(sorted(k for k in tp_rules if is_expert(k)))

    prefix = built.text_prefix
    injected = {}
    owner_config = built.config if not built.plan_owner else getattr(built.config, built.plan_owner)
    base_plan = getattr(owner_config, "base_model_tp_plan", None) or {}
    key = f"{prefix}.embed_tokens" if prefix else "embed_tokens"
    if key in tp_rules and "embed_tokens" not in base_plan:
        injected[key] = tp_rules[key]
    return ResolvedPlan(tp_size=tp_size, ep_size=ep_size, tp_rules=tp_rules, ep_rules=ep_rules,
                        applied_tp=applied_tp, applied_ep=applied_ep, unused_tp_rules=unused_tp,
                        unused_ep_rules=unused_ep, dropped_tp_rules=dropped, injected_rules=injected,
                        override=override, text_prefix=prefix, plan_owner=built.plan_owner,
                        loader_errors=tuple(loader_errors), dist_overrides=dist_overrides)
