"""Cache keys (what determines a line) and the result cache: one JSON file per key, written atomically."""


from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import TpauditError, UsageError
from ...sources.files import write_text_atomic
from .lines import line_problem
from .model_list import LINE_MAX_BYTES

CACHE_SCHEMA = "tpaudit/batch-cache/v2"


# ----------------------------------------------------------------------------------------------------------------------
# Cache keys and the cache
# ----------------------------------------------------------------------------------------------------------------------
def installed_versions() -> dict[str, str | None]:
    """The versions a result depends on: tpaudit, transformers and torch (installed distribution metadata, so that
    the driver can compute keys without importing torch)."""
    from importlib import metadata

    from ... import __version__

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

    An entry is `{"schema", "key", "inputs", "result", "mac"}`: `inputs` echoes what the key hashes (`key_inputs`:
    model hash, sizes, plan hash, dtype, versions); `mac` authenticates the rest (HMAC-SHA256 under this user's cache
    key, kept outside the cache: `tpaudit.sources.cache_key`). The key is a hash of public inputs, so anyone who can write
    the folder can write an entry for any key: an entry is used only when its `mac` matches, it is a regular file
    under `LINE_MAX_BYTES` (a FIFO or device is refused without blocking), its inputs are exactly the requested ones
    and hash to its key, and its result is a well-formed line (`line_problem`) for the same sizes and model hash;
    anything else is recomputed, rewritten, and its line says why (`BatchResult.cache_problem`).

    Attributes:
        directory (`str`): the cache folder (created on the first write).
        key_bytes (`bytes`): the key entries are authenticated with (`tpaudit.sources.cache_key.cache_key`).
    """

    directory: str
    key_bytes: bytes = field(repr=False)

    def path(self, key: str) -> Path:
        """Where the entry of `key` lives."""
        return Path(self.directory) / key[:2] / f"{key}.json"

    def get(self, key: str, inputs: dict[str, Any] | None = None) -> dict | None:
        """The stored line of `key` (a `BatchResult.to_json()` dict), `None` on a miss or an entry that does not
        check out (see the class)."""
        return self.lookup(key, inputs)[0]

    def lookup(self, key: str, inputs: dict[str, Any] | None = None) -> tuple[dict | None, str | None]:
        """`(line, None)` for an entry that checks out, `(None, None)` when there is none, `(None, why)` when there
        is one and it is refused (`why`: one phrase for the line and the summary).

        Args:
            key (`str`): the key (`result_key`).
            inputs (`dict`, *optional*): what the key was made of (`key_inputs`); the entry must echo exactly these.
        """
        from ...sources.cache_key import authentic
        from ...sources.files import load_json, read_capped

        path = self.path(key)
        if not os.path.lexists(path):
            return None, None

        def refuse(message: str) -> TpauditError:
            return UsageError(message)

        def refused(why: str) -> tuple[None, str]:
            return None, f"the cache entry {path} was refused: {why}"

        try:
            entry = load_json(read_capped(path, "cache entry", LINE_MAX_BYTES, refuse), "cache entry", str(path),
                              refuse, max_depth=64)
        except TpauditError as e:  # not a regular file (FIFO, device, directory), too large, not JSON
            return refused(str(e).split(": ", 1)[-1].split(". ", 1)[0])
        if not isinstance(entry, dict) or not authentic(self.key_bytes, "batch", entry):
            return refused("it is not authenticated by this user's cache key (forged, or written with another key)")
        if entry.get("schema") != CACHE_SCHEMA or entry.get("key") != key:
            return refused("it is the entry of another key (copied)")
        echo, result = entry.get("inputs"), entry.get("result")
        if not isinstance(echo, dict) or _key_of(echo) != key or (inputs is not None and echo != inputs):
            return refused("it is the entry of other inputs (copied)")
        if line_problem(result) is not None or result.get("key") != key:
            return refused("its result is not a well-formed line of this key")
        if (result["tp_size"], result["ep_size"]) != (echo.get("tp_size"), echo.get("ep_size")) or \
                result.get("model_sha256") != echo.get("model_sha256"):
            return refused("its result is the line of other sizes or another model")
        return result, None

    def put(self, key: str, result: dict, inputs: dict[str, Any] | None = None) -> None:
        """Store `result` under `key`, echoing `inputs` (`key_inputs`), sealed with the cache key. A cache that cannot
        be written is not an error: the batch goes on. A FIFO or other file squatting on the entry's name is
        replaced, not opened."""
        from ...sources.cache_key import seal

        entry = {"schema": CACHE_SCHEMA, "key": key, "inputs": inputs, "result": result}
        entry = json.loads(json.dumps(entry))  # sealed as it will read back
        entry["mac"] = seal(self.key_bytes, "batch", entry)
        try:
            write_text_atomic(self.path(key), json.dumps(entry))
        except OSError:
            pass


def open_result_cache(directory: str | None) -> tuple[ResultCache | None, str | None]:
    """The cache at `directory` with this user's key: `(None, None)` without a folder (the cache is off),
    `(None, why)` when there is no usable cache key (`tpaudit.sources.cache_key.cache_key`)."""
    from ...sources.cache_key import cache_key

    if not directory:
        return None, None
    key, problem = cache_key()
    if key is None:
        return None, f"the cache is not used: {problem}"
    return ResultCache(directory, key), None
