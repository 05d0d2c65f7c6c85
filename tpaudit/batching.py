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

Nothing here prints or exits; the command is `tpaudit/cli/batch.py`, the renderers `tpaudit/report/batch.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

from .errors import ExitCode, TpauditError, UnsupportedVersionError, UsageError
from .run.executor import RAY_INSTALL  # noqa: F401  (re-exported: the CLI and the API name it here)

BATCH_SCHEMA = "tpaudit/batch/v1"
CACHE_SCHEMA = "tpaudit/batch-cache/v1"

Status = Literal["ok", "error"]


# ----------------------------------------------------------------------------------------------------------------------
# The list of models
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelRef:
    """One model of a batch, as written in the list.

    Attributes:
        text (`str`): the reference exactly as written (with its `@revision`), used as `model` in every line.
        ref (`str`): what `open_source` is given: a Hub id, a local directory or `config.json`, a snapshot file.
        revision (`str`, *optional*): the Hub revision after `@` (branch, tag or commit).
        line (`int`, *optional*): the line number in the list file (1-based).
        problem (`str`, *optional*): why the entry cannot be a model reference; it becomes error lines.
    """

    text: str
    ref: str
    revision: str | None = None
    line: int | None = None
    problem: str | None = None


LIST_MAX_BYTES = 64 * 2**20
"""A LIST file: some 600,000 references of 100 characters."""
ENTRY_MAX_CHARS = 4096
"""One LIST line: a Hub id is at most 96 characters plus a revision; a path at most PATH_MAX (4,096 bytes)."""
RESULTS_MAX_BYTES = 4 * 2**30
"""An OUT or `--compare` file (JSON lines), read line by line."""
LINE_MAX_BYTES = 64 * 2**20
"""One JSON line of OUT, or one cache entry: a line of a model with thousands of findings takes a few MB."""


def parse_model_ref(text: str, line: int | None = None) -> ModelRef:
    """Split `org/name@revision` into reference and revision.

    An existing path is taken whole (a directory may contain `@`); otherwise the text after the last `@` is the
    revision. An empty reference or revision, or a NUL byte (no path or Hub id holds one), is not an exception: the
    `ModelRef` carries a `problem`, which the batch turns into error lines (exit code 2).

    Args:
        text (`str`): one entry of the list, without comment or surrounding blanks.
        line (`int`, *optional*): its line number, for messages.

    Returns:
        `ModelRef`.
    """
    text = text.strip()
    if "\x00" in text:
        return ModelRef(text, text, None, line, problem=f"{text!r} is not a model reference: it contains a NUL byte, "
                                                        "which no path or Hub id holds. Fix the list entry")
    if "@" in text and not os.path.exists(text):
        ref, _, revision = text.rpartition("@")
        if not ref or not revision:
            return ModelRef(text, ref or text, None, line,
                            problem=f"{text!r} is not a model reference: write org/name@revision with both parts")
        return ModelRef(text, ref, revision, line)
    return ModelRef(text, text, None, line)


_COMMENT = re.compile(r"\s#")


def _strip_comment(text: str) -> str:
    """The entry of one stripped, non-comment line: a `#` after a blank starts a comment, unless the text up to a
    later ` #` (or the whole line) names an existing file or directory, so a path containing ` #` stays whole."""
    cuts = [m.start() for m in _COMMENT.finditer(text)]
    if not cuts:
        return text
    for end in [len(text), *reversed(cuts)]:
        if os.path.exists(text[:end].rstrip()):
            return text[:end].rstrip()
    return text[:cuts[0]].rstrip()


def parse_list(lines: Iterable[str]) -> list[ModelRef]:
    """Model references from the lines of a list: one a line, blank lines and `#` comments ignored, duplicates
    (same text) kept once, in order.

    A `#` starts a comment at the start of a line, or after a blank (space or tab) unless the text before a later
    blank-`#` (or the whole line) names an existing file or directory: a path with ` #` in its name stays whole,
    and a comment after it is still one. Hub ids and revisions never contain `#` or blanks.

    Args:
        lines (`Iterable[str]`): the list's lines.

    Returns:
        `list[ModelRef]`, in list order.
    """
    out, seen = [], set()
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if text.startswith("#"):
            continue
        text = _strip_comment(text)
        if not text or text in seen:
            continue
        seen.add(text)
        out.append(parse_model_ref(text, number))
    return out


def _capped_lines(path: str | os.PathLike, what: str, *, max_bytes: int, max_line: int, error) -> Iterator[bytes]:
    """The lines (bytes, without the newline) of a regular file read with caps: a directory, FIFO or device is
    refused before any read (`sources.files.open_regular`), the file may hold at most `max_bytes` bytes and a line
    at most `max_line`; each is refused through `error(message)` naming the line."""
    from .sources.files import _human, open_regular

    f, size = open_regular(path, what, error)
    with f:
        if size > max_bytes:
            raise error(f"cannot read {what} {os.fspath(path)}: it is {size:,} bytes, over tpaudit's cap of "
                        f"{_human(max_bytes)} for a {what}. Pass the real {what}")
        total = 0
        number = 0
        while True:
            try:
                raw = f.readline(max_line + 1)
            except OSError as e:
                raise error(f"cannot read {what} {os.fspath(path)}: {e.strerror or e}. Check the file") from None
            if not raw:
                return
            number += 1
            total += len(raw)
            if total > max_bytes:
                raise error(f"cannot read {what} {os.fspath(path)}: it grew past tpaudit's cap of "
                            f"{_human(max_bytes)} for a {what}. Pass the real {what}")
            if len(raw) > max_line and not raw.endswith(b"\n"):
                raise error(f"cannot read {what} {os.fspath(path)}: line {number} is longer than {max_line:,} "
                            f"bytes, which no {'model reference' if what == 'model list' else 'line of it'} is. "
                            f"Pass the real {what}")
            yield raw.rstrip(b"\n")


def read_list(path: str | os.PathLike) -> list[ModelRef]:
    """Read a LIST file of model references (see `parse_list`).

    The file must be a regular file (a directory, FIFO or device is refused before any read) of at most
    `LIST_MAX_BYTES`, with lines of at most `ENTRY_MAX_CHARS` bytes, in UTF-8.

    Args:
        path (`str` or `os.PathLike`): a UTF-8 text file.

    Returns:
        `list[ModelRef]`, in list order.

    Raises:
        UsageError: the file cannot be read (missing, not a regular file, over a cap, not UTF-8), or names no model.
    """
    def error(message: str) -> UsageError:
        return UsageError(f"{message}. A LIST is a text file with one model reference a line")

    lines = []
    for number, raw in enumerate(_capped_lines(path, "model list", max_bytes=LIST_MAX_BYTES,
                                               max_line=ENTRY_MAX_CHARS, error=UsageError), start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError:
            raise error(f"the model list {path} is not UTF-8 text (line {number})") from None
    refs = parse_list(lines)
    if not refs:
        raise UsageError(f"the model list {path} names no model (only blank lines and # comments). Add one model "
                         "reference a line, e.g. Qwen/Qwen3-30B-A3B")
    return refs


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
                "model_sha256": self.model_sha256, "key": self.key, "cached": self.cached}

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
                   model_sha256=data.get("model_sha256"), key=data.get("key"), cached=data.get("cached", False))


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
    for name in ("reason", "architecture", "commit", "model_sha256", "key"):
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
    from .sources.files import load_json

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


# ----------------------------------------------------------------------------------------------------------------------
# Cache keys and the cache
# ----------------------------------------------------------------------------------------------------------------------
def installed_versions() -> dict[str, str | None]:
    """The versions a result depends on: tpaudit, transformers and torch (installed distribution metadata, so that
    the driver can compute keys without importing torch)."""
    from importlib import metadata

    from . import __version__

    def dist(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"tpaudit": __version__, "transformers": dist("transformers"), "torch": dist("torch")}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def model_sha256(source) -> str:
    """sha256 of what a model's audit reads from its source: `config.json` (canonical JSON, keys sorted) and the
    checkpoint's tensor listing (name, safetensors dtype, shape, in order; `null` for a config-only model). Shard file
    names, repo, commit and paths are not part of it: the same metadata gives the same results wherever it is read.

    Args:
        source (`ModelSource`): from `tpaudit.sources.open_source`.

    Returns:
        `str`, 64 hex digits.
    """
    tensors = None if source.tensors is None else [[t.name, t.dtype, list(t.shape)] for t in source.tensors]
    return hashlib.sha256(_canonical({"config": source.config, "tensors": tensors})).hexdigest()


def plan_sha256(plan: dict[str, str] | None) -> str | None:
    """sha256 of a `--plan`'s rules (canonical JSON: formatting and key order do not matter); `None` without one."""
    return None if plan is None else hashlib.sha256(_canonical(plan)).hexdigest()


