"""The sharded run: the small model loaded with `from_pretrained(dir, distributed_config=DistributedConfig(...))` on
`max(tp_size, ep_size)` ranks that are threads of this process on torch's multi-threaded process group
(`tpaudit.compat.parity`), every module's input and output recorded by forward hooks on both sides, and the sharded
parameters each op reads logged in order.

Threads or processes: measured on the 2-core reference machine, 4 gloo ranks under torchrun (as `tpaudit verify`
starts them) took 17 s for a tiny llama, almost all of it 4 imports of torch and transformers; 4 threaded ranks in
an already-importing process took 0.3 s.

Tolerance: float32 has a 2^-23 (1.2e-7) relative rounding step; a sharded forward changes only the order of the
sums a `rowwise` all-reduce adds up, over at most a few hundred terms of magnitude about one in the small model,
which moves a result by well under 1e-4 of its scale. A wrong split swaps whole rows and moves it by the order of its
own magnitude. A comparison fails when `max |sharded - unsharded| > 1e-4 * max(1, max |unsharded|)`
(`model.PARITY_TOLERANCE`).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..compat import parity as seam
from ..model import PARITY_TOLERANCE
from ..units import shorten
from .small_model import SmallModel
from .trace import tensors


def first_tensor(x):
    """The first tensor in a module's inputs or outputs (a DTensor as its local shard), or `None`."""
    import torch

    x = seam.local_tensor(x) if isinstance(x, torch.Tensor) else x
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for y in x:
            t = first_tensor(y)
            if t is not None:
                return t
    return None


class Recorder:
    """Forward hooks on every module: each call's first input and first output tensor (by module name and call
    index), the order calls end in, the module running when an exception leaves, and (for a rank) the sharded
    parameters each op touched."""

    def __init__(self, model):
        self.outputs: dict[tuple[str, int], Any] = {}
        self.inputs: dict[tuple[str, int], Any] = {}
        self.exits: list[tuple[int, tuple[str, int]]] = []
        self.enters: dict[tuple[str, int], int] = {}
        self.param_uses: list[tuple[int, str]] = []
        self.stack: list[tuple[str, int]] = []
        self.counts: dict[str, int] = {}
        self.op_counts: dict[tuple, int] = {}
        self.cuts: dict[str, tuple] = {}   # source -> the pieces this rank's forward cut its output into
        self.seq = 0
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post(name), with_kwargs=True))

    def _pre(self, name):
        def hook(module, args, kwargs):
            idx = self.counts.get(name, 0)
            self.counts[name] = idx + 1
            self.stack.append((name, idx))
            self.enters[(name, idx)] = self.seq
            t = first_tensor(list(args) + list(kwargs.values()))
            if t is not None:
                self.inputs[(name, idx)] = t.detach().clone()
            self.seq += 1
        return hook

    def _post(self, name):
        def hook(module, args, kwargs, output):
            key = self.stack.pop() if self.stack and self.stack[-1][0] == name else (name, self.counts[name] - 1)
            t = first_tensor(output)
            if t is not None:
                self.outputs[key] = t.detach().clone()
            self.exits.append((self.seq, key))
            self.seq += 1
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _param_ranges(model) -> list[tuple[int, int, str]]:
    """`(start, end, concrete name)` of the local storage of every parameter a rule shards on this rank."""
    out = []
    for name, p in model.named_parameters():
        local = seam.sharded_local(p)
        if local is not None and local.numel():
            start = local.data_ptr()
            out.append((start, start + local.numel() * local.element_size(), name))
    return sorted(out)


