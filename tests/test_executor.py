"""The executor `scan` and `batch` share (`tpaudit/run/executor.py`) and its one policy for a tpaudit bug inside a
worker: an internal error with exit code 4, the other tasks still run; a worker that stops is exit code 2."""

from __future__ import annotations

import json
import os

import pytest

from conftest import FIXTURES, run_main


def square_or_bug(n: int) -> int:
    if n == 3:
        raise RuntimeError("simulated bug\nsecond line")
    return n * n


def stop_the_worker(n: int) -> int:
    if n == 1:
        os._exit(7)  # a worker killed mid-task (out of memory, a signal)
    return n


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_task_that_raises_is_an_internal_error_and_the_others_run(jobs):
    from tpaudit.run.executor import TaskFailed, run_tasks

    out = dict((task[0], outcome) for task, outcome in run_tasks(square_or_bug, [(n,) for n in range(5)], jobs=jobs))
    assert {n: v for n, v in out.items() if n != 3} == {0: 0, 1: 1, 2: 4, 4: 16}
    assert out[3] == TaskFailed("internal", "RuntimeError: simulated bug") and out[3].exit_code == 4


def test_an_exception_it_is_told_to_propagate_stops_the_run():
    from tpaudit.errors import UnsupportedVersionError
    from tpaudit.run.executor import run_tasks

    def needs_transformers(n):
        raise UnsupportedVersionError("transformers 5.21 lacks what tpaudit calls")

    with pytest.raises(UnsupportedVersionError):
        list(run_tasks(needs_transformers, [(1,), (2,)], propagate=(UnsupportedVersionError,)))


def test_a_worker_that_stops_is_not_a_bug():
    from tpaudit.run.executor import TaskFailed, run_tasks

    out = dict((task[0], outcome) for task, outcome in run_tasks(stop_the_worker, [(1,), (2,)], jobs=2))
    assert isinstance(out[1], TaskFailed) and out[1].kind == "stopped" and out[1].exit_code == 2


def test_scan_turns_a_bug_into_an_internal_error_row_and_exit_4(monkeypatch, tmp_path):
    """A bug while scanning one type was a `build_failed` row (exit 0 in a survey); now the row says
    internal_error, stderr names it and the scan exits 4, as batch does."""
    import tpaudit.run.pipeline

    def broken(self, sizes, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(tpaudit.run.pipeline.Audit, "report", broken)
    out = tmp_path / "scan.json"
    proc = run_main("scan", "--model-type", "llama", "--tp", "2", "--format", "json", "-o", str(out))
    assert proc.returncode == 4, proc.stderr
    (row,) = json.loads(out.read_text())["models"]
    assert (row["model_type"], row["status"]) == ("llama", "internal_error")
    assert row["reason"].startswith("internal error: RuntimeError: simulated bug. This is a tpaudit bug")
    assert "error: llama: internal error: RuntimeError: simulated bug" in proc.stderr


def test_batch_exits_4_when_a_line_is_an_internal_error(monkeypatch, tmp_path):
    import tpaudit.run.pipeline

    def broken(self, sizes, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(tpaudit.run.pipeline.Audit, "report", broken)
    listing = tmp_path / "list.txt"
    listing.write_text(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz") + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_main("batch", str(listing), "--tp", "4", "-o", str(out), "--no-cache")
    assert proc.returncode == 4, proc.stderr
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert (line["status"], line["exit_code"]) == ("error", 4) and line["reason"].startswith("internal error:")
