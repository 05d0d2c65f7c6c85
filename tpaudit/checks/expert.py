"""TPA4xx: expert parallelism: how EP rules and TP rules meet."""

from __future__ import annotations

from typing import Iterable

from ..model import Finding, generic_name
from .registry import CheckContext, rule


@rule("TPA401", "ep_overrides_tp", severity="note", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=False)
def check_ep_overrides_tp(ctx: CheckContext) -> Iterable[Finding]:
    """TP rules that expert parallelism drops because an EP rule covers their module.

    **What it detects**
    With `ep_size > 1`, transformers drops every TP rule on a module that has an EP rule (and on its children):
    the experts are split by expert on the EP ranks instead of tensor-parallel inside each expert.

    **Why it matters**
    Expected, but easy to misread: the TP rules in the config (`mlp.experts.gate_up_proj: packed_colwise`) do not
    describe what runs. Each rank holds `num_experts / ep_size` whole experts.

    **Example**
    Qwen3-VL-30B-A3B at `--tp 4 --ep 4`: `layers.*.mlp.experts*` TP rules are replaced by `grouped_gemm` /
    `ep_dispatch_experts`.

    **Fix**
    Nothing to fix; listed so the report says which rules are in force.

    **References**
    transformers `distributed/mixin.py` (`_resolve_parallel_plans`: "EP rules take precedence").
    """
    plan = ctx.plan
    if ctx.shard_map.ep_size <= 1 or not plan.dropped_tp_rules:
        return
    yield Finding(
        code="TPA401", kind="ep_overrides_tp", severity="note", target=", ".join(plan.dropped_tp_rules[:3]),
        message=(f"ep_size {ctx.shard_map.ep_size}: {len(plan.dropped_tp_rules)} TP rule(s) yield to EP rules "
                 f"({', '.join(f'`{k}`' for k in plan.dropped_tp_rules[:4])}): experts are split by expert"),
        facts={"dropped_tp_rules": list(plan.dropped_tp_rules)})


@rule("TPA402", "deprecated_style", severity="warning", breaks_forward=False, suggest=None, counts_replicated=False,
      fails_load=False)
def check_deprecated_style(ctx: CheckContext) -> Iterable[Finding]:
    """A TP rule whose style the installed transformers still applies but has announced the removal of.

    **What it detects**
    A rule in force at this `tp_size` whose style is deprecated by the installed release: transformers 5.25 deprecates
    `moe_tp_experts` (the experts' TP split; removal announced for 5.28) in favour of expert parallelism. A plan the
    model ships (Llama 4's) gives a note; a plan of the user's own (`--plan`, `DistributedConfig` overrides) a warning.

    **Why it matters**
    The plan loads today and fails to load on the release that removes the style: a plan written now should not
    depend on it. transformers itself only warns once, on rank 0, at load time.

    **Example**
    `--tp 8` on Llama-4-Scout under transformers 5.25: `layers.*.feed_forward.experts: moe_tp_experts`.

    **Fix**
    Split the experts by expert parallelism instead: `--ep N` with `N = tp_size` (the model's EP plan,
    `ep_dispatch_experts` / `grouped_gemm`), and drop the experts' TP rules from a plan of your own.

    **References**
    transformers 5.25 `distributed/tensor_parallel.py` (`apply_tensor_parallelism`: the `moe_tp_experts` deprecation
    warning), `distributed/mixin.py` (`_resolve_parallel_plans`).
    """
    plan = ctx.plan
    if not plan.deprecated_rules:
        return
    shipped = plan.override is None and not plan.dist_overrides
    tp, has_ep = ctx.shard_map.tp_size, bool(plan.ep_rules)
    for key, advice in sorted(plan.deprecated_rules.items()):
        style = next((s for k, s in plan.applied_tp.items() if s and generic_name(k) == key), "")
        fix = (f"Split the experts by expert parallelism: --ep {tp} (the model's EP plan)" if has_ep else
               "Split the experts by expert parallelism (give the model an EP plan, then --ep N)")
        if not shipped:
            fix += f", and drop `{key}: {style}` from your plan"
        yield Finding(
            code="TPA402", kind="deprecated_style", severity="note" if shipped else "warning", target=key,
            message=(f"`{key}: {style}` uses a style that is {advice}"
                     + (" (the model's shipped plan)" if shipped else "")),
            fix=fix, facts={"style": style, "shipped": shipped, "advice": advice})
