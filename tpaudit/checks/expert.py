"""TPA4xx: expert parallelism: how EP rules and TP rules meet."""

from __future__ import annotations

from typing import Iterable

from ..model import Finding
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
