"""Shared helpers. Expected values in the tests are computed here from shapes and configs, never copied from
tpaudit's own output."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

# pytest caches each test module's assertion-rewritten bytecode unless bytecode writing is off (PYTHONDONTWRITEBYTECODE,
# set on some machines): then every run and every xdist worker rewrites ~60 modules again (about 3 s each). The test
# session writes bytecode (into the git-ignored __pycache__ folders) whatever the environment says.
sys.dont_write_bytecode = False

# Hermetic caches: tpaudit's caches (Hub headers, sibling plans, batch results) live under HF_HOME; a test session
# gets its own, set before anything (or any CLI subprocess, which inherits it) reads it.
if "TPAUDIT_TEST_KEEP_HF_HOME" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="tpaudit-tests-hf-home-")
    # removed when this process (the session, or one xdist worker: each has its own) exits; the CLI children that
    # inherit it have ended by then
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
    # and its own cache key (tpaudit.sources.cache_key): never the user's ~/.config/tpaudit/cache-key, never a CI's secret
    os.environ["XDG_CONFIG_HOME"] = os.path.join(os.environ["HF_HOME"], "config")
    os.environ.pop("TPAUDIT_CACHE_KEY", None)

# Test processes build and shard hundreds of real models: the cyclic collector gets the thresholds tpaudit's own
# processes use (`tpaudit._process`), which a CLI test run in-process (`run_main`) would set anyway on its first call.
from tpaudit._process import tune_gc  # noqa: E402

tune_gc()

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CASES = FIXTURES / "cases"


def transformers_release() -> tuple[int, int]:
    """(major, minor) of the installed transformers: 5.24 changed some models' shipped plans and dtypes."""
    from importlib.metadata import version

    major, minor = version("transformers").split(".")[:2]
    return int(major), int(minor)


