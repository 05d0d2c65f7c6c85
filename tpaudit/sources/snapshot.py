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
optional. Unknown keys are ignored, so later versions may add some.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
from pathlib import Path
from typing import Any

from ..errors import SnapshotError
from ..model import SAFETENSORS_DTYPE_BYTES, CheckpointTensor, ModelSource

SNAPSHOT_SCHEMA = "tpaudit/snapshot/v1"
_GZIP_MAGIC = b"\x1f\x8b"


def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SnapshotError(f"cannot read {path}: {e.strerror or e}. Check the path", path=str(path)) from None
    try:
        if raw[:2] == _GZIP_MAGIC:
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SnapshotError(f"{path} is not a JSON (or gzip JSON) file: {e}. Record it again with "
                            "'tpaudit snapshot'", path=str(path)) from None


def _index(x) -> bool:
    """A non-negative int that is not a bool (JSON `true` would pass `isinstance(x, int)`)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def looks_like_snapshot(path: Path) -> bool:
    """True when `path` is meant as a snapshot: gzip data (a config.json is never compressed), or a JSON object with a
    `schema` key or the snapshot's `config` + `tensors` keys. A corrupt one is then reported as a snapshot error
    rather than mistaken for a config. Never raises."""
    try:
        with open(path, "rb") as f:
            if f.read(2) == _GZIP_MAGIC:
                return True
        data = _read_json(path)
    except (OSError, SnapshotError):
        return path.name.endswith((".json.gz", ".snapshot.json"))
    return isinstance(data, dict) and ("schema" in data or ("config" in data and "tensors" in data))


def load_snapshot(ref: str, data: dict | None = None) -> ModelSource:
    """Read a snapshot file.

    Args:
        ref (`str`): path of a `.json` or `.json.gz` snapshot.
        data (`dict`, *optional*): the already-parsed JSON, to avoid reading the file twice.

    Returns:
        `ModelSource` of kind `"snapshot"`, with the recorded repo, revision and commit.

    Raises:
        SnapshotError: unknown schema, or a malformed `config`, `files` or `tensors` entry (named in the message).
    """
    path = Path(ref)
    if data is None:
        data = _read_json(path)
    if not isinstance(data, dict):
        raise SnapshotError(f"{path} is not a JSON object", path=str(path))
    schema = data.get("schema")
    if schema != SNAPSHOT_SCHEMA:
        raise SnapshotError(f"{path} has schema {schema!r}; this tpaudit reads {SNAPSHOT_SCHEMA!r}. Record it again "
                            "with this version's 'tpaudit snapshot'", path=str(path))
    config = data.get("config")
    if not isinstance(config, dict):
        raise SnapshotError(f"{path}: 'config' must be the config.json object", path=str(path))
    files = data.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise SnapshotError(f"{path}: 'files' must be a list of shard file names", path=str(path))
    raw_tensors = data.get("tensors")
    tensors: tuple[CheckpointTensor, ...] | None = None
    if raw_tensors is not None:
        if not isinstance(raw_tensors, list):
            raise SnapshotError(f"{path}: 'tensors' must be a list or null", path=str(path))
        out = []
        for i, entry in enumerate(raw_tensors):
            try:
                name, dtype, shape, file_index = entry
                if not isinstance(name, str) or dtype not in SAFETENSORS_DTYPE_BYTES:
                    raise ValueError
                if not isinstance(shape, list) or not all(_index(x) for x in shape):
                    raise ValueError
                if file_index is not None and not _index(file_index):
                    raise ValueError
                file = files[file_index] if file_index is not None else None
            except (ValueError, TypeError, IndexError):
                raise SnapshotError(f"{path}: tensors[{i}] = {str(entry)[:120]} is not [name, dtype, shape, file "
                                    "index]", path=str(path)) from None
            out.append(CheckpointTensor(name=name, dtype=dtype, shape=tuple(shape), file=file))
        tensors = tuple(out)
    source = data.get("source") or {}
    if not isinstance(source, dict):
        source = {}
    for key in ("repo_id", "revision", "commit"):
        if source.get(key) is not None and not isinstance(source[key], str):
            raise SnapshotError(f"{path}: source.{key} must be a string, not {source[key]!r}", path=str(path))
    notes = []
    if tensors is None:
        notes.append("config only: the snapshot records no checkpoint, so shapes come from the model built on the "
                     "meta device and bytes from the config's dtype")
    return ModelSource(ref=ref, kind="snapshot", config=config, tensors=tensors,
                       repo_id=source.get("repo_id"), revision=source.get("revision"), commit=source.get("commit"),
                       config_path=str(path), notes=tuple(notes))


def snapshot_document(source: ModelSource, *, origin: str | None = None, recorded_by: str | None = None) -> dict:
    """The `tpaudit/snapshot/v1` JSON object for `source` (config and tensor table, as read)."""
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
            "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
            "recorded_by": recorded_by, "origin": origin}
    return {"schema": SNAPSHOT_SCHEMA, "source": {k: v for k, v in meta.items() if v is not None},
            "config": source.config, "files": files, "tensors": rows}


def write_snapshot(source: ModelSource, path: str | Path, *, origin: str | None = None,
                   recorded_by: str | None = None) -> Path:
    """Write `source` as a snapshot file; gzip-compressed when `path` ends with `.gz`.

    Returns:
        The path written.

    Raises:
        SnapshotError: the file cannot be written.
    """
    path = Path(path)
    doc = snapshot_document(source, origin=origin, recorded_by=recorded_by)
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