def key_inputs(*, model_sha256: str, tp_size: int, ep_size: int, plan_sha256: str | None = None,
               dtype: str | None = None, versions: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Everything that determines one line, as the JSON object its cache key hashes (and its cache entry echoes).

    Args:
        model_sha256 (`str`): see `model_sha256`.
        tp_size (`int`), ep_size (`int`): the sizes.
        plan_sha256 (`str`, *optional*): see `plan_sha256`.
        dtype (`str`, *optional*): the load dtype (`None` for `"auto"`).
        versions (`dict`, *optional*): tpaudit, transformers, torch (default: `installed_versions()`).
    """
    v = versions if versions is not None else installed_versions()
    return {"schema": CACHE_SCHEMA, "tpaudit": v.get("tpaudit"), "transformers": v.get("transformers"),
            "torch": v.get("torch"), "model_sha256": model_sha256, "plan_sha256": plan_sha256, "dtype": dtype,
            "tp_size": tp_size, "ep_size": ep_size}


def result_key(*, model_sha256: str, tp_size: int, ep_size: int, plan_sha256: str | None = None,
               dtype: str | None = None, versions: dict[str, str | None] | None = None) -> str:
    """The cache key of one line: sha256 of everything that determines it (`key_inputs`, canonical JSON).

    Returns:
        `str`, 64 hex digits.
    """
    return _key_of(key_inputs(model_sha256=model_sha256, tp_size=tp_size, ep_size=ep_size, plan_sha256=plan_sha256,
                              dtype=dtype, versions=versions))


def _key_of(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(inputs)).hexdigest()


def default_cache_dir() -> Path:
    """`$TPAUDIT_CACHE`, else `tpaudit/batch` inside the Hugging Face cache folder (`$HF_HOME`, by default
    `~/.cache/huggingface`, as `huggingface_hub.constants.HF_HOME` resolves it)."""
    if os.environ.get("TPAUDIT_CACHE"):
        return Path(os.environ["TPAUDIT_CACHE"]).expanduser()
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HOME") or constants.HF_HOME).expanduser() / "tpaudit" / "batch"


@dataclass(frozen=True)
class ResultCache:
    """Batch results on disk, one JSON file per key (`<dir>/<key[:2]>/<key>.json`), written to a temporary file in
    the same folder and renamed into place (`os.replace`, atomic on POSIX and Windows), so readers never see a
    partial entry and concurrent writers of the same key simply leave one of two identical files.

    An entry is `{"schema", "key", "inputs", "result"}`: `inputs` echoes what the key hashes (`key_inputs`: model
    hash, sizes, plan hash, dtype, versions). It is validated, never trusted: it is used only when it is a regular
    file under `LINE_MAX_BYTES`, its inputs are exactly the requested ones and hash to its key, and its result is a
    well-formed line (`line_problem`) for the same sizes and model hash; anything else is a miss, recomputed and
    rewritten. A well-formed entry forged with a wrong result cannot be told from a real one, so a cache must not
    be shared with anyone whose results you would not take (README, "Cache").

    Attributes:
        directory (`str`): the cache folder (created on the first write).
    """

    directory: str

    def path(self, key: str) -> Path:
        """Where the entry of `key` lives."""
        return Path(self.directory) / key[:2] / f"{key}.json"

    def get(self, key: str, inputs: dict[str, Any] | None = None) -> dict | None:
        """The stored line of `key` (a `BatchResult.to_json()` dict), `None` on a miss or an entry that does not
        check out (see the class).

        Args:
            key (`str`): the key (`result_key`).
            inputs (`dict`, *optional*): what the key was made of (`key_inputs`); the entry must echo exactly these.
        """
        from .sources.files import load_json, read_capped

        def refuse(message: str) -> TpauditError:
            return UsageError(message)

        try:
            entry = load_json(read_capped(self.path(key), "cache entry", LINE_MAX_BYTES, refuse), "cache entry",
                              str(self.path(key)), refuse, max_depth=64)
        except TpauditError:  # missing, not a regular file (FIFO, device, directory), too large, not JSON
            return None
        if not isinstance(entry, dict) or entry.get("schema") != CACHE_SCHEMA or entry.get("key") != key:
            return None
        echo, result = entry.get("inputs"), entry.get("result")
        if not isinstance(echo, dict) or _key_of(echo) != key or (inputs is not None and echo != inputs):
            return None
        if line_problem(result) is not None or result.get("key") != key:
            return None
        if (result["tp_size"], result["ep_size"]) != (echo.get("tp_size"), echo.get("ep_size")) or \
                result.get("model_sha256") != echo.get("model_sha256"):
            return None
        return result

    def put(self, key: str, result: dict, inputs: dict[str, Any] | None = None) -> None:
        """Store `result` under `key`, echoing `inputs` (`key_inputs`). A cache that cannot be written is not an
        error: the batch goes on. A FIFO or other file squatting on the entry's name is replaced, not opened."""
        target = self.path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}-", suffix=".tmp", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"schema": CACHE_SCHEMA, "key": key, "inputs": inputs, "result": result}, f)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------------------------------
