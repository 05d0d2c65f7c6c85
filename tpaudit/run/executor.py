"""One executor for `scan` and `batch`: run a task function over many tasks in this process, in spawned local worker
processes, or as Ray tasks, and yield each task's outcome as it finishes.

    tasks -> executor (local: this process or N workers; ray: a local instance or a cluster) -> (task, outcome)

The task function is the commands' own (`run.scan.scan_one`, `run.batch.run_task`): it turns every bad input into a
result (a `build_failed` row, an error line), so whatever still escapes it is a tpaudit bug. One policy for both
commands, whichever executor runs the task:

- **the task raised** (a tpaudit bug inside a worker): the outcome is `TaskFailed(kind="internal")`, which the
  command records as an internal error with exit code 4 (a scan row `internal_error`, a batch line `exit_code` 4)
  and ends with exit 4; the other tasks still run;
- **the worker stopped** before returning (killed, out of memory, a worker that could not start): the outcome is
  `TaskFailed(kind="stopped")`, recorded with exit code 2 (the input could not be run; the cause is outside it);
- an exception of a type in `propagate` (the installed transformers lacks what tpaudit calls: no task can run) is
  re-raised in the caller.

Workers start with the `spawn` method (a forked process would inherit locks and a CUDA context), import torch and
transformers once each, and run many tasks; `jobs=1` runs every task here, in order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence

from ..errors import LaunchError

__all__ = ["TaskFailed", "run_tasks", "ray_available", "internal_error_reason", "RAY_INSTALL"]

RAY_INSTALL = 'pip install "tpaudit[ray]"'


@dataclass(frozen=True)
class TaskFailed:
    """A task that returned no result.

    Attributes:
        kind (`"internal" | "stopped"`): the task function raised (a tpaudit bug, exit code 4), or its worker
            ended before returning (exit code 2).
        error (`str`): `TypeName: first line of the message` (at most 300 characters).
    """

    kind: Literal["internal", "stopped"]
    error: str

    @property
    def exit_code(self) -> int:
        """4 for a tpaudit bug, 2 for a worker that stopped."""
        return 4 if self.kind == "internal" else 2


def internal_error_reason(error: str, rerun: str = "the same command") -> str:
    """The one-line reason of an internal error, as `check` words it (the line says it is a tpaudit bug).

    Args:
        error (`str`): `TypeName: message`.
        rerun (`str`, *optional*): what to rerun with `TPAUDIT_DEBUG=1` for the traceback.
    """
    return (f"internal error: {error}. This is a tpaudit bug: rerun {rerun} with TPAUDIT_DEBUG=1 and report the "
            "traceback")


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def ray_available() -> bool:
    """Whether Ray can be imported (the `ray` extra: `pip install "tpaudit[ray]"`)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_tasks(fn: Callable[..., Any], tasks: Sequence[tuple], *, jobs: int | None = None,
              executor: Literal["local", "ray"] = "local", ray_address: str | None = None,
              initializer: Callable[[], None] | None = None,
              propagate: tuple[type[BaseException], ...] = (),
              max_tasks_per_child: int | None = None) -> Iterator[tuple[tuple, Any]]:
    """Run `fn(*task)` for every task and yield `(task, result or TaskFailed)` as each finishes.

    Args:
        fn (`Callable`): a module-level function (picklable: it travels to worker processes and Ray tasks).
        tasks (`Sequence[tuple]`): the arguments of each call.
        jobs (`int`, *optional*): local worker processes (`None` or 1: in this process, in order), or the CPUs of a
            local Ray instance (default: every CPU; ignored with `ray_address`).
        executor (`"local" | "ray"`, *optional*, defaults to `"local"`).
        ray_address (`str`, *optional*): a running Ray cluster (`auto`, `ray://host:10001`); default: a local
            instance, with no dashboard and no usage report.
        initializer (`Callable`, *optional*): run once in each local worker process before its first task.
        propagate (`tuple[type]`, *optional*): exception types re-raised here instead of becoming a `TaskFailed`.
        max_tasks_per_child (`int`, *optional*): replace a local worker process after this many tasks, so that what
            a task leaves behind (allocator pools, caches of the models it built) is returned to the system with its
            process. With more tasks than this, even `jobs=1` runs them in one worker process at a time rather than
            here. `None`: workers live as long as the run.

    Yields:
        `(task, outcome)`: in task order with one job, in completion order otherwise.

    Raises:
        LaunchError: `ray_address` names no Ray cluster this process can reach (or a `ray://` address without the
            `ray[client]` package).
        Any exception of a `propagate` type a task raised.
    """
    tasks = list(tasks)
    if not tasks:
        return
    if executor == "ray":
        yield from _run_ray(fn, tasks, jobs, ray_address, propagate)
    elif (jobs is None or jobs <= 1 or len(tasks) <= 1) and not (max_tasks_per_child
                                                                  and len(tasks) > max_tasks_per_child):
        for task in tasks:
            try:
                yield task, fn(*task)
            except propagate:
                raise
            except Exception as e:  # noqa: BLE001 - a bug in the task: recorded, the other tasks go on
                if os.environ.get("TPAUDIT_DEBUG"):
                    import traceback

                    traceback.print_exception(e)
                yield task, TaskFailed("internal", _describe(e))
    else:
        yield from _run_pool(fn, tasks, max(1, jobs or 1), initializer, propagate, max_tasks_per_child)


