"""TPA5xx: packed layouts a split breaks: fused projections split as if they were one, and quantized values packed
into int32 words split between words."""

from __future__ import annotations

import dataclasses
from typing import Iterable

from ..compat.styles import (COLWISE, COLWISE_GATHER_OUTPUT, PACKED_COLWISE, ROWWISE, ROWWISE_SPLIT_INPUT,
                             is_rowwise_named)
from ..model import Finding, ParityResult, SplitOutput
from ..metamodel import vocabulary as V
from ._shapes import FUSED_GATE_UP, FUSED_QKV_LEAVES, chunk, leaf_module, local_logical, quant_units
from .registry import CheckContext, rule


@rule("TPA501", "packed_layout", severity="error", breaks_forward=True, suggest=None,
      counts_replicated=False, fails_load=False)
def check_packed_layout(ctx: CheckContext) -> Iterable[Finding]:
    """A packed dimension that the rule splits without respecting its packing.

    **What it detects**
    (a) A fused or packed projection whose split scrambles its parts: the plan splits the projection's output
    (`colwise`, `packed_colwise`) and the model's forward then cuts that output into parts (q, k and v; gate and up;
    per-head groups) that the split does not respect. The verdict comes from evidence: the parity check runs the
    sharded forward of a small model of the same architecture and plan on threaded ranks, compares every output and
    the parts each rank cuts, and re-runs with each failing rule repaired until every rule has its own verdict (facts
    `"evidence": "parity"`). A valid split is cleared (GPT-NeoX's per-head `query_key_value` survives plain
    `colwise`). Where the parity check did not run (`--no-parity`), a fused
    name split by plain `colwise` is only a suspicion and a warning. (b) Quantized values packed into int32 words
    (AWQ along outputs, GPTQ and compressed-tensors pack-quantized along inputs) split where a rank's share is not a
    whole number of words, or packed with a bit width that does not divide 32 (3/5/6/7 bits), where any split cuts
    values: arithmetic on the checkpoint's own layout, an error.

    **Why it matters**
    The layer computes with the wrong halves (gate times gate), a rank gets all of Q and K and none of V, or a rank
    unpacks half a word: wrong outputs or a crash in the first forward, with no error at load.

    **Example**
    `layers.*.mlp.experts.gate_up_proj: colwise` instead of `packed_colwise`; a linear-attention
    `in_proj_qkv` (`[Q_all | K_all | V_all]`) split with plain `colwise`; a 4-bit AWQ `up_proj` whose output share is
    not a multiple of 8.

    **Fix**
    Use `packed_colwise` for concatenated gate/up, `colwise_gather_output` for a fused qkv whose parts differ in
    size; choose a `tp_size` whose shares are whole words.

    **References**
    transformers `distributed/tensor_parallel.py` (`PackedColwiseParallel`); huggingface/transformers#46846.
    """
    tp = ctx.shard_map.tp_size
    if tp <= 1:
        return
    parity = ctx.parity
    if parity is not None and parity.ran:
        yield from _parity_layout_findings(ctx, parity)
    else:
        yield from _name_suspicions(ctx)
        yield from _quant_packing(ctx)


def _quant_packing(ctx: CheckContext) -> Iterable[Finding]:
    tp = ctx.shard_map.tp_size
    scheme = ctx.facts.quant
    if scheme is None or not scheme.packed_axis:
        return
    for unit in quant_units(ctx):
        if unit.axis != scheme.packed_axis or unit.weight.plan == "ep":
            continue
        sizes = local_logical(unit, tp)
        if scheme.bits_divide_word:
            bad = [(r, s) for r, s in enumerate(sizes) if scheme.pack_factor and s % scheme.pack_factor]
            if not bad:
                continue
            r, s = bad[0]
            why = (f"rank {r}'s {s} {'output' if unit.axis == 'out' else 'input'} features are not a whole number "
                   f"of int32 words ({scheme.pack_factor} x {scheme.bits}-bit values each)")
        else:
            why = (f"{scheme.bits}-bit values do not divide a 32-bit word, so any split of the packed "
                   f"{'output' if unit.axis == 'out' else 'input'} axis cuts values")
        whole = unit.out_features if unit.axis == "out" else unit.in_features
        ok = [t for t in range(1, tp) if scheme.pack_factor and all(
            chunk(whole, t, r) % scheme.pack_factor == 0 for r in range(t))]
        yield Finding(
            code="TPA501", kind="packed_layout", severity="error", target=unit.key,
            message=f"`{unit.key}` ({scheme.method}, packed along {unit.axis}put features, `{unit.style}`): {why}",
            fix=(f"Use tp_size {max(ok)} or less" if ok else "Keep this module whole") + ", or a format whose "
                "packing the split respects",
            facts={"axis": unit.axis, "bits": scheme.bits, "pack_factor": scheme.pack_factor, "per_rank": sizes})


