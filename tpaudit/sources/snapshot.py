"""Snapshot source: a recorded model's metadata in one file, for offline and reproducible checks.

Format `tpaudit/snapshot/v1` (JSON, optionally gzip-compressed; the reader detects gzip by its magic bytes):

```json
{
  "schema": "tpaudit/snapshot/v1",
  "source": {"repo_id": "Qwen/Qwen3-VL-30B-A3B-Instruct", "revision": "main", "commit": "<40 hex>",
             "recorded_at": "2026-11-30T10:00:00Z", "recorded_by": "tpaudit 0.1.0",
             "origin": "free text: where the data came from"},
  "config": {"...": "config.json, unchanged"},
  "files": ["model-00001-of-00013.safetensors", "..."],
  "tensors": [["model.language_model.embed_tokens.weight", "BF16", [151936, 2048], 0], "..."]
}
```

`tensors` lists every checkpoint tensor in on-disk order as `[name, safetensors dtype, shape, index into files or
null]`; `null` instead of the list records a config-only model. `source` fields other than `schema`-level keys are
optional, but `source` itself is an object (or absent) and each of its fields above a string (or null): a
snapshot whose `source` is anything else is refused, not read as if it had none. Unknown keys are ignored, so later
versions may add some.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
from itertools import chain
from pathlib import Path
from typing import Any

from ..errors import SnapshotError
from ..model import SAFETENSORS_DTYPE_BYTES, CheckpointTensor, ModelSource, checkpoint_tensors
from ..units import shorten
from .files import (JSON_MAX_DEPTH, SNAPSHOT_MAX_BYTES, gunzip_capped, json_depth_exceeds, load_json,
                    read_capped)
from .safetensors_header import MAX_DIM, MAX_ELEMENTS, MAX_RANK

SNAPSHOT_SCHEMA = "tpaudit/snapshot/v1"
_GZIP_MAGIC = b"\x1f\x8b"


def _read_json(path: Path) -> Any:
    """A snapshot's JSON: a regular file of at most `SNAPSHOT_MAX_BYTES`, gunzipped as a stream up to the same cap
    (a 6 MB gzip bomb stops at the cap), parsed with the caps of `files.load_json`."""
    def error(message: str) -> SnapshotError:
        return SnapshotError(message, path=str(path))

    raw = read_capped(path, "snapshot", SNAPSHOT_MAX_BYTES, error)
    if raw[:2] == _GZIP_MAGIC:
        raw = gunzip_capped(raw, "snapshot", str(path), SNAPSHOT_MAX_BYTES, error)
    return load_json(raw, "snapshot", str(path), error)


def looks_like_snapshot(path: Path) -> bool:
    """True when `path` is meant as a snapshot: gzip data (a config.json is never compressed), or a JSON object with a
    `schema` key or the snapshot's `config` + `tensors` keys. A corrupt one is then reported as a snapshot error
    rather than mistaken for a config. Never raises."""
    from .files import open_regular

    try:
        f, _ = open_regular(path, "snapshot", lambda m: SnapshotError(m, path=str(path)))
        with f:
            if f.read(2) == _GZIP_MAGIC:
                return True
        data = _read_json(path)
    except (OSError, SnapshotError):
        return path.name.endswith((".json.gz", ".snapshot.json"))
    return isinstance(data, dict) and ("schema" in data or ("config" in data and "tensors" in data))


def load_snapshot(ref: str, data: dict | None = None) -> ModelSource:
    """Read a snapshot file.

    The tensor table is validated as safetensors headers are (`safetensors_header`): a known dtype, a shape of at
    most 8 non-negative JSON integers (no bools, floats or strings) each at most 2^53, at most 2^53 elements, a
    file index into `files` or null, and no tensor name twice.

    Args:
        ref (`str`): path of a `.json` or `.json.gz` snapshot.
        data (`dict`, *optional*): the already-parsed JSON, to avoid reading the file twice.

    Returns:
        `ModelSource` of kind `"snapshot"`, with the recorded repo, revision and commit.

    Raises:
        SnapshotError: not a regular file, over the size cap (compressed or not), corrupt gzip, not JSON, unknown
            schema, a config nested too deeply, or a malformed `config`, `files` or `tensors` entry (named in the
            message).
    """
    path = Path(ref)
    if data is None:
        data = _read_json(path)
    if not isinstance(data, dict):
        raise SnapshotError(f"{path} is not a JSON object", path=str(path))
    schema = data.get("schema")
    if schema != SNAPSHOT_SCHEMA:
        raise SnapshotError(f"{path} has schema {str(schema)[:80]!r}; this tpaudit reads {SNAPSHOT_SCHEMA!r}. Record "
                            "it again with this version's 'tpaudit snapshot'", path=str(path))
    config = data.get("config")
    if not isinstance(config, dict):
        raise SnapshotError(f"{path}: 'config' must be the config.json object", path=str(path))
    if json_depth_exceeds(config, JSON_MAX_DEPTH):
        raise SnapshotError(f"{path}: 'config' nests arrays/objects more than {JSON_MAX_DEPTH} levels deep, which no "
                            "real config.json does. Record the snapshot again", path=str(path))
    files = data.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise SnapshotError(f"{path}: 'files' must be a list of shard file names", path=str(path))
    raw_tensors = data.get("tensors")
    tensors: tuple[CheckpointTensor, ...] | None = None
    if raw_tensors is not None:
        if not isinstance(raw_tensors, list):
            raise SnapshotError(f"{path}: 'tensors' must be a list or null", path=str(path))
        tensors = _tensor_rows(raw_tensors, files, path)
    source = data.get("source")
    if source is None:
        source = {}
    if not isinstance(source, dict):
        raise SnapshotError(f"{path}: 'source' must be an object (repo_id, revision, commit, ...) or absent, not "
                            f"{json.dumps(source)[:80]}. Record the snapshot again", path=str(path))
    for key in SOURCE_TEXT_KEYS:
        if source.get(key) is not None and not isinstance(source[key], str):
            raise SnapshotError(f"{path}: source.{key} must be a string, not {json.dumps(source[key])[:80]}",
                                path=str(path))
    notes = []
    if tensors is None:
        notes.append("config only: the snapshot records no checkpoint, so shapes come from the model built on the "
                     "meta device and bytes from the config's dtype")
    return ModelSource(ref=ref, kind="snapshot", config=config, tensors=tensors,
                       repo_id=source.get("repo_id"), revision=source.get("revision"), commit=source.get("commit"),
                       config_path=str(path), notes=tuple(notes))


SOURCE_TEXT_KEYS = ("repo_id", "revision", "commit", "recorded_at", "recorded_by", "origin")
"""The fields of a snapshot's `source` (all optional text)."""


