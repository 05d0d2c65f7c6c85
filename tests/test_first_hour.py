"""The first hour of a new user, README only: a memory size without a unit, `--help` at 80 columns, `check -o`, a
`tpaudit/` folder shadowing the installed package, `--params all`'s totals, the width of piped output, `size`'s title
and `verify`'s progress, and `--width`. Expected values come from the inputs (the examples the commands declare, the shapes of the
model), never from tpaudit's output."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

from conftest import FIXTURES, run_env, run_main

LLAMA = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
QWEN3_VL = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")


def test_memory_size_without_unit_is_refused_with_both_spellings():
    proc = run_main("size", LLAMA, "--gpu-memory", "80")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "--gpu-memory" in line and "80GB" in line and "80GiB" in line


def _commands():
    from tpaudit.cli import batch, check, scan, size, snapshot, verify

    return {"check": check.CHECK_EXAMPLES, "size": size.SIZE_EXAMPLES, "scan": scan.SCAN_EXAMPLES,
            "verify": verify.VERIFY_EXAMPLES, "batch": batch.BATCH_EXAMPLES, "snapshot": snapshot.SNAPSHOT_EXAMPLES}


@pytest.mark.parametrize("command", ["check", "size", "scan", "verify", "batch", "snapshot"])
def test_help_wraps_between_words_at_80_columns(command):
    """Every option name of the command's examples (`--gpu-memory`) is whole on one line of its `--help`, every line
    fits 80 columns, and each example reads back as the declared command once its ` \\` continuations are joined."""
    proc = run_env(command, "--help", env={"COLUMNS": "80"})
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    examples = proc.stdout.split("Examples:", 1)[1]
    joined = " ".join(re.sub(r" \\\n\s*", " ", examples).split())
    for example in _commands()[command]:
        code = example.partition("  #")[0]
        assert " ".join(code.split()) in joined, code
        for option in re.findall(r"--[a-z][a-z-]*", code):
            assert any(re.search(rf"(^|\s){re.escape(option)}(\s|$)", line) for line in examples.splitlines()), option
    assert not [line for line in lines if re.search(r"--[a-z]+-$", line)], "an option name broken at a hyphen"


def test_check_output_file_says_what_it_wrote(tmp_path):
    out = tmp_path / "report.json"
    proc = run_main("check", LLAMA, "--tp", "4", "--format", "json", "-o", str(out))
    severities = [f["severity"] for f in json.loads(out.read_text())["findings"]]
    want = (f"{severities.count('error')} error", f"{severities.count('warning')} warning",
            f"{severities.count('note')} note")
    [line] = proc.stderr.strip().splitlines()
    assert str(out) in line and "json" in line and all(w in line for w in want), line


def test_size_output_file_says_what_it_wrote(tmp_path):
    """`size -o` says what it wrote too: the options and what is recommended (the JSON in the file)."""
    out = tmp_path / "size.json"
    proc = run_main("size", LLAMA, "--gpu", "H100-80GB", "--tp", "1,2", "--format", "json", "-o", str(out))
    doc = json.loads(out.read_text())
    best = doc["recommended"]
    [line] = proc.stderr.strip().splitlines()
    assert str(out) in line and f"{len(doc['options'])} options" in line
    assert f"recommended tp {best['tp_size']}, ep {best['ep_size']}" in line, line


def test_a_shadowing_tpaudit_folder_is_named(tmp_path, monkeypatch, capsys):
    """`python -m tpaudit` from a directory holding a `tpaudit/` folder without `__init__.py` (a clone): Python
    imports the folder as an empty namespace package `tpaudit` (the editable install's finder then serves
    `tpaudit.__main__`), and the command line's `from .. import __version__` failed with an ImportError on every
    rank. `__main__` now names the folder first and exits 2."""
    import types

    from tpaudit import _process

    folder = tmp_path / "tpaudit"
    folder.mkdir()
    shadow = types.ModuleType("tpaudit")
    shadow.__path__ = [str(folder)]  # what the import system makes of a folder without __init__.py
    assert _process.shadowing_folder(_process.__file__) is None  # the installed package itself
    monkeypatch.setitem(sys.modules, "tpaudit", shadow)
    assert _process.shadowing_folder(_process.__file__) == str(folder)
    with pytest.raises(SystemExit) as stop:
        _process.exit_if_shadowed(_process.__file__)
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and str(folder) in line and "another directory" in line


def test_params_all_says_its_bytes_are_totals():
    """Llama-3.1-8B has 32 `input_layernorm.weight` of [4096] bf16: 32 x 4096 x 2 = 262,144 B = 256.00 KiB whole,
    replicated, so rank 0 holds the same total."""
    proc = run_env("check", LLAMA, "--tp", "4", "--params", "all", env={"COLUMNS": "200"})
    assert "totals over all n" in proc.stdout
    table = proc.stdout.split("Parameters by generic name", 1)[1]
    [row] = [line for line in table.splitlines() if "model.layers.*.input_layernorm.weight" in line]
    assert re.search(r"\b32\b", row) and row.count(f"{32 * 4096 * 2 / 1024:.2f} KiB") == 2, row


def test_piped_output_fits_a_ci_log(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    proc = run_main("check", QWEN3_VL, "--tp", "4")
    assert max(len(line) for line in proc.stdout.splitlines()) == 120
    narrow = run_env("check", QWEN3_VL, "--tp", "4", env={"COLUMNS": "100"})
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 100


def test_width_option_sets_the_columns_over_columns_and_pipes(monkeypatch, tmp_path):
    """`--width N`: the terminal report is N columns in a pipe, over `COLUMNS`, and in an `-o` file; outside 20-4,000
    it is refused in one line with exit 2."""
    monkeypatch.delenv("COLUMNS", raising=False)
    proc = run_main("check", QWEN3_VL, "--tp", "4", "--width", "100")
    assert max(len(line) for line in proc.stdout.splitlines()) == 100
    over = run_env("check", QWEN3_VL, "--tp", "4", "--width", "90", env={"COLUMNS": "200"})
    assert max(len(line) for line in over.stdout.splitlines()) == 90
    out = tmp_path / "size.txt"
    assert run_main("size", QWEN3_VL, "--gpu", "H100-80GB", "--width", "200", "-o", str(out)).returncode == 0
    assert max(len(line) for line in out.read_text(encoding="utf-8").splitlines()) == 200
    for bad in ("10", "5000", "wide"):
        refused = run_main("check", QWEN3_VL, "--tp", "4", "--width", bad)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert "--width" in refused.stderr


def test_a_table_too_wide_for_the_width_says_which_width_shows_it_whole():
    """At 80 columns `size`'s table (11 columns of figures with units) cannot show every cell: rich shortens some
    (`56.…`), and one line under the table names the width that shows them whole. At that width no cell is
    shortened and the line is gone; one column less shortens a cell again (the width named is the least)."""
    fp8 = str(FIXTURES / "llama-3.1-8b-instruct-fp8-dynamic.snapshot.json.gz")
    narrow = run_main("size", fp8, "--gpu", "H100-80GB", "--width", "80").stdout
    assert "…" in narrow
    need = int(re.search(r"cells above shortened to fit 80 columns: --width (\d+) or --format markdown", narrow)[1])
    assert 80 < need <= 200
    whole = run_main("size", fp8, "--gpu", "H100-80GB", "--width", str(need)).stdout
    assert "…" not in whole and "shortened" not in whole
    assert "…" in run_main("size", fp8, "--gpu", "H100-80GB", "--width", str(need - 1)).stdout


def test_size_title_wraps_at_separators():
    """At 80 columns the title's parts (the GPU, `context 8,192 x batch 1`, the KV dtype, the units) stay whole: each
    title line but the last ends at a " ·" separator."""
    proc = run_env("size", QWEN3_VL, "--gpu", "H100-80GB", env={"COLUMNS": "80"})
    lines = proc.stdout.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith(("┏", "╭", "┌")))
    title = lines[:end]
    assert len(title) > 1 and all(line.endswith(" ·") for line in title[:-1]), title
    assert any("context 8,192 x batch 1" in line for line in title), title


def test_verify_progress_one_line_per_phase_in_a_log():
    from tpaudit.cli.verify import Progress

    log = io.StringIO()
    progress = Progress(log)
    for phase, detail in [("predicting", "meta model"), ("loading", "0/2 ranks started"),
                          ("loading", "2/2 ranks started"), ("comparing", "2 ranks")]:
        progress(phase, detail)
    progress.close()
    assert log.getvalue().splitlines() == ["tpaudit verify: predicting: meta model",
                                           "tpaudit verify: loading: 0/2 ranks started",
                                           "tpaudit verify: comparing: 2 ranks"]


def test_verify_progress_rewrites_one_line_on_a_terminal():
    from tpaudit.cli.verify import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    progress = Progress(screen)
    progress("loading", "1/2 ranks started")
    progress("loading", "2/2 ranks started")
    progress.close()
    text = screen.getvalue()
    assert "\n" not in text and text.count("\r\x1b[K") == 3 and "2/2 ranks started" in text
