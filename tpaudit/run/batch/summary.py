"""The summary of a batch and the comparison with a previous results file."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ...errors import ExitCode
from .cache import installed_versions
from .lines import BatchResult


@dataclass(frozen=True)
class Change:
    """One difference between two OUT files, for one line.

    Attributes:
        model (`str`), tp_size (`int`), ep_size (`int`): the line.
        what (`str`): the error that appeared or went away (`code:target` of a finding, or `unreadable: <reason>`),
            or `worst_rank_param_bytes` for a size change.
        old_bytes (`int`, *optional*), new_bytes (`int`, *optional*): worst-rank bytes before and after.
    """

    model: str
    tp_size: int
    ep_size: int
    what: str
    old_bytes: int | None = None
    new_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The change as a JSON object (bytes as integers)."""
        return {"model": self.model, "tp_size": self.tp_size, "ep_size": self.ep_size, "what": self.what,
                "old_bytes": self.old_bytes, "new_bytes": self.new_bytes}


@dataclass(frozen=True)
class BatchComparison:
    """What changed between a previous OUT file and this batch (lines matched by model, tp_size, ep_size).

    Attributes:
        previous (`str`): the previous OUT file.
        new_errors (`tuple[Change, ...]`): errors present now and not before: error findings (`code:target`) new to
            a line, a line that became unreadable, and the errors of lines the previous file did not have.
        fixed_errors (`tuple[Change, ...]`): errors of the previous file gone from the same line now.
        worse (`tuple[Change, ...]`), better (`tuple[Change, ...]`): lines whose worst-rank bytes grew / shrank.
        added (`int`), removed (`int`): lines only in this batch / only in the previous file.
    """

    previous: str
    new_errors: tuple[Change, ...] = ()
    fixed_errors: tuple[Change, ...] = ()
    worse: tuple[Change, ...] = ()
    better: tuple[Change, ...] = ()
    added: int = 0
    removed: int = 0

    def to_json(self) -> dict[str, Any]:
        """The comparison as a JSON object."""
        return {"previous": self.previous, "new_errors": [c.to_json() for c in self.new_errors],
                "fixed_errors": [c.to_json() for c in self.fixed_errors], "worse": [c.to_json() for c in self.worse],
                "better": [c.to_json() for c in self.better], "added": self.added, "removed": self.removed}


def _error_set(line: BatchResult) -> list[str]:
    if line.status == "error":
        return [f"unreadable: {line.reason}"]
    return list(dict.fromkeys(line.error_targets))


def compare(old: Iterable[BatchResult], new: Iterable[BatchResult], previous: str = "") -> BatchComparison:
    """Compare two batches line by line (see `BatchComparison`).

    An error line's identity is its status (`unreadable: ...`), not the exact wording of its reason, so a model that
    stays unreadable for a new reason is neither new nor fixed.

    Args:
        old (`Iterable[BatchResult]`): the previous OUT file's lines (`read_results`).
        new (`Iterable[BatchResult]`): this batch's lines.
        previous (`str`, *optional*): the previous file's name, for the report.

    Returns:
        `BatchComparison`.
    """
    before = {r.id: r for r in old}
    after = {r.id: r for r in new}
    new_errors: list = []
    fixed: list = []
    worse: list = []
    better: list = []

    def identity(what: str) -> str:
        return "unreadable" if what.startswith("unreadable: ") else what

    for key, line in after.items():
        was = before.get(key)
        now_errors = _error_set(line)
        old_errors = {identity(e) for e in _error_set(was)} if was else set()
        new_errors += [Change(*key, what=e) for e in now_errors if identity(e) not in old_errors]
        if was is None:
            continue
        now_ids = {identity(e) for e in now_errors}
        fixed += [Change(*key, what=e) for e in _error_set(was) if identity(e) not in now_ids]
        a, b = was.worst_rank_param_bytes, line.worst_rank_param_bytes
        if a is not None and b is not None and a != b:
            (worse if b > a else better).append(Change(*key, what="worst_rank_param_bytes", old_bytes=a,
                                                       new_bytes=b))
    return BatchComparison(previous=previous, new_errors=tuple(new_errors), fixed_errors=tuple(fixed),
                           worse=tuple(worse), better=tuple(better),
                           added=sum(1 for k in after if k not in before),
                           removed=sum(1 for k in before if k not in after))


