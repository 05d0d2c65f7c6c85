"""Blame: compare every rank with the unsharded run and attribute a divergence to the split that caused it.

The first module (in execution order) whose output differs beyond the tolerance, or the module running when a rank
raised, is where the divergence shows. It is attributed to the split that caused it: that module's own rule when its
input still matched (a colwise `o_proj` fed split heads, a rowwise `q_proj` fed a whole hidden state); a module with
no rule that received a split input (a missing reduction); else a split weight the rank used inside that module, or
since the last whole output that matched of a module above it: the last one before a crash, a fused or packed one
first for wrong numbers.
"""

from __future__ import annotations

from typing import Any

from ..compat import parity as seam
from ..compat.logic import generic_name
from ..compat.styles import is_own_split, is_split_output
from .ranks import Recorder, RankRun, compare
from .small_model import SmallModel
from .trace import rule_for


def layer_index(name: str) -> int | None:
    """The first layer index in a concrete module name (`model.layers.1.self_attn` -> 1)."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return None


def rule_at_load(small: SmallModel, name: str, is_param: bool, ep_size: int,
                 overrides: dict | None = None) -> tuple[str | None, str | None]:
    """The rule that applies at load: the EP plan's first when `ep_size > 1` (EP rules replace TP rules on the same
    modules), else the TP plan's (with `overrides` merged as `DistributedConfig(tp_plan=...)` merges them)."""
    if ep_size > 1:
        rule, style = rule_for(small.ep_plan, name, is_param)
        if rule is not None:
            return rule, style
    plan = {**small.plan, **overrides} if overrides else small.plan
    return rule_for(plan, name, is_param)


def analyse(small: SmallModel, ref: Recorder, runs: list[RankRun], world: int, found: dict, ep_size: int = 1,
            overrides: dict | None = None) -> dict[str, Any]:
    """Compare every rank with the unsharded run and attribute the first divergence (see the module docstring)."""
    compared: set[tuple[str, int]] = set()
    max_err: float | None = None
    observations: list[tuple[Any, ...]] = []
    reached: set[str] = set()
    matched: dict[str, bool] = {}   # generic module -> every call compared before the rank's failure matched
    # modules whose ranks hold partial results until the module reduces them: an expert-parallel module (each rank
    # computes other tokens) and a module whose style all-reduces its output (`compat.parity.REDUCING_STYLES`: each
    # rank's experts, and 5.24's identity expert pre-divided by tp_size, are partial sums inside it)
    ep_scopes = [name for name, _ in small.reference.named_modules()
                 if name and ((ep_size > 1 and rule_for(small.ep_plan, name, is_param=False)[0] is not None)
                              or rule_at_load(small, name, False, ep_size, overrides)[1] in seam.REDUCING_STYLES)]
    for run in runs:
        rec = run.recorder
        if rec is None:
            continue
        reached.update(generic_name(n) for n in rec.counts)
        first = None
        for seq, key in rec.exits:
            if run.done and rec.counts.get(key[0]) != ref.counts.get(key[0]):
                continue   # called another number of times (an expert loop over this rank's experts): no pairing
            if any(key[0].startswith(scope + ".") for scope in ep_scopes):
                continue   # inside an expert-parallel module each rank computes other tokens: only its output pairs
            ok, err, tol = compare(ref.outputs.get(key), rec.outputs.get(key), run.rank, world)
            if not ok:
                continue
            compared.add(key)
            max_err = err if max_err is None else max(max_err, err)
            diverged = err > tol
            if first is None:
                g = generic_name(key[0])
                matched[g] = matched.get(g, True) and not diverged
            if diverged and first is None:
                first = (seq, key, err)
        if first is not None:
            observations.append((first[0], run.rank, first[1], first[2], None))
        elif run.error and run.phase == "forward":
            observations.append((rec.seq, run.rank, run.crash_site, None, run.error))
    load_errors = [run for run in runs if run.error and run.phase == "load"]
    out: dict[str, Any] = {"modules_compared": len(compared), "max_abs_error": max_err, "reached": reached,
                           "matched": {g for g, ok in matched.items() if ok}}
    if not observations:
        if load_errors:
            run = load_errors[0]
            out.update(error=f"rank {run.rank}: {run.error}", rank=run.rank, observed_at="from_pretrained",
                       passed=False)
        else:
            # passed means compared: a run whose ranks all finished but compared no output is no evidence
            out["passed"] = True if all(run.done for run in runs) and compared else \
                None if all(run.done for run in runs) else False
        return out
    seq, rank, site, err, error = min(observations, key=lambda o: (o[0], o[1]))
    run = runs[rank]
    rec = run.recorder
    out.update(passed=False, rank=rank)
    if error:
        out["error"] = f"rank {rank}: {error}"
    if site is None:
        out["observed_at"] = "the forward (outside any module)"
        return out
    name = site[0]
    out["observed_at"] = generic_name(name) or type(small.reference).__name__
    found_layer = layer_index(name)
    if found_layer is not None and found_layer < len(small.layers):
        out["observed_layer"] = small.layers[found_layer]
    culprit = attribute(small, ref, rec, rank, world, site, seq, crashed=bool(error), ep_size=ep_size,
                        overrides=overrides)
    out.update(culprit)
    out["fused"] = bool(culprit.get("first_divergent_module") in found)
    return out


