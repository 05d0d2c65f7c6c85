"""`tpaudit batch`: audit a whole model registry, one JSON line per (model, tp_size, ep_size), cached and parallel.

    LIST -> ModelRef -> task (one per model, in a worker) -> BatchResult lines -> BatchSummary -> renderer

- **List**: a text file of model references, one a line, as `check` takes them (Hub id, local directory or
  `config.json`, snapshot file), with an optional `@revision` (Hub only) and `#` comments (`read_list`).
- **Task**: `audit_model` opens a model's source once (`tpaudit.sources.open_source`) and produces one
  `BatchResult` per (tp_size, ep_size). It never raises: a model that cannot be read, or that transformers refuses,
  becomes `status="error"` lines carrying the one-line reason and the exit code `check` would give; an unexpected
  exception becomes an error line whose reason names it as an internal error (exit code 4).
- **Cache**: a result is stored under a key made of what determines it: tpaudit, transformers and torch versions,
  the sha256 of the model's config and tensor listing (names, dtypes, shapes), the plan's rules, the dtype, tp_size
  and ep_size (`result_key`). One JSON file per key, written atomically (`ResultCache`), so that concurrent workers,
  processes on several machines sharing a file system, and an interrupted run never leave a half-written entry. A
  cache hit costs reading the model's metadata and hashing it, never an audit. Error lines are cached only when they
  are deterministic (the source was read, then transformers or tpaudit refused it); unreadable models are retried.
- **Executors**: the one `scan` uses too (`tpaudit.run.executor`): `jobs=1` runs in this process; `jobs=N` runs N
  spawned worker processes, each importing torch and transformers once and auditing many models;
  `executor="ray"` submits the same task function as Ray tasks (a local Ray instance, or a cluster by address). A
  tpaudit bug that escapes a task is an internal error line (exit code 4, and the batch exits 4); a worker that
  stops gives error lines with exit code 2.
- **Summary**: `summarize` counts lines and models by status, picks the worst offenders by replicated bytes and,
  with a previous OUT file, lists what changed (`compare`): new errors, fixed errors, worst-rank bytes that moved.

The package: `model_list`, `lines`, `cache`, `task` (and its executors), `summary`; this module runs
the batch. Nothing here prints or exits; the command is `tpaudit/cli/batch.py`, the renderers `tpaudit/report/batch.py`.
"""


from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator, Literal, Sequence

from ...errors import UsageError
from ..executor import RAY_INSTALL  # noqa: F401  (the CLI and the API name it here)
from .cache import (  # noqa: F401
    CACHE_SCHEMA,
    ResultCache,
    default_cache_dir,
    installed_versions,
    key_inputs,
    model_sha256,
    plan_sha256,
    result_key,
)
from .lines import BATCH_SCHEMA, EXIT_CODES, BatchResult, Status, line_problem, read_results  # noqa: F401
from .model_list import ModelRef, parse_list, parse_model_ref, read_list  # noqa: F401
from .summary import BatchComparison, BatchSummary, Change, batch_exit_code, compare, summarize  # noqa: F401
from .task import Task, TaskOptions, WorkerStopped, _run, audit_model, ray_available, run_task  # noqa: F401


