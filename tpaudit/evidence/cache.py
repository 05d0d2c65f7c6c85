"""The parity verdict cache: a repeat check of the same model and plan spends no time on the parity check.

One JSON file per key under the cache folder, written atomically (a temporary file in the same folder, then
`os.replace`), as the batch cache writes its lines:

- **where**: `$TPAUDIT_PARITY_CACHE` when set; else a `parity` folder inside `$TPAUDIT_CACHE` (the batch cache's
  folder) when that is set; else `$HF_HOME/tpaudit/parity`, beside the batch cache's default `$HF_HOME/tpaudit/batch`
  (`HF_HOME` as `huggingface_hub.constants.HF_HOME` resolves it). `TPAUDIT_NO_PARITY_CACHE=1` (or `check`/`scan
  --no-cache`) neither reads nor writes it.
- **key**: the sha256 of a canonical JSON of everything the result depends on: the tpaudit, transformers and torch
  versions and `ENGINE` (the parity check's own revision), the real config (every attribute: the small config is a
  function of it and the tp size), the model class, the plan under review, tp and ep sizes, the checkpoint layout (the
  sha256 of its generic tensor names), the blocks the static facts say cannot split, and why the check runs.
- **trust**: an entry is used only when it is authenticated: its `mac` is the HMAC-SHA256 of the rest of the entry
  under this user's cache key, which lives outside every cache folder (`tpaudit.sources.cache_key`: the key file
  `~/.config/tpaudit/cache-key`, created on first use, mode 0600, or `TPAUDIT_CACHE_KEY` for a CI that shares one
  cache on purpose). The key is a hash of public inputs, so anyone who can write the folder can write an entry for
  any key: without the MAC a copied passing result, a forged `not needed` or `passed: true` would decide the gate.
  An authenticated entry must also be a regular file (opened without blocking: a FIFO or device squatting on the
  name is refused at once) of at most `MAX_ENTRY_BYTES`, parse, name this schema, echo the key it is filed under
  (and its recorded inputs hash to that key), and every field of its result must have the type the data model
  declares (`ParityResult.from_json`). Anything else (truncated, corrupt, forged, another version's) is refused: the
  check runs, rewrites it, and the report says an entry was refused (`ParityResult.cache_problem`). Without a
  usable key, and for a folder that cannot be read or written, the cache is not used: it is a speed-up, never a
  source of verdicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ..model import ParityResult

SCHEMA = "tpaudit/parity-cache/v2"
ENGINE = 2
"""Bumped when the parity check's verdicts change meaning for the same inputs (a new tpaudit release also does)."""
MAX_ENTRY_BYTES = 4 << 20
NOT_NEEDED = "not needed"
VOLATILE_CONFIG_KEYS = ("_name_or_path",)
"""Config entries that say where the config was read from (a temporary folder for a snapshot), not what it is."""


