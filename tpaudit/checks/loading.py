"""TPA304: the load itself fails on some rank, decided by running transformers' own shard-on-read and converter
operations for every rank (`tpaudit.shard.load`)."""

from __future__ import annotations

from typing import Iterable

from ..model import Finding, FindingSubject, FixOption, LoadIssue
from ..units import ranks_text
from .registry import CheckContext, rule


@rule("TPA304", "load_failure", severity="error", breaks_forward=False, suggest=None,
      counts_replicated=False, fails_load=True, points_at="checkpoint")
def check_load_failure(ctx: CheckContext) -> Iterable[Finding]:
    """The TP/EP load of this checkpoint fails on some rank, or fills a parameter with a shard of the wrong shape.

    **What it detects**
    Under TP/EP, `from_pretrained` reads every checkpoint tensor sharded on read by the placements of the parameter
    it loads into, then runs the loader's converters (per-expert merges, transposes, a quantizer's dequantize
    operation) on each rank's pieces. tpaudit runs those same steps, transformers' own code, for every rank on
    meta tensors (small CPU tensors where an operation reads values): a step that raises, or a converted shard
    whose shape is not the parameter's local shape, is this finding. Which rule split the parameter, which
    checkpoint tensor and which operation are named.

    **Why it matters**
    The load stops (transformers raises, or records a conversion error and raises at the end of the load), or
    with `ignore_mismatched_sizes` each rank holds the wrong slice: no byte count of the report is reached on real
    GPUs. Kimi-K2.5 (compressed-tensors int4 experts) at tp 8: the per-expert `weight_shape` (2 ints) is read with
    the 3-D fused experts' placement and `DtensorShardOperation.shard_tensor` raises `IndexError` on every rank;
    Qwen3-VL-30B-A3B at tp 4: the stored experts `[E, hidden, 2 x intermediate]` are sliced on the stored layout's
    axis 1 before the loader's `Transpose`, so every rank gets `[128, 1536, 512]` for a `[128, 384, 2048]` shard.

    **Example**
    `layers.*.mlp.experts.gate_up_proj: packed_colwise` on a checkpoint that stores per-expert compressed-tensors
    tensors (`experts.E.gate_proj.weight_packed`, `weight_scale`, `weight_shape`).

    **Fix**
    Keep the parameter whole (drop its rule) or split it another way the stored layout allows (expert parallelism
    for fused experts), or re-save the checkpoint in the runtime layout; `tpaudit verify` confirms on real ranks.

    **References**
    transformers `core_model_loading.py` (`convert_and_load_state_dict_in_model`, `log_conversion_errors`),
    `distributed/sharding_utils.py` (`DtensorShardOperation`).
    """
    load = ctx.load
    if load is None:
        return
    for issue in load.issues:
        if issue.kind not in ("raises", "shape"):
            continue
        member = next((q for q in ctx.shard_map.params if q.generic_name == issue.name), None)
        rule_text = f" (rule `{member.rule}: {member.style}`)" if member is not None and member.rule else ""
        where = ranks_text(issue.ranks)
        if issue.kind == "raises":
            step = ("transformers' shard-on-read" if issue.stage == "read" else "the loader's conversion")
            about = f" for `{issue.source}`" if issue.source else ""
            message = (f"`{issue.name}`{rule_text}: the load fails on {where}: {step} (`{issue.op}`) raises "
                       f"`{issue.error}`{about}")
        else:
            message = (f"`{issue.name}`{rule_text}: on {where} the loader's operations ({issue.op}) give a "
                       f"{list(issue.local_shape)} shard where the parameter's local shard is "
                       f"{list(issue.expected_shape)}: the load stops with a size mismatch")
        key = ctx.relative_key(member.rule) if member is not None and member.rule else ctx.relative_key(issue.name)
        fix = (f"Keep `{key}` whole (drop its rule) or split it as the stored layout allows, or store the checkpoint "
               "in the runtime layout; confirm with tpaudit verify")
        sizes = ctx.shard_map
        options = []
        if member is not None and member.plan == "tp" and sizes.ep_size == 1 and ctx.plan.ep_rules:
            # the model has an expert-parallel plan: splitting the experts by expert reads each stored tensor whole
            fix = (f"Try expert parallelism, which splits the experts by expert and reads each stored tensor whole "
                   f"(tpaudit check --tp {sizes.tp_size} --ep {sizes.tp_size} says whether that load works); else "
                   + fix[0].lower() + fix[1:])
            from ..compat import backend

            tp = sizes.tp_size
            options += [FixOption(f"Use expert parallelism, --tp {tp} --ep {ep}: it splits the experts by expert and "
                                  "reads each stored tensor whole", tp, ep)
                        for ep in backend().accepted_ep_sizes(tp, range(2, tp + 1))]
        # keeping the parameter whole is no clean alternative (it is then replicated: TPA001), so only the EP
        # layouts are re-checked; the rest of the advice is what is shown when none of them is clean
        yield Finding(
            code="TPA304", kind="load_failure", severity="error", target=issue.name, message=message, fix=fix,
            facts=_facts(issue), fix_options=tuple(options),
            subject=FindingSubject(rule_key=key, key_kind="parameter", families=(issue.name,)) if options else None,
            fix_fallback=(f"Keep `{key}` whole (drop its rule) or split it as the stored layout allows, or store the "
                          "checkpoint in the runtime layout; confirm with tpaudit verify"))


def _facts(issue: LoadIssue) -> dict:
    out = issue.to_json()
    out.pop("kind")
    return out