def _name_suspicions(ctx: CheckContext) -> Iterable[Finding]:
    """Without the parity check: a fused name split by plain `colwise` is a suspicion (a warning), never an error."""
    seen = set()
    for g in ctx.shard_map.groups:
        p = g.first
        if p.sharding != "sharded" or p.tied_to is not None or p.plan == "ep":
            continue
        leaf = leaf_module(p)
        fused = leaf in FUSED_GATE_UP or leaf in FUSED_QKV_LEAVES
        packed_dim = p.ndim - 2 if p.ndim >= 2 else 0
        if fused and p.style == COLWISE and p.shard_dim == packed_dim and p.split_factor == 1:
            seen.add(p.generic_name)
            parts = "gate and up" if leaf in FUSED_GATE_UP else "q, k and v"
            yield Finding(
                code="TPA501", kind="packed_layout", severity="warning", target=p.generic_name,
                message=(f"`{p.generic_name}` may pack {parts} along dim {packed_dim}, which rule `{p.rule}: {COLWISE}` "
                         f"cuts into contiguous shards (rank 0 gets rows 0..{p.local_shapes[0][packed_dim] - 1} of "
                         f"{p.global_shape[packed_dim]}); whether that scrambles the parts depends on the layout, "
                         "which the parity check did not confirm"),
                fix="Run tpaudit check --parity to decide it from the sharded forward",
                facts={"style": p.style, "dim": packed_dim, "size": p.global_shape[packed_dim],
                       "evidence": "name", "confirmed": False})


def _parity_layout_findings(ctx: CheckContext, parity) -> Iterable[Finding]:
    """With the parity check: an error for every rule whose split scrambles the parts of an output the forward cuts
    into parts (one verdict per rule, `ParityResult.verdicts`); every suspicion the check did not decide (a rule it
    could not exercise, a run that compared nothing) stays a warning that says why. A rule it cleared gives none."""
    if not parity.verdicts:   # a result without per-rule verdicts (made by hand, or by an older tpaudit)
        yield from (f for f in parity_findings(parity, text_prefix=ctx.text_prefix) if f.code == "TPA501")
        if parity.passed is False:
            yield from _masked_suspicions(ctx, parity)
        elif parity.passed is None:
            yield from _name_suspicions(ctx)
        yield from _quant_packing(ctx)
        return
    yield from (f for f in parity_findings(parity, text_prefix=ctx.text_prefix) if f.code == "TPA501")
    yield from _undecided_suspicions(ctx, parity)
    yield from _quant_packing(ctx)


def _decided(parity) -> set[str]:
    """Rule keys and modules the parity check gave an error or cleared."""
    out: set[str] = set()
    for v in parity.verdicts:
        if v.status in ("error", "cleared"):
            out.update(x for x in (v.rule, v.module) if x)
    return out


