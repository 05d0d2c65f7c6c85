"""Isolation: one verdict per rule when the sharded forward of the plan as given raises or diverges.

The run of the plan as given names the first rule to blame (`blame.analyse`), and everything after that point is
masked: the forward raised there, or every later output inherits the divergence. So the plan is re-run with that
rule *repaired*, and the next failure (if any) names the next rule, until the sharded forward matches the unsharded
model:

- a repair is a style with which the module computes its part of the unsharded result, chosen from what the run
  showed, tightest first: `rowwise` for a module whose input arrived split (a missing reduction, a colwise `o_proj`),
  `packed_colwise` for a split cut into two equal blocks, `colwise_gather_output` for a split output the forward cuts
  into parts, `rowwise_split_input` for a rowwise module fed a whole input; when that does not help, its whole block
  (the rules under the same parent module, e.g. `self_attn`) runs replicated, which computes the unsharded result
  by construction. Repairs go in as `DistributedConfig(tp_plan=...)` overrides, which transformers merges into the
  model's own plan; only the ranks run again (the small model, its trace and the unsharded reference are reused);
- a rule the static checks already know cannot split at this `tp_size` (heads or KV heads that `tp_size` does not
  divide: TPA101 / TPA102) has its whole block replicated at once: no style of its partners could make it run;
- once a run matches, every culprit is an error, and the fix that made its block match is re-run evidence. Where a
  block needed two repairs or more, each is verified by putting that one rule back as the plan has it: a rule with
  which the forward still matches was only in the way of the first failure and is cleared;
- every rule the final matching run exercised as the plan has it is cleared; a rule it replaced, never reached, or
  that belongs to an expert-parallel scope is `not_exercised` with the reason.

A plan that fails while loading (a style transformers cannot apply to a module) is bisected: half of the remaining
rules replicated at a time until one rule is left whose replication lets the model load.

Bounded by `MAX_RERUNS` re-runs and a time budget; a rule left undecided says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..compat.logic import ep_dropped_rules, generic_name, parameter_rule
from ..compat.styles import (COLWISE, COLWISE_GATHER_OUTPUT, PACKED_COLWISE, REPLICATE, ROWWISE, ROWWISE_SPLIT_INPUT,
                             is_colwise_family, is_no_op, is_rowwise_family, is_split_output)
from ..model import RuleVerdict, SplitOutput
from .blame import analyse
from .ranks import RankRun, Recorder, cut_evidence, run_ranks
from .small_model import SmallModel, layer_tail

MAX_RERUNS = 10


@dataclass(frozen=True)
class RuleInfo:
    """One rule of the small model's merged plans.

    Attributes:
        key (`str`): the generic prefixed rule key. style (`str`): its style.
        module (`str`): the module it applies to (a parameter rule's owning module).
        is_param (`bool`): the key names a parameter (experts' `gate_up_proj`), not a module.
        block (`str`): the module whose forward consumes it with its siblings (the parent of `module`), or the
            module itself at the top of the model (`embed_tokens`, `lm_head`).
        plan (`"tp" | "ep"`): which plan it belongs to. matches (`bool`): it names something in the small model.
    """

    key: str
    style: str
    module: str
    is_param: bool
    block: str
    plan: str
    matches: bool

    @property
    def name(self) -> str:
        """What a verdict names: the parameter for a parameter rule, else the module."""
        return self.key if self.is_param else self.module


def rule_table(small: SmallModel, ep_size: int) -> dict[str, RuleInfo]:
    """Every rule of the small model's TP plan (and EP plan when `ep_size > 1`), keyed by rule key."""
    modules = {generic_name(n) for n, _ in small.reference.named_modules()}
    params = {generic_name(n) for n, _ in small.reference.named_parameters()}
    plans = [("tp", small.plan)] + ([("ep", small.ep_plan)] if ep_size > 1 else [])
    out: dict[str, RuleInfo] = {}
    for kind, plan in plans:
        for key, style in plan.items():
            is_param = key in params and key not in modules
            module = key.rsplit(".", 1)[0] if is_param else key
            parent = module.rsplit(".", 1)[0] if "." in module else ""
            block = parent if "*" in parent else module
            out[key] = RuleInfo(key, style, module, is_param, block, kind, key in modules or key in params)
    return out


@dataclass
class Observation:
    """One sharded run compared with the unsharded one (`blame.analyse` facts) and the overrides it ran with."""

    facts: dict
    overrides: dict[str, str]
    seconds: float

    @property
    def passed(self) -> bool | None:
        return self.facts.get("passed")

    @property
    def load_failed(self) -> bool:
        return self.facts.get("observed_at") == "from_pretrained"


@dataclass
class Culprit:
    """A rule (or a module without one) a failing run blamed, and what was tried to repair it."""

    key: str
    rule: str | None
    style: str | None
    module: str
    block: str
    facts: dict
    repair: dict[str, str] = field(default_factory=dict)
    tries: int = 0
    escalated: str | None = None     # why its block ran replicated ("block", or the head-count reason)
    innocent: bool = False
    partner_of: "Culprit | None" = None   # it failed only as the partner of an earlier culprit's repair
    smaller_tp: tuple[int, ...] = ()       # a smaller tp_size that ran its rule as the plan has it


class Isolation:
    """The isolation loop for one small model at one (tp_size, ep_size) (see the module docstring).

    Args:
        small (`SmallModel`), ref (`Recorder`): the saved small model and its unsharded run.
        found (`dict[str, SplitOutput]`): the trace's split outputs the forward cuts into parts.
        tp_size (`int`), ep_size (`int`), timeout (`float`): as for `run_parity`.
        head_limited (`dict[str, str]`): blocks (named relative to the decoder layer: `self_attn`) the static checks
            already know cannot split at this `tp_size` (TPA101 / TPA102) -> why.
        budget (`float`): seconds the re-runs may take together.
    """

    def __init__(self, small: SmallModel, ref: Recorder, found: dict[str, SplitOutput], tp_size: int, ep_size: int,
                 timeout: float, head_limited: dict[str, str] | None = None, budget: float = 60.0):
        self.small, self.ref, self.found = small, ref, found
        self.cuts: dict[str, tuple[bool, float | None]] = {}
        self.tp_size, self.ep_size, self.timeout = tp_size, ep_size, timeout
        self.world = max(tp_size, ep_size)
        self.head_limited = dict(head_limited or {})
        self.budget = budget
        self.table = rule_table(small, ep_size)
        self.dropped = set(ep_dropped_rules(small.plan, small.ep_plan)) if ep_size > 1 else set()
        self.linear = {generic_name(n) for n, m in small.reference.named_modules() if hasattr(m, "in_features")}
        self.ep_scopes = tuple(n for n, _ in small.reference.named_modules()
                               if ep_size > 1 and n and parameter_rule(n, small.ep_plan, is_weight=False))
        self.reruns = 0
        self.seconds = 0.0

    # -- runs ----------------------------------------------------------------------------------------------------------
    def observe(self, runs: list[RankRun], finished: bool, overrides: dict[str, str], seconds: float) -> Observation:
        facts = analyse(self.small, self.ref, runs, self.world, self.found, self.ep_size, overrides)
        if not finished:
            hung = [run.rank for run in runs if not (run.done or run.error or run.woken)]
            facts.setdefault("error", f"rank {hung[0] if hung else 0}: did not finish within {self.timeout:g} s "
                                      "(hung)")
            facts["passed"] = False
        return Observation(facts, dict(overrides), seconds)

    def rerun(self, overrides: dict[str, str], tp_size: int | None = None) -> Observation:
        start = time.perf_counter()
        tp = tp_size or self.tp_size
        runs, finished = run_ranks(self.small, tp, self.ep_size, self.timeout,
                                   {"tp_plan": dict(overrides)} if overrides else None)
        seconds = time.perf_counter() - start
        self.reruns += 1
        self.seconds += seconds
        if tp != self.tp_size:
            facts = analyse(self.small, self.ref, runs, max(tp, self.ep_size), self.found, self.ep_size, overrides)
            return Observation(facts if finished else {**facts, "passed": False}, dict(overrides), seconds)
        return self.observe(runs, finished, overrides, seconds)

    def _smaller_tp(self, c: Culprit, overrides: dict[str, str]) -> tuple[int, ...]:
        """For a split whose parts repeat in groups: the largest tp_size below this one that divides the number of
        groups, re-run with the rule as the plan has it (the other repairs kept) on the same small model (whose
        widths keep every residue modulo 2 * tp_size, hence modulo any divisor); `()` when none ran clean."""
        split = self.found.get(c.module) or (self.found.get(c.rule) if c.rule else None)
        if split is None or split.cut != "groups" or self.ep_size > 1 or self._spent():
            return ()
        sizes = [d for d in range(self.tp_size - 1, 1, -1) if split.groups % d == 0]
        if not sizes:
            return ()
        trial = {k: v for k, v in overrides.items() if k not in c.repair}
        obs = self.rerun(trial, tp_size=sizes[0])
        return (sizes[0],) if obs.passed is True else ()

    def _spent(self) -> bool:
        return self.reruns >= MAX_RERUNS or self.seconds >= self.budget

    # -- repairs -------------------------------------------------------------------------------------------------------
    def _block_rules(self, block: str) -> list[str]:
        return [k for k, r in self.table.items() if r.block == block and r.plan == "tp" and r.matches]

    def _group_rules(self, module: str) -> list[str]:
        """A parameter rule's module and every rule under it (experts and their parameters)."""
        return [k for k, r in self.table.items() if r.plan == "tp" and r.matches and
                (r.module == module or k == module or k.startswith(module + "."))]

    def _ladder(self, c: Culprit, facts: dict) -> list[dict[str, str]]:
        """The repairs to try for `c`, tightest first."""
        block = {k: REPLICATE for k in self._block_rules(c.block)}
        if c.rule is None:   # a module no rule splits receives a split input: the missing reduction
            return [{c.module: ROWWISE}] if c.module in self.linear and facts.get("input_split") else []
        info = self.table.get(c.rule)
        if info is None or info.plan != "tp":
            return []        # an EP rule: its partners are the EP dispatch's, not ours to swap
        split = self.found.get(c.module) or self.found.get(c.rule)
        halves = split is not None and split.cut == "blocks" and len(split.parts) == 2 and \
            split.parts[0] == split.parts[1]
        if info.is_param:
            group = {k: REPLICATE for k in self._group_rules(info.module)}
            return ([{c.rule: PACKED_COLWISE}] if c.style == COLWISE and halves else []) + [group, block]
        if facts.get("input_split") and not is_rowwise_family(c.style):
            return [{c.rule: ROWWISE}, block]
        if is_colwise_family(c.style):
            tight = [{c.rule: PACKED_COLWISE}] if c.style == COLWISE and halves else []
            gather = [{c.rule: COLWISE_GATHER_OUTPUT}] if c.style != COLWISE_GATHER_OUTPUT else []
            return tight + gather + [block]
        if is_rowwise_family(c.style) and facts.get("input_split") is False and c.style != ROWWISE_SPLIT_INPUT:
            return [{c.rule: ROWWISE_SPLIT_INPUT}, block]
        return [{c.rule: REPLICATE}, block] if not is_no_op(c.style) else [block]

    def _culprit(self, facts: dict) -> Culprit | None:
        module = facts.get("first_divergent_module")
        if module is None:
            return None
        rule = facts.get("rule")
        info = self.table.get(rule) if rule else None
        block_of = info.block if info else (module.rsplit(".", 1)[0] if "." in module else module)
        return Culprit(key=rule or module, rule=rule, style=facts.get("style"), module=info.module if info else module,
                       block=block_of, facts=facts)

    def _bisect_load(self, overrides: dict[str, str]) -> tuple[Culprit | None, Observation | None]:
        """One rule whose replication lets the model load (see the module docstring), and the run that showed it."""
        pool = [k for k, r in self.table.items() if r.plan == "tp" and r.matches and k not in overrides
                and not is_no_op(r.style)]
        loaded = None
        while len(pool) > 1 and not self._spent():
            half = pool[: len(pool) // 2]
            obs = self.rerun({**overrides, **{k: REPLICATE for k in half}})
            if obs.load_failed:
                pool = pool[len(pool) // 2:]
            else:
                pool, loaded = half, obs
        if len(pool) != 1:
            return None, None
        info = self.table[pool[0]]
        facts = {"first_divergent_module": info.module, "rule": info.key, "style": info.style,
                 "observed_at": "from_pretrained"}
        return Culprit(key=info.key, rule=info.key, style=info.style, module=info.module, block=info.block,
                       facts=facts), loaded

    # -- the loop ------------------------------------------------------------------------------------------------------
    def isolate(self, first: Observation) -> tuple[tuple[RuleVerdict, ...], Observation]:
        """Verdicts for every rule after the run `first`, and the last run observed."""
        culprits: dict[str, Culprit] = {}
        overrides: dict[str, str] = {}
        obs = first
        while obs.passed is False and not self._spent():
            if obs.load_failed and obs.facts.get("first_divergent_module") is None:
                c, _ = self._bisect_load(overrides)
                if c is None:
                    break
                c = culprits.setdefault(c.key, c)
                ladder = [{c.key: REPLICATE}]
            else:
                c = self._culprit(obs.facts)
                if c is None:
                    break
                c = culprits.setdefault(c.key, c)
                ladder = self._ladder(c, c.facts)
                limited = self.head_limited.get(layer_tail(c.block))
                if limited and not c.escalated and self._block_rules(c.block):
                    c.escalated = limited
                    ladder = [{k: REPLICATE for k in self._block_rules(c.block)}]
                    c.tries = 0
            if c.tries >= len(ladder):
                break        # nothing left to try: the rules it masks stay undecided
            repair = ladder[c.tries]
            c.tries += 1
            if c.tries == len(ladder) and len(repair) > 1 and not c.escalated:
                c.escalated = "block"
            c.repair = repair
            overrides.update(repair)
            obs = self.rerun(overrides)
        if obs.passed is True:
            obs = self._verify(culprits, overrides, obs)
            for c in culprits.values():
                if not c.innocent and c.partner_of is None:
                    partner_keys = {k for p in culprits.values() if p.partner_of is c for k in p.repair}
                    c.smaller_tp = self._smaller_tp(c, {k: v for k, v in overrides.items() if k not in partner_keys})
        return self._verdicts(obs, culprits), obs

    def _partners(self, culprits: dict[str, Culprit]) -> None:
        """Mark the culprits that failed only as partners of an earlier repair in their block: a rowwise-family
        module (it reduces a split input) fed a whole input because an earlier culprit of the same block, which split
        its output (`colwise`), was repaired into a whole one. Its rule is the right partner of the split the plan
        has; the split itself is what fails."""
        seen: list[Culprit] = []
        for c in culprits.values():
            earlier = [e for e in seen if e.block == c.block and is_split_output(e.style) and e.partner_of is None]
            if (earlier and not c.escalated and c.rule and is_rowwise_family(c.style) and c.style != ROWWISE_SPLIT_INPUT
                    and c.facts.get("input_split") is False):
                c.partner_of = earlier[0]
            seen.append(c)

    def _verify(self, culprits: dict[str, Culprit], overrides: dict[str, str], last: Observation) -> Observation:
        """Put back, one at a time, each culprit of a block that needed two repairs or more (partners of a repair
        aside): a rule with which the forward still matches is cleared."""
        self._partners(culprits)
        by_block: dict[str, list[Culprit]] = {}
        for c in culprits.values():
            if c.partner_of is None:
                by_block.setdefault(c.block, []).append(c)
        for block, group in by_block.items():
            if len(group) < 2 or any(c.escalated for c in group):
                continue
            for c in group:
                if self._spent():
                    return last
                trial = {k: v for k, v in overrides.items() if k not in c.repair}
                for k in c.repair:      # a rule the plan has goes back to its own style; an added one goes away
                    if k != c.rule and k in self.small.plan:
                        trial[k] = self.small.plan[k]
                obs = self.rerun(trial)
                if obs.passed is True:
                    c.innocent = True
                    overrides.clear()
                    overrides.update(trial)
                    last = obs
        return last

    # -- verdicts ------------------------------------------------------------------------------------------------------
    def _verdicts(self, last: Observation, culprits: dict[str, Culprit]) -> tuple[RuleVerdict, ...]:
        out: list[RuleVerdict] = []
        passed = last.passed is True
        guilty = [c for c in culprits.values() if not c.innocent and c.partner_of is None]
        partners = [c for c in culprits.values() if c.partner_of is not None]
        replaced = {k: c for c in guilty for k in c.repair}
        for c in guilty:
            out.append(self._error(c, passed, guilty, [p for p in partners if p.partner_of is c]))
        for p in partners:
            info = self.table[p.rule]
            out.append(RuleVerdict(
                rule=p.rule, style=p.style, module=info.name, status="not_exercised",
                why=(f"not exercised as the plan has it: its input arrived whole once `{p.partner_of.key}` was "
                     f"repaired ({p.partner_of.repair.get(p.partner_of.key, 'replicated')}); it is the partner that "
                     f"reduces `{p.partner_of.key}: {p.partner_of.style}`, which is what fails"),
                fix_style=p.repair.get(p.key)))
        blamed = {c.key for c in guilty} | {p.key for p in partners}
        repaired = len(guilty)
        failed_at = last.facts.get("observed_at")
        for key, info in self.table.items():
            if key in blamed:
                continue
            why = self._why_not(info, last)
            if why is None and key in last.overrides and key in replaced:
                c = replaced[key]
                why = (f"not exercised: its block ran whole while `{c.key}` was isolated"
                       + (f" ({c.escalated})" if c.escalated and c.escalated != "block" else ""))
            if why is None and passed:
                extra = (f", with the {repaired} failing rule{'s' if repaired > 1 else ''} repaired" if repaired
                         else "")
                why = f"held in a run whose {last.facts.get('modules_compared', 0)} compared outputs matched{extra}"
                out.append(RuleVerdict(rule=key, style=info.style, module=info.name, status="cleared", why=why))
                continue
            if why is None and info.block in last.facts.get("matched", ()) and last.passed is False:
                why = f"held: its block's outputs matched before the forward failed at `{failed_at}`"
                out.append(RuleVerdict(rule=key, style=info.style, module=info.name, status="cleared", why=why))
                continue
            if why is None:
                why = (f"not exercised: the forward failed first at `{failed_at}`" if last.passed is False else
                       "not exercised: the run compared no module output")
            split = self.found.get(info.module) or self.found.get(key)
            held = self.cuts.get(split.module) if split is not None else None
            if held is not None and held[0] and info.matches and key not in self.dropped:
                why = ("held: the parts the forward cuts its output into are, on every rank, the rank's share of the "
                       f"unsharded parts (max abs error {held[1]:.2g}); the rest of its block was " + why)
                out.append(RuleVerdict(rule=key, style=info.style, module=info.name, status="cleared", why=why,
                                       split=split))
                continue
            out.append(RuleVerdict(rule=key, style=info.style, module=info.name, status="not_exercised", why=why))
        order = {"error": 0, "cleared": 1, "not_exercised": 2}
        return tuple(sorted(out, key=lambda v: (order[v.status], v.target)))

    def _why_not(self, info: RuleInfo, last: Observation) -> str | None:
        if not info.matches:
            return "not exercised: it matches no module or parameter of the small model"
        if info.key in self.dropped:
            return "not exercised: EP scope (the EP plan replaces this rule on its module)"
        if info.module not in last.facts.get("reached", ()) and last.passed is not False:
            return "not exercised: the forward never reached its module"
        return None

    def _error(self, c: Culprit, passed: bool, guilty: list[Culprit], partners: list[Culprit]) -> RuleVerdict:
        facts = c.facts
        info = self.table.get(c.rule) if c.rule else None
        split = self.found.get(c.module) or (self.found.get(c.rule) if c.rule else None)
        held = self.cuts.get(split.module) if split is not None else None
        # the split scrambles the parts of its output unless every rank's parts were its share of the unsharded ones
        kind = "packed_layout" if split is not None and not (held and held[0]) else "style_mismatch"
        fix = None
        if passed and len(c.repair) == 1 and c.key in c.repair and c.repair[c.key] != REPLICATE:
            fix = c.repair[c.key]
        together = tuple(sorted(g.key for g in guilty if g is not c and g.block == c.block))
        how = ("its block's rules fail together" if c.escalated == "block" else
               c.escalated if c.escalated else
               f"the sharded forward matched once it used `{fix}`" if fix else
               "the sharded forward matched once its block ran whole" if passed else
               "it breaks the sharded forward")
        with_partners = tuple((p.key, p.repair[p.key]) for p in partners if p.key in p.repair) if fix else ()
        return RuleVerdict(
            rule=c.rule, style=c.style if c.rule else None, module=info.name if info else c.module, status="error",
            kind=kind, why=how, observed_at=facts.get("observed_at"), observed_layer=facts.get("observed_layer"),
            exception=facts.get("error"), max_abs_error=None if facts.get("error") else facts.get("max_abs_error"),
            rank=facts.get("rank"), input_split=facts.get("input_split"), fix_style=fix, together_with=together,
            split=split, fix_partners=with_partners, tp_sizes_ok=c.smaller_tp)


def first_verdicts(small: SmallModel, ref: Recorder, found: dict[str, SplitOutput], tp_size: int, ep_size: int,
                   timeout: float, runs: list[RankRun], finished: bool, head_limited: dict[str, str] | None = None,
                   budget: float = 60.0):
    """Compare the first run (of the plan as given) and, when it failed, isolate.

    Returns:
        `(facts, verdicts, reruns, seconds)`: the first run's `analyse` facts, one verdict per rule, and the re-runs
        isolation took (count and wall seconds).
    """
    iso = Isolation(small, ref, found, tp_size, ep_size, timeout, head_limited, budget)
    iso.cuts = cut_evidence(small, runs, iso.world, iso.ep_scopes)
    first = iso.observe(runs, finished, {}, 0.0)
    verdicts, _ = iso.isolate(first)
    return first.facts, verdicts, iso.reruns, iso.seconds
