"""Every rule code against its data table (`tests/rules/TPAxxx.json`): named cases where it must fire (target glob and
severity) and where it must not. A new finding is its check module plus its table; this file needs no change.

A case names a real model (a fixture snapshot, or `case:NAME` for a real-world case under `fixtures/cases`), the
sizes, and optionally a plan (`plan`, or `plan_file` under `fixtures/`), a `max_replicated` budget, the parity mode,
and edits to the real checkpoint that reproduce a failure class (`config_patch`, deep-merged into config.json;
`drop_tensors`; `add_tensors` as `[name, dtype, shape]`). Expectations are written from the model's shapes and config,
as each case's name says; where a transformers release changes them, `since_release` gives the new ones and why.
`fixtures/plans/` holds the plans transformers 5.24.0 shipped for MoE models, for cases about expert TP rules that 5.25
no longer ships."""

from __future__ import annotations

import copy
import fnmatch
import functools
import gzip
import json
from pathlib import Path

import pytest

from conftest import CASES, FIXTURES, read_json_any
from test_cases import for_release

RULES = Path(__file__).parent / "rules"
TABLES = {p.stem: json.loads(p.read_text()) for p in sorted(RULES.glob("TPA*.json"))}
# the largest fixtures (DeepSeek-V3: 91,991 tensors) and the FP8 quantizer's models run outside the fast loop
SLOW_MODELS = {"deepseek-v3", "kimi-k2.5", "case:14-fp8-block-shards-smaller-than-block"}
CASES_PARAMS = [pytest.param(code, i, id=f"{code}-{i}-{case['name'][:40]}",
                             marks=pytest.mark.slow if case["model"] in SLOW_MODELS else ())
                for code, table in TABLES.items() for i, case in enumerate(table["cases"])]


def _merge(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _edited_snapshot(name: str, case: dict, tmp: Path) -> str:
    doc = read_json_any(FIXTURES / f"{name}.snapshot.json.gz")
    doc["config"] = _merge(doc["config"], case.get("config_patch", {}))
    if doc["tensors"] is not None or case.get("add_tensors"):  # a config-only snapshot stays one
        rows = [r for r in doc["tensors"] or [] if r[0] not in set(case.get("drop_tensors", []))]
        rows += [[n, d, s, None] for n, d, s in case.get("add_tensors", [])]
        doc["tensors"] = rows
    path = tmp / f"{name}.edited.snapshot.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return str(path)


@functools.lru_cache(maxsize=None)
def _audit(model: str, edits: str, tmp: str):
    """One built model per (model, edits) for the whole module (each case then only re-simulates)."""
    from tpaudit.run.pipeline import Audit
    from tpaudit.sources import open_source

    case = json.loads(edits)
    tmp_path = Path(tmp)
    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = None
    if model.startswith("case:"):
        from test_cases import materialise

        name = model.removeprefix("case:")
        model_dir, plan = materialise(name, tmp_path)
        if case.get("config_patch"):
            config = json.loads((model_dir / "config.json").read_text())
            (model_dir / "config.json").write_text(json.dumps(_merge(config, case["config_patch"])))
        ref = str(model_dir)
    elif edits != "{}":
        ref = _edited_snapshot(model, case, tmp_path)
    else:
        ref = str(FIXTURES / f"{model}.snapshot.json.gz")
    return Audit(open_source(ref)), plan


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("rules")


@pytest.mark.parametrize("code, index", CASES_PARAMS)
def test_rule_table(code, index, workdir):
    from tpaudit.checks.registry import CheckOptions
    from tpaudit.model import ParallelSizes

    case = for_release(TABLES[code]["cases"][index])
    edits = {k: case[k] for k in ("config_patch", "drop_tensors", "add_tensors") if k in case}
    audit, case_plan = _audit(case["model"], json.dumps(edits, sort_keys=True), str(workdir / f"{code}-{index}"))
    plan = case.get("plan")
    if "plan_file" in case:
        plan = json.loads((FIXTURES / case["plan_file"]).read_text())
    if plan is None:
        plan = case_plan
    options = CheckOptions.from_budget(case["max_replicated"]) if "max_replicated" in case else CheckOptions()
    report = audit.report(ParallelSizes.of(case["tp"], case.get("ep", 1)), plan=plan, options=options,
                          parity=case.get("parity", "off"))
    found = [f for f in report.findings if f.code == code]
    shown = [(f.target, f.severity) for f in found]
    for want in case.get("fires", []):
        assert any(fnmatch.fnmatchcase(f.target, want["target"]) and f.severity == want["severity"] for f in found), \
            f"{case['name']}: no {code} {want} in {shown}"
    for glob in case.get("absent", []):
        assert not any(fnmatch.fnmatchcase(f.target, glob) for f in found), f"{case['name']}: {glob} in {shown}"
    if case.get("passes"):
        assert not found, f"{case['name']}: expected no {code}, got {shown}"
    if case.get("no_error"):
        assert not [f for f in found if f.severity == "error"], f"{case['name']}: {shown}"


def test_every_rule_has_a_table_that_fires_and_passes():
    from tpaudit.checks.registry import all_rules

    codes = {r.code for r in all_rules() if r.status == "stable"}
    assert codes == set(TABLES), f"codes without a table: {codes - set(TABLES)}; tables without a rule: " \
                                 f"{set(TABLES) - codes}"
    for code, table in TABLES.items():  # in some supported release (a rule new in 5.25 fires only there)
        variants = [c for case in table["cases"] for c in (case, *case.get("since_release", {}).values())]
        assert any(c.get("fires") for c in variants), code
        assert any(c.get("passes") or c.get("no_error") for c in variants), code


def test_case_models_exist():
    for table in TABLES.values():
        for case in table["cases"]:
            model = case["model"]
            if model.startswith("case:"):
                assert (CASES / model.removeprefix("case:") / "expected.json").is_file(), model
            else:
                assert (FIXTURES / f"{model}.snapshot.json.gz").is_file(), model
