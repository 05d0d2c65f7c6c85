"""When the pipeline asks the sharded forward for evidence, and what it asks.

The engine builds a small model of the same architecture and plan, loads it on `tp_size` real ranks with
`from_pretrained(..., distributed_config=...)` and compares its outputs with the unsharded model's. This module
decides when that is needed for one option of a report:

- always for a proposed plan (`--plan`, a `--suggest` candidate: a plan under review is exactly what needs
  evidence) and with `--parity`;
- by itself when the plan splits a projection's output and the model's forward then cuts that output into parts (a
  fused or packed projection, by any name), which only the forward can tell: a cheap static filter (a module split on
  its output whose `out_features` is not one size the config names for a single projection) picks the candidates,
  and a trace of one forward of the small model (`trace.split_outputs`) confirms that the forward cuts them;
- never with `--no-parity`, for one rank, or for a plan the loader refuses; and never for a shipped plan with no such
  projection (nothing extra runs).

`packed_colwise` on a fused experts parameter that transformers itself marks as concatenated `[gate; up]` and not
transposed (`is_concatenated`, `is_transposed`, the flags its experts kernels read) is decided without evidence: it
is the layout that style is written for.
"""

from __future__ import annotations

import dataclasses

from ..compat.styles import PACKED_COLWISE, is_split_output
from ..metamodel import vocabulary as V
from ..model import ParityResult, RuleVerdict
from .cache import NOT_NEEDED, digest, open_cache
from .cache import inputs as cache_inputs
from .run import run_parity
from .small_model import small_model
from .trace import split_outputs


SWITCHED_OFF = "not run: switched off"
"""How the `reason` of a parity section begins when the check was switched off (`--no-parity`, a plain scan)."""