def _use_tracker(recorder: Recorder, ranges, sites: dict | None = None):
    """A `TorchFunctionMode` that logs, in the recorder's sequence, the sharded parameters each op reads, and keeps
    the pieces of the ops at `sites` (`trace.CutSite` by source: the same op of the same module call as in the
    unsharded trace) in `recorder.cuts`."""
    starts = [r[0] for r in ranges]
    wanted = {(site.call, site.op, site.occurrence): source for source, site in (sites or {}).items()}

    class Tracker(seam.function_mode()):  # type: ignore[misc]  # torch's TorchFunctionMode, read as untyped
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            source = None
            if wanted:
                name = getattr(func, "__name__", "")
                key = (recorder.stack[-1] if recorder.stack else None, name)
                recorder.op_counts[key] = recorder.op_counts.get(key, 0) + 1
                source = wanted.get((key[0], name, recorder.op_counts[key]))
            for t in tensors(list(args) + list(kwargs.values())):
                try:
                    ptr = seam.local_tensor(t).data_ptr()
                except Exception:  # noqa: BLE001 - tensors without storage
                    continue
                i = bisect.bisect_right(starts, ptr) - 1
                if i >= 0 and ptr < ranges[i][1]:
                    name = ranges[i][2]
                    if not recorder.param_uses or recorder.param_uses[-1][1] != name:
                        recorder.param_uses.append((recorder.seq, name))
            recorder.seq += 1
            out = func(*args, **kwargs)
            if source is not None:
                recorder.cuts[source] = tuple(seam.local_tensor(t).detach().clone() for t in tensors(out))
            return out

    return Tracker()


@dataclass
class RankRun:
    """One rank's run: its recorder, and how it ended (`done`, an `error` in `phase` "load" or "forward", `woken` by
    another rank's failure, the module call it was in when it raised)."""

    rank: int
    recorder: Recorder | None = None
    error: str | None = None
    phase: str | None = None        # "load" | "forward"
    woken: bool = False
    crash_site: tuple[str, int] | None = None
    done: bool = False


def run_ranks(small: SmallModel, tp_size: int, ep_size: int, timeout: float,
              overrides: dict | None = None, cut_sites: dict | None = None) -> tuple[list[RankRun], bool]:
    """Load `small` on `max(tp_size, ep_size)` threaded ranks and run its input through each.

    Args:
        small (`SmallModel`): the saved small model.
        tp_size (`int`), ep_size (`int`): the `DistributedConfig` sizes.
        timeout (`float`): seconds before hung ranks are woken.
        overrides (`dict`, *optional*): `DistributedConfig` `tp_plan` / `ep_plan` overrides (generic prefixed keys
            -> style), merged by transformers into the model's own plans (`_resolve_parallel_plans`).
        cut_sites (`dict`, *optional*): the trace's cuts whose pieces each rank keeps (`cut_evidence`).

    Returns:
        `(runs, finished)`: every rank's run, and whether the ranks finished within `timeout`.
    """
    import torch

    from ..compat import backend

    tf = backend()
    world = max(tp_size, ep_size)
    runs = [RankRun(rank=r) for r in range(world)]

    def main(run: RankRun, store, lock) -> None:
        try:
            run.phase = "load"
            seam.init_rank(run.rank, world, store)
            try:
                dc = tf.distributed_config(tp_size, ep_size, overrides)
                model = small.model_class.from_pretrained(
                    small.path, config=small.config, dtype=torch.float32, **small.kernels,
                    use_kernels=False, distributed_config=dc).eval()
            finally:
                lock.release()
            run.phase = "forward"
            run.recorder = Recorder(model)
            tracker = _use_tracker(run.recorder, _param_ranges(model), cut_sites)
            with torch.no_grad(), tracker:
                model(input_ids=small.input_ids)
            run.recorder.remove()
            run.done = True
        except SystemExit as e:
            if str(e) == seam.TERMINATED:
                run.woken = True
            else:
                run.error = shorten(f"SystemExit: {e}", 240, words=False)
                seam.wake_ranks(e)
        except BaseException as e:  # noqa: BLE001 - a rank's failure is the evidence
            run.error = shorten(f"{type(e).__name__}: {e}", 240, words=False)
            if run.recorder is not None and run.recorder.stack:
                run.crash_site = run.recorder.stack[-1]
            seam.wake_ranks(e)
        finally:
            seam.leave_rank()

    finished = True
    with tf.quiet(), seam.threaded_world() as store, seam.serialized_loading(small.model_class) as lock:
        threads = [threading.Thread(target=main, args=(run, store, lock), daemon=True,
                                    name=f"tpaudit-rank{run.rank}") for run in runs]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            finished = False
            seam.wake_ranks(TimeoutError(f"parity ranks did not finish within {timeout:g} s"))
            for t in threads:
                t.join(5.0)
    return runs, finished