def size_pairs(tp_sizes: Iterable[int], ep_sizes: Iterable[int] = (1,)) -> tuple[list[tuple[int, int]], list[str]]:
    """Every (tp_size, ep_size) combination transformers accepts, and the reasons of those it refuses.

    Validity is transformers' own (`DistributedConfig`, through the seam): in 5.23 and 5.24 without
    FSDP, `ep_size` is 1 or `tp_size`, so `--tp 4,8 --ep 1,4` gives (4, 1), (4, 4) and (8, 1). A pair with
    `ep_size` 1 is taken without importing transformers (a batch served from the cache never imports it); each
    audit checks its sizes again, so a refusal there would still show, as error lines.

    Args:
        tp_sizes (`Iterable[int]`), ep_sizes (`Iterable[int]`): the sizes asked for (duplicates kept once).

    Returns:
        `(pairs, refused)`: the valid pairs in `tp`-major order, and one message per refused pair.

    Raises:
        UsageError: no size given, a size below 1, or no valid pair at all.
    """
    from ...model import MAX_WORLD_SIZE, ParallelSizes

    tps, eps = list(dict.fromkeys(tp_sizes)), list(dict.fromkeys(ep_sizes))
    if not tps or not eps:
        raise UsageError("no tp_size given. Pass tp_sizes=[4, 8] (--tp 4,8)")
    pairs, refused = [], []
    for tp in tps:
        for ep in eps:
            if tp < 1 or ep < 1:
                raise UsageError(f"tp_size={tp}, ep_size={ep} (--tp {tp} --ep {ep}) is invalid: sizes must be positive "
                                 "integers. Pass tp_sizes=[4, 8] (--tp 4,8)")
            if ep == 1 and tp <= MAX_WORLD_SIZE:
                pairs.append((tp, ep))
                continue
            try:
                ParallelSizes.of(tp, ep, names=("--tp", "--ep"))
                from ...compat import PlanRejectedError, backend

                backend().distributed_config(tp, ep)
            except UsageError as e:
                refused.append(str(e))
                continue
            except PlanRejectedError as e:
                refused.append(f"tp_size={tp}, ep_size={ep} (--tp {tp} --ep {ep}) is rejected by transformers: "
                               f"{e.detail}")
                continue
            pairs.append((tp, ep))
    if not pairs:
        raise UsageError(f"no (tp, ep) combination is accepted: {refused[0]}")
    return pairs, refused


def batch(models: Iterable[str | ModelRef], *, tp_sizes: Iterable[int], ep_sizes: Iterable[int] = (1,),
          plan: dict[str, str] | str | None = None, dtype: str | None = None, token: str | None = None,
          jobs: int | None = None, executor: Literal["local", "ray"] = "local", ray_address: str | None = None,
          cache: bool | str | os.PathLike = True, refresh: bool = False,
          previous: Iterable[BatchResult] = ()) -> Iterator[BatchResult]:
    """Audit many models at several (tp_size, ep_size), yielding one `BatchResult` per line as tasks finish.

    The arguments are checked when `batch` is called (so errors come before any work); the audits run as the
    returned iterator is consumed.

    Args:
        models (`Iterable[str | ModelRef]`): references as `check` takes them (Hub id, directory, snapshot file),
            `org/name@revision` allowed; or `read_list(path)`.
        tp_sizes (`Iterable[int]`), ep_sizes (`Iterable[int]`, *optional*, defaults to `(1,)`): every valid
            combination is audited (see `size_pairs`; pairs transformers refuses are left out).
        plan (`dict` or `str`, *optional*): rules (or a JSON file of them) replacing `base_model_tp_plan`.
        dtype (`str`, *optional*): load dtype (default `"auto"`).
        token (`str`, *optional*): Hub token (default `HF_TOKEN` or the stored login).
        jobs (`int`, *optional*): local worker processes (default 1: in this process), or the CPUs of a local Ray
            instance (default: every CPU of this machine; ignored with `ray_address`).
        executor (`"local"` or `"ray"`, *optional*, defaults to `"local"`).
        ray_address (`str`, *optional*): a Ray cluster (`ray://host:10001`, `auto`); default: a local instance.
        cache (`bool` or path, *optional*, defaults to `True`): `True` uses `default_cache_dir()`, a path uses that
            folder, `False` disables the cache.
        refresh (`bool`, *optional*, defaults to `False`): recompute every line (results are still cached).
        previous (`Iterable[BatchResult]`, *optional*): lines of an interrupted run (its OUT file). A line whose
            key still matches (same model hash, versions, plan, dtype, sizes) is yielded as is and not recomputed.

    Yields:
        `BatchResult`, first the reused `previous` lines, then the others in completion order (not list order).

    Raises:
        UsageError: invalid sizes, no valid (tp, ep) pair, `executor="ray"` without Ray installed, an unknown
            executor.
        PlanError: the plan is malformed or names an unknown style.
        UnsupportedVersionError: transformers or torch outside the tested range.
    """
    import multiprocessing

    from ...compat import require_installed

    if jobs is not None and jobs > 1 and getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UsageError("tpaudit.batch(..., jobs=%d) was called while a worker process was starting: the calling "
                         "script re-runs in every worker. Put the call under `if __name__ == \"__main__\":`" % jobs)
    if executor not in ("local", "ray"):
        raise UsageError(f"executor {executor!r} is not known. Pass local or ray")
    if executor == "ray" and not ray_available():
        raise UsageError(f"executor='ray' (--executor ray) needs Ray, which is not installed. Install it with: "
                         f"{RAY_INSTALL}")
    if jobs is not None and jobs < 1:
        raise UsageError(f"jobs={jobs} (--jobs {jobs}) is invalid: pass 1 or more worker processes")
    refs = []
    seen = set()
    for m in models:
        ref = parse_model_ref(m) if isinstance(m, str) else m
        if ref.text not in seen:
            seen.add(ref.text)
            refs.append(ref)
    require_installed()  # the full probe (an import of transformers) waits for the first line not in the cache
    pairs, _ = size_pairs(tp_sizes, ep_sizes)
    if isinstance(plan, (str, os.PathLike)):
        from ...metamodel import load_plan_file

        plan = load_plan_file(str(plan))
    elif plan is not None:
        from ...metamodel import validate_plan

        validate_plan(plan)
    cache_dir = None if cache is False else str(default_cache_dir() if cache is True else Path(cache))
    options = TaskOptions(plan=plan, dtype=dtype, token=token, cache_dir=cache_dir, read_cache=not refresh)

    return _generate(refs, pairs, options, previous, jobs=jobs, executor=executor, ray_address=ray_address)


