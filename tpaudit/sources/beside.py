"""Read a local or snapshot source in a forked child while this process imports torch and transformers.

A check spends its first two seconds importing torch and transformers, on one core, before it can build anything;
reading a large checkpoint's listing needs none of that (Kimi-K2.5: 208,550 tensors in 64 safetensors headers and an
index, 0.75 s; 0.34 s from its snapshot). In a process tpaudit owns (`_process.may_fork`), `read_beside` forks a child
that reads the source while this process imports and groups the tensor names into families
(`ModelSource.name_positions`), and takes the result over as columns (names, dtypes, shapes, files, through an
in-memory file: 0.1 s to unpickle and rebuild for Kimi-K2.5). The child runs the same `open_source` this process
would; it is only a head start: whenever it hands over nothing (the source is bad, the child failed, no fork here),
this process reads the source itself, so errors are raised here with their usual messages.

Hub ids are read in this process (network, tokens, progress bars).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from dataclasses import replace
from operator import itemgetter
from typing import Callable, TypeVar

from ..model import ModelSource, checkpoint_tensors
from ..model.source import group_positions

T = TypeVar("T")


def read_beside(ref: str, work: Callable[[], T], *, revision: str | None = None, token: str | None = None,
                progress: bool = False) -> tuple[ModelSource, T]:
    """`(open_source(ref, ...), work())`, the source read in a forked child while `work` runs here where that is
    possible (see the module docstring), else one after the other (the reference is classified first, so that a
    path that does not exist is reported before `work` runs).

    Raises:
        what `sources.open_source` raises; what `work` raises.
    """
    from .. import _process
    from . import classify_reference, open_source

    def read() -> ModelSource:
        return open_source(ref, revision=revision, token=token, progress=progress)

    child = None
    if _process.may_fork() and revision is None and classify_reference(ref) != "hub" and \
            threading.current_thread() is threading.main_thread():
        refusal = _Refusal()
        try:
            child = _process.Beside.start(lambda: _pack(_refusing(read)))
            if child is None:
                return read(), work()
            try:
                refusal.arm()
                done = work()
                refusal.armed = False
            except _Refused:  # the child met bad input: say so now, not after the imports
                child.cancel()
                source = read()  # raises what the child met, with its message
                return source, work()  # (the source changed between the two reads: carry on)
            except BaseException:
                child.cancel()
                raise
            # no local of this frame holds the child's bytes (Kimi-K2.5: 18 MiB): an exception the imports raised
            # and kept (an optional package's ImportError) keeps this frame, and its locals, for the process's life
            source = _take(child)
        finally:
            refusal.disarm()  # the child is gone: no signal can come any more
        return (source if source is not None else read()), done
    return read(), work()


class _Refused(BaseException):
    """Raised in this process, from a signal handler, when the reading child met bad input."""


class _Refusal:
    """The child's SIGUSR1 (`_refusing`), installed before the fork: while armed it raises `_Refused` wherever this
    process is (importing torch, most likely), so that bad input is reported at once rather than after the imports;
    one that came before `arm` raises there. The previous handler is put back by `disarm`, once the child has
    exited.

    A raise from a signal handler lands in whatever code runs then, a finalizer included (`ZipFile.__del__` while
    torch imports, met in CI), and Python swallows an exception that leaves a finalizer, printing a traceback to
    stderr. While armed, this process's `sys.unraisablehook` drops a `_Refused` silently and leaves the refusal
    pending, and a finder first on `sys.meta_path` raises a pending one at the next import (torch imports hundreds of
    modules): raised from there, the exception reaches `read_beside`. Where no import comes, nothing is lost but time:
    the child hands over nothing and this process reads the source itself, meeting the same error."""

    def __init__(self):
        self.armed = self.received = False
        self.previous = signal.signal(signal.SIGUSR1, self._handle)
        self._hook = self._finder = None

    def _handle(self, signum, frame):
        self.received = True
        if self.armed:
            self.armed = False
            raise _Refused

    def arm(self) -> None:
        if self.received:
            raise _Refused
        self.armed = True
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        self._finder = _RaisePending(self)
        sys.meta_path.insert(0, self._finder)

    def _unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, _Refused):
            self.armed = True  # pending: the finder raises it at the next import
            return
        (self._hook or sys.__unraisablehook__)(unraisable)

    def disarm(self) -> None:
        self.armed = False
        signal.signal(signal.SIGUSR1, self.previous)
        if self._hook is not None:
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self._hook
            self._hook = None
        if self._finder is not None:
            try:
                sys.meta_path.remove(self._finder)
            except ValueError:
                pass
            self._finder = None


class _RaisePending:
    """A `sys.meta_path` finder that finds nothing; it raises `_Refused` when the child's refusal is pending (see
    `_Refusal`)."""

    def __init__(self, refusal: _Refusal):
        self.refusal = refusal

    def find_spec(self, name, path=None, target=None):
        refusal = self.refusal
        if refusal.armed and refusal.received:
            refusal.armed = False
            raise _Refused
        return None


def _refusing(read: Callable[[], ModelSource]) -> ModelSource:
    """In the child: `read()`, and on bad input (a `TpauditError`: the same input gives the same error in the parent)
    a SIGUSR1 to the parent before the error ends the child."""
    from ..errors import TpauditError

    try:
        return read()
    except TpauditError:
        os.kill(os.getppid(), signal.SIGUSR1)
        raise


def _pack(source: ModelSource) -> bytes:
    """The source as bytes: its fields without the tensor table, the table as four columns, and the names' families
    as positions (`model.source.group_positions`, work the child does while this process imports)."""
    tensors = source.tensors
    columns = positions = None
    if tensors is not None:
        names = list(map(itemgetter(0), tensors))
        # dtypes, shapes and files repeat (Kimi-K2.5: 208,550 rows, 32 distinct shapes): one object each, which
        # pickle then writes once and refers back to (unpickling 0.07 s -> 0.02 s, and fewer objects here)
        columns = (names, *(_shared(map(itemgetter(i), tensors)) for i in (1, 2, 3)))
        positions = group_positions(names)
    return pickle.dumps((replace(source, tensors=None), columns, positions), protocol=pickle.HIGHEST_PROTOCOL)


def _shared(values) -> list:
    """`values` with equal values as one object (the first seen)."""
    seen: dict = {}
    return [seen.setdefault(v, v) for v in values]


def _take(child) -> ModelSource | None:
    """The source the child handed over (`_process.Beside.result`, unpacked), or `None`."""
    data = child.result()
    return _unpack(data) if data is not None else None


def _unpack(data: bytes) -> ModelSource | None:
    try:
        source, columns, positions = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a value the child did not finish: read the source here
        return None
    if not isinstance(source, ModelSource):
        return None
    if columns is None:
        return source
    source = replace(source, tensors=checkpoint_tensors(*columns))
    source.__dict__["name_positions"] = positions  # the cached property's value
    return source