def record_reference(small: SmallModel) -> Recorder:
    """Every module's input and output in one forward of the unsharded small model."""
    import torch

    ref = Recorder(small.reference)
    try:
        with torch.no_grad():
            small.reference(input_ids=small.input_ids)
    finally:
        ref.remove()
    return ref


def compare(ref, loc, rank: int, world: int) -> tuple[bool, float | None, float]:
    """`(comparable, max abs error, tolerance)` of one rank's tensor against the unsharded one: directly when the
    shapes are equal, as the rank's `torch.chunk` slice (or its slice of each half, for a packed output) when one
    dimension is sharded."""
    import torch

    if ref is None or loc is None or ref.ndim != loc.ndim:
        return False, None, 0.0
    if not ref.is_floating_point() or not loc.is_floating_point():
        if ref.shape == loc.shape:
            return True, 0.0 if torch.equal(ref, loc) else math.inf, 0.0
        return False, None, 0.0
    tol = PARITY_TOLERANCE * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0)
    if ref.shape == loc.shape:
        return True, _err(ref, loc), tol
    diff = [d for d in range(ref.ndim) if ref.shape[d] != loc.shape[d]]
    if len(diff) != 1:
        return False, None, tol
    d = diff[0]
    n, size = ref.shape[d], loc.shape[d]
    errs = []
    chunk = -(-n // world)
    start = rank * chunk
    if size == max(0, min(chunk, n - start)) and size:
        errs.append(_err(ref.narrow(d, start, size), loc))
    if n % 2 == 0 and size % 2 == 0 and size:
        half, piece = n // 2, size // 2
        chunk = -(-half // world)
        start = rank * chunk
        if piece == max(0, min(chunk, half - start)):
            expected = torch.cat([ref.narrow(d, start, piece), ref.narrow(d, half + start, piece)], dim=d)
            errs.append(_err(expected, loc))
    if not errs:
        return False, None, tol
    return True, min(errs), tol


def _err(a, b) -> float:
    diff = (a.float() - b.float()).abs()
    if diff.numel() == 0:
        return 0.0
    value = float(diff.max())
    return math.inf if math.isnan(value) else value


def cut_evidence(small: SmallModel, runs: list[RankRun], world: int,
                 ep_scopes: tuple[str, ...] = ()) -> dict[str, tuple[bool, float | None]]:
    """For every split output the trace saw cut into parts: whether the parts each rank's forward cut it into are the
    rank's share of the unsharded parts (`torch.chunk` order along the one dimension the split shortened, as
    `compare` pairs them), with the largest error; only for sources some rank's forward reached the cut of.

    Returns:
        `{source: (held, max_abs_error)}`: `held` False when a piece differs beyond the tolerance or is not the
        rank's share of its unsharded piece (another width: the split scrambled the parts).
    """
    out: dict[str, tuple[bool, float | None]] = {}
    for source, site in small.cut_sites.items():
        if any(site.call[0] == scope or site.call[0].startswith(scope + ".") for scope in ep_scopes):
            continue
        held, worst, seen = True, None, False
        for run in runs:
            pieces = run.recorder.cuts.get(source) if run.recorder is not None else None
            if pieces is None:
                continue
            seen = True
            if len(pieces) != len(site.pieces):
                held = False
                continue
            for ref, loc in zip(site.pieces, pieces):
                ok, err, tol = compare(ref, loc, run.rank, world)
                if not ok or err is None:
                    held = False
                    continue
                worst = err if worst is None else max(worst, err)
                held = held and err <= tol
        if seen:
            out[source] = (held, worst)
    return out
