"""A tpaudit process reads a local or snapshot source in a forked child while it imports torch and transformers
(`sources.beside`, `_process.Beside`), and ends without tearing down its objects (`_process.exit_now`). The child is a
head start, never a second way to read: reports and errors must be the same as when this process reads the source
itself, and the child must really have done the reading."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT, run_cli, run_main

KIMI = str(FIXTURES / "kimi-k2.5.snapshot.json.gz")
QWEN = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")

# a tpaudit-owned process (tuned, torch not imported) reading `ref` beside a stand-in for the imports, recording the
# pid of every process that opened the source, then the source's size and the families of its names
_READ = """
import json, os, sys
from tpaudit._process import tune_gc
tune_gc()
import tpaudit.sources as sources
from tpaudit.sources.beside import read_beside
opened = []
real = sources.open_source
def recording(*args, **kwargs):
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return real(*args, **kwargs)
sources.open_source = recording
source, work = read_beside(sys.argv[1], lambda: "imported")
families = source.name_families
print(json.dumps({"pid": os.getpid(), "work": work, "tensors": len(source.tensors or ()),
                  "first": list(source.tensors[0]) if source.tensors else None,
                  "families": {k.replace("\\0", "*"): len(v) for k, v in (families or {}).items()}}))
"""


def _read_in_child(ref: str, tmp_path) -> tuple[dict, list[int]]:
    log = tmp_path / "opened"
    proc = subprocess.run([sys.executable, "-c", _READ, ref, str(log)], capture_output=True, text=True, cwd=str(ROOT),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), [int(x) for x in log.read_text().split()]


def test_the_child_reads_the_source_and_hands_over_the_same_tensors_and_families(tmp_path):
    from tpaudit.model.source import name_family
    from tpaudit.sources import open_source

    out, opened = _read_in_child(KIMI, tmp_path)
    assert out["work"] == "imported"
    assert len(opened) == 1 and opened[0] != out["pid"]  # read once, by another process: the child
    here = open_source(KIMI)
    assert out["tensors"] == len(here.tensors) == 208_550
    assert out["first"] == [here.tensors[0].name, here.tensors[0].dtype, list(here.tensors[0].shape),
                            here.tensors[0].file]
    # the families, counted here name by name with the one-name form
    counts: dict[str, int] = {}
    for t in here.tensors:
        family = name_family(t.name)[0].replace("\0", "*")
        counts[family] = counts.get(family, 0) + 1
    assert out["families"] == counts
    assert counts["language_model.model.layers.*.mlp.experts.*.gate_proj.weight_packed"] == 60 * 384


def test_an_error_the_imports_keep_keeps_none_of_the_childs_bytes():
    # an optional package's ImportError that the imports keep (transformers keeps some) holds its traceback, and with
    # it the frames that called the imports, read_beside's included, for the process's life: none of their locals may
    # be the bytes the child handed over (Kimi-K2.5: 18 MiB of pickled listing)
    code = ("import sys\nfrom tpaudit._process import tune_gc\ntune_gc()\n"
            "from tpaudit.sources.beside import read_beside\nkept = []\n"
            "def imports():\n    try:\n        raise ImportError('optional')\n"
            "    except ImportError as e:\n        kept.append(e)\n    return 'imported'\n"
            "source, work = read_beside(sys.argv[1], imports)\n"
            "frame = kept[0].__traceback__.tb_frame.f_back\n"
            "print(frame.f_code.co_name, len(source.tensors), "
            "max([len(v) for v in frame.f_locals.values() if isinstance(v, (bytes, bytearray))], default=0))\n")
    proc = subprocess.run([sys.executable, "-c", code, KIMI], capture_output=True, text=True, cwd=str(ROOT),
                          timeout=120)
    assert proc.stdout.split() == ["read_beside", "208550", "0"], proc.stdout + proc.stderr


def test_a_source_the_child_cannot_read_is_read_here_and_fails_with_the_usual_error(tmp_path):
    bad = tmp_path / "bad.snapshot.json"
    bad.write_text(json.dumps({"schema": "tpaudit/snapshot/v1", "config": {"model_type": "llama"},
                               "tensors": [["a.weight", "NOPE", [1], None]]}))
    proc = subprocess.run([sys.executable, "-c", _READ, str(bad), str(tmp_path / "opened")], capture_output=True,
                          text=True, cwd=str(ROOT), timeout=120)
    assert proc.returncode == 1 and "SnapshotError" in proc.stderr and "has dtype 'NOPE'" in proc.stderr
    pids = (tmp_path / "opened").read_text().split()
    assert len(pids) == 2 and pids[0] != pids[1]  # the child tried, then this process read it and raised
    cli = run_cli("check", str(bad), "--tp", "2")
    here = run_main("check", str(bad), "--tp", "2")
    assert (cli.returncode, cli.stderr) == (here.returncode, here.stderr) == (2, here.stderr)
    assert "has dtype 'NOPE'" in cli.stderr


def test_a_child_that_dies_hands_over_nothing():
    code = ("import os, signal\nfrom tpaudit._process import tune_gc, Beside\ntune_gc()\n"
            "ok = Beside.start(lambda: b'x' * 100000)\nraises = Beside.start(lambda: 1 / 0)\n"
            "killed = Beside.start(lambda: os.kill(os.getpid(), signal.SIGKILL))\n"
            "print(ok.result() == b'x' * 100000, raises.result(), killed.result())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert proc.stdout.split() == ["True", "None", "None"], proc.stderr


def test_when_the_work_beside_fails_the_child_is_stopped_and_the_error_raised(tmp_path):
    # the child would read for 20 s and then leave a mark; the work fails at once: the error is raised without
    # waiting for the child (no mark: it never finished) and no child is left
    mark = tmp_path / "child-finished"
    code = ("import os, time\nfrom tpaudit._process import tune_gc\ntune_gc()\n"
            "from tpaudit.sources import beside\nimport tpaudit.sources as sources\n"
            "def slow(*a, **k):\n    time.sleep(20)\n    open(%r, 'w').close()\n"
            "sources.open_source = slow\n"
            "def work():\n    raise RuntimeError('imports-failed')\n"
            "try:\n    beside.read_beside(%r, work)\nexcept RuntimeError as e:\n"
            "    print(e, os.path.exists(%r))\n"
            "try:\n    os.waitpid(-1, os.WNOHANG)\nexcept ChildProcessError:\n    print('no-child')\n"
            % (str(mark), QWEN, str(mark)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=90)
    assert proc.stdout.split() == ["imports-failed", "False", "no-child"], proc.stdout + proc.stderr
    assert not mark.exists()


def test_no_child_in_a_process_that_imported_torch_or_did_not_tune_itself():
    code = ("from tpaudit._process import may_fork, tune_gc\nfirst = may_fork()\nimport torch\ntune_gc()\n"
            "print(first, may_fork())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert proc.stdout.split() == ["False", "False"], proc.stderr
    import torch  # noqa: F401 - this test process, tuned by conftest, imports torch here if no test did before
    from tpaudit._process import Beside

    assert Beside.start(lambda: b"") is None


@pytest.mark.parametrize("fixture, tp", [(QWEN, "4"), pytest.param(str(FIXTURES / "deepseek-v3.snapshot.json.gz"), "8",
                                                                  marks=pytest.mark.slow)])
def test_the_report_from_the_command_line_is_the_report_read_in_process(fixture, tp, tmp_path):
    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint

    directory = tmp_path / "model"
    write_sparse_checkpoint(open_source(fixture), directory)
    for ref in (fixture, str(directory)):
        cli = run_cli("check", ref, "--tp", tp, "--format", "json", "--no-parity")
        here = run_main("check", ref, "--tp", tp, "--format", "json", "--no-parity")
        assert cli.returncode == here.returncode and cli.stderr == here.stderr
        assert json.loads(cli.stdout) == json.loads(here.stdout)
        assert cli.stdout == here.stdout


def test_a_closed_stdout_still_ends_the_process_as_sigpipe_does():
    proc = subprocess.run(f"{sys.executable} -m tpaudit check {QWEN} --tp 4 --format json | head -c 1",
                          shell=True, capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert proc.stdout == "{" and "Traceback" not in proc.stderr


@pytest.mark.slow  # two imports of torch and transformers
def test_the_import_phase_frees_the_copies_of_sys_modules_inspect_leaves_and_puts_inspect_back():
    # torch's import parses builtin signatures with inspect._signature_fromstr, which leaves a copy of sys.modules in a
    # reference cycle per call; the paused import phase frees each right after the call instead of collecting all
    code = ("import gc, inspect\nfrom tpaudit._process import tune_gc\ntune_gc()\n"
            "from tpaudit.compat import backend\nbackend()\n"
            "restored = inspect._signature_fromstr.__qualname__ == '_signature_fromstr'\n"
            "gc.unfreeze(); gc.set_debug(gc.DEBUG_SAVEALL); gc.collect()\n"
            "copies = [o for o in gc.garbage if isinstance(o, dict) and 'sys' in o and 'builtins' in o]\n"
            "print(restored, len(copies))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert proc.stdout.split() == ["True", "0"], proc.stdout + proc.stderr
    # without the wrapper the same import leaves them (the check above can fail)
    unwrapped = code.replace("tune_gc()\n", "tune_gc()\nimport tpaudit._process as p; "
                                               "p._collect_around_signature_parsing(False)\n")
    proc = subprocess.run([sys.executable, "-c", unwrapped], capture_output=True, text=True, cwd=str(ROOT),
                          timeout=120)
    restored, copies = proc.stdout.split()
    assert restored == "True" and int(copies) > 10, proc.stdout + proc.stderr


@pytest.mark.parametrize("long_lived, freed", [(True, "True"), (False, "False")])
def test_a_long_lived_worker_frees_the_import_garbage_the_signature_wrapper_froze(long_lived, freed):
    # the wrapper freezes everything that exists before each signature parse; a scan or batch worker's import phase
    # ends with a full collection that must reach that garbage too (a plain check keeps it frozen: 0.3 s saved)
    code = ("import gc, inspect, weakref\nfrom tpaudit import _process\n"
            f"_process.tune_gc(long_lived={long_lived})\n"
            "class Node: pass\n"
            "a = Node(); a.me = a; ref = weakref.ref(a); del a\n"  # cyclic garbage made while the collector is paused
            "inspect.signature(len)\n"  # a builtin's signature is parsed by _signature_fromstr: the wrapper freezes
            "_process.resume_gc()\n"
            "print(ref() is None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert proc.stdout.split() == [freed], proc.stdout + proc.stderr


def _refused_beside(tmp_path, imports: str, after: str = "") -> tuple[list[str], str]:
    """A tuned process reading a corrupt snapshot beside `imports` (the body of a stand-in for the imports, which
    leaves a mark when it ends: none means it was cut short, whatever the machine's speed), then running `after`:
    `(stdout words, stderr)`, the first two words the error's type and whether the mark exists."""
    bad = tmp_path / "bad.snapshot.json.gz"
    bad.write_bytes(b"\x1f\x8bnot gzip")
    mark = tmp_path / "imports-finished"
    code = ("import os, time\nfrom tpaudit._process import tune_gc\ntune_gc()\nfrom tpaudit.sources.beside import "
            "read_beside\nclass Slow:\n    def __del__(self):\n        time.sleep(20)\n"
            f"def imports():\n{imports}    open({str(mark)!r}, 'w').close()\n"
            f"try:\n    read_beside({str(bad)!r}, imports)\n"
            f"except Exception as e:\n    print(type(e).__name__, os.path.exists({str(mark)!r}))\n{after}")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=90)
    return proc.stdout.split(), proc.stderr


