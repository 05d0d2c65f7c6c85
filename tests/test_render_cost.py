"""What the terminal table of a huge `--plan` costs, counted in operations, never in seconds.

A 16 MiB `--plan` is about 100,000 rules, each one that matches nothing a TPA002 warning. The table draws the first
`FINDING_ROWS` findings and `UNUSED_RULES_SHOWN` unused rules and counts the rest; its cost must grow at most linearly
with the plan (counting the rest), never faster (drawing or re-measuring everything for each row). The cost is the
number of Python and C function calls `sys.setprofile` sees while the renderer draws: deterministic for a given report,
unlike a clock on a shared machine.

The reports are one real audit (Llama-3.1-8B-Instruct's snapshot at tp 2 with 100 dead rules) grown to 10,000,
40,000 and 100,000 dead rules by appending more findings and unused rules of the same shape: the renderer computes
nothing, so it sees what an audit of that plan would hand it.
"""

from __future__ import annotations

import dataclasses
import io
import sys

import pytest

from conftest import FIXTURES, audit

DEAD = "layers.*.no_such_module_{}_" + "x" * 110   # ~160 bytes a rule: 100,000 of them make a 16 MiB plan


@pytest.fixture(scope="module")
def base_report():
    plan = {DEAD.format(i): "colwise" for i in range(100)}
    plan["layers.*.self_attn.q_proj"] = "colwise"
    report = audit(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), 2, plan=plan)
    assert len(report.unused_rules) == 100
    return report


def _grown(report, rules: int):
    """`report` as an audit of `rules` dead rules would give it: one TPA002 finding and one unused rule per rule."""
    dead = [f for f in report.findings if f.target in set(report.unused_rules)]
    assert len(dead) == len(report.unused_rules), "each dead rule is one finding"
    sample = dead[-1]
    extra = [dataclasses.replace(sample, target=DEAD.format(i), message=sample.message.replace(sample.target,
                                                                                                DEAD.format(i)))
             for i in range(len(dead), rules)]
    return dataclasses.replace(report, findings=report.findings + tuple(extra),
                               unused_rules=report.unused_rules + tuple(f.target for f in extra))


def _calls_to_draw(report) -> tuple[int, str]:
    from rich.console import Console

    from tpaudit.report import get

    draw = get("check", "table").fn
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, no_color=True, markup=False)
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        draw(report, console)
    finally:
        sys.setprofile(previous)
    return count, buffer.getvalue()


def test_the_table_of_a_huge_plan_costs_at_most_linear_operations(base_report):
    from tpaudit.report.terminal import FINDING_ROWS

    sizes = (10_000, 40_000, 100_000)
    costs, texts = {}, {}
    for n in sizes:
        report = _grown(base_report, n)
        assert sum(f.code == "TPA002" for f in report.findings) == n
        costs[n], texts[n] = _calls_to_draw(report)
        rest = len(report.findings) - FINDING_ROWS
        assert f"and {rest:,} more" in texts[n]
    # the same drawing whatever the plan: only the counts in it grow
    assert len({text.count("\n") for text in texts.values()}) == 1, {n: t.count("\n") for n, t in texts.items()}
    # linear: the cost of one more rule is the same from 10,000 to 40,000 as from 40,000 to 100,000 (a quadratic
    # renderer would pay 2.3 times more per rule in the second step), and small (a few calls: counting it)
    first = (costs[40_000] - costs[10_000]) / 30_000
    second = (costs[100_000] - costs[40_000]) / 60_000
    assert second <= first * 1.1 + 0.5, costs
    assert second <= 8, costs