def _undecided_suspicions(ctx: CheckContext, parity) -> Iterable[Finding]:
    """Plain-`colwise` splits of outputs the forward cuts into parts (found by the trace, or by a fused name) that
    the parity check did not decide: a warning each, with the reason from its verdict."""
    decided = _decided(parity)
    seen: set[str] = set()
    for s in parity.split:
        if s.style != COLWISE or {s.module, s.rule} & decided or s.module in seen:
            continue
        seen.add(s.module)
        verdict = parity.verdict(s.rule) or parity.verdict(s.module)
        why = verdict.why if verdict is not None else "the parity check has no verdict for it"
        yield Finding(
            code="TPA501", kind="packed_layout", severity="warning", target=s.rule or s.module,
            message=(f"`{s.module}` is split by `{ctx.relative_key(s.rule or s.module)}: {COLWISE}` as one matrix and "
                     f"the forward cuts its output into parts ({s.action}); the parity check could not decide "
                     f"whether this split keeps the parts together ({why})"),
            fix="Fix the errors above and run tpaudit check again, or run the check at a tp_size where the parity "
                "check can run this module",
            facts={"style": COLWISE, "evidence": "trace", "confirmed": False, "why": why})
    for f in _name_suspicions(ctx):
        module = f.target.rpartition(".")[0] if f.target.endswith((".weight", ".bias")) else f.target
        if module in seen or {module, f.target} & decided:
            continue
        seen.add(module)
        verdict = parity.verdict(module)
        why = verdict.why if verdict is not None else (
            "the run compared no module output" if parity.passed is None else "the parity check has no verdict for it")
        yield dataclasses.replace(f, message=f"{f.message} ({why})", facts={**f.facts, "why": why})


def _masked_suspicions(ctx: CheckContext, parity) -> Iterable[Finding]:
    """Without per-rule verdicts: a failed run is evidence about the module it blames and nothing after it. Every
    other plain-`colwise` split of a projection whose output the forward cuts into parts (found by the run's trace,
    or by a fused name) stays a suspicion (a warning)."""
    blamed = {parity.first_divergent_module, parity.rule} - {None}
    seen: set[str] = set()
    for s in parity.split:
        if s.style != COLWISE or {s.module, s.rule} & blamed or s.module in seen:
            continue
        seen.add(s.module)
        yield Finding(
            code="TPA501", kind="packed_layout", severity="warning", target=s.rule or s.module,
            message=(f"`{s.module}` is split by `{ctx.relative_key(s.rule or s.module)}: {COLWISE}` as one matrix and "
                     f"the forward cuts its output into parts ({s.action}); the parity run failed first at "
                     f"`{parity.first_divergent_module}`, so it could not tell whether this split keeps the parts "
                     "together"),
            fix="Fix the error above and run tpaudit check again: the parity run then decides this one",
            facts={"style": COLWISE, "evidence": "trace", "confirmed": False,
                   "masked_by": parity.first_divergent_module})
    for f in _name_suspicions(ctx):
        module = f.target.rpartition(".")[0] if f.target.endswith((".weight", ".bias")) else f.target
        if module in seen or {module, f.target} & blamed:
            continue
        seen.add(module)
        masked_by = parity.first_divergent_module
        yield dataclasses.replace(f, message=f"{f.message}; the parity run failed first at `{masked_by}`",
                                  facts={**f.facts, "masked_by": masked_by})


@rule("TPA502", "style_mismatch", severity="error", breaks_forward=True, suggest=None,
      counts_replicated=False, fails_load=False)
def check_style_mismatch(ctx: CheckContext) -> Iterable[Finding]:
    """A style that does not fit how the model uses the module: the sharded forward diverges.

**What it detects**
The parity check (`tpaudit check --parity`) loaded a small model of the same architecture on `tp_size` ranks with
the plan under review, ran the same tokens through it and through the unsharded model, and a rule that is not a
fused or packed projection broke it (alone, or together with the rest of its block: the check re-runs with each
failing rule repaired until the forward matches, so every wrong rule gets its own finding): a colwise-colwise chain
with no reduction (`o_proj: colwise` after colwise `q/k/v_proj`), a rowwise module fed a whole input
(`q_proj: rowwise`), a module that receives a split input but has no rule, a style transformers cannot apply to the
module while loading, or a projection split through the middle of a head.

**Why it matters**
The ranks either crash at the first forward (a shape mismatch) or, worse, return numbers that are not the model's:
a missing all-reduce leaves each rank with a partial sum, and nothing fails at load.

**Example**
`layers.*.self_attn.q_proj`, `k_proj`, `v_proj` and `o_proj` all `colwise`: `o_proj` receives each rank's heads but splits its output
instead of reducing its input, and the forward fails with `mat1 and mat2 shapes cannot be multiplied`.

**Fix**
Pair the styles: a `colwise` (or `packed_colwise`) projection is followed by a `rowwise` one that sums the partial
results (`o_proj`, `down_proj`); a module whose input is whole uses `colwise`, or `rowwise_split_input`; split heads
only when `tp_size` divides them.

**References**
transformers `distributed/tensor_parallel.py` (`ColwiseParallel`, `RowwiseParallel`); the parity check in
`tpaudit/evidence/`.
"""
    parity = ctx.parity
    if parity is None or not parity.ran:
        return
    for f in parity_findings(parity, text_prefix=ctx.text_prefix):
        if f.code == "TPA502" and not _explained_by_head_counts(ctx, f.facts.get("module")):
            yield f


