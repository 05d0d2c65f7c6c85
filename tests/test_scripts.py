"""The project's scripts (`scripts/*.py`): the benchmark and the fixture tools are run by hand, not by the suite, so
the suite at least compiles each of them (a syntax error there shows up only when someone needs the numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))


def test_there_are_scripts():
    assert {"benchmark.py", "transformers_alone.py", "case_dir.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_script_compiles(path):
    compile(path.read_text(encoding="utf-8"), str(path), "exec")
