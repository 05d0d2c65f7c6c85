"""The command line as a user runs it: exit codes, one-line errors on stderr, parseable stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import CASES, FIXTURES, ROOT, run_cli, run_main

LLAMA = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), proc.stderr
    assert len(lines) <= 2 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_help_imports_neither_torch_nor_transformers():
    code = ("import sys; from tpaudit.cli.app import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_the_cli_tunes_its_own_garbage_collector_and_the_library_does_not():
    # the CLI owns its process and raises the collector's first threshold (mypy's 200,000); importing tpaudit as a
    # library, or building its Python API objects, leaves the user's process as Python set it up
    code = ("import gc, json; before = gc.get_threshold()\n"
            "import tpaudit, tpaudit.api, tpaudit.run.pipeline, tpaudit.verify.guard; library = gc.get_threshold()\n"
            "from tpaudit.cli.app import main\nmain(['--version'])\n"
            "print(json.dumps([before, library, gc.get_threshold()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    before, library, cli = json.loads(out.stdout.strip().splitlines()[-1])
    assert library == before != cli, out.stderr  # Python's defaults: (700, 10, 10) on 3.11-3.13
    assert cli == [200_000, 30, 30]


def test_clean_model_exits_0_and_json_is_the_contract():
    proc = run_main("check", LLAMA, "--tp", "2", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "tpaudit/check/v1"
    assert (out["tp_size"], out["ep_size"]) == (2, 1)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["total_param_bytes"] == 16_060_522_496
    assert out["findings"] == [] and out["unused_rules"] == []


def test_terminal_report_states_units():
    proc = run_main("check", LLAMA, "--tp", "2", "--no-params")
    assert proc.returncode == 0, proc.stderr
    assert "GiB = 2^10, 2^20, 2^30 bytes" in proc.stdout
    assert "16,060,522,496 B" in proc.stdout
    proc = run_main("check", LLAMA, "--tp", "2", "--no-params", "--units", "GB")
    assert "GB = 10^3, 10^6, 10^9 bytes" in proc.stdout and "16.06 GB" in proc.stdout


@pytest.mark.parametrize("args, needles", [
    (["check", "does/not-exist.json", "--tp", "2"], ["does not exist"]),
    (["check", "no_such_dir_or_hub_id", "--tp", "2"], ["not a Hub id"]),
    (["check", LLAMA, "--tp", "0"], ["--tp 0", "positive"]),
    (["check", LLAMA, "--tp", "2", "--ep", "3"], ["ep_size=3", "--ep 3", "rejected by transformers"]),
    (["check", LLAMA, "--tp", "2", "--max-replicated", "lots"], ["--max-replicated"]),
])
def test_bad_input_is_one_line_and_exit_2(args, needles):
    assert_one_line_error(run_main(*args), *needles)


@pytest.mark.slow  # a real process: one more torch and transformers import
def test_bad_input_in_a_real_process_is_one_line_and_exit_2():
    """The same contract through the installed console script (no in-process shortcuts)."""
    assert_one_line_error(run_cli("check", LLAMA, "--tp", "2", "--ep", "3"), "ep_size=3", "--ep 3")


def test_unknown_style_in_plan(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"layers.*.self_attn.q_proj": "colwize"}))
    assert_one_line_error(run_main("check", LLAMA, "--tp", "2", "--plan", str(plan)), "colwize", "colwise")


def test_malformed_plan_and_config(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("[1, 2]")
    assert_one_line_error(run_main("check", LLAMA, "--tp", "2", "--plan", str(plan)), "JSON object")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    assert_one_line_error(run_main("check", str(model), "--tp", "2"), "not valid JSON")
    (model / "config.json").write_text(json.dumps({"model_type": "no_such_model_type_xyz"}))
    assert_one_line_error(run_main("check", str(model), "--tp", "2"), "no_such_model_type_xyz")


def test_missing_shard_and_bad_header(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    assert_one_line_error(run_main("check", str(model), "--tp", "2"), "model-00002-of-00002.safetensors", "missing")
    (model / "model.safetensors.index.json").unlink()
    (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    assert_one_line_error(run_main("check", str(model), "--tp", "2"))


def test_max_replicated_gate_and_exit_zero():
    proc = run_main("check", LLAMA, "--tp", "2", "--format", "json", "--max-replicated", "100KiB")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    budget = [f for f in out["findings"] if f["code"] == "TPA004"]
    assert budget and budget[0]["facts"]["replicated_bytes"] == (32 * 2 + 1) * 4096 * 2
    proc = run_main("check", LLAMA, "--tp", "2", "--format", "json", "--max-replicated", "100KiB", "--exit-zero")
    assert proc.returncode == 0


def test_rules_and_explain():
    proc = run_main("rules", "--format", "json")
    assert proc.returncode == 0
    codes = {r["code"]: r["kind"] for r in json.loads(proc.stdout)}
    assert codes["TPA001"] == "replicated_weight" and codes["TPA002"] == "unused_rule"
    proc = run_main("explain", "TPA001")
    assert proc.returncode == 0 and "Why it matters" in proc.stdout and "Fix" in proc.stdout
    assert_one_line_error(run_main("explain", "TPA999"), "TPA999")


@pytest.mark.slow  # a real process writing into a real pipe
def test_a_closed_pipe_ends_quietly_with_141_not_1():
    """`tpaudit check ... | head -1`: the reader leaves early. Exit 1 would read as "error findings"; a process
    killed by SIGPIPE ends with 128 + 13 = 141, and nothing is printed on stderr."""
    import fcntl
    import os

    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # smaller than the report: the writer is still writing when we leave
    proc = subprocess.Popen([sys.executable, "-m", "tpaudit", "check", LLAMA, "--tp", "2", "--params", "all"], stdout=w,
                            stderr=subprocess.PIPE, cwd=str(ROOT), text=True)
    os.close(w)
    with os.fdopen(r) as reader:
        first = reader.readline()
    _, stderr = proc.communicate(timeout=300)
    assert first.startswith("╭─ tpaudit check")
    assert proc.returncode == 141 and stderr == "", (proc.returncode, stderr)


def test_dtype_auto_is_the_default_spelled_out():
    """`--help` says auto is the default: passing it gives the report of no flag (it was refused)."""
    ref = str(FIXTURES / "llama-3.1-8b.snapshot.json.gz")
    default = run_main("check", ref, "--tp", "4", "--format", "json")
    auto = run_main("check", ref, "--tp", "4", "--format", "json", "--dtype", "auto")
    assert auto.returncode == default.returncode == 0, auto.stderr
    assert json.loads(auto.stdout) == json.loads(default.stdout)


def test_piped_help_wraps_every_option_and_crops_nothing():
    # a pipe (stdout not a terminal) gets click's plain help: every word of every option's help text is there whole
    proc = subprocess.run([sys.executable, "-m", "tpaudit", "check", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert proc.returncode == 0 and "…" not in proc.stdout
    words = " ".join(proc.stdout.split())
    assert "(keys relative to the base model, as in configuration_*.py)" in words
    assert "--trust-remote-code" in proc.stdout
