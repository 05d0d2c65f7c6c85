"""The real-world cases (fixtures/cases): TP-plan bugs and non-bugs from public reports, each with the findings it
must and must not produce (`expected.json`, whose `notes` name the report), run end to end through the same pipeline
as `tpaudit check`: a sparse checkpoint with the case's real headers, the case's plan, and the judging rules
(fnmatch on targets, replicated[] / unused_rules[] count too, worst rank within the expected +-1%). Where a transformers
release changes a verdict, `since_release` in `expected.json` gives the new expectations and why."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil

import pytest
from filelock import FileLock

from conftest import CASES, ROOT, audit

ALL_CASES = sorted(p.name for p in CASES.iterdir() if (p / "expected.json").is_file())


def for_release(expected: dict) -> dict:
    """The expectations for the installed transformers release: `since_release` maps a release (`"5.25"`) to the keys
    that replace the case's own from that release on (with the `why`), applied oldest first."""
    from releases import RELEASE

    out = {k: v for k, v in expected.items() if k != "since_release"}
    for release, changes in sorted(expected.get("since_release", {}).items(),
                                   key=lambda kv: tuple(map(int, kv[0].split(".")))):
        if RELEASE >= tuple(map(int, release.split("."))):
            out.update({k: v for k, v in changes.items() if k != "why"})
    return out


def _rule_matches(entry: str, glob: str) -> bool:
    return fnmatch.fnmatchcase(entry, glob) or fnmatch.fnmatchcase(entry, "*." + glob)


def _hits(report: dict, kind: str, glob: str) -> list[str]:
    hits = []
    for f in report["findings"]:
        if f["kind"] != kind:
            continue
        ok = _rule_matches(f["target"], glob) if kind == "unused_rule" else fnmatch.fnmatchcase(f["target"], glob)
        if ok:
            hits.append(f["target"])
    if kind == "replicated_weight":
        hits += [r["name"] for r in report["replicated"] if fnmatch.fnmatchcase(r["name"], glob)]
    if kind == "unused_rule":
        hits += [u for u in report["unused_rules"] if _rule_matches(u, glob)]
    return hits


def materialise(case: str, tmp_path):
    """The case as a model directory under `tmp_path`: config.json, plus sparse safetensors shards when it lists
    tensors. The shards are written once per session (the first xdist worker to need a case writes it, the others
    wait on its lock) and hard-linked here; config.json is a copy each test may edit."""
    src = CASES / case
    # under xdist each worker's base temp is a child of the session's; without it, the base temp is the session's
    base = tmp_path.parent
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    written = session / "cases" / case
    written.parent.mkdir(exist_ok=True)
    with FileLock(f"{written}.lock"):
        if not written.is_dir():
            work = written.with_suffix(".tmp")
            shutil.rmtree(work, ignore_errors=True)
            _write_case(src, work)
            work.rename(written)
    model_dir = tmp_path / case
    model_dir.mkdir()
    for f in written.iterdir():
        if f.suffix == ".safetensors":
            os.link(f, model_dir / f.name)
        else:
            shutil.copyfile(f, model_dir / f.name)
    plan = json.loads((src / "tp_plan.json").read_text()) if (src / "tp_plan.json").is_file() else None
    return model_dir, plan


def _write_case(src, model_dir) -> None:
    """The case as a model directory: the script users run for the same thing (`scripts/case_dir.py`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("case_dir", ROOT / "scripts" / "case_dir.py")
    case_dir = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(case_dir)
    case_dir.write_case(src, model_dir)


# case 14's 62,636-tensor sparse checkpoint (test_findings checks its numbers in the fast loop)
SLOW_CASES = {"14-fp8-block-shards-smaller-than-block"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in ALL_CASES])
def test_case(case, tmp_path):
    expected = for_release(json.loads((CASES / case / "expected.json").read_text()))
    model_dir, plan = materialise(case, tmp_path)
    report_obj = audit(str(model_dir), tp=expected["tp_size"], ep=expected.get("ep_size", 1), plan=plan)
    report = report_obj.to_json()
    problems = []
    exit_code = 1 if report_obj.has_errors else 0
    if exit_code != expected["exit_code"]:
        problems.append(f"exit code {exit_code}, expected {expected['exit_code']}")
    for item in expected.get("must_report", []):
        if not _hits(report, item["kind"], item["target_glob"]):
            problems.append(f"missing {item['kind']} {item['target_glob']}")
    for item in expected.get("must_not_report", []):
        hits = _hits(report, item["kind"], item["target_glob"])
        if hits:
            problems.append(f"unexpected {item['kind']} {item['target_glob']}: {hits[:2]}")
    bounds = expected.get("worst_rank_param_bytes")
    if bounds:
        world = max(expected["tp_size"], expected.get("ep_size", 1))
        values = [r["param_bytes"] for r in report["ranks"]]
        assert len(values) == world
        if not bounds["min"] <= max(values) <= bounds["max"]:
            problems.append(f"worst rank {max(values)} outside {bounds}")
    assert not problems, "; ".join(problems)
