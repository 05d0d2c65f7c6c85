"""The task, one model at every (tp_size, ep_size), and the executors that run tasks (this process, worker processes,
Ray)."""


from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Literal, Sequence

from ...errors import ExitCode, TpauditError, UnsupportedVersionError, UsageError
from .cache import _key_of, installed_versions, key_inputs, model_sha256, open_result_cache, plan_sha256
from .lines import BatchResult
from .model_list import ModelRef, parse_model_ref


@dataclass(frozen=True)
class TaskOptions:
    """What every task of a batch shares (picklable: it travels to worker processes and Ray tasks).

    Attributes:
        plan (`dict[str, str]`, *optional*): `--plan` rules replacing the base model's `base_model_tp_plan`.
        dtype (`str`, *optional*): the load dtype (default `"auto"`).
        token (`str`, *optional*): Hub token; never written into a line or the cache.
        cache_dir (`str`, *optional*): the cache folder; `None` disables the cache.
        read_cache (`bool`): serve lines from the cache (`False` recomputes, still writing the results).
    """

    plan: dict[str, str] | None = None
    dtype: str | None = None
    token: str | None = field(default=None, repr=False)
    cache_dir: str | None = None
    read_cache: bool = True


def _error_line(model: str, tp: int, ep: int, error: BaseException, seconds: float, **extra) -> BatchResult:
    if isinstance(error, TpauditError):
        reason, code = " ".join(str(error).split()), int(error.exit_code)
    else:
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        reason = (f"internal error: {type(error).__name__}: {first}. This is a tpaudit bug: rerun 'tpaudit check' "
                  "on this model with TPAUDIT_DEBUG=1 and report the traceback")
        code = int(ExitCode.INTERNAL)
    return BatchResult(model=model, tp_size=tp, ep_size=ep, status="error", exit_code=code, seconds=seconds,
                       reason=reason, **extra)


def _reports(source, pairs: Sequence[tuple[int, int]], options: TaskOptions) -> Iterator[tuple[int, int, Any]]:
    """The one call into the analysis pipeline: the model is built once (`audit.Audit`), then every (tp_size,
    ep_size) is resolved and simulated from that build; yields `(tp, ep, Report)` or `(tp, ep, exception)`."""
    from ..pipeline import Audit, CheckRequest
    from ...metamodel import BuildOptions
    from ...model import ParallelSizes

    try:
        audit = Audit(source, BuildOptions(plan_override=options.plan, dtype=options.dtype))
    except Exception as e:  # noqa: BLE001 - a model that does not build gives one error line per pair
        for tp, ep in pairs:
            yield tp, ep, e
        return
    for tp, ep in pairs:
        try:
            # as `tpaudit check` does it, fixes re-checked: a line's findings are the single check's
            yield tp, ep, audit.check(CheckRequest(ParallelSizes.of(tp, ep), parity="off"))
        except Exception as e:  # noqa: BLE001 - one pair never stops the model's other pairs
            yield tp, ep, e


def audit_model(model: ModelRef | str, pairs: Sequence[tuple[int, int]],
                options: TaskOptions | None = None) -> list[BatchResult]:
    """Audit one model at every (tp_size, ep_size) of `pairs`, opening its source once.

    Each line comes from the cache when `options.cache_dir` holds its key (and `options.read_cache`), else from the
    pipeline (`tpaudit.run.pipeline.Audit`: built once, transformers' own plan resolution and TP code on the meta
    device), and is then stored in the cache.

    Args:
        model (`ModelRef` or `str`): the list entry (`org/name@revision` allowed).
        pairs (`Sequence[tuple[int, int]]`): `(tp_size, ep_size)` pairs, in the order the lines are returned.
        options (`TaskOptions`, *optional*): plan, dtype, token, cache.

    Returns:
        `list[BatchResult]`, one per pair. A model that cannot be read gives `status="error"` lines with `check`'s
        one-line message as `reason` and its exit code (2); a pair transformers refuses gives an error line too; an
        unexpected exception gives an error line with exit code 4 whose reason says it is an internal error.

    Raises:
        UnsupportedVersionError: a line must be computed and the installed transformers lacks what tpaudit calls
            (every other failure is an error line).
    """
    options = options or TaskOptions()
    ref = parse_model_ref(model) if isinstance(model, str) else model
    start = time.perf_counter()
    if ref.problem:
        return [_error_line(ref.text, tp, ep, UsageError(ref.problem), 0.0) for tp, ep in pairs]
    try:
        from ...sources import open_source

        source = open_source(ref.ref, revision=ref.revision, token=options.token)
        digest = model_sha256(source)
    except Exception as e:  # noqa: BLE001 - an unreadable model is an error line, never a stopped batch
        seconds = time.perf_counter() - start
        return [_error_line(ref.text, tp, ep, e, seconds) for tp, ep in pairs]
    cache, cache_off = open_result_cache(options.cache_dir)
    problems: dict[tuple[int, int], str] = {p: cache_off for p in pairs} if cache_off else {}
    found = installed_versions()
    plan_digest = plan_sha256(options.plan)
    inputs = {(tp, ep): key_inputs(model_sha256=digest, tp_size=tp, ep_size=ep, plan_sha256=plan_digest,
                                   dtype=options.dtype, versions=found) for tp, ep in pairs}
    keys = {pair: _key_of(value) for pair, value in inputs.items()}
    lines: dict[tuple[int, int], BatchResult] = {}
    if cache is not None and options.read_cache:
        for pair, key in keys.items():
            stored, problem = cache.lookup(key, inputs[pair])  # anything that does not check out is recomputed
            if problem:
                problems[pair] = problem
            if stored is not None:
                lines[pair] = replace(BatchResult.from_json(stored), model=ref.text, cached=True,
                                      commit=source.commit)
    todo = [p for p in pairs if p not in lines]
    if todo:
        from ...compat import backend

        backend()  # raises UnsupportedVersionError: no line of this batch can be computed
        # torch and transformers: once per process, not part of a line's seconds
        from .. import pipeline  # noqa: F401
    clock = time.perf_counter()
    for tp, ep, outcome in (_reports(source, todo, options) if todo else ()):
        now = time.perf_counter()
        seconds, clock = now - clock, now
        common = {"commit": source.commit, "model_sha256": digest, "key": keys[(tp, ep)]}
        if isinstance(outcome, BaseException):
            line = _error_line(ref.text, tp, ep, outcome, seconds, **common)
            if not isinstance(outcome, TpauditError):
                line = replace(line, key=None)  # a tpaudit bug is not a result worth keeping
        else:
            line = _line_from_report(ref.text, outcome, seconds, **common)
        if cache is not None and line.key is not None:
            cache.put(line.key, replace(line, model="", cached=False, commit=None).to_json(), inputs[(tp, ep)])
        lines[(tp, ep)] = replace(line, cache_problem=problems.get((tp, ep)))
    return [lines[p] for p in pairs]


