"""Settings for a Python process that tpaudit owns: the CLI and the scan/batch worker processes it spawns (never a
user's process that imports tpaudit as a library).

**The cyclic garbage collector.** A check allocates millions of small objects that live until the process ends: the
modules of torch and transformers, the parsed checkpoint listing (Kimi-K2.5: 208,550 names, shapes and rows), the
checkpoint mapping, the meta model. With CPython's default thresholds (700, 10, 10) a collection starts every 700 net
allocations and each older-generation collection walks everything allocated so far, so most of that work finds
nothing to free: a Kimi-K2.5 check spent about a third of its time there (20.9 s -> 14.2 s without it; Qwen3-VL-30B-A3B
10.8 s -> 8.7 s; peak RSS unchanged). tpaudit raises the first threshold to 200,000 allocations, as mypy does for the
same reason; collections still run, so cyclic garbage is still freed and memory stays bounded.

**The import phase.** Importing torch and transformers creates about two million objects that live as long as the
process (modules, functions, classes), and even at 200,000 the collector walked them a dozen times while they were
imported (a Kimi-K2.5 check: about 0.4 s of its CPU time, a Qwen3-VL-30B-A3B check 0.2 s). A process that has not
imported torch yet when it is tuned therefore starts with the collector paused; the seam's first probe, which
imports them (`compat.backend`), ends the pause (`resume_gc`): what the imports left is moved to the permanent
generation (`gc.freeze`, as a pre-fork server does), never walked again, and the collector runs as above for
everything the check itself allocates. A process that imported torch before (a test process calling `main`) keeps
its collector running throughout.

**The imports' garbage.** The imports leave about 9,000 objects of cyclic garbage, 7 MB, and nearly all of the bytes
come from one function: CPython's `inspect._signature_fromstr` (3.11-3.13) copies `sys.modules` into a closure of a
class it defines on every call, a reference cycle that only the collector frees, and torch's import calls it 58
times (6 MB of dict copies). Freeing them with one full collection at the end of the import phase walks all two
million objects (0.3 s, the largest single cost of a Qwen3-VL check beyond the imports), and freezing them instead
raised a check's peak RSS by 6 MiB. So, while the collector is paused, that function is wrapped: before each call
everything that exists is frozen, after it a collection of the youngest generation walks only the call's own objects
and frees its copy (the function is put back when the pause ends). The rest of the imports' garbage stays frozen,
about 2 MiB (a check's peak RSS stays under its figure before this change: `scripts/benchmark.py`); a long-lived
worker (scan, batch) unfreezes it for its one full collection instead.

**The heap.** glibc serves an allocation above its mmap threshold with its own mapping, returned to the system when
freed; below it, from the heap, whose freed pages stay resident until trimmed. The threshold starts at 128 KiB and
rises, up to 32 MiB, to the size of every mapped block freed, so after the first large tensors are freed the next
ones come from the heap: the load stage's converters on zeros of real size (compressed-tensors' dequantize of a whole
Kimi-K2.5 expert: tens of MiB of temporaries) then left their heap resident under the next, and a Kimi-K2.5 check
peaked 70-110 MiB higher than what was alive at once. A tpaudit-owned process fixes the threshold at `MMAP_THRESHOLD`
(`mallopt(M_MMAP_THRESHOLD)`, which also stops its rise): the kernel then hands out fresh pages for each large
tensor, about 1% of that check's wall time (`scripts/benchmark.py`, README). A no-op outside glibc.

**A folder that shadows the package.** `python -m tpaudit` and `torchrun ... -m tpaudit` put the current directory
first on `sys.path`, so a folder named `tpaudit` there (a clone of the repository) is imported as the package in
place of the installed one: a folder without `__init__.py` as an empty namespace package, whose missing `__version__`
then failed the import of the command line (`ImportError: cannot import name '__version__' from 'tpaudit' (unknown
location)`) on every rank. `exit_if_shadowed`, which `__main__` calls before importing anything else, names the
folder instead. (This module imports nothing from tpaudit, so it loads even then.)

**A child's environment.** A child tpaudit starts for its own work (the parity check's, the guard's analysis, the
ranks `verify` launches through torchrun) must not believe it is a worker of the caller's torchrun: its environment
leaves out what torchrun sets for a worker (`TORCHRUN_ENV`, `without_torchrun`).
"""

from __future__ import annotations

import gc

# mypy's `main.py` setting (`gc.set_threshold(200 * 1000, 30, 30)`), for the same kind of allocation-heavy,
# short-lived process
GC_THRESHOLDS = (200_000, 30, 30)

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
"""What torchrun (`torch.distributed.run`) sets in each worker's environment; the first three are set for every worker
(a process that has them is one: `verify.under_torchrun`)."""


def without_torchrun(environ=None, *also: str) -> dict[str, str]:
    """`environ` (default `os.environ`) without `TORCHRUN_ENV` nor the names in `also`: for a child process."""
    import os

    drop = set(TORCHRUN_ENV) | set(also)
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k not in drop}


