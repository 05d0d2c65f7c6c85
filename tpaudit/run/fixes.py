"""Fixes that are re-checked before they are shown: the run stage re-simulates every concrete alternative a finding's
fix names (`Finding.fix_options`: a tp size, an ep size, plan edits) with the whole check (plan, sharding, the
load stage, parity as the request asks) and keeps only the clean ones in the fix text; each finding gets `verified`
(the exit code `check` would give and the error count, per alternative).

Checks propose, they never simulate another option; renderers print `fix` and `verified` as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import TpauditError
from ..model import Finding, FixOption, ParallelSizes


@dataclasses.dataclass(frozen=True)
class Recheck:
    """One alternative's re-check.

    Attributes:
        option (`FixOption`): what was re-checked.
        exit_code (`int`): what `tpaudit check` exits with for it: 0 clean, 1 error findings, 2 transformers refuses
            the sizes or the plan.
        errors (`tuple[str, ...]`): `CODE target` of its error findings (or transformers' refusal).
    """

    option: FixOption
    exit_code: int
    errors: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        edits = {k: v for k, v in self.option.plan_edits}
        return {"fix": self.option.label, "tp_size": self.option.tp_size, "ep_size": self.option.ep_size,
                "plan_edits": edits, "exit_code": self.exit_code, "errors": len(self.errors),
                "remaining": list(self.errors)}


def _remaining(errors: tuple[str, ...], limit: int = 3) -> str:
    shown = ", ".join(errors[:limit])
    return shown + (f" and {len(errors) - limit} more" if len(errors) > limit else "")


def fix_text(finding: Finding, results: list[Recheck]) -> str:
    """The fix as shown: the clean alternatives (each re-checked), else what each alternative leaves, then the
    check's own fallback advice (`finding.fix_fallback`, which names no size or rule of its own)."""
    clean = [r for r in results if r.clean]
    if clean:
        what = "; or ".join([clean[0].option.label] + [r.option.label[0].lower() + r.option.label[1:]
                                                         for r in clean[1:]])
        return f"{what} (re-checked with the whole check, load stage included: 0 errors)"
    left = "; ".join(f"{r.option.label} leaves " + (f"{len(r.errors)} error(s) ({_remaining(r.errors)})"
                                                     if r.exit_code == 1 else f"a refusal ({_remaining(r.errors)})")
                     for r in results)
    rest = f" {finding.fix_fallback}" if finding.fix_fallback else ""
    return f"No re-checked alternative is clean: {left}.{rest}"


def together_text(finding: Finding, result: Recheck, group: tuple[str, ...], before: set[str],
                  accepted: int = 0) -> tuple[str, bool]:
    """The fix as shown for a finding whose edit was re-checked with the report's other edits of its kind
    (`FixOption.together`): `result` is that one re-check (its option holds every edit), `group` the `CODE target` of
    every finding it covers, `before` the `CODE target` of the report's errors, `accepted` how many findings of the
    group a `--baseline` accepts (they are not shown, so the text says where their rules come from). Returns
    `(text, offered)`: offered when the plan clears every finding of the group and adds no error (the report's other
    errors may remain, and are named)."""
    option = finding.fix_options[0]
    others = len(set(result.option.plan_edits) - set(option.plan_edits)) if len(group) > 1 else 0
    hidden = f", {accepted} of them for findings the baseline accepts" if accepted else ""
    with_others = f", with the {others} other metadata rule(s) this check proposes{hidden}" if others else ""
    whom = f"all {len(group)} findings" if len(group) > 1 else "this finding"
    together = "together " if others else ""
    if result.clean:
        return (f"{option.label}{with_others} (re-checked {together}with the whole check, load stage included: 0 "
                "errors)"), True
    kept = [e for e in result.errors if e in group]
    new = [e for e in result.errors if e not in before]
    if result.exit_code == 1 and not kept and not new:
        return (f"{option.label}{with_others} (re-checked {together}with the whole check, load stage included: "
                f"clears {whom} and adds no error; {len(result.errors)} other error(s) remain: "
                f"{_remaining(result.errors)})"), True
    label = f"{option.label}{with_others}"
    left = (f"{label} leaves {len(result.errors)} error(s) ({_remaining(tuple(kept + new) or result.errors)})"
            if result.exit_code == 1 else f"{label} leaves a refusal ({_remaining(result.errors)})")
    rest = f" {finding.fix_fallback}" if finding.fix_fallback else ""
    return f"No re-checked alternative is clean: {left}.{rest}", False


def verify_fixes(audit, report, sizes: ParallelSizes, *, options=None, dist_overrides=None, parity: str = "auto",
                 accepted: frozenset[str] | set[str] | None = None):
    """`report` with every finding that proposes concrete alternatives (`fix_options`) re-checked: each alternative
    is one `Audit.report` on the same built model (a tp/ep size, the plan in force with the edits), the fix text
    keeps the clean ones (or says none is, with what remains), and `verified` records the re-checks. Alternatives
    shared by several findings are simulated once. Edits marked `together` (one piece of quantization metadata kept
    whole each) are re-checked as one plan per (tp, ep) with all of them (`together_text`).

    Args:
        audit (`Audit`): the pipeline that produced `report`.
        report (`Report`): the checked option.
        sizes (`ParallelSizes`), options (`CheckOptions`), dist_overrides (`dict`), parity (`str`): as the request.
        accepted (`set[str]`, *optional*): fingerprints (`CODE:target`) a `--baseline` accepts, applied after this:
            a fix re-checked together with theirs says how many of its companions they are.

    Returns:
        A copy of `report` (the same object when no finding proposes alternatives).
    """
    if not any(f.fix_options for f in report.findings):
        return report
    built = audit.built
    base_plan = dict(report.plan.get("override") or built.original_plan)
    memo: dict[tuple, Recheck] = {}

    def recheck(option: FixOption) -> Recheck:
        key = (option.tp_size, option.ep_size, option.plan_edits)
        if key in memo:
            return dataclasses.replace(memo[key], option=option)
        plan = None
        if option.plan_edits:
            plan = dict(base_plan)
            for k, style in option.plan_edits:
                if style is None:
                    plan.pop(k, None)
                else:
                    plan[k] = style
        try:
            # the parity check runs where the alternative's layouts need evidence, and always for an edit that adds a
            # rule (a plan under review)
            adds_rule = any(style is not None for _, style in option.plan_edits)
            r = audit.report(ParallelSizes.of(option.tp_size, option.ep_size), plan=plan, options=options,
                             dist_overrides=dist_overrides, parity=parity, proposed=adds_rule)
        except TpauditError as e:
            memo[key] = Recheck(option, 2, (str(e).splitlines()[0],))
            return memo[key]
        errors = tuple(f"{f.code} {f.target}" for f in r.findings if f.severity == "error")
        memo[key] = Recheck(option, 1 if errors else 0, errors)
        return memo[key]

    # the edits re-checked together: one plan per (tp, ep) with every such edit of the report, in report order
    groups: dict[tuple[int, int], list[Finding]] = {}
    for f in report.findings:
        if f.fix_options and f.fix_options[0].together:
            o = f.fix_options[0]
            groups.setdefault((o.tp_size, o.ep_size), []).append(f)
    merged: dict[tuple[int, int], FixOption] = {}
    for (tp, ep), members in groups.items():
        edits = tuple(dict.fromkeys(e for f in members for e in f.fix_options[0].plan_edits))
        merged[(tp, ep)] = FixOption(label=f"Add the {len(edits)} rule(s) together", tp_size=tp, ep_size=ep,
                                     plan_edits=edits, together=True)
    before = {f"{f.code} {f.target}" for f in report.findings if f.severity == "error"}

    findings = []
    for f in report.findings:
        if not f.fix_options:
            findings.append(f)
            continue
        if f.fix_options[0].together:
            o = f.fix_options[0]
            result = recheck(merged[(o.tp_size, o.ep_size)])
            group = tuple(f"{g.code} {g.target}" for g in groups[(o.tp_size, o.ep_size)])
            hidden = sum(1 for g in groups[(o.tp_size, o.ep_size)] if g is not f and g.fingerprint in (accepted or ()))
            text, offered = together_text(f, result, group, before, hidden)
            verified = {"exit_code": result.exit_code, "errors": len(result.errors), "together": len(group),
                        "clears": offered, "alternatives": [result.to_json()]}
            findings.append(dataclasses.replace(f, fix=text, verified=verified))
            continue
        results = [recheck(o) for o in f.fix_options]
        offered_r = next((r for r in results if r.clean), None) or min(results, key=lambda r: (r.exit_code != 1,
                                                                                               len(r.errors)))
        verified = {"exit_code": offered_r.exit_code, "errors": len(offered_r.errors),
                    "alternatives": [r.to_json() for r in results]}
        findings.append(dataclasses.replace(f, fix=fix_text(f, results), verified=verified))
    return dataclasses.replace(report, findings=tuple(findings))


__all__ = ["Recheck", "fix_text", "together_text", "verify_fixes"]