def read_json_any(path: Path):
    """Read a JSON or gzip-JSON file with the standard library only (independent of tpaudit's readers)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1, "I8": 1}


def snapshot_tensors(name: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """`[(name, dtype, shape)]` of a fixture snapshot, read without tpaudit."""
    doc = read_json_any(FIXTURES / f"{name}.snapshot.json.gz")
    return [(n, d, tuple(s)) for n, d, s, _ in doc["tensors"]]


def nbytes(dtype: str, shape) -> int:
    return math.prod(shape) * DTYPE_BYTES[dtype]


def chunk(n: int, parts: int, rank: int) -> int:
    """Size of rank's piece when `torch.chunk` splits n into `parts`: ceil on the low ranks, the rest on the last."""
    size = -(-n // parts)
    return max(0, min(size, n - rank * size))


def run_cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m tpaudit ARGS` as a user would; returns the completed process (text mode)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("TPAUDIT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "tpaudit", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=str(ROOT))


# `python -m tpaudit ARGS` that records its own peak resident memory when it exits (`VmHWM` of /proc/self/status:
# the high-water mark of this process's address space since its exec). `ru_maxrss` from the parent's `wait4` is no
# such thing: Linux carries a process's peak over fork and exec, so a child of a pytest worker that had grown to 3 GB
# reports at least 3 GB whatever it did itself, and the figure depends on which tests ran before.
_CHILD = """
import atexit, os, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(os.environ["TPAUDIT_TEST_PEAK_FILE"], "w") as out:
        out.write(str(kb * 1024))
atexit.register(_peak)
from tpaudit.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


class Bounded(subprocess.CompletedProcess):
    """A finished child: `returncode`, `stdout`, `stderr` and `peak_bytes` (its own peak RSS, measured in it; `None`
    when it died before recording it)."""

    peak_bytes: int | None


def run_bounded(*args: str, seconds: float = 10, memory: int = 2 << 30, env: dict | None = None,
                cwd: str | None = None) -> Bounded:
    """`python -m tpaudit ARGS` in a child whose address space is capped at `memory` bytes (RLIMIT_AS, set in the
    child) and that is killed after `seconds` (the test then fails with a TimeoutError naming the command); the
    child measures its own peak memory (see `_CHILD`)."""
    import resource
    import tempfile

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    full_env = {**os.environ, **(env or {})}
    full_env.pop("TPAUDIT_DEBUG", None)
    with tempfile.TemporaryDirectory(prefix="tpaudit-child-") as tmp:
        full_env["TPAUDIT_TEST_PEAK_FILE"] = peak_file = os.path.join(tmp, "peak")
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                                  timeout=seconds, env=full_env, cwd=cwd or str(ROOT), preexec_fn=cap)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"tpaudit {' '.join(map(str, args))} still running after {seconds} s") from None
        result = Bounded(proc.args, proc.returncode, proc.stdout, proc.stderr)
        result.peak_bytes = int(open(peak_file).read()) if os.path.exists(peak_file) else None
    return result


def count_calls(fn):
    """`(calls, fn())`: the Python and built-in function calls `fn` makes in this thread (a profile hook counts
    them). A test of how work grows (linear in the rules, or not at all) compares counts, which a loaded machine does
    not change; how long it takes is `scripts/benchmark.py`'s to say."""
    calls = 0

    def hook(frame, event, arg):
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    sys.setprofile(hook)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return calls, out


def run_main(*args: str) -> subprocess.CompletedProcess:
    """`tpaudit ARGS` through the same `main()` the console script calls, in this process (no interpreter start-up:
    for tests that run the CLI many times). stdout/stderr are captured; `returncode` is main's exit code."""
    import contextlib
    import io

    from huggingface_hub.utils import close_session

    from tpaudit.cli.app import main

    # a console-script run starts with no pooled HTTP connection: one an earlier in-process run left to a loopback
    # server that has since gone (another test's) must not answer for this one
    close_session()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["tpaudit", *args], code, out.getvalue(), err.getvalue())


def run_env(*args: str, env: dict | None = None, timeout: int | None = None) -> subprocess.CompletedProcess:
    """`run_main` with environment variables set for the call (as `run_cli(..., env=...)` gives a subprocess), for
    tests that need the environment (HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE, HF_TOKEN) but not a new interpreter.
    tpaudit reads these variables when it opens a source, not at import."""
    from unittest import mock

    del timeout
    with mock.patch.dict(os.environ, {k: v for k, v in (env or {}).items()}):
        return run_main(*args)


def audit(ref: str, tp: int, ep: int = 1, plan: dict | None = None, *, suggest: bool = False, parity: str = "off",
          **build_options):
    """In-process `tpaudit check` (the same pipeline as the CLI, without the interpreter start-up). The parity check
    is off unless asked for: tests of it ask."""
    from tpaudit.run.pipeline import Audit
    from tpaudit.metamodel import BuildOptions
    from tpaudit.model import ParallelSizes
    from tpaudit.sources import open_source

    sizes = ParallelSizes.of(tp, ep)
    pipeline = Audit(open_source(ref), BuildOptions(plan_override=plan, **build_options))
    report = pipeline.report(sizes, parity=parity)
    if suggest:
        from tpaudit.checks.registry import suggest_actions
        from tpaudit.plan.suggest import with_suggestion

        report = with_suggestion(pipeline, report, sizes, actions=suggest_actions())
    return report


@pytest.fixture(autouse=True)
def _own_parity_cache(request, monkeypatch, tmp_path_factory):
    """Each test gets its own parity verdict cache folder (created only if the test writes to it), so that no test
    reads a verdict another test computed."""
    import hashlib

    root = tmp_path_factory.getbasetemp() / "parity-cache"
    monkeypatch.setenv("TPAUDIT_PARITY_CACHE",
                       str(root / hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]))
    monkeypatch.delenv("TPAUDIT_NO_PARITY_CACHE", raising=False)


@pytest.fixture
def fixture_path():
    return lambda name: str(FIXTURES / f"{name}.snapshot.json.gz")


# --- one build and one report per bundled fixture, options and sizes, per test process -------------------------------
# Building a real model on the meta device (transformers' `from_config`, the quantizer, the checkpoint mapping) and
# sharding it on a fake process group are most of the suite's time, and the CLI tests repeat them: in the fast loop
# the Llama-3.1-8B and Qwen3-VL-30B-A3B fixtures were built some 70 times, and 70 reports were the same model, sizes
# and options as an earlier one. The pipeline is deterministic and `Audit` builds once and reports many (the
# simulation does not consume the built model; the `size`, `--suggest` and guard tests rely on that), so each test
# process keeps the `BuiltModel` of a bundled, read-only fixture (keyed by its path, size, mtime, the reference as
# given and the build options) and each `Report` made from one (keyed by sizes, every argument of `Audit.report` and
# the installed versions; reports are frozen). A saved report still makes its plan the build's active plan, as
# `Audit.report` does. Sources outside `fixtures/` (each test's own edited copy, the loopback Hub), builds from a
# config or model object and failed builds are never shared. TPAUDIT_TEST_FRESH_BUILDS=1 turns the sharing off
# (.ci/run's second leg runs that way, so the suite passes both ways).
_SHARED_BUILDS: dict = {}


def _shared_build_key(source, options) -> tuple | None:
    if options is not None and (options.config is not None or options.instance_plans):
        return None
    try:
        path = Path(source.ref).resolve()
    except (OSError, ValueError):
        return None
    if FIXTURES not in path.parents or not path.exists():
        return None
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size, source.ref, source.config_path, repr(options)


@pytest.fixture(autouse=True, scope="session")
def _share_fixture_builds():
    if os.environ.get("TPAUDIT_TEST_FRESH_BUILDS"):
        yield
        return
    import tpaudit.run.pipeline

    real_build, real_report = tpaudit.run.pipeline.build_model, tpaudit.run.pipeline.Audit.report
    shared_ids: set[int] = set()
    reports: dict = {}

    def build_model(source, options=None):
        key = _shared_build_key(source, options)
        if key is None:
            return real_build(source, options)
        if key not in _SHARED_BUILDS:
            _SHARED_BUILDS[key] = real_build(source, options)
            shared_ids.add(id(_SHARED_BUILDS[key]))
        return _SHARED_BUILDS[key]

    def report(self, sizes, **kwargs):
        if id(self.built) not in shared_ids:
            return real_report(self, sizes, **kwargs)
        key = (id(self.built), repr(sizes), repr(sorted(kwargs.items())), repr(sorted(self.versions.items())))
        if key not in reports:
            reports[key] = real_report(self, sizes, **kwargs)
        return reports[key]

    tpaudit.run.pipeline.build_model, tpaudit.run.pipeline.Audit.report = build_model, report
    yield
    tpaudit.run.pipeline.build_model, tpaudit.run.pipeline.Audit.report = real_build, real_report


@contextlib.contextmanager
def deadline(seconds: float):
    """Interrupt whatever runs in this process after `seconds` (a hang becomes a failing test, not a stuck run)."""
    import signal

    def on_alarm(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_one_error_line(proc, *needles: str, peak: int | None = None) -> None:
    """Bad input as the CLI must answer it: exit 2, one `error:` line on stderr (not an internal error) holding every
    needle; with `peak`, the child's own peak memory (`run_bounded`) stayed under it."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    if peak is not None:
        assert proc.peak_bytes is not None and proc.peak_bytes < peak, proc.peak_bytes