def test_bad_input_met_by_the_child_is_reported_without_waiting_for_the_imports(tmp_path):
    # the work beside (the imports, here a 30 s sleep) is cut short when the child meets bad input: the error the
    # source gives is raised at once, with its usual message
    words, stderr = _refused_beside(tmp_path, "    time.sleep(30)\n")
    assert words == ["SnapshotError", "False"], (words, stderr)
    cli = run_cli("check", str(tmp_path / "bad.snapshot.json.gz"), "--tp", "2")
    assert cli.returncode == 2 and "gzip data is corrupt" in cli.stderr and len(cli.stderr.splitlines()) == 1


def test_a_refusal_that_lands_in_a_finalizer_is_raised_at_the_next_import(tmp_path):
    # the child's signal arrives while a finalizer runs (CI met it in ZipFile.__del__ while torch imported): Python
    # swallows what leaves a finalizer and prints its traceback; the refusal must print nothing, stay pending and be
    # raised at the next import, before the rest of the stand-in (a 30 s sleep) runs
    words, stderr = _refused_beside(
        tmp_path, "    x = Slow()\n    del x\n    import colorsys\n    time.sleep(30)\n",
        after="import sys\nprint(sys.unraisablehook is sys.__unraisablehook__, "
              "any(type(f).__name__ == '_RaisePending' for f in sys.meta_path))\n")
    assert words == ["SnapshotError", "False", "True", "False"], (words, stderr)
    assert stderr == ""