def _line_from_report(model: str, report, seconds: float, **extra) -> BatchResult:
    errors, warnings, notes = report.count("error"), report.count("warning"), report.count("note")
    return BatchResult(model=model, tp_size=report.tp_size, ep_size=report.ep_size, status="ok",
                       exit_code=1 if errors else 0, worst_rank_param_bytes=report.worst_rank_param_bytes,
                       total_param_bytes=report.total_param_bytes, replicated_bytes=report.replicated_bytes,
                       errors=errors, warnings=warnings, notes=notes,
                       findings=tuple(f.to_json() for f in report.findings), seconds=seconds,
                       architecture=report.model.get("architecture"), **extra)


def run_task(model: ModelRef, pairs: Sequence[tuple[int, int]], options: TaskOptions) -> list[BatchResult]:
    """The task function every executor runs (in this process, a worker process, or a Ray worker): `audit_model`
    with the worker's threads limited to one (the workers are the parallelism)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return audit_model(model, pairs, options)


def _worker_init() -> None:
    # torch and transformers are imported on a worker's first audit and stay imported for the next models (a
    # batch served from the cache never imports them). The worker is tpaudit's process: its collector is tuned.
    from ..._process import tune_gc

    tune_gc(long_lived=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from ...sources.hub import remember_missed_endpoints

    remember_missed_endpoints()  # an endpoint that missed its deadline is not asked again by this worker


# ----------------------------------------------------------------------------------------------------------------------
# Executors
# ----------------------------------------------------------------------------------------------------------------------
Task = tuple[ModelRef, tuple[tuple[int, int], ...]]


class WorkerStopped(TpauditError):
    """A worker process ended before returning a model's lines: killed (out of memory), or it could not start
    because the calling script is not guarded (spawned workers re-import it). Exit code 2: the batch could not run
    this model, and the cause is outside the model."""

    def __init__(self, detail: str):
        super().__init__(
            f"the worker process stopped before returning this model's lines ({detail or 'no message'}): it was "
            "killed (out of memory?) or could not start. A script that calls tpaudit.batch(..., jobs=2 or more) must "
            "make the call under `if __name__ == \"__main__\":` (workers start with Python's spawn method and "
            "re-import the script); jobs=1 runs every model in this process")


def _failed_task(task: Task, failure) -> list[BatchResult]:
    """The lines of a task that returned none (`run.executor.TaskFailed`): a tpaudit bug in the worker is an
    internal error (exit code 4), a worker that stopped is `WorkerStopped` (exit code 2)."""
    from ..executor import internal_error_reason

    ref, pairs = task
    if failure.kind == "internal":
        reason = internal_error_reason(failure.error, "'tpaudit check' on this model")
        return [BatchResult(model=ref.text, tp_size=tp, ep_size=ep, status="error", exit_code=failure.exit_code,
                            reason=reason) for tp, ep in pairs]
    return [_error_line(ref.text, tp, ep, WorkerStopped(failure.error), 0.0) for tp, ep in pairs]


def _run(tasks: list[Task], options: TaskOptions, jobs: int | None, executor: Literal["local", "ray"],
         address: str | None) \
        -> Iterator[list[BatchResult]]:
    """Every task's lines, through the executor `scan` shares (`tpaudit.run.executor`)."""
    from ..executor import TaskFailed, run_tasks

    for (ref, pairs, _), outcome in run_tasks(run_task, [(ref, pairs, options) for ref, pairs in tasks], jobs=jobs,
                                           executor=executor, ray_address=address, initializer=_worker_init,
                                           propagate=(UnsupportedVersionError,)):
        yield _failed_task((ref, pairs), outcome) if isinstance(outcome, TaskFailed) else outcome


def ray_available() -> bool:
    """Whether Ray can be imported (the `ray` extra: `pip install "tpaudit[ray]"`)."""
    from ..executor import ray_available as available

    return available()
