"""The parity verdict cache: a repeat check of the same model and plan spends no time on the parity check.

One JSON file per key under the cache folder, written atomically (a temporary file in the same folder, then
`os.replace`), as the batch cache writes its lines:

- **where**: `$TPAUDIT_PARITY_CACHE` when set; else a `parity` folder inside `$TPAUDIT_CACHE` (the batch cache's
  folder) when that is set; else `$HF_HOME/tpaudit/parity`, beside the batch cache's default `$HF_HOME/tpaudit/batch`
  (`HF_HOME` as `huggingface_hub.constants.HF_HOME` resolves it). `TPAUDIT_NO_PARITY_CACHE=1` neither reads nor
  writes it.
- **key**: the sha256 of a canonical JSON of everything the result depends on: the tpaudit, transformers and torch
  versions and `ENGINE` (the parity check's own revision), the real config (every attribute: the small config is a
  function of it and the tp size), the model class, the plan under review, tp and ep sizes, the checkpoint layout (the
  sha256 of its generic tensor names), the blocks the static facts say cannot split, and why the check runs.
- **trust**: an entry is used only when it parses, is at most `MAX_ENTRY_BYTES`, names this schema, echoes the key it
  is filed under (and its recorded inputs hash to that key), and every field of its result has the type the data
  model declares (`ParityResult.from_json`). Anything else (truncated, corrupt, forged, another version's) is ignored
  and the check runs and rewrites it. A folder that cannot be read or written is ignored too: the cache is a speed-up,
  never a source of verdicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ..model import ParityResult

SCHEMA = "tpaudit/parity-cache/v1"
ENGINE = 2
"""Bumped when the parity check's verdicts change meaning for the same inputs (a new tpaudit release also does)."""
MAX_ENTRY_BYTES = 4 << 20
NOT_NEEDED = "not needed"
VOLATILE_CONFIG_KEYS = ("_name_or_path",)
"""Config entries that say where the config was read from (a temporary folder for a snapshot), not what it is."""


def cache_dir() -> Path | None:
    """The cache folder (see the module docstring), or `None` when the cache is switched off."""
    if os.environ.get("TPAUDIT_NO_PARITY_CACHE", "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    if os.environ.get("TPAUDIT_PARITY_CACHE"):
        return Path(os.environ["TPAUDIT_PARITY_CACHE"]).expanduser()
    if os.environ.get("TPAUDIT_CACHE"):
        return Path(os.environ["TPAUDIT_CACHE"]).expanduser() / "parity"
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HOME") or constants.HF_HOME).expanduser() / "tpaudit" / "parity"


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value) -> str:
    """sha256 (hex) of the canonical JSON of `value`."""
    return hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def inputs(*, config, model_class: str, plan: dict | None, tp_size: int, ep_size: int, checkpoint_names,
           head_limited: dict | None, why: str) -> dict:
    """What a parity result depends on (see the module docstring), as a JSON-able dict."""
    from ..compat import installed_version
    from .. import __version__

    names = sorted(checkpoint_names) if checkpoint_names is not None else None
    values = {k: v for k, v in config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS}
    return {"engine": ENGINE, "tpaudit": __version__, "transformers": installed_version("transformers"),
            "torch": installed_version("torch"), "model_type": getattr(config, "model_type", None),
            "config": json.loads(_canonical(values)), "model_class": model_class,
            "plan": dict(plan) if plan is not None else None, "tp_size": tp_size, "ep_size": ep_size,
            "checkpoint": digest(names) if names is not None else None,
            "head_limited": dict(sorted((head_limited or {}).items())), "why": why}


@dataclasses.dataclass(frozen=True)
class ParityCache:
    """Parity results on disk, one JSON file per key (`<dir>/<key[:2]>/<key>.json`).

    Attributes:
        directory (`str`): the cache folder (created on the first write).
    """

    directory: str

    def path(self, key: str) -> Path:
        return Path(self.directory) / key[:2] / f"{key}.json"

    def get(self, key: str) -> ParityResult | None:
        """The stored result of `key` (with `cached=True`), or `None` on a miss or an entry that is not trusted."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
        if len(raw) > MAX_ENTRY_BYTES:
            return None
        try:
            entry = json.loads(raw.decode("utf-8"))
            if not (isinstance(entry, dict) and entry.get("schema") == SCHEMA and entry.get("key") == key
                    and digest(entry.get("inputs")) == key and isinstance(entry.get("result"), dict)):
                return None
            result = ParityResult.from_json(entry["result"])
        except (ValueError, UnicodeDecodeError, TypeError, RecursionError):
            return None
        if not (result.ran or result.reason.startswith(NOT_NEEDED)):
            return None     # a check that could not run here is never served from the cache
        return dataclasses.replace(result, cached=True)

    def put(self, key: str, inputs_: dict, result: ParityResult) -> None:
        """Store `result` under `key` (the digest of `inputs_`): a check that ran, or the trace's answer that it is
        not needed; a check that could not run here (a subprocess that timed out, a small model that could not be
        built) is not stored. A folder that cannot be written is ignored."""
        if not (result.ran or result.reason.startswith(NOT_NEEDED)):
            return
        path = self.path(key)
        entry = {"schema": SCHEMA, "key": key, "inputs": inputs_,
                 "result": dataclasses.replace(result, cached=False).to_json()}
        from ..sources.files import write_text_atomic

        try:
            write_text_atomic(path, json.dumps(entry))
        except OSError:
            pass


def open_cache() -> ParityCache | None:
    """The cache at `cache_dir()`, or `None` when switched off."""
    directory = cache_dir()
    return ParityCache(str(directory)) if directory is not None else None