def test_closed_streams_and_a_command_that_never_imports_torch(tmp_path):
    # stdout or stderr closed at start: the exit code still says how the command ended; `main` returning leaves the
    # collector on and inspect as it was, in a process that goes on
    llama = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
    for redirect, args, code in (("2>&-", "rules", 0), ("2>&-", "check /nonexistent/x --tp 4", 2),
                                 (">&-", f"check {llama} --tp 2", 0), (">&- 2>&-", f"check {llama} --tp 0", 2)):
        proc = subprocess.run(f"{sys.executable} -m tpaudit {args} {redirect}", shell=True, capture_output=True,
                              text=True, cwd=str(ROOT), timeout=120)
        assert proc.returncode == code, (redirect, args, proc.returncode)
    script = ("import gc, inspect, io, contextlib\nfrom tpaudit.cli.app import main\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n    main(['rules'])\n"
              "print(gc.isenabled(), inspect._signature_fromstr.__qualname__)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert proc.stdout.split() == ["True", "_signature_fromstr"], proc.stdout + proc.stderr


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mmap threshold")
def test_a_tuned_process_gives_freed_large_blocks_back_whatever_was_freed_before():
    # untuned, freeing a 24 MiB block raises glibc's mmap threshold to 24 MiB (and the heap's trim threshold to 48), so
    # the next 6 MiB blocks come from the heap and stay resident once freed (30 MiB: not enough to trim); tuned, they
    # are mapped and unmapped
    code = ("import os, sys\nfrom tpaudit import _process\nif sys.argv[1] == 'tuned':\n    _process.tune_gc()\n"
            "def rss():\n    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
            "big = bytearray(24 << 20)\ndel big\nkeep = [bytearray(6 << 20) for _ in range(5)]\n"
            "before = rss()\ndel keep\nprint((before - rss()) >> 20)\n")
    freed = {}
    for mode in ("untuned", "tuned"):
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=str(ROOT),
                              timeout=60)
        freed[mode] = int(proc.stdout.strip() or -1)
    assert freed["untuned"] < 6 and freed["tuned"] >= 28, freed
