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


def verify_fixes(audit, report, sizes: ParallelSizes, *, options=None, dist_overrides=None, parity: str = "auto"):
    """`report` with every finding that proposes concrete alternatives (`fix_options`) re-checked: each alternative
    is one `Audit.report` on the same built model (a tp/ep size, the plan in force with the edits), the fix text
    keeps the clean ones (or says none is, with what remains), and `verified` records the re-checks. Alternatives
    shared by several findings are simulated once.

    Args:
        audit (`Audit`): the pipeline that produced `report`.
        report (`Report`): the checked option.
        sizes (`ParallelSizes`), options (`CheckOptions`), dist_overrides (`dict`), parity (`str`): as the request.

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

    findings = []
    for f in report.findings:
        if not f.fix_options:
            findings.append(f)
            continue
        results = [recheck(o) for o in f.fix_options]
        offered = next((r for r in results if r.clean), None) or min(results, key=lambda r: (r.exit_code != 1,
                                                                                             len(r.errors)))
        verified = {"exit_code": offered.exit_code, "errors": len(offered.errors),
                    "alternatives": [r.to_json() for r in results]}
        findings.append(dataclasses.replace(f, fix=fix_text(f, results), verified=verified))
    return dataclasses.replace(report, findings=tuple(findings))


__all__ = ["Recheck", "fix_text", "verify_fixes"]