_paused = False

MMAP_THRESHOLD = 4 << 20
"""Bytes above which glibc maps an allocation of its own (see the module docstring; 256 KiB-4 MiB gave one peak)."""


_collect_at_resume = False


def release_memory() -> None:
    """Return what a finished task freed to the system: one full collection, then glibc's `malloc_trim(0)` (freed
    heap pages otherwise stay resident in a long-lived worker; the parity check's small models leave tens of MiB
    each). A no-op where the C library has no `malloc_trim` (macOS, musl)."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """glibc's `malloc_trim(0)`: give the heap pages freed since back to the system, so the next large transient
    allocation does not come on top of them (the load stage's converters on zeros of real size leave about 100 MiB of
    freed heap resident per family). A no-op where the C library has no `malloc_trim` (macOS, musl)."""
    _libc_call("malloc_trim", 0)


def fix_mmap_threshold() -> None:
    """glibc's `mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)`: large allocations are mapped, and unmapped when freed,
    whatever was freed before (see the module docstring). A no-op where the C library has no `mallopt`."""
    _libc_call("mallopt", -3, MMAP_THRESHOLD)  # -3: M_MMAP_THRESHOLD, glibc's <malloc.h>


def _libc_call(name: str, *args: int) -> None:
    """`name(*args)` of the C library this process already runs on (`ctypes.CDLL(None)`: no `find_library`, which
    spawns `ldconfig` each call); nothing where the library has no such function (macOS, musl)."""
    import ctypes

    try:
        getattr(ctypes.CDLL(None), name)(*args)
    except (OSError, AttributeError):
        pass


def tune_gc(long_lived: bool = False) -> None:
    """Set the cyclic collector's thresholds for a tpaudit-owned process, and pause it until the import phase ends
    when torch is not imported yet (see the module docstring). Idempotent.
    `long_lived`: a worker that audits many models (scan, batch): its import phase ends with one full collection
    as well (0.3 s once, and the least memory frozen for the rest of its life)."""
    import sys

    global _paused, _collect_at_resume
    _collect_at_resume = long_lived
    fix_mmap_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    if "torch" not in sys.modules and gc.isenabled():
        gc.disable()
        _paused = True
        _collect_around_signature_parsing(True)


def resume_gc() -> None:
    """End the import phase of a process `tune_gc` paused: freeze what the imports left (torch's and transformers'
    modules, the permanent generation) and let the collector run again. A no-op in any other process (a user's
    process that imports tpaudit as a library is never paused)."""
    global _paused
    if _paused:
        _paused = False
        _collect_around_signature_parsing(False)
        if _collect_at_resume:
            # what the signature wrapper froze along the way is walked too: frozen objects are never collected, so
            # garbage the imports made between two of its calls would otherwise stay (2 MiB of a scan worker's peak)
            gc.unfreeze()
            gc.collect()
        gc.freeze()
        gc.enable()


def end_pause() -> None:
    """End a pause that no import ended (a command that never needed torch: `rules`, `--version`, a usage error):
    the collector runs again and `inspect` is put back, nothing is frozen. Called when a command returns, so that a
    process that goes on after `cli.app.main` (a test, a caller) is left as Python set it up, thresholds aside."""
    global _paused
    if _paused:
        _paused = False
        _collect_around_signature_parsing(False)
        gc.enable()


_PARSE_SIGNATURE = None


def _collect_around_signature_parsing(on: bool) -> None:
    """While the import phase pauses the collector, free the cyclic garbage of `inspect._signature_fromstr` right
    after each call (see the module docstring); `on=False` puts the function back."""
    global _PARSE_SIGNATURE
    import inspect

    if on and _PARSE_SIGNATURE is None and callable(getattr(inspect, "_signature_fromstr", None)):
        original = _PARSE_SIGNATURE = inspect._signature_fromstr  # type: ignore[attr-defined]  # private

        def parse_then_collect(*args, **kwargs):
            gc.freeze()  # what exists before the call is not walked below (the import phase freezes it anyway)
            try:
                return original(*args, **kwargs)
            finally:
                gc.collect(0)  # the call's own objects only: its class, closures and copy of sys.modules

        inspect._signature_fromstr = parse_then_collect  # type: ignore[attr-defined]
    elif not on and _PARSE_SIGNATURE is not None:
        inspect._signature_fromstr = _PARSE_SIGNATURE  # type: ignore[attr-defined]
        _PARSE_SIGNATURE = None


def may_fork() -> bool:
    """True in a tpaudit-owned process that has not imported torch yet (`tune_gc` paused its collector), on Linux:
    the one place a child may be forked to work beside the import phase (`Beside`). Never in a user's process that
    imports tpaudit as a library, and never after torch is imported (its thread pools do not survive a fork)."""
    import os
    import sys

    return _paused and sys.platform == "linux" and hasattr(os, "fork") and "torch" not in sys.modules


class Beside:
    """A forked child that computes one `bytes` value while this process does something else (on a machine with two
    or more cores, the two run at once): `Beside.start(produce)` forks, the child runs `produce()` and writes what it
    returns to an anonymous in-memory file both share (`os.memfd_create`: no pipe to drain 64 KB at a time; Kimi-K2.5's
    listing is 18 MB), and `result()` reads it once the child has exited.

    The child is a cache, never the only way: it exits with `os._exit` (no atexit handlers, no flush of this process's
    buffers), dies with a SIGINT, and `result()` answers `None` whenever it did not hand over a whole value (it raised,
    was killed, or could not be forked); the caller then does the work itself, so an error is raised, with its usual
    message, in this process.
    """

    def __init__(self, pid: int, fd: int):
        self._pid, self._fd = pid, fd

    @classmethod
    def start(cls, produce) -> "Beside | None":
        """Fork a child running `produce() -> bytes`; `None` where `may_fork()` is false, or the shared file or the
        fork cannot be made."""
        import os

        if not may_fork() or not hasattr(os, "memfd_create"):
            return None
        try:
            fd = os.memfd_create("tpaudit-beside", os.MFD_CLOEXEC)
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            os.close(fd)
            return None
        if pid == 0:  # pragma: no cover - the child; its work is checked through `result()`
            _child(fd, produce)
        return cls(pid, fd)

    def cancel(self) -> None:
        """Stop the child and forget its value (the caller failed before it needed it)."""
        import os
        import signal

        try:
            os.kill(self._pid, signal.SIGKILL)
        except OSError:
            pass
        os.close(self._fd)
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:
            pass

    def result(self) -> bytes | None:
        """The child's value, once it exits; `None` when it handed over none (see the class docstring)."""
        import os

        try:
            _, status = os.waitpid(self._pid, 0)
        except ChildProcessError:
            status = -1
        except BaseException:  # Ctrl-C while waiting: no child is left behind
            self.cancel()
            raise
        try:
            size = os.fstat(self._fd).st_size
            data = os.pread(self._fd, size, 0) if status == 0 and size >= 8 else b""
        except OSError:
            data = b""
        finally:
            os.close(self._fd)
        if len(data) < 8 or int.from_bytes(data[:8], "little") != len(data) - 8:
            return None
        return data[8:]