def _explained_by_head_counts(ctx: CheckContext, blamed: str | None) -> bool:
    """The divergence is a head split that TPA101/TPA102 already report from the config: the blamed module is a key
    projection of a layer whose KV heads `tp_size` does not divide, or a query/output projection while the attention
    heads do not divide. One problem, one finding."""
    from ..shard.kvcache import key_projections, kv_layers
    from ._shapes import role

    blamed = blamed or ""
    tp = ctx.shard_map.tp_size
    kv = {layer.index: layer.kv_heads for layer in kv_layers(ctx.facts)}
    for index, key in key_projections(ctx.shard_map, ctx.text_prefix).items():
        if blamed in (key.name, key.name.rpartition(".")[0]) and kv.get(index, 0) % tp:
            return True
    group = next((g for g in ctx.shard_map.groups if g.generic_name.rpartition(".")[0] == blamed), None)
    heads = [h for h in ctx.facts.role_values(V.ATTENTION_HEADS)[1] if isinstance(h, int)]
    return group is not None and role(group.first) in ("q", "o", "qkv") and any(h % tp for h in heads)


# ----------------------------------------------------------------------------------------------------------------------
# The findings a parity result is evidence for (the text of TPA501 / TPA502 from the typed result)
# ----------------------------------------------------------------------------------------------------------------------
_PAIR_THE_STYLES = (f"Pair the styles: a {COLWISE} projection feeds a {ROWWISE} one that reduces it; a module fed a "
                    f"whole input is {COLWISE} (or {ROWWISE_SPLIT_INPUT}); split heads only where tp_size divides them")


def _relative(key: str | None, text_prefix: str) -> str | None:
    if key and text_prefix and key.startswith(text_prefix + "."):
        return key[len(text_prefix) + 1:]
    return key


def _packed_fix(split: SplitOutput | None, key: str) -> str:
    """What to write instead, from the traced layout of the output (`SplitOutput.cut`, `parts`)."""
    if split is not None and split.cut == "groups":
        return (f"Split whole heads only: keep `{key}` on a tp_size that divides its heads, or use "
                f"`{key}: {COLWISE_GATHER_OUTPUT}`")
    if split is not None and len(split.parts) == 2 and split.parts[0] == split.parts[1]:
        return f"Use `{key}: {PACKED_COLWISE}` (two equal halves, each split across ranks)"
    return f"Use `{key}: {COLWISE_GATHER_OUTPUT}` (every rank keeps the whole output) and split the next module's input"