def _tensor_rows(rows: list, files: list[str], path: Path) -> tuple[CheckpointTensor, ...]:
    """`[name, dtype, shape, file index or null]` rows -> tensors, each row checked (see `load_snapshot`).

    The common case is checked in bulk (a few passes of C-level `map`/`set` over all rows); only when a bulk check
    fails are the rows walked one by one, to name the first bad row."""
    fast = _tensor_rows_bulk(rows, files)
    if fast is not None:
        return fast
    return _tensor_rows_one_by_one(rows, files, path)


def _tensor_rows_bulk(rows: list, files: list[str]) -> tuple[CheckpointTensor, ...] | None:
    """The rows as tensors when every row passes every check, else `None` (the caller then finds the bad row)."""
    if not rows:
        return ()
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {4}:
        return None
    names, dtypes, shapes, indices = zip(*rows)
    if set(map(type, names)) != {str} or len(set(names)) != len(names):
        return None
    if set(map(type, dtypes)) != {str} or not set(dtypes) <= SAFETENSORS_DTYPE_BYTES.keys():
        return None
    if set(map(type, shapes)) != {list} or max(map(len, shapes)) > MAX_RANK:
        return None
    dims = list(chain.from_iterable(shapes))
    if dims and (set(map(type, dims)) != {int} or min(dims) < 0 or max(dims) > MAX_DIM):
        return None
    if max(map(math.prod, shapes)) > MAX_ELEMENTS:
        return None
    nfiles = len(files)
    given = [i for i in indices if i is not None]
    if given and (set(map(type, given)) != {int} or min(given) < 0 or max(given) >= nfiles):
        return None
    table = [None if i is None else files[i] for i in indices]
    return checkpoint_tensors(names, dtypes, map(tuple, shapes), table)