def _generate(refs: list[ModelRef], pairs: list[tuple[int, int]], options: TaskOptions,
              previous: Iterable[BatchResult], *, jobs: int | None, executor: Literal["local", "ray"],
              ray_address: str | None) \
        -> Iterator[BatchResult]:
    refresh, plan, dtype = not options.read_cache, options.plan, options.dtype
    reused: dict[tuple[str, int, int], BatchResult] = {}
    if not refresh:
        found, plan_digest = installed_versions(), plan_sha256(plan)
        for line in previous:
            if line.model_sha256 and line.key and line.key == result_key(
                    model_sha256=line.model_sha256, tp_size=line.tp_size, ep_size=line.ep_size,
                    plan_sha256=plan_digest, dtype=dtype, versions=found):
                reused[line.id] = replace(line, cached=True)
    tasks: list[Task] = []
    for ref in refs:
        todo = tuple(p for p in pairs if (ref.text, *p) not in reused)
        for p in pairs:
            key = (ref.text, *p)
            if key in reused:
                yield reused[key]
        if todo:
            tasks.append((ref, todo))
    if not tasks:
        return
    from ...sources.hub import remembering_missed_endpoints

    with remembering_missed_endpoints():  # a dead endpoint costs one deadline, not one per model
        for lines in _run(tasks, options, jobs, executor, ray_address):
            yield from lines


def order_results(results: Iterable[BatchResult], models: Sequence[str | ModelRef],
                  pairs: Sequence[tuple[int, int]] | None = None) -> list[BatchResult]:
    """`results` in list order (model, then tp_size, then ep_size as given), for a deterministic OUT file."""
    texts = [m if isinstance(m, str) else m.text for m in models]
    rank = {t: i for i, t in enumerate(texts)}
    pair_rank = {p: i for i, p in enumerate(pairs or ())}
    return sorted(results, key=lambda r: (rank.get(r.model, len(rank)), pair_rank.get((r.tp_size, r.ep_size), 0),
                                          r.tp_size, r.ep_size))