def parity_findings(result: ParityResult, *, text_prefix: str = "") -> list[Finding]:
    """The findings a parity result is evidence for.

    A passed (or skipped) result gives none. A failed one gives an error for every rule whose verdict is an error
    (the run of the plan and the isolation re-runs decide each rule on its own, `RuleVerdict`):

    - `TPA501` `packed_layout` when the split blamed is one whose output the forward cuts into parts (`result.fused`):
      a fused or packed projection split as if it were one matrix;
    - `TPA502` `style_mismatch` otherwise: a style that does not fit how the model uses the module (a colwise-colwise
      chain with no reduction, a rowwise module fed a whole input, a module left without a rule between split ones,
      a projection split through a head), or a plan transformers cannot load.

    Both carry `facts = {"evidence": "parity", "module", "rule", "style", "max_abs_error" | "exception",
    "observed_at", "tp_size", "ep_size", "rank"}` (`module`, `rule`: generic names with the base model's prefix).

    Args:
        result (`ParityResult`): from `tpaudit.evidence.run_parity`.
        text_prefix (`str`, *optional*): the base model's module path (`model`, `model.language_model`); fixes then
            name plan keys relative to it, as a `--plan` file writes them.

    Returns:
        `list[Finding]`: one per rule the check found in error (`result.verdicts`); for a result without verdicts,
        zero or one, from its first divergence.
    """
    if result.ran and result.verdicts:
        return [_verdict_finding(v, result, text_prefix) for v in result.errors()]
    if not result.ran or result.passed is not False:
        return []
    module = result.first_divergent_module
    facts: dict = {"evidence": "parity", "module": module, "rule": result.rule, "style": result.style,
                   "observed_at": result.observed_at, "tp_size": result.tp_size,
                   "ep_size": result.ep_size, "rank": result.rank}
    if result.error:
        facts["exception"] = result.error
        how = f"a rank raised {result.error.split(': ', 1)[-1]}"
    else:
        facts["max_abs_error"] = result.max_abs_error
        how = (f"outputs differ from the unsharded model by up to {result.max_abs_error:.3g} (tolerance "
               f"{result.tolerance:g} of their scale)")
    where = f"at `{result.observed_at}`" if result.observed_at else "while loading"
    small = f"a small {result.model_class or 'model'} on {max(result.tp_size, result.ep_size)} ranks"
    key = _relative(result.rule or module, text_prefix) or "the rule"
    if module is None:
        return [Finding(
            code="TPA502", kind="style_mismatch", severity="error", target=result.model_class or "tp_plan",
            message=f"the sharded forward of {small} fails {where}: {how}",
            fix="Make the plan loadable: every style must fit the module it names", facts=facts)]
    if result.fused:
        split = next((s for s in result.split if s.module == module), None)
        cut = f" the forward cuts its output into parts ({split.action})" if split else ""
        return [Finding(
            code="TPA501", kind="packed_layout", severity="error", target=result.rule or module,
            message=(f"`{module}` is split by `{key}: {result.style}` as one matrix, but"
                     f"{cut or ' its output holds parts'}: the sharded forward of {small} diverges {where} ({how})"),
            fix=_packed_fix(split, key), facts=facts)]
    if result.rule is None and result.input_split:
        message = (f"`{module}` receives a split input but no rule splits it (no reduction): the sharded forward of "
                   f"{small} diverges {where} ({how})")
        fix = f"Add `{_relative(module, text_prefix)}: {ROWWISE}` so that it reduces the split input"
    elif result.rule is None:
        message = (f"the sharded forward of {small} diverges {where} ({how}), in `{module}`, which no rule splits "
                   "and which used no split weight: a parameter it reads per head or per feature is not split "
                   "with the rest")
        fix = "Give the module's own parameters (attention sinks, per-head scales) the rule its inputs need"
    else:
        message = (f"`{key}: {result.style}` does not fit how the model uses `{module}`: the sharded forward of "
                   f"{small} diverges {where} ({how})")
        if result.input_split is True:
            fix = f"Use `{key}: {ROWWISE}`: its input arrives split by the {COLWISE} projections before it"
        elif result.input_split is False and is_rowwise_named(result.style):
            fix = f"Use `{key}: {COLWISE}` (its input arrives whole), or `{ROWWISE_SPLIT_INPUT}` to split it first"
        else:
            fix = _PAIR_THE_STYLES
    return [Finding(code="TPA502", kind="style_mismatch", severity="error", target=result.rule or module,
                    message=message, fix=fix, facts=facts)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def _layout_fix(v, key: str, tp_size: int, text_prefix: str = "") -> str:
    """What to write instead of a split that scrambles the parts of its output, from the traced layout and the style
    the re-run matched with (and the partners that style needs)."""
    split = v.split
    style = v.fix_style if v.fix_style and v.fix_style != PACKED_COLWISE else COLWISE_GATHER_OUTPUT
    partners = (" with " + ", ".join(f"`{_relative(k, text_prefix)}: {st}`" for k, st in v.fix_partners)
                if v.fix_partners else "")
    if v.fix_style == PACKED_COLWISE:
        return (f"Use `{key}: {PACKED_COLWISE}`: its output is {len(split.parts) if split else 2} equal blocks, each "
                "split across ranks (the sharded forward then matches)")
    if split is not None and split.cut == "groups":
        parts = f"{len(split.parts)} parts" if len(split.parts) > 1 else "parts"
        whole = (f"its output is cut in {split.groups} groups of {parts} each, and tp_size {tp_size} does not "
                 f"divide {split.groups}")
        if v.tp_sizes_ok:
            sizes = [d for d in _divisors(split.groups) if d <= max(v.tp_sizes_ok)]
            return (f"Use `{key}: {style}`{partners}, or a tp_size dividing {split.groups} so that every rank holds "
                    f"whole groups ({', '.join(map(str, sizes))}; tp_size {max(v.tp_sizes_ok)} re-run clean): {whole}")
        return (f"Use `{key}: {style}`{partners}: {whole}, and no smaller tp_size that divides it ran clean either "
                "(the forward also needs the whole output)")
    if split is not None and len(split.parts) == 2 and split.parts[0] == split.parts[1] and v.style == COLWISE:
        return f"Use `{key}: {PACKED_COLWISE}` (two equal halves, each split across ranks)"
    return (f"Use `{key}: {style}`{partners} (every rank keeps the whole output) and split the next module's input"
            + (" (the sharded forward then matches)" if v.fix_style else ""))


def _style_fix(v, key: str, module_key: str) -> str:
    if v.rule is None:
        return f"Add `{module_key}: {v.fix_style or ROWWISE}` so that it reduces the split input"
    verified = " (the sharded forward then matches)" if v.fix_style else ""
    if v.input_split is True:
        return f"Use `{key}: {v.fix_style or ROWWISE}`: its input arrives split by the {COLWISE} projections before it"
    if v.fix_style:
        return f"Use `{key}: {v.fix_style}`{verified}"
    if v.input_split is False and is_rowwise_named(v.style):
        return f"Use `{key}: {COLWISE}` (its input arrives whole), or `{ROWWISE_SPLIT_INPUT}` to split it first"
    return _PAIR_THE_STYLES


def _verdict_finding(v, result: ParityResult, text_prefix: str) -> Finding:
    """The TPA501 / TPA502 finding of one error verdict."""
    facts: dict = {"evidence": "parity", "module": v.module, "rule": v.rule, "style": v.style,
                   "observed_at": v.observed_at, "tp_size": result.tp_size, "ep_size": result.ep_size, "rank": v.rank}
    if v.exception:
        facts["exception"] = v.exception
        how = f"a rank raised {v.exception.split(': ', 1)[-1]}"
    else:
        facts["max_abs_error"] = v.max_abs_error
        err = f"{v.max_abs_error:.3g}" if v.max_abs_error is not None else "an unknown amount"
        how = f"outputs differ from the unsharded model by up to {err} (tolerance {result.tolerance:g} of their scale)"
    if v.fix_style:
        facts["fix_style"] = v.fix_style
    if v.fix_partners:
        facts["fix_partners"] = {k: st for k, st in v.fix_partners}
    if v.together_with:
        facts["together_with"] = list(v.together_with)
    where = f"at `{v.observed_at}`" if v.observed_at and v.observed_at != "from_pretrained" else "while loading"
    small = f"a small {result.model_class or 'model'} on {max(result.tp_size, result.ep_size)} ranks"
    key = _relative(v.rule or v.module, text_prefix) or "the rule"
    together = (f"; together with {', '.join(f'`{_relative(t, text_prefix)}`' for t in v.together_with)} in the "
                "same block") if v.together_with else ""
    if v.kind == "packed_layout":
        cut = f" the forward cuts its output into parts ({v.split.action})" if v.split else " its output holds parts"
        return Finding(
            code="TPA501", kind="packed_layout", severity="error", target=v.target,
            message=(f"`{v.module}` is split by `{key}: {v.style}` as one matrix, but{cut}: the sharded forward of "
                     f"{small} diverges {where} ({how}){together}"),
            fix=_layout_fix(v, key, result.tp_size, text_prefix), facts=facts)
    if v.rule is None:
        message = (f"`{v.module}` receives a split input but no rule splits it (no reduction): the sharded forward of "
                   f"{small} diverges {where} ({how})")
    else:
        message = (f"`{key}: {v.style}` does not fit how the model uses `{v.module}`: the sharded forward of {small} "
                   f"diverges {where} ({how}){together}")
    return Finding(code="TPA502", kind="style_mismatch", severity="error", target=v.target, message=message,
                   fix=_style_fix(v, key, _relative(v.module, text_prefix) or v.module), facts=facts)
