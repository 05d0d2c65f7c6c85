"""Each rule declares its behaviour in its registry entry, and `size`, `--suggest`, the guard and `verify` read it
from there: a rule without a declaration cannot register, and no module outside `tpaudit/checks/` names a code."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpaudit"

# The behaviour each rule is meant to have, written out here from what its findings mean (README's rule catalogue):
# code -> (severity, breaks the forward, --suggest action, counts as replicated bytes, fails the load).
# TPA101's forward-breaking is a predicate (attention heads only): listed as "heads".
EXPECTED = {
    "TPA001": ("error", False, "vote", True, False),
    "TPA002": ("warning", False, None, False, False),
    "TPA003": ("error", False, None, False, False),
    "TPA004": ("error", False, None, False, False),
    "TPA101": ("error", "heads", None, False, False),
    "TPA102": ("error", False, None, False, False),
    "TPA201": ("error", True, "keep_whole", False, False),
    "TPA202": ("error", True, None, False, False),
    "TPA203": ("error", True, "keep_whole", False, False),
    "TPA204": ("error", False, None, False, False),
    "TPA205": ("warning", False, None, False, False),
    "TPA206": ("error", False, None, False, False),
    "TPA301": ("warning", False, None, False, False),
    "TPA302": ("warning", False, None, False, False),
    "TPA303": ("error", False, None, False, False),
    "TPA304": ("error", False, None, False, True),
    "TPA401": ("note", False, None, False, False),
    "TPA402": ("warning", False, None, False, False),
    "TPA501": ("error", True, None, False, False),
    "TPA502": ("error", True, None, False, False),
}


def _finding(code: str, target: str = "model.layers.*.x.weight", severity: str = "error"):
    from tpaudit.model import Finding

    return Finding(code=code, kind="k", severity=severity, target=target, message="m")


def test_every_rule_declares_its_behaviour():
    from tpaudit.checks.registry import all_rules

    rules = {r.code: r for r in all_rules() if r.status == "stable"}
    assert set(rules) == set(EXPECTED), "a rule was added or removed: declare its behaviour in EXPECTED too"
    for code, (severity, breaks, suggest, replicated, load) in EXPECTED.items():
        r = rules[code]
        assert r.severity == severity, code
        if breaks == "heads":
            assert callable(r.breaks_forward), code
        else:
            assert r.breaks_forward is breaks, code
        assert (r.suggest, r.counts_replicated, r.fails_load) == (suggest, replicated, load), code


def test_a_rule_without_a_declaration_cannot_register():
    from tpaudit.checks.registry import rule

    doc = "X.\n\n**What it detects**\nx\n\n**Why it matters**\nx\n\n**Example**\nx\n\n**Fix**\nx\n"

    def check_x(ctx):
        return ()

    check_x.__doc__ = doc
    with pytest.raises(ValueError, match=r"TPA999 \(check_x\) declares no breaks_forward, counts_replicated"):
        rule("TPA999", "x", severity="error", suggest=None, fails_load=False)(check_x)
    with pytest.raises(ValueError, match="declares no severity"):
        rule("TPA999", "x", breaks_forward=False, suggest=None, counts_replicated=False, fails_load=False)(check_x)
    with pytest.raises(ValueError, match="suggest 'fix'"):
        rule("TPA999", "x", severity="error", breaks_forward=False, suggest="fix", counts_replicated=False,
             fails_load=False)(check_x)
    from tpaudit.checks.registry import get_rule

    assert get_rule("TPA999") is None


def test_tpa101_breaks_the_forward_only_for_attention_heads():
    from tpaudit.checks.registry import breaks_the_forward

    assert breaks_the_forward(_finding("TPA101", "text_config.num_attention_heads"))
    assert breaks_the_forward(_finding("TPA101", "n_head"))
    assert not breaks_the_forward(_finding("TPA101", "text_config.intermediate_size"))
    assert not breaks_the_forward(_finding("TPA101", "vocab_size"))
    assert breaks_the_forward(_finding("TPA501"))
    assert not breaks_the_forward(_finding("TPA501", severity="warning"))   # only errors break it
    assert not breaks_the_forward(_finding("TPA001"))
    assert not breaks_the_forward(_finding("TPA777"))                       # no rule, no behaviour


def _redeclare(monkeypatch, code: str, **declaration):
    from tpaudit.checks import registry

    registry.all_rules()
    monkeypatch.setitem(registry._RULES, code, dataclasses.replace(registry._RULES[code], **declaration))


def test_size_reads_breaks_forward_from_the_declaration(monkeypatch):
    from types import SimpleNamespace

    from tpaudit.sizing import _forward_breaks

    report = SimpleNamespace(findings=[_finding("TPA001", "model.layers.*.mlp.a.weight"),
                                       _finding("TPA502", "model.layers.*.mlp.b.weight")])
    assert _forward_breaks(report) == "the plan breaks the forward: TPA502 model.layers.*.mlp.b.weight"
    _redeclare(monkeypatch, "TPA001", breaks_forward=True)
    assert _forward_breaks(report) == ("the plan breaks the forward: TPA001 model.layers.*.mlp.a.weight "
                                       "(and 1 more)")
    _redeclare(monkeypatch, "TPA001", breaks_forward=False)
    _redeclare(monkeypatch, "TPA502", breaks_forward=False)
    assert _forward_breaks(report) is None


def test_the_guard_reads_counts_replicated_from_the_declaration(monkeypatch):
    import tpaudit

    findings = [_finding("TPA001"), _finding("TPA303")]
    guard = tpaudit.strict_tp(max_replicated_bytes=1000)
    assert [f.code for f in guard.blocking(findings, 1000)] == ["TPA303"]
    assert [f.code for f in guard.blocking(findings, 1001)] == ["TPA001", "TPA303"]
    _redeclare(monkeypatch, "TPA303", counts_replicated=True)
    assert guard.blocking(findings, 1000) == []


def test_verify_reads_fails_load_from_the_declaration(monkeypatch):
    from types import SimpleNamespace

    from tpaudit.verify import predicted_failure

    report = SimpleNamespace(findings=[_finding("TPA303", "a"), _finding("TPA304", "b"), _finding("TPA304", "c")])
    assert predicted_failure(report) == "tpaudit check predicted it: TPA304 b and 1 more"
    _redeclare(monkeypatch, "TPA304", fails_load=False)
    assert predicted_failure(report) == "tpaudit check did not predict this failure (please report it)"


def test_suggest_reads_its_action_from_the_declaration():
    from types import SimpleNamespace

    from tpaudit.checks.registry import suggest_actions
    from tpaudit.model import Finding, FindingSubject
    from tpaudit.plan.suggest import suggest_rules

    assert suggest_actions() == {"TPA001": "vote", "TPA201": "keep_whole", "TPA203": "keep_whole"}
    scale = Finding(code="TPA203", kind="k", severity="error", target="model.layers.*.mlp.down_proj.weight_scale",
                    message="m", subject=FindingSubject(rule_key="layers.*.mlp.down_proj.weight_scale"))
    report = SimpleNamespace(findings=[scale])
    suggestions, unresolved = suggest_rules(report, {}, "model", actions={"TPA203": "keep_whole"})
    assert [(s.key, s.style, s.voters) for s in suggestions] == [
        ("layers.*.mlp.down_proj.weight_scale", "replicate", ["TPA203"])]
    assert unresolved == []
    assert suggest_rules(report, {}, "model", actions={}) == ([], [])


def test_no_finding_code_literal_outside_the_checks():
    """A module outside `tpaudit/checks/` that compares a finding's code with a literal (`f.code == "TPA304"`) is a
    rule behaviour kept away from its rule: it belongs in the rule's declaration."""
    code = re.compile(r"^TPA\d{3}$")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "checks" in path.relative_to(PACKAGE).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and code.match(node.value):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value!r}")
    assert not offenders, "\n".join(offenders)