CACHE_PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class BatchSummary:
    """A finished batch, counted: what every renderer draws (`tpaudit/report/batch.py`).

    Attributes:
        results (`tuple[BatchResult, ...]`): every line, in list order.
        pairs (`tuple[tuple[int, int], ...]`): the (tp_size, ep_size) pairs audited.
        models (`dict[str, int]`): models by status: `ok` (every line ran, no error finding), `findings` (every
            line ran, some has an error finding), `error` (some line could not run).
        lines (`dict[str, int]`): lines by status (`ok`, `error`).
        lines_with_errors (`int`): `ok` lines with at least one error finding (exit code 1).
        findings (`dict[str, int]`): findings of every line by severity (`error`, `warning`, `note`).
        computed (`int`), cached (`int`): lines audited in this run / served from the cache or an earlier OUT.
        seconds (`float`): wall time of the batch.
        worst (`tuple[BatchResult, ...]`): the lines with the most replicated bytes, largest first (ok lines with
            replicated bytes only).
        failed (`tuple[BatchResult, ...]`): the error lines, in list order.
        comparison (`BatchComparison`, *optional*): against `--compare OLD.jsonl`.
        exit_code (`int`): 0, or 1 (see `batch_exit_code`).
        refused (`tuple[str, ...]`): (tp, ep) combinations left out, with transformers' reason.
        versions (`dict[str, str | None]`): tpaudit, transformers, torch.
        cache_refused (`int`): computed lines whose cache entry was refused or for which the cache could not be
            used (`BatchResult.cache_problem`).
        cache_problems (`tuple[str, ...]`): their distinct reasons, at most `CACHE_PROBLEMS_SHOWN`.
    """

    results: tuple[BatchResult, ...]
    pairs: tuple[tuple[int, int], ...]
    models: dict[str, int]
    lines: dict[str, int]
    lines_with_errors: int
    findings: dict[str, int]
    computed: int
    cached: int
    seconds: float
    worst: tuple[BatchResult, ...]
    failed: tuple[BatchResult, ...]
    comparison: BatchComparison | None
    exit_code: int
    refused: tuple[str, ...] = ()
    versions: dict[str, str | None] = field(default_factory=dict)
    cache_refused: int = 0
    cache_problems: tuple[str, ...] = ()

    @property
    def model_count(self) -> int:
        """Models in the batch (every status)."""
        return sum(self.models.values())

    @property
    def models_per_minute(self) -> float | None:
        """Models finished per minute of wall time (`None` for an instant batch)."""
        return self.model_count * 60.0 / self.seconds if self.seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The counts as a JSON object (schema `tpaudit/batch-summary/v1`; lines named by `[model, tp, ep]`)."""
        return {"schema": "tpaudit/batch-summary/v1", "pairs": [list(p) for p in self.pairs], "models": self.models,
                "lines": self.lines, "lines_with_errors": self.lines_with_errors, "findings": self.findings,
                "computed": self.computed, "cached": self.cached, "seconds": round(self.seconds, 3),
                "worst": [r.id for r in self.worst], "failed": [r.id for r in self.failed],
                "comparison": self.comparison.to_json() if self.comparison else None, "exit_code": self.exit_code,
                "refused": list(self.refused), "versions": self.versions,
                **({"cache_refused": self.cache_refused, "cache_problems": list(self.cache_problems)}
                   if self.cache_refused else {})}


def batch_exit_code(results: Sequence[BatchResult], comparison: BatchComparison | None = None, *,
                    strict: bool = False) -> int:
    """The batch's exit code: 4 when some line is an internal error (a tpaudit bug); else 1 when some line has an
    error finding (with a comparison: when there is a new error instead), or with `strict` when some line could not
    run; else 0. Bad usage (exit 2) is raised before.

    Args:
        results (`Sequence[BatchResult]`): every line.
        comparison (`BatchComparison`, *optional*): from `compare`.
        strict (`bool`, *optional*, defaults to `False`): error lines (unreadable models) fail the batch too.

    Returns:
        `int`, 0, 1 or 4.
    """
    if any(r.exit_code == int(ExitCode.INTERNAL) for r in results):
        return int(ExitCode.INTERNAL)  # a tpaudit bug in some line is never a pass (run.executor's policy)
    if comparison is not None:
        failing = bool(comparison.new_errors)
    else:
        failing = any(r.status == "ok" and r.errors for r in results)
    if strict and any(r.status == "error" for r in results):
        failing = True
    return int(ExitCode.FINDINGS) if failing else int(ExitCode.OK)


def summarize(results: Iterable[BatchResult], *, pairs: Sequence[tuple[int, int]] = (), seconds: float = 0.0,
              comparison: BatchComparison | None = None, strict: bool = False, top: int = 10,
              refused: Sequence[str] = ()) -> BatchSummary:
    """Count a finished batch (see `BatchSummary`).

    Args:
        results (`Iterable[BatchResult]`): every line, in list order (`order_results`).
        pairs (`Sequence[tuple[int, int]]`, *optional*): the pairs audited.
        seconds (`float`, *optional*): wall time of the batch.
        comparison (`BatchComparison`, *optional*): from `compare`.
        strict (`bool`, *optional*, defaults to `False`): see `batch_exit_code`.
        top (`int`, *optional*, defaults to 10): how many worst offenders to keep.
        refused (`Sequence[str]`, *optional*): (tp, ep) combinations left out.

    Returns:
        `BatchSummary`.
    """
    results = tuple(results)
    by_model: dict[str, list[BatchResult]] = {}
    for r in results:
        by_model.setdefault(r.model, []).append(r)
    models = {"ok": 0, "findings": 0, "error": 0}
    for lines in by_model.values():
        if any(r.status == "error" for r in lines):
            models["error"] += 1
        elif any(r.errors for r in lines):
            models["findings"] += 1
        else:
            models["ok"] += 1
    ok = [r for r in results if r.status == "ok"]
    worst = sorted((r for r in ok if r.replicated_bytes), key=lambda r: (-r.replicated_bytes, r.id))[:top]
    return BatchSummary(
        results=results, pairs=tuple(pairs), models=models,
        lines={"ok": len(ok), "error": len(results) - len(ok)},
        lines_with_errors=sum(1 for r in ok if r.errors),
        findings={"error": sum(r.errors for r in results), "warning": sum(r.warnings for r in results),
                  "note": sum(r.notes for r in results)},
        computed=sum(1 for r in results if not r.cached), cached=sum(1 for r in results if r.cached),
        seconds=seconds, worst=tuple(worst), failed=tuple(r for r in results if r.status == "error"),
        comparison=comparison, exit_code=batch_exit_code(results, comparison, strict=strict),
        refused=tuple(refused), versions=installed_versions(),
        cache_refused=sum(1 for r in results if r.cache_problem and not r.cached),
        cache_problems=tuple(dict.fromkeys(r.cache_problem for r in results if r.cache_problem and not r.cached))
        [:CACHE_PROBLEMS_SHOWN])