def attribute(small: SmallModel, ref: Recorder, rec: Recorder, rank: int, world: int, site, seq: int,
              crashed: bool, ep_size: int = 1, overrides: dict | None = None) -> dict:
    """The split to blame for a divergence seen at module call `site` (sequence `seq` of this rank)."""
    name = site[0]
    rule, style = rule_at_load(small, name, False, ep_size, overrides)
    ok, err, tol = compare(ref.inputs.get(site), rec.inputs.get(site), rank, world)
    input_ok = ok and err is not None and err <= tol
    input_split = input_ok and ref.inputs.get(site) is not None and rec.inputs.get(site) is not None and \
        tuple(ref.inputs[site].shape) != tuple(rec.inputs[site].shape)
    if input_ok and is_own_split(style):
        return {"first_divergent_module": generic_name(name), "rule": rule, "style": style,
                "input_split": input_split}
    if input_split and style is None:
        return {"first_divergent_module": generic_name(name), "rule": None, "style": None, "input_split": True}

    def suspect(param: str) -> bool:
        # a weight whose split reaches the model split: a parameter with its own rule (experts), or the weight of a
        # module whose output stays split (colwise, packed_colwise); a gathered or reduced output is whole again
        prule, pstyle = rule_at_load(small, param, True, ep_size, overrides)
        return prule == generic_name(param) or is_split_output(pstyle)

    inside = [p for s, p in rec.param_uses if rec.enters.get(site, seq) <= s <= seq and suspect(p)]
    if inside:
        used = inside
    else:
        # since the last whole output that matched, of a module shallower than the site (a sibling's clean output
        # does not clear a split output the site is still to consume)
        depth = name.count(".")
        clean = 0
        for s, key in rec.exits:
            if s >= seq:
                break
            if key[0].count(".") >= depth or not key[0]:
                continue
            r, o = ref.outputs.get(key), rec.outputs.get(key)
            if r is not None and o is not None and tuple(r.shape) == tuple(o.shape):
                ok, e, t = compare(r, o, rank, world)
                if ok and e is not None and e <= t:
                    clean = s
        used = [p for s, p in rec.param_uses if clean < s <= seq and suspect(p)]
    if not used:
        return {"first_divergent_module": generic_name(name), "rule": rule, "style": style}
    pick = None
    if not crashed:   # wrong numbers: a fused or packed projection first, its split is the one the forward cuts
        for p in reversed(used):
            g = generic_name(p)
            if g in small.found or g.rsplit(".", 1)[0] in small.found:
                pick = p
                break
    pick = pick or used[-1]   # a crash: the last split weight the rank used before it
    prule, pstyle = rule_at_load(small, pick, True, ep_size, overrides)
    g = generic_name(pick)
    module = g if prule == g else g.rsplit(".", 1)[0]
    return {"first_divergent_module": module, "rule": prule, "style": pstyle}
