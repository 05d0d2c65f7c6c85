"""`tpaudit scan --parity` as a CI gate: a parity check that cannot run never takes the static audit with it, and the
summary counts the parity verdicts. Expected rows come from the plain scan of the same type (no parity), not from the
code under test."""

from __future__ import annotations

import json

import pytest

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
    # the gate verdict is the static audit's (5.23 ships gpt_neox no plan: TPA003 fails it either way)
    assert row.parity_outcome == "could_not_run" and row.failing == plain.failing
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
    static = run_main(*[a for a in args if a != "--parity"], "--format", "json")
    assert proc.returncode == static.returncode, proc.stderr   # the exit code is the static audit's
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


# ----------------------------------------------------------------------------------------------------------------------
# the small-model builder on the architectures whose parity check could not run (transformers' default configs)
# ----------------------------------------------------------------------------------------------------------------------
def _text_dict(model_type: str) -> tuple[type, dict]:
    from tpaudit.compat import backend

    config = backend().config_from_class(model_type)
    text = config.get_text_config(decoder=True)
    return type(text), text.to_dict()


def test_dots3_sliding_layers_keep_head_dim_equal_to_the_mla_parts():
    from tpaudit.evidence import shrink_config

    config_cls, real = _text_dict("dots3_note_text")
    small, _ = shrink_config(real, 4)
    config = config_cls.from_dict(small)  # its validator: SWA head_dim == qk_nope_head_dim + qk_rope_head_dim
    sliding = config.per_layer_config["sliding_attention"]
    assert sliding.head_dim == sliding.qk_nope_head_dim + sliding.qk_rope_head_dim
    real_sliding = config_cls.from_dict(real).per_layer_config["sliding_attention"]
    assert sliding.head_dim < real_sliding.head_dim and sliding.head_dim % 8 == real_sliding.head_dim % 8


def test_hunyuan_v4_mrope_keeps_its_rope_width_and_a_wider_indexer_head():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from tpaudit.evidence import shrink_config

    if "hy_v4_vl_text" not in CONFIG_MAPPING:
        pytest.skip("hy_v4_vl_text arrived in transformers 5.24")

    config_cls, real = _text_dict("hy_v4_vl_text")
    small, _ = shrink_config(real, 4)
    config = config_cls.from_dict(small)  # its validator: sum(mrope_section) == qk_rope_head_dim // 2
    section = real["rope_parameters"]["mrope_section"]
    assert config.qk_rope_head_dim == 2 * sum(section) == real["qk_rope_head_dim"]
    assert config.index_head_dim >= config.qk_rope_head_dim and config.hidden_size < real["hidden_size"]


def test_ernie_vl_widths_per_expert_kind_shrink_each():
    from tpaudit.evidence import shrink_config

    _, real = _text_dict("ernie4_5_vl_moe")
    small, shrunk = shrink_config(real, 4, keep_head_widths=True)
    widths = real["moe_intermediate_size"]
    assert isinstance(widths, list) and len(widths) == 2
    assert all(s < r and s % 8 == r % 8 for s, r in zip(small["moe_intermediate_size"], widths))
    # the RoPE code lays its default mrope section out for the real head width: kept, while the hidden size shrinks
    assert small["head_dim"] == real["hidden_size"] // real["num_attention_heads"]
    assert small["hidden_size"] < real["hidden_size"]


@pytest.mark.slow
def test_the_nine_types_get_a_verdict_or_a_specific_reason():
    import inspect

    from tpaudit.compat import backend
    from tpaudit.run.scan import scan_one

    verdicts = ["deepseek_v2", "dots3_note", "dots3_note_text", "hy_v4_vl", "hy_v4_vl_text", "ernie4_5_vl_moe",
                "unlimited_ocr"]
    for model_type in verdicts:
        row = scan_one(model_type, 4, "auto")
        assert row.status == scan_one(model_type, 4, "off").status == "ok", (model_type, row.reason)
        assert row.parity_outcome in ("passed", "failed", "not_checked") and row.parity_error is None, \
            (model_type, row.parity)
    # an assistant all of whose layers reuse its target model's KV states: no forward of its own
    text = backend().config_from_class("gemma4_unified_assistant").get_text_config(decoder=True)
    assert text.num_kv_shared_layers == text.num_hidden_layers
    row = scan_one("gemma4_unified_assistant", 4, "auto")
    assert row.status == "ok" and row.parity_outcome == "could_not_run"
    assert f"num_kv_shared_layers = {text.num_hidden_layers} of {text.num_hidden_layers}" in row.parity_error
    # PI0's forward needs a robot state that token ids do not give
    from transformers import PI0ForConditionalGeneration

    assert inspect.signature(PI0ForConditionalGeneration.forward).parameters["state"].default is inspect._empty
    row = scan_one("pi0", 4, "auto")
    assert row.status == "ok" and row.parity_outcome == "could_not_run" and "`state`" in row.parity_error


def test_workers_are_replaced_after_max_tasks_per_child():
    import os

    from tpaudit.run.executor import run_tasks

    pids = [pid for _, pid in run_tasks(os.getpid, [(), (), ()], jobs=1, max_tasks_per_child=1)]
    assert len(set(pids)) == 3 and os.getpid() not in pids      # one fresh worker per task, none of them here
    assert [pid for _, pid in run_tasks(os.getpid, [(), ()], jobs=1)] == [os.getpid()] * 2  # no recycling: here


def test_library_warnings_are_collected_into_the_report_once_each_with_a_count(monkeypatch, tmp_path, capfd):
    import warnings

    from tpaudit.run import scan as scan_module

    real = scan_module._scan_one

    def noisy(model_type, tp_size, parity="off"):
        from transformers.utils import logging as hf_logging

        hf_logging.get_logger("transformers.integrations.hub_kernels").warning(
            "`chunk_kda` is falling back to its reference PyTorch implementation")
        warnings.warn(f"{model_type} config is odd", UserWarning)
        return real(model_type, tp_size, parity)

    monkeypatch.setattr(scan_module, "_scan_one", noisy)
    out = tmp_path / "scan.json"
    proc = run_main("scan", "--tp", "4", "--jobs", "1", "--model-type", "llama", "--model-type", "qwen2",
                    "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "falling back" not in proc.stderr + capfd.readouterr().err  # nothing reached the terminal
    doc = json.loads(out.read_text())
    assert doc["library_warnings"][0] == {
        "message": "transformers: `chunk_kda` is falling back to its reference PyTorch implementation", "count": 2}
    assert {"message": "UserWarning: llama config is odd", "count": 1} in doc["library_warnings"]
    md = run_main("scan", "--tp", "4", "--jobs", "1", "--model-type", "llama", "--format", "markdown")
    said = md.stdout.split("transformers and torch said:")[1]
    assert "1x transformers:" in said and "1x UserWarning: llama config is odd" in said


def test_recycling_workers_with_all_tasks_submitted_finishes_every_task():
    import os

    from tpaudit.run.executor import run_tasks

    # nine tasks on two workers retiring after two each: Python 3.11's own max_tasks_per_child waits forever here
    pids = [pid for _, pid in run_tasks(os.getpid, [()] * 9, jobs=2, max_tasks_per_child=2)]
    assert len(pids) == 9 and os.getpid() not in pids
    assert len(set(pids)) >= 3   # at least ceil(9 / (2 * 2)) pools, each with fresh workers
