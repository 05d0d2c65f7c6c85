"""The Python API (`tpaudit.check`) and the load-time guard's own logic, in this process: no torchrun ranks, so the
fast loop runs them (the guard on real ranks is tests/test_guard.py)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, ROOT, run_cli
from releases import EXPERTS_IN_TP_PLANS, QWEN_VL_TP4


def test_api_check_equals_cli_json():
    import tpaudit

    path = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
    report = tpaudit.check(path, tp_size=4)
    cli = json.loads(run_cli("check", path, "--tp", "4", "--format", "json").stdout)
    api = report.to_json()
    for key in ("ranks", "total_param_bytes", "worst_rank_param_bytes", "replicated", "unused_rules", "findings",
                "params", "kv_cache"):
        assert api[key] == cli[key], key
    assert report.worst_rank_param_bytes == QWEN_VL_TP4


def test_api_accepts_config_and_meta_model_objects():
    import torch
    import tpaudit
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(ROOT / "fixtures" / "cases" / "18-qwen2-moe-shared-expert-replicated"))
    by_config = tpaudit.check(config, tp_size=4)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    by_model = tpaudit.check(model, tp_size=4)
    assert by_model.rank_param_bytes == by_config.rank_param_bytes
    # the shared expert has no rule in any release; the routed experts none since transformers 5.25 (EP plan only)
    experts = set() if EXPERTS_IN_TP_PLANS else {f"model.layers.*.mlp.experts.{p}" for p in ("gate_up_proj", "down_proj")}
    assert {f.target for f in by_model.findings if f.severity == "error"} == {
        f"model.layers.*.mlp.shared_expert.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")} | experts
    assert all(p.device.type == "meta" and not hasattr(p, "placements") for p in model.parameters())  # untouched
    # a model object's merged plans cannot be handed to a small model: said, before any small model is built
    forced = tpaudit.check(model, tp_size=4, parity=True).parity
    assert not forced.ran and forced.reason.startswith("not run: a model object's merged plans")


def test_api_errors_are_exceptions_with_facts():
    import tpaudit
    from tpaudit.errors import ModelReferenceError, PlanError, UsageError

    with pytest.raises(ModelReferenceError) as e:
        tpaudit.check("no/such/dir.json", tp_size=2)
    assert e.value.ref == "no/such/dir.json" and e.value.exit_code == 2
    with pytest.raises(PlanError):
        tpaudit.check(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), tp_size=2, plan={"x": "colwize"})
    with pytest.raises(UsageError) as e:
        tpaudit.check(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), tp_size=0)
    assert "tp_size=0" in str(e.value)


def test_batch_errors_name_the_api_arguments():
    """`tpaudit.batch` checks its arguments when called, and its messages name the API's arguments (`tp_size=0`,
    `jobs=0`) before the CLI's flags, as `tpaudit.check`'s do."""
    import tpaudit
    from tpaudit.errors import UsageError

    model = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
    for kwargs, needle in (({"tp_sizes": [0]}, "tp_size=0, ep_size=1 (--tp 0 --ep 1) is invalid"),
                           ({"tp_sizes": [4], "jobs": 0}, "jobs=0 (--jobs 0) is invalid"),
                           ({"tp_sizes": [4], "ep_sizes": [3]}, "tp_size=4, ep_size=3 (--tp 4 --ep 3) is rejected"),
                           ({"tp_sizes": []}, "Pass tp_sizes=[4, 8] (--tp 4,8)")):
        with pytest.raises(UsageError) as e:
            list(tpaudit.batch([model], **kwargs))
        assert needle in str(e.value), (kwargs, str(e.value))


def test_guard_allow_list_threshold_and_restore():
    import tpaudit
    from transformers.distributed.mixin import DistributedMixin

    from tpaudit.model import Finding

    original = DistributedMixin.__dict__["maybe_distribute_model"]
    report = {"replicated_bytes": 1000, "findings": [
        {"code": "TPA001", "kind": "replicated_weight", "severity": "error", "target": "model.layers.*.mlp.a.weight",
         "message": "m"},
        {"code": "TPA102", "kind": "kv_heads_per_rank", "severity": "error", "target": "num_key_value_heads",
         "message": "m"},
        {"code": "TPA002", "kind": "unused_rule", "severity": "warning", "target": "x", "message": "m"}]}
    from tpaudit.verify.guard import GuardReading

    reading = GuardReading.from_json(report)                        # as the guard reads its worker's report
    findings, replicated = reading.findings, reading.replicated_bytes
    assert replicated == 1000 and reading.rank_param_bytes == () and reading.plan_snippet is None
    assert [f.code for f in tpaudit.strict_tp().blocking(findings, replicated)] == ["TPA001", "TPA102"]
    assert [f.code for f in tpaudit.strict_tp(allow=["model.layers.*.mlp.*"]).blocking(findings, replicated)] == \
        ["TPA102"]
    assert [f.code for f in tpaudit.strict_tp(max_replicated_bytes=1000).blocking(findings, replicated)] == \
        ["TPA102"]
    assert [f.code for f in tpaudit.strict_tp(codes=["TPA001"]).blocking(findings, replicated)] == ["TPA001"]
    with pytest.raises(ValueError):
        Finding.from_json({"code": "TPA001", "severity": "fatal"})

    @tpaudit.strict_tp()
    def inside():
        return DistributedMixin.__dict__["maybe_distribute_model"] is not original

    assert inside() is True
    assert DistributedMixin.__dict__["maybe_distribute_model"] is original


def test_guard_refuses_a_transformers_without_what_it_wraps(monkeypatch):
    import tpaudit
    import tpaudit.compat as compat
    from tpaudit.compat._probe import Capability
    from tpaudit.errors import UnsupportedVersionError

    for line in compat._lines():
        monkeypatch.setattr(line, "CAPABILITIES", line.CAPABILITIES + (
            Capability("transformers.distributed.mixin", "DistributedMixin.no_such_hook"),))
    compat.reset_for_tests()
    try:
        with pytest.raises(UnsupportedVersionError, match="DistributedMixin.no_such_hook does not exist"):
            with tpaudit.strict_tp():
                pass
    finally:
        monkeypatch.undo()
        compat.reset_for_tests()


def test_the_guard_reads_a_report_as_typed_values():
    """`GuardReading` takes exactly the fields the guard uses from the worker's report JSON and refuses a report whose
    fields have other types (one message, never a `KeyError` deep in the guard)."""
    from tpaudit.verify.guard import GuardReading

    report = {"ranks": [{"rank": 0, "param_bytes": 10}, {"rank": 1, "param_bytes": 12}], "replicated_bytes": 4,
              "findings": [{"code": "TPA001", "kind": "replicated_weight", "severity": "error", "target": "t",
                            "message": "m", "facts": {"bytes_per_rank": 4}}],
              "suggestion": {"snippet": "base_model_tp_plan = {}"}, "total_param_bytes": 22}
    reading = GuardReading.from_json(report)
    assert reading.rank_param_bytes == (10, 12) and reading.replicated_bytes == 4
    assert reading.plan_snippet == "base_model_tp_plan = {}"
    assert [(f.code, f.target, f.facts) for f in reading.findings] == [("TPA001", "t", {"bytes_per_rank": 4})]
    for bad in ([], {"findings": {}}, {"ranks": [{"rank": 0}]}, {"replicated_bytes": "4"},
                {"replicated_bytes": True}, {"suggestion": {"snippet": 3}}, {"findings": [{"code": "TPA001"}]}):
        with pytest.raises(ValueError):
            GuardReading.from_json(bad)