# The task: one model, every (tp_size, ep_size)
# ----------------------------------------------------------------------------------------------------------------------
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
    from .audit import Audit
    from .build import BuildOptions
    from .model import ParallelSizes

    try:
        audit = Audit(source, BuildOptions(plan_override=options.plan, dtype=options.dtype))
    except Exception as e:  # noqa: BLE001 - a model that does not build gives one error line per pair
        for tp, ep in pairs:
            yield tp, ep, e
        return
    for tp, ep in pairs:
        try:
            yield tp, ep, audit.report(ParallelSizes.of(tp, ep), parity="off")
        except Exception as e:  # noqa: BLE001 - one pair never stops the model's other pairs
            yield tp, ep, e


def audit_model(model: ModelRef | str, pairs: Sequence[tuple[int, int]],
                options: TaskOptions | None = None) -> list[BatchResult]:
    """Audit one model at every (tp_size, ep_size) of `pairs`, opening its source once.

    Each line comes from the cache when `options.cache_dir` holds its key (and `options.read_cache`), else from the
    pipeline (`tpaudit.audit.Audit`: built once, transformers' own plan resolution and TP code on the meta device), and
    is then stored in the cache.

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
        from .sources import open_source

        source = open_source(ref.ref, revision=ref.revision, token=options.token)
        digest = model_sha256(source)
    except Exception as e:  # noqa: BLE001 - an unreadable model is an error line, never a stopped batch
        seconds = time.perf_counter() - start
        return [_error_line(ref.text, tp, ep, e, seconds) for tp, ep in pairs]
    cache = ResultCache(options.cache_dir) if options.cache_dir else None
    found = installed_versions()
    plan_digest = plan_sha256(options.plan)
    inputs = {(tp, ep): key_inputs(model_sha256=digest, tp_size=tp, ep_size=ep, plan_sha256=plan_digest,
                                   dtype=options.dtype, versions=found) for tp, ep in pairs}
    keys = {pair: _key_of(value) for pair, value in inputs.items()}
    lines: dict[tuple[int, int], BatchResult] = {}
    if cache is not None and options.read_cache:
        for pair, key in keys.items():
            stored = cache.get(key, inputs[pair])  # validated: anything that does not check out is recomputed
            if stored is not None:
                lines[pair] = replace(BatchResult.from_json(stored), model=ref.text, cached=True,
                                      commit=source.commit)
    todo = [p for p in pairs if p not in lines]
    if todo:
        from .compat import backend

        backend()  # raises UnsupportedVersionError: no line of this batch can be computed
        from . import audit  # noqa: F401  torch and transformers: once per process, not part of a line's seconds
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
        lines[(tp, ep)] = line
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
    from ._process import tune_gc

    tune_gc()
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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
    from .run.executor import internal_error_reason

    ref, pairs = task
    if failure.kind == "internal":
        reason = internal_error_reason(failure.error, "'tpaudit check' on this model")
        return [BatchResult(model=ref.text, tp_size=tp, ep_size=ep, status="error", exit_code=failure.exit_code,
                            reason=reason) for tp, ep in pairs]
    return [_error_line(ref.text, tp, ep, WorkerStopped(failure.error), 0.0) for tp, ep in pairs]


def _run(tasks: list[Task], options: TaskOptions, jobs: int | None, executor: str, address: str | None) \
        -> Iterator[list[BatchResult]]:
    """Every task's lines, through the executor `scan` shares (`tpaudit.run.executor`)."""
    from .run.executor import TaskFailed, run_tasks

    for (ref, pairs, _), outcome in run_tasks(run_task, [(ref, pairs, options) for ref, pairs in tasks], jobs=jobs,
                                           executor=executor, ray_address=address, initializer=_worker_init,
                                           propagate=(UnsupportedVersionError,)):
        yield _failed_task((ref, pairs), outcome) if isinstance(outcome, TaskFailed) else outcome