def _call(fn, task):
    """What a worker runs: the task, with a bug in it returned as a `TaskFailed` (so that a dead worker, whose
    future raises, is told apart from a task that raised)."""
    try:
        return fn(*task)
    except Exception as e:  # noqa: BLE001 - a bug in the task travels back as a value, told apart from a dead worker
        if os.environ.get("TPAUDIT_DEBUG"):
            import traceback

            traceback.print_exception(e)
        return _Raised(e)


class _Raised:
    """A task's exception, carried back from a worker (the exception itself when it pickles, else its text)."""

    def __init__(self, error: BaseException):
        import pickle

        try:
            pickle.dumps(error)
            self.error: BaseException | None = error
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
            self.error = None
        self.text = _describe(error)


def _outcome(value, propagate):
    if isinstance(value, _Raised):
        if value.error is not None and isinstance(value.error, propagate):
            raise value.error
        return TaskFailed("internal", value.text)
    return value


def _run_pool(fn, tasks, jobs, initializer, propagate, max_tasks_per_child=None) -> Iterator[tuple[tuple, Any]]:
    if max_tasks_per_child:
        # a fresh pool per batch of `jobs * max_tasks_per_child` tasks, rather than ProcessPoolExecutor's own
        # `max_tasks_per_child`: on Python 3.11 a pool whose tasks were all submitted at once stops replacing the
        # workers that retire and waits forever (CPython gh-115634, fixed in 3.12.4)
        size = max(1, jobs * max_tasks_per_child)
        for begin in range(0, len(tasks), size):
            yield from _run_pool(fn, tasks[begin:begin + size], jobs, initializer, propagate)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=multiprocessing.get_context("spawn"),
                               initializer=initializer)
    try:
        futures = {pool.submit(_call, fn, task): task for task in tasks}
        for future in as_completed(futures):
            task = futures[future]
            try:
                value = future.result()
            except Exception as e:  # noqa: BLE001 - the worker died (killed, out of memory, could not start)
                yield task, TaskFailed("stopped", _describe(e))
                continue
            yield task, _outcome(value, propagate)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(fn, tasks, jobs, address, propagate) -> Iterator[tuple[tuple, Any]]:
    import logging

    import ray

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        if address:
            try:
                ray.init(address=address, **kwargs)
            except Exception as e:  # noqa: BLE001 - Ray's own errors (ConnectionError, ValueError, ...): bad input
                raise LaunchError(
                    f"cannot reach the Ray cluster at --ray-address {address!r}: {_describe(e)}",
                    hint="start one with `ray start --head` and pass --ray-address auto, check the address, or run "
                         "with --executor local; a ray:// address also needs the client: pip install \"ray[client]\"",
                ) from None
        else:
            # A local instance: nothing leaves this machine (no dashboard, no usage report unless the user asked).
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(num_cpus=jobs or os.cpu_count() or 1, **kwargs)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(_call)
        pending = {remote.remote(fn, task): task for task in tasks}
        waiting = list(pending)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=min(len(waiting), 8), timeout=0.5)
            for obj in done:
                try:
                    value = ray.get(obj)
                except Exception as e:  # noqa: BLE001 - the task's worker died: the other tasks go on
                    yield pending[obj], TaskFailed("stopped", f"the Ray task failed: {_describe(e)}")
                    continue
                yield pending[obj], _outcome(value, propagate)
    finally:
        if started:
            ray.shutdown()


def chunks(items: Iterable, parts: int) -> list[list]:
    """`items` dealt round-robin into at most `parts` non-empty lists (one per worker)."""
    items = list(items)
    return [items[i::parts] for i in range(min(parts, len(items)))]