def _child(fd: int, produce) -> None:  # pragma: no cover - runs in the forked child
    import os
    import signal

    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        data = produce()
        view = memoryview(len(data).to_bytes(8, "little") + data)
        while view:
            view = view[os.write(fd, view):]
        code = 0
    except BaseException:  # noqa: BLE001 - the parent does the work itself
        code = 1
    finally:
        os._exit(code)


def exit_now(code: int) -> None:
    """End a tpaudit-owned process with `code` once its command is done, without tearing down its objects: flush
    stdout and stderr, run the `atexit` handlers (libraries' cleanups: logging, Ray, temporary files), then
    `os._exit`. The interpreter's own shutdown would free every object one by one (a Kimi-K2.5 check holds 208,550
    checkpoint tensors and the modules of torch and transformers: 0.27 s, against 0.06 s this way), work whose only
    effect is on memory the operating system takes back anyway; mypy ends its runs the same way. Only the console
    script and `python -m tpaudit` call it, never `cli.app.main` (tests and callers get its return value)."""
    import atexit
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: started with the stream closed (`2>&-`)
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def shadowing_folder(module_file: str) -> str | None:
    """The folder imported as `tpaudit` when it is not the package holding `module_file` (a module of the installed
    package, e.g. `tpaudit/__main__.py`), else `None`."""
    import os
    import sys

    package = sys.modules.get("tpaudit")
    if package is None:
        return None
    ours = os.path.dirname(os.path.abspath(module_file))
    while os.path.basename(ours) != "tpaudit" and os.path.dirname(ours) != ours:
        ours = os.path.dirname(ours)
    location = getattr(package, "__file__", None)
    if location is not None:
        folder = os.path.dirname(os.path.abspath(location))
        return None if os.path.realpath(folder) == os.path.realpath(ours) else folder
    paths = [os.path.abspath(p) for p in getattr(package, "__path__", [])]
    return next((p for p in paths if os.path.realpath(p) != os.path.realpath(ours)), paths[0] if paths else None)


def exit_if_shadowed(module_file: str) -> None:
    """Say which folder shadows the installed package, with the way out, and exit 2 (bad input) when one does."""
    import sys

    folder = shadowing_folder(module_file)
    if folder is None:
        return
    print(f"error: the folder {folder} is imported as the package tpaudit in place of the installed one (python -m "
          "puts the current directory first on sys.path). Run from another directory, or rename that folder",
          file=sys.stderr)
    raise SystemExit(2)