def ray_available() -> bool:
    """Whether Ray can be imported (the `ray` extra: `pip install "tpaudit[ray]"`)."""
    from .run.executor import ray_available as available

    return available()


# ----------------------------------------------------------------------------------------------------------------------
# The batch
# ----------------------------------------------------------------------------------------------------------------------
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
    from .model import MAX_WORLD_SIZE, ParallelSizes

    tps, eps = list(dict.fromkeys(tp_sizes)), list(dict.fromkeys(ep_sizes))
    if not tps or not eps:
        raise UsageError("no tp_size given. Pass --tp 4,8")
    pairs, refused = [], []
    for tp in tps:
        for ep in eps:
            if tp < 1 or ep < 1:
                raise UsageError(f"--tp {tp} --ep {ep} is invalid: sizes must be positive integers. Pass --tp 4,8")
            if ep == 1 and tp <= MAX_WORLD_SIZE:
                pairs.append((tp, ep))
                continue
            try:
                ParallelSizes.of(tp, ep, names=("--tp", "--ep"))
                from .compat import PlanRejectedError, backend

                backend().distributed_config(tp, ep)
            except UsageError as e:
                refused.append(str(e))
                continue
            except PlanRejectedError as e:
                refused.append(f"--tp {tp} --ep {ep} is rejected by transformers: {e.detail}")
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
    from .compat import require_installed

    import multiprocessing

    if jobs is not None and jobs > 1 and getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UsageError("tpaudit.batch(..., jobs=%d) was called while a worker process was starting: the calling "
                         "script re-runs in every worker. Put the call under `if __name__ == \"__main__\":`" % jobs)
    if executor not in ("local", "ray"):
        raise UsageError(f"executor {executor!r} is not known. Pass local or ray")
    if executor == "ray" and not ray_available():
        raise UsageError(f"--executor ray needs Ray, which is not installed. Install it with: {RAY_INSTALL}")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs} is invalid: pass 1 or more worker processes")
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
        from .build import load_plan_file

        plan = load_plan_file(str(plan))
    elif plan is not None:
        from .build import validate_plan

        validate_plan(plan)
    cache_dir = None if cache is False else str(default_cache_dir() if cache is True else Path(cache))
    options = TaskOptions(plan=plan, dtype=dtype, token=token, cache_dir=cache_dir, read_cache=not refresh)

    return _generate(refs, pairs, options, previous, jobs=jobs, executor=executor, ray_address=ray_address)


def _generate(refs: list[ModelRef], pairs: list[tuple[int, int]], options: TaskOptions,
              previous: Iterable[BatchResult], *, jobs: int | None, executor: str, ray_address: str | None) \
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
            if (ref.text, *p) in reused:
                yield reused[(ref.text, *p)]
        if todo:
            tasks.append((ref, todo))
    if not tasks:
        return
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


# ----------------------------------------------------------------------------------------------------------------------
# Summary and comparison
# ----------------------------------------------------------------------------------------------------------------------
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
    new_errors, fixed, worse, better = [], [], [], []

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
                "refused": list(self.refused), "versions": self.versions}


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
        refused=tuple(refused), versions=installed_versions())
