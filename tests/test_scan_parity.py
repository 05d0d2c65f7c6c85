"""`tpaudit scan --parity` as a CI gate: a parity check that cannot run never takes the static audit with it, and the
summary counts the parity verdicts. Expected rows come from the plain scan of the same type (no parity), not from the
code under test."""

from __future__ import annotations

import json

from conftest import run_main


def _broken_small_model(*args, **kwargs):
    from tpaudit.errors import ParityUnavailableError

    raise ParityUnavailableError("the parity check cannot build a small GPTNeoXForCausalLM from this config: "
                                 "KeyError: 'sliding_attention'")


def test_a_parity_check_that_cannot_run_keeps_the_static_audit(monkeypatch):
    from tpaudit.evidence import stage
    from tpaudit.run.scan import scan_one

    # gpt_neox's fused query_key_value is split colwise: --parity needs its small model
    plain = scan_one("gpt_neox", 4, "off")
    monkeypatch.setattr(stage, "small_model", _broken_small_model)
    row = scan_one("gpt_neox", 4, "auto")
    assert plain.status == "ok" and plain.parity_outcome is None
    assert row.status == plain.status
    assert row.findings == plain.findings and row.replicated == plain.replicated
    assert row.replicated_bytes == plain.replicated_bytes and row.unused_rules == plain.unused_rules
    assert row.parity_outcome == "could_not_run" and not row.failing
    assert "KeyError: 'sliding_attention'" in row.parity_error and "--no-parity" in row.parity_error
    back = type(row).from_json(json.loads(json.dumps(row.to_json())))
    assert back.parity_error == row.parity_error and back.parity_outcome == "could_not_run"


def test_the_summary_counts_parity_verdicts_in_every_format(monkeypatch, tmp_path):
    from tpaudit.evidence import stage

    real = stage.small_model

    def small_model(config, model_class, *args, **kwargs):  # gpt_neox's small model "cannot be built"
        if "GPTNeoX" in str(model_class):
            _broken_small_model()
        return real(config, model_class, *args, **kwargs)

    monkeypatch.setattr(stage, "small_model", small_model)
    args = ["scan", "--tp", "4", "--jobs", "1", "--parity", "--model-type", "gpt_neox", "--model-type", "llama"]
    out = tmp_path / "scan.json"
    proc = run_main(*args, "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    rows = {m["model_type"]: m for m in doc["models"]}
    # llama's shipped plan splits no fused projection: not needed; gpt_neox's could not run
    assert doc["parity_counts"] == {"checked": 0, "passed": 0, "failed": 0, "could_not_run": 1, "not_checked": 1}
    assert rows["gpt_neox"]["status"] == "ok" and "--no-parity" in rows["gpt_neox"]["parity_error"]
    assert "parity_error" not in rows["llama"]
    md = run_main(*args, "--format", "markdown")
    assert "parity: 0 types checked (0 passed, 0 failed), 1 could not run, 1 not needed" in md.stdout
    assert "`gpt_neox`: " in md.stdout.split("Parity could not run")[1]
    table = run_main(*args)
    assert "1 could not run" in table.stdout and "gpt_neox: parity could not run" in table.stdout
    plain = run_main("scan", "--tp", "4", "--jobs", "1", "--model-type", "llama", "--format", "json")
    assert "parity_counts" not in json.loads(plain.stdout)