def _single_widths(facts) -> set[int]:
    """Output widths of single (unfused) projections the config names (`vocabulary.SINGLE_OUTPUTS`), and every head
    count times a head width (`SINGLE_HEADS` x `SINGLE_HEAD_DIMS`, with `hidden / heads` and MLA's `qk_nope_head_dim +
    qk_rope_head_dim`)."""
    def ints(*roles):
        return {v for n in V.attrs_of(*roles) if isinstance(v := facts.value(n), int)}

    widths = ints(*V.SINGLE_OUTPUTS)
    heads = ints(*V.SINGLE_HEADS)
    dims = ints(*V.SINGLE_HEAD_DIMS)
    hidden = facts.value(V.HIDDEN.canonical)
    attention = facts.value(V.ATTENTION_HEADS.canonical)
    if isinstance(hidden, int) and isinstance(attention, int) and attention:
        dims.add(hidden // attention)
    mla_q = (facts.value(V.MLA_NOPE_HEAD_DIM.canonical), facts.value(V.MLA_ROPE_HEAD_DIM.canonical))
    if all(isinstance(x, int) for x in mla_q):
        dims.add(sum(mla_q))
    return widths | {h * d for h in heads for d in dims}


def candidates(built, shard_map) -> list[str]:
    """Generic names of the projections the plan splits on their output whose width is not one single projection's
    (`out_features` of a module, or the output dim of a bare experts parameter), excluding what is decided without
    evidence (see the module docstring)."""
    single = _single_widths(built.facts)
    out = []
    for g in shard_map.groups:
        p = g.first
        if p.sharding != "sharded" or p.plan != "tp" or not is_split_output(p.style) or p.ndim < 2:
            continue
        facts = built.modules.get(p.module_name)
        bare = p.name.rpartition(".")[2] not in ("weight", "bias")
        if bare:  # a fused experts parameter: [E, out, in] (or [E, in, out] when transposed)
            width = p.global_shape[-1] if facts is not None and facts.is_transposed else p.global_shape[-2]
            if p.style == PACKED_COLWISE and facts is not None and facts.is_concatenated is not False \
                    and not facts.is_transposed:
                continue
        else:
            width = facts.out_features if facts is not None and facts.out_features else p.global_shape[-2]
        if width in single or (p.style == PACKED_COLWISE and width // 2 in single and not bare):
            continue
        out.append(g.generic_name)
    return out


def gather(built, resolved, shard_map, mode: str, *, proposed: bool) -> ParityResult:
    """The `parity` section of one option's report: a result that ran, or one that says why it did not.

    Args:
        built (`BuiltModel`), resolved (`ResolvedPlan`), shard_map (`ShardMap`): the option's earlier stages.
        mode (`"auto" | "on" | "off"`): when the plan needs evidence (see the module docstring), always
            (`--parity`), never (`--no-parity`).
        proposed (`bool`): the plan is under review (`--plan`, a `--suggest` candidate).

    The trace that decides whether the check runs and the sharded run share one small model (one build, not two).

    Raises:
        ConfigError: the trace cannot build or run the small model (`--no-parity` skips it).
    """
    if not resolved.sizes.parallel:
        return skipped(resolved, "not run: one rank splits nothing")
    if resolved.loader_errors:
        return skipped(resolved, "not run: from_pretrained refuses this plan (see TPA003)")
    if mode == "off":
        return skipped(resolved, f"{SWITCHED_OFF} (--no-parity); fused-projection suspicions stay warnings")
    if built.instance_plans is not None:
        return skipped(resolved, "not run: a model object's merged plans cannot be given to a small model of its "
                                 "architecture")
    if mode == "on":
        why = "asked for (--parity)"
    elif proposed:
        why = "the plan is a proposed one (--plan): a plan under review is checked against the sharded forward"
    elif not candidates(built, shard_map):
        return _not_needed(resolved)
    else:
        why = None
    cache, problem = open_cache()
    limited = head_limited(built, shard_map, resolved.tp_size)
    if cache is not None:
        facts = cache_inputs(config=built.config, model_class=built.architecture, plan=_plan(resolved),
                             tp_size=resolved.tp_size, ep_size=resolved.ep_size, checkpoint_names=_keys(built),
                             head_limited=limited, why=why or "auto")
        key = digest(facts)
        hit, problem = cache.lookup(key)
        if hit is not None:
            return hit
    result = _run(built, resolved, why, shard_map=shard_map, limited=limited) if why else \
        _auto(built, resolved, shard_map, limited)
    if cache is not None:
        cache.put(key, facts, result)
    return dataclasses.replace(result, cache_problem=problem) if problem else result


def _auto(built, resolved, shard_map, limited) -> ParityResult:
    """The check by itself: when the trace finds a split output the forward cuts into parts."""
    small = small_model(built.config, built.architecture, _plan(resolved), resolved.tp_size,
                        checkpoint_keys=_keys(built))
    try:
        found = split_outputs(built.config, built.architecture, _plan(resolved), resolved.tp_size, small=small)
        if not found:
            return _not_needed(resolved)
        names = ", ".join(f"`{s.module}` ({s.style})" for s in found[:3])
        why = f"the plan splits {names}{' and more' if len(found) > 3 else ''}, whose output the forward cuts into parts"
        return _run(built, resolved, why, small, shard_map, limited)
    finally:
        small.cleanup()


def _not_needed(resolved) -> ParityResult:
    return skipped(resolved, f"{NOT_NEEDED}: the plan splits no projection whose output the forward cuts into parts")


def skipped(resolved, why: str) -> ParityResult:
    """The `parity` section of a report for which the check did not run, with the reason."""
    return ParityResult(ran=False, reason=why, tp_size=resolved.tp_size, ep_size=resolved.ep_size)


def head_limited(built, shard_map, tp_size: int) -> dict[str, str]:
    """Attention blocks the static facts already say cannot split at `tp_size`: the block (the parent module, as a
    name relative to the decoder layer, `self_attn`) of a key projection the plan splits in a layer whose KV heads
    (TPA102) or attention heads (TPA101) `tp_size` does not divide -> why, in words. The isolation runs such a block
    whole at once instead of trying styles on its partners (no partner can make half a head whole).

    Source: the KV-cache section's key projections and per-layer KV heads (`shard.kvcache.key_projections`, `kv_layers`,
    from transformers' `get_head_shapes`), the attention heads of the model's facts."""
    from ..shard.kvcache import key_projections, kv_layers
    from .small_model import layer_tail

    if tp_size <= 1:
        return {}
    kv = {layer.index: layer.kv_heads for layer in kv_layers(built.facts)}
    heads = [h for h in built.facts.role_values(V.ATTENTION_HEADS)[1] if isinstance(h, int)]
    out: dict[str, str] = {}
    for index, key in sorted(key_projections(shard_map, built.text_prefix).items()):
        if key.gathered or not key.style:
            continue
        module = key.name.rsplit(".", 1)[0]
        block = layer_tail(module.rsplit(".", 1)[0])
        if block in out:
            continue
        if kv.get(index, 0) % tp_size:
            out[block] = (f"its attention cannot split at tp_size {tp_size}: layer {index} has {kv[index]} KV heads "
                          "(TPA102)")
        elif any(h % tp_size for h in heads):
            out[block] = f"its attention cannot split at tp_size {tp_size}: {heads[0]} attention heads (TPA101)"
    return out


def _run(built, resolved, reason: str, small=None, shard_map=None, limited=None) -> ParityResult:
    """Run the parity check for this option (`run_parity`, the checkpoint's own layout) and say why it ran."""
    if limited is None and shard_map is not None:
        limited = head_limited(built, shard_map, resolved.tp_size)
    result = run_parity(built.config, built.architecture, _plan(resolved), resolved.tp_size, resolved.ep_size,
                        checkpoint_keys=_keys(built), small=small, head_limited=limited)
    result = _real_names(built, resolved, result)
    return dataclasses.replace(result, reason=f"{reason}; {result.reason}",
                               verdicts=result.verdicts + _outside(built, resolved, result))


def _outside(built, resolved, result: ParityResult) -> tuple[RuleVerdict, ...]:
    """A verdict for each rule of the real model's resolved plans that the small model does not have: rules the
    quantizer adds for its own tensors (the small model runs unquantized), and rules of the towers a composite
    model's text decoder leaves out. Rules that match nothing are TPA002's, not listed here."""
    if not result.ran:
        return ()
    have = {v.rule for v in result.verdicts} | {v.module for v in result.verdicts}
    unused = set(resolved.unused_tp_rules) | set(resolved.unused_ep_rules)
    rules = {**resolved.tp_rules, **(resolved.ep_rules if resolved.ep_size > 1 else {})}
    prefix = built.text_prefix + "." if built.text_prefix else ""
    out = []
    for key, style in sorted(rules.items()):
        if key in have or key in unused:
            continue
        if built.quantization is not None and (not prefix or key.startswith(prefix)):
            why = ("not exercised: quantized kernel (the small model runs unquantized, without the tensors this rule "
                   "splits)")
        elif prefix and not key.startswith(prefix) and key not in built.lm_head_names:
            why = "not exercised: outside the text decoder the small model runs"
        else:
            why = "not exercised: not in the small model"
        module = key.rsplit(".", 1)[0] if key.rsplit(".", 1)[-1] in ("weight", "bias") else key
        out.append(RuleVerdict(rule=key, style=style, module=module, status="not_exercised", why=why))
    return tuple(out)


def _real_names(built, resolved, result: ParityResult) -> ParityResult:
    """The small model of a composite model is its text decoder alone (`layers.*.x`): name modules and rules as the
    real model does (`model.language_model.layers.*.x`), so findings point at what a user edits."""
    from ..compat import backend

    names = backend().model_names(built.model)
    prefix = built.text_prefix
    rules = None

    def real(name: str | None) -> str | None:
        nonlocal rules
        if not name or name in names or not prefix:
            return name
        # the decoder's own base prefix (`model` of a causal LM) stands where the composite model has its text prefix
        own = name.split(".", 1)[1] if "." in name else None
        for candidate in (f"{prefix}.{name}", f"{prefix}.{own}" if own else None):
            if candidate and candidate in names:
                return candidate
        if rules is None:
            rules = resolved_rules(resolved)
        return next((c for c in (f"{prefix}.{name}", f"{prefix}.{own}" if own else None) if c and c in rules), name)

    split = tuple(dataclasses.replace(s, module=real(s.module), rule=real(s.rule)) for s in result.split)
    verdicts = tuple(dataclasses.replace(
        v, rule=real(v.rule), module=real(v.module), observed_at=real(v.observed_at),
        together_with=tuple(real(t) for t in v.together_with),
        fix_partners=tuple((real(k), st) for k, st in v.fix_partners),
        split=dataclasses.replace(v.split, module=real(v.split.module), rule=real(v.split.rule)) if v.split else None)
        for v in result.verdicts)
    return dataclasses.replace(result, first_divergent_module=real(result.first_divergent_module),
                               rule=real(result.rule), observed_at=real(result.observed_at), split=split,
                               verdicts=verdicts)


def resolved_rules(resolved) -> set[str]:
    """Every key of the merged TP and EP plans of one resolution (`ResolvedPlan`)."""
    return set(resolved.tp_rules) | set(resolved.ep_rules)


def _plan(resolved) -> dict | None:
    """The plan under review, when it is not the one transformers ships (the small model is built with it)."""
    return dict(resolved.base_plan) if resolved.override is not None else None


def _keys(built):
    """The checkpoint's tensor names as generic names, each once (what the small model's layout is decided on): the
    mapping's, read off the families the build grouped the names into, else the source's (one `generic_name` per
    tensor)."""
    if built.mapping is not None:
        return built.mapping.generic_tensor_names
    return built.source.generic_tensor_names