def switched_off() -> bool:
    """`TPAUDIT_NO_PARITY_CACHE` is set to a true value (`--no-cache` sets it for the run)."""
    return os.environ.get("TPAUDIT_NO_PARITY_CACHE", "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def bypassed(active: bool = True):
    """Within the block, the cache is neither read nor written (`--no-cache`): `TPAUDIT_NO_PARITY_CACHE=1` is set,
    so worker processes started inside the block (`scan --jobs`) inherit it, and restored afterwards."""
    if not active:
        yield
        return
    old = os.environ.get("TPAUDIT_NO_PARITY_CACHE")
    os.environ["TPAUDIT_NO_PARITY_CACHE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TPAUDIT_NO_PARITY_CACHE", None)
        else:
            os.environ["TPAUDIT_NO_PARITY_CACHE"] = old


def cache_dir() -> Path | None:
    """The cache folder (see the module docstring), or `None` when the cache is switched off."""
    if switched_off():
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
    """Parity results on disk, one JSON file per key (`<dir>/<key[:2]>/<key>.json`), each sealed with `key_bytes`.

    Attributes:
        directory (`str`): the cache folder (created on the first write).
        key_bytes (`bytes`): the key entries are authenticated with (`tpaudit.sources.cache_key.cache_key`).
    """

    directory: str
    key_bytes: bytes = dataclasses.field(repr=False)

    def path(self, key: str) -> Path:
        return Path(self.directory) / key[:2] / f"{key}.json"

    def get(self, key: str) -> ParityResult | None:
        """The stored result of `key` (with `cached=True`), or `None` on a miss or an entry that is not trusted."""
        return self.lookup(key)[0]

    def lookup(self, key: str) -> tuple[ParityResult | None, str | None]:
        """`(result, None)` for an entry that checks out (see the module docstring), `(None, None)` when there is no
        entry, `(None, why)` when there is one and it is refused (`why`: one phrase, for the report)."""
        from ..sources.cache_key import authentic
        from ..errors import InputError
        from ..sources.files import read_capped

        path = self.path(key)
        if not os.path.lexists(path):
            return None, None
        try:
            raw = read_capped(path, "parity cache entry", MAX_ENTRY_BYTES)
        except InputError as e:  # not a regular file (FIFO, device, directory), too large, unreadable
            return None, _refused(path, _why(e))
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None, _refused(path, "it is not JSON (truncated or corrupt)")
        if not isinstance(entry, dict) or not authentic(self.key_bytes, "parity", entry):
            return None, _refused(path, "it is not authenticated by this user's cache key (forged, or written with "
                                            "another key)")
        try:
            if not (entry.get("schema") == SCHEMA and entry.get("key") == key and digest(entry.get("inputs")) == key
                    and isinstance(entry.get("result"), dict)):
                return None, _refused(path, "it is the entry of other inputs (copied)")
            result = ParityResult.from_json(entry["result"])
        except (ValueError, TypeError, RecursionError) as e:
            return None, _refused(path, f"it is malformed ({e})")
        if not (result.ran or result.reason.startswith(NOT_NEEDED)):
            return None, _refused(path, "it holds a check that did not run")  # never served from the cache
        return dataclasses.replace(result, cached=True, cache_problem=None), None

    def put(self, key: str, inputs_: dict, result: ParityResult) -> None:
        """Store `result` under `key` (the digest of `inputs_`), sealed with the cache key: a check that ran, or the
        trace's answer that it is not needed; a check that could not run here (a subprocess that timed out, a small
        model that could not be built) is not stored. A folder that cannot be written is ignored."""
        from ..sources.cache_key import seal

        if not (result.ran or result.reason.startswith(NOT_NEEDED)):
            return
        path = self.path(key)
        entry = {"schema": SCHEMA, "key": key, "inputs": json.loads(_canonical(inputs_)),
                 "result": dataclasses.replace(result, cached=False, cache_problem=None).to_json()}
        entry["mac"] = seal(self.key_bytes, "parity", entry)
        from ..sources.files import write_text_atomic

        try:
            write_text_atomic(path, json.dumps(entry))
        except OSError:
            pass


def _refused(path: Path, why: str) -> str:
    return f"the cache entry {path} was refused: {why}"


def _why(error: Exception) -> str:
    """The reason part of a `read_capped` message (`cannot read X: <reason>. <hint>`)."""
    text = str(error)
    return text.split(": ", 1)[-1].split(". ", 1)[0]


def open_cache() -> tuple[ParityCache | None, str | None]:
    """The cache at `cache_dir()` with this user's key, or `(None, None)` when switched off, or `(None, why)` when
    there is no usable cache key (`tpaudit.sources.cache_key`)."""
    from ..sources.cache_key import cache_key

    directory = cache_dir()
    if directory is None:
        return None, None
    key, problem = cache_key()
    if key is None:
        return None, f"the cache is not used: {problem}"
    return ParityCache(str(directory), key), None