def _tensor_rows_one_by_one(rows: list, files: list[str], path: Path) -> tuple[CheckpointTensor, ...]:
    out = []
    seen: set[str] = set()
    nfiles = len(files)
    for i, entry in enumerate(rows):
        if type(entry) is not list or len(entry) != 4:
            raise _bad_row(path, i, entry, "is not [name, dtype, shape, file index]")
        name, dtype, shape, file_index = entry
        if type(name) is not str:
            raise _bad_row(path, i, entry, "has a name that is not a string")
        if type(dtype) is not str or dtype not in SAFETENSORS_DTYPE_BYTES:
            raise _bad_row(path, i, entry, f"has dtype {str(dtype)[:40]!r}, which safetensors does not define (or "
                                           "tpaudit cannot size)")
        if type(shape) is not list or len(shape) > MAX_RANK:
            raise _bad_row(path, i, entry, f"has a shape that is not a list of at most {MAX_RANK} dimensions")
        for d in shape:
            if type(d) is not int or d < 0 or d > MAX_DIM:
                raise _bad_row(path, i, entry, "has a shape that is not a list of non-negative integers of at most "
                                               "2^53")
        if math.prod(shape) > MAX_ELEMENTS:
            raise _bad_row(path, i, entry, "has more than 2^53 elements")
        if file_index is None:
            file = None
        elif type(file_index) is int and 0 <= file_index < nfiles:
            file = files[file_index]
        else:
            raise _bad_row(path, i, entry, f"has file index {str(file_index)[:20]}, not an index into 'files' "
                                           f"({nfiles} entries) or null")
        if name in seen:
            raise _bad_row(path, i, entry, "names a tensor an earlier row already lists")
        seen.add(name)
        out.append(CheckpointTensor(name, dtype, tuple(shape), file))
    return tuple(out)


def _bad_row(path: Path, i: int, entry: Any, why: str) -> SnapshotError:
    text = shorten(json.dumps(entry, default=str), 120, words=False)
    return SnapshotError(f"{path}: tensors[{i}] = {text} {why}. Record the snapshot again with 'tpaudit snapshot'",
                         path=str(path))


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def snapshot_document(source: ModelSource, *, origin: str | None = None, recorded_by: str | None = None,
                      recorded_at: str | None = None) -> dict:
    """The `tpaudit/snapshot/v1` JSON object for `source` (config and tensor table, as read); `recorded_at` (ISO 8601
    UTC) defaults to now."""
    files: list[str] = []
    file_index: dict[str, int] = {}
    rows = None
    if source.tensors is not None:
        rows = []
        for t in source.tensors:
            idx = None
            if t.file is not None:
                idx = file_index.setdefault(t.file, len(files))
                if idx == len(files):
                    files.append(t.file)
            rows.append([t.name, t.dtype, list(t.shape), idx])
    meta = {"repo_id": source.repo_id, "revision": source.revision, "commit": source.commit,
            "recorded_at": recorded_at or _utc_now(),
            "recorded_by": recorded_by, "origin": origin}
    return {"schema": SNAPSHOT_SCHEMA, "source": {k: v for k, v in meta.items() if v is not None},
            "config": source.config, "files": files, "tensors": rows}


def write_snapshot(source: ModelSource, path: str | Path, *, origin: str | None = None,
                   recorded_by: str | None = None, recorded_at: str | None = None) -> Path:
    """Write `source` as a snapshot file; gzip-compressed when `path` ends with `.gz`.

    Args:
        source (`ModelSource`): the config and tensor table to record.
        path (`str` or `Path`): the file to write.
        origin (`str`, *optional*): free text stored as `source.origin`: where the data came from.
        recorded_by (`str`, *optional*): the tool that recorded it.
        recorded_at (`str`, *optional*): ISO 8601 UTC time stored as `source.recorded_at`; defaults to now (pass the
            old value to regenerate a snapshot without changing it).

    Returns:
        The path written.

    Raises:
        SnapshotError: the file cannot be written.
    """
    path = Path(path)
    doc = snapshot_document(source, origin=origin, recorded_by=recorded_by, recorded_at=recorded_at)
    # One tensor per line keeps snapshots diffable in review.
    head = {k: v for k, v in doc.items() if k != "tensors"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "tensors": '
    if doc["tensors"] is None:
        text += "null\n}\n"
    else:
        text += "[\n" + ",\n".join(json.dumps(row, separators=(",", ":")) for row in doc["tensors"]) + "\n ]\n}\n"
    raw = text.encode("utf-8")
    if path.suffix == ".gz":
        raw = gzip.compress(raw, mtime=0)
    try:
        path.write_bytes(raw)
    except OSError as e:
        raise SnapshotError(f"cannot write {path}: {e.strerror or e}. Check the directory exists and is writable",
                            path=str(path)) from None
    return path
