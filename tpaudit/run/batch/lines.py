"""One line of the batch (`BatchResult`, schema `tpaudit/batch/v1`) and reading a results file back, validated line
by line."""


from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

from ...errors import UsageError
from .model_list import LINE_MAX_BYTES, RESULTS_MAX_BYTES, _capped_lines

BATCH_SCHEMA = "tpaudit/batch/v1"

Status = Literal["ok", "error"]


# ----------------------------------------------------------------------------------------------------------------------
# One line of the batch
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchResult:
    """One (model, tp_size, ep_size) of a batch: one JSON line of OUT (`to_json`, schema `tpaudit/batch/v1`).

    Attributes:
        model (`str`): the reference as written in the list (with its `@revision`).
        tp_size (`int`), ep_size (`int`): the sizes simulated.
        status (`"ok" | "error"`): `error` when the model could not be audited at these sizes (unreadable, refused
            by transformers, an internal error); `ok` otherwise, with or without findings.
        exit_code (`int`): what `tpaudit check` would return for it: 0 clean, 1 error findings, 2 bad input, 4
            internal error.
        worst_rank_param_bytes (`int`, *optional*): bytes of parameters on the rank holding the most (`None` for
            an error line).
        total_param_bytes (`int`, *optional*): bytes of the whole model (tied pairs once).
        replicated_bytes (`int`, *optional*): bytes every rank holds whole because nothing shards them.
        errors (`int`), warnings (`int`), notes (`int`): findings by severity.
        findings (`tuple[dict, ...]`): every finding as in `check --format json` (`code`, `kind`, `severity`,
            `target`, `message`, `fix`, `facts`).
        seconds (`float`): wall time of the audit when it was computed (a cached line keeps its original time).
        reason (`str`, *optional*): for an error line, the one-line reason (`check`'s stderr message).
        architecture (`str`, *optional*): the model class built.
        commit (`str`, *optional*): the Hub commit resolved (or recorded in a snapshot).
        model_sha256 (`str`, *optional*): sha256 of the config and tensor listing (`model_sha256`); `None` when
            the source could not be read.
        key (`str`, *optional*): the cache key (`result_key`); `None` when the line is not cacheable.
        cached (`bool`): the line was served from the cache or from the OUT file of an interrupted run.
        cache_problem (`str`, *optional*): why a computed line was not served from the cache although it was asked:
            its entry was refused (not authenticated by this user's cache key, copied, corrupt, a FIFO), or there is
            no usable cache key. In the JSON line only when set.
    """

    model: str
    tp_size: int
    ep_size: int
    status: Status
    exit_code: int
    worst_rank_param_bytes: int | None = None
    total_param_bytes: int | None = None
    replicated_bytes: int | None = None
    errors: int = 0
    warnings: int = 0
    notes: int = 0
    findings: tuple[dict, ...] = ()
    seconds: float = 0.0
    reason: str | None = None
    architecture: str | None = None
    commit: str | None = None
    model_sha256: str | None = None
    key: str | None = None
    cached: bool = False
    cache_problem: str | None = None

    @property
    def id(self) -> tuple[str, int, int]:
        """`(model, tp_size, ep_size)`: what identifies a line within a batch and across runs."""
        return (self.model, self.tp_size, self.ep_size)

    @property
    def replicated_share(self) -> float | None:
        """`replicated_bytes / total_param_bytes`, `None` for an error line or an empty model."""
        if not self.total_param_bytes or self.replicated_bytes is None:
            return None
        return self.replicated_bytes / self.total_param_bytes

    @property
    def error_targets(self) -> tuple[str, ...]:
        """`code:target` of every error-severity finding (the identity `--baseline` and `--compare` use)."""
        return tuple(f"{f.get('code')}:{f.get('target')}" for f in self.findings if f.get("severity") == "error")

    def to_json(self) -> dict[str, Any]:
        """The JSON line (a dict; sizes are integer bytes)."""
        return {"schema": BATCH_SCHEMA, "model": self.model, "tp_size": self.tp_size, "ep_size": self.ep_size,
                "status": self.status, "exit_code": self.exit_code,
                "worst_rank_param_bytes": self.worst_rank_param_bytes, "total_param_bytes": self.total_param_bytes,
                "replicated_bytes": self.replicated_bytes, "errors": self.errors, "warnings": self.warnings,
                "notes": self.notes, "findings": list(self.findings), "seconds": round(self.seconds, 3),
                "reason": self.reason, "architecture": self.architecture, "commit": self.commit,
                "model_sha256": self.model_sha256, "key": self.key, "cached": self.cached,
                **({"cache_problem": self.cache_problem} if self.cache_problem else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "BatchResult":
        """Read back a line written by `to_json`, checking every field (unknown keys are ignored).

        A line is data from a file someone else may have written (an OUT file, `--compare`, a cache entry): its
        schema, every type and range is checked, and so is what the fields imply of each other (an `ok` line has
        byte counts and exit code 0 or 1 as its error findings say; counts match the findings).

        Raises:
            ValueError: naming the first field that is missing, of the wrong type or out of range.
        """
        problem = line_problem(data)
        if problem:
            raise ValueError(f"not a tpaudit batch line: {problem}")
        return cls(model=data["model"], tp_size=data["tp_size"], ep_size=data["ep_size"], status=data["status"],
                   exit_code=data["exit_code"], worst_rank_param_bytes=data.get("worst_rank_param_bytes"),
                   total_param_bytes=data.get("total_param_bytes"), replicated_bytes=data.get("replicated_bytes"),
                   errors=data.get("errors", 0), warnings=data.get("warnings", 0), notes=data.get("notes", 0),
                   findings=tuple(data.get("findings") or ()), seconds=float(data.get("seconds") or 0.0),
                   reason=data.get("reason"), architecture=data.get("architecture"), commit=data.get("commit"),
                   model_sha256=data.get("model_sha256"), key=data.get("key"), cached=data.get("cached", False),
                   cache_problem=data.get("cache_problem"))


EXIT_CODES = (0, 1, 2, 4)
_SEVERITIES = ("error", "warning", "note")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def line_problem(data) -> str | None:
    """Why `data` is not a well-formed batch line (`None` when it is): the contract of `BatchResult.to_json`.

    Checked: `schema`; `model` a string; `tp_size`, `ep_size` integers >= 1; `status` `ok`/`error`; `exit_code`
    one of 0, 1, 2, 4 and consistent with the status (an `ok` line: 1 exactly when it has error findings; an `error`
    line: 2 or 4, with a `reason`); byte counts integers >= 0 (present on `ok` lines, worst rank and replicated at
    most the total); `errors`/`warnings`/`notes` integers that count the `findings` by severity; each finding an
    object with string `code`, `target` and a known `severity`; `seconds` a finite number >= 0; the optional strings
    strings, `model_sha256` and `key` 64 hex digits, `cached` a bool.
    """
    if not isinstance(data, dict):
        return f"a line is a JSON object, not {type(data).__name__}"
    if data.get("schema", BATCH_SCHEMA) != BATCH_SCHEMA:
        return f"schema {str(data.get('schema'))[:60]!r} is not {BATCH_SCHEMA}"
    for name in ("model", "tp_size", "ep_size", "status", "exit_code"):
        if name not in data:
            return f"{name} is missing"
    if not isinstance(data["model"], str):
        return "model is not a string"
    for name in ("tp_size", "ep_size"):
        if not _is_int(data[name]) or data[name] < 1:
            return f"{name} {str(data[name])[:40]} is not a positive integer"
    status, code = data["status"], data["exit_code"]
    if status not in ("ok", "error"):
        return f"status {str(status)[:40]!r} is neither ok nor error"
    if not _is_int(code) or code not in EXIT_CODES:
        return f"exit_code {str(code)[:40]} is not one of {', '.join(map(str, EXIT_CODES))}"
    sizes = {}
    for name in ("worst_rank_param_bytes", "total_param_bytes", "replicated_bytes"):
        value = data.get(name)
        if value is None:
            if status == "ok":
                return f"{name} is missing from an ok line"
            continue
        if not _is_int(value) or value < 0:
            return f"{name} {str(value)[:40]} is not a byte count (an integer >= 0)"
        sizes[name] = value
    if status == "ok" and (sizes["worst_rank_param_bytes"] > sizes["total_param_bytes"]
                           or sizes["replicated_bytes"] > sizes["total_param_bytes"]):
        return "worst_rank_param_bytes or replicated_bytes exceeds total_param_bytes"
    findings = data.get("findings", [])
    if not isinstance(findings, list):
        return "findings is not a list"
    counts = dict.fromkeys(_SEVERITIES, 0)
    for i, f in enumerate(findings):
        if not isinstance(f, dict):
            return f"findings[{i}] is not an object"
        if not isinstance(f.get("code"), str) or not isinstance(f.get("target"), str):
            return f"findings[{i}] has no string code and target"
        if f.get("severity") not in _SEVERITIES:
            return f"findings[{i}].severity {str(f.get('severity'))[:20]!r} is not error, warning or note"
        for name, kinds in (("message", (str,)), ("kind", (str,)), ("fix", (str, type(None))), ("facts", (dict,))):
            if name in f and not isinstance(f[name], kinds):
                return f"findings[{i}].{name} has the wrong type"
        counts[f["severity"]] += 1
    for severity, name in (("error", "errors"), ("warning", "warnings"), ("note", "notes")):
        value = data.get(name, 0)
        if not _is_int(value) or value < 0:
            return f"{name} {str(value)[:40]} is not a count (an integer >= 0)"
        if value != counts[severity]:
            return f"{name} = {value}, but the line has {counts[severity]} {severity} finding(s)"
    if status == "ok" and code != (1 if counts["error"] else 0):
        return f"exit_code {code} of an ok line with {counts['error']} error finding(s)"
    if status == "error" and (code not in (2, 4) or not isinstance(data.get("reason"), str)):
        return "an error line has exit code 2 or 4 and a reason"
    seconds = data.get("seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or \
            seconds < 0:
        return f"seconds {str(seconds)[:40]} is not a duration"
    for name in ("reason", "architecture", "commit", "model_sha256", "key", "cache_problem"):
        if data.get(name) is not None and not isinstance(data[name], str):
            return f"{name} is not a string"
    for name in ("model_sha256", "key"):
        if data.get(name) is not None and not _HEX64.match(data[name]):
            return f"{name} is not 64 hex digits"
    if not isinstance(data.get("cached", False), bool):
        return "cached is not true or false"
    return None


def read_results(path: str | os.PathLike, *, partial_ok: bool = False, what: str = "batch results file") \
        -> list[BatchResult]:
    """Read an OUT file (JSON lines of `BatchResult`), checking every line (`line_problem`).

    The file must be a regular file (a directory, FIFO or device is refused before any read) of at most
    `RESULTS_MAX_BYTES`, with lines of at most `LINE_MAX_BYTES`.

    Args:
        path (`str` or `os.PathLike`): the file.
        partial_ok (`bool`, *optional*, defaults to `False`): skip lines that do not parse or do not check out (the
            last line of an interrupted run may be cut short; `--resume` recomputes whatever it skips) instead of
            failing.
        what (`str`, *optional*): what the file is, for messages (`"--compare file"`).

    Returns:
        `list[BatchResult]`, in file order.

    Raises:
        UsageError: the file cannot be read (missing, not a regular file, over a cap), or (unless `partial_ok`) a
            line is not a well-formed batch result.
    """
    from ...sources.files import load_json

    def error(message: str) -> UsageError:
        return UsageError(message)

    out = []
    for number, raw in enumerate(_capped_lines(path, what, max_bytes=RESULTS_MAX_BYTES, max_line=LINE_MAX_BYTES,
                                               error=error), start=1):
        if not raw.strip():
            continue
        try:
            out.append(BatchResult.from_json(load_json(raw, what, str(path), max_depth=64)))
        except ValueError as e:  # InputError (not JSON, too deep) is a ValueError too
            if partial_ok:
                continue
            raise UsageError(f"{path} line {number} is not a tpaudit batch result: {e}. Pass an OUT file "
                             "written by 'tpaudit batch -o'") from None
    return out
