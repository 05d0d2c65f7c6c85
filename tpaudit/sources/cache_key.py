"""Authenticating cache entries: an HMAC-SHA256 under a key kept outside the caches.

The parity cache (`evidence/cache.py`) and the batch cache (`run/batch/cache.py`) are keyed by a hash of public
inputs, so whoever can write a cache folder (a CI cache restored from shared storage) can write an entry for any key.
Each entry therefore carries `mac`: `HMAC-SHA256(key, "<domain>\\0" + canonical JSON of the rest of the entry)`, and
an entry is used only when its `mac` matches under this user's key; anything else is recomputed, and the report says
so. The key never lives in a cache folder:

- **`TPAUDIT_CACHE_KEY`** (at least `MIN_KEY_CHARS` characters), for a CI that shares one cache between jobs on
  purpose: store it as a secret, and only jobs that hold it can write entries the others accept;
- else **the key file** `$XDG_CONFIG_HOME/tpaudit/cache-key` (`~/.config/tpaudit/cache-key` without
  `XDG_CONFIG_HOME`): 32 random bytes (`secrets.token_hex`), created on first use with mode 0600 in a folder of mode
  0700, atomically (written to a temporary file opened with `O_EXCL`, then hard-linked to its name, which fails if
  another process got there first: then both use the winner's key). A key file that is not a regular file, belongs
  to another user, or is readable or writable by group or others is not used.

Without a usable key the caches are off (neither read nor written) and the reason is kept (`key_problem`): a
cache is a speed-up, never a source of verdicts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

KEY_ENV = "TPAUDIT_CACHE_KEY"
MIN_KEY_CHARS = 16
_KEY_FILE_MAX_BYTES = 4096

_memo: dict[tuple, tuple[bytes | None, str | None]] = {}


def key_path() -> Path:
    """Where this user's cache key lives: `$XDG_CONFIG_HOME/tpaudit/cache-key`, else `~/.config/tpaudit/cache-key`."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base).expanduser() if os.path.isabs(os.path.expanduser(base)) else Path.home() / ".config"
    return root / "tpaudit" / "cache-key"


def cache_key() -> tuple[bytes | None, str | None]:
    """This user's cache key and, when there is none, why.

    Returns:
        `(key, None)`: the key bytes (from `TPAUDIT_CACHE_KEY`, or the key file, created on first use); or
        `(None, reason)`: no usable key, so the caches are off (`reason` is one sentence naming the file or variable).
    """
    env = os.environ.get(KEY_ENV)
    path = key_path()
    memo_key = (env, str(path))
    if memo_key not in _memo:
        _memo[memo_key] = _key_from_env(env) if env is not None else _key_from_file(path)
    return _memo[memo_key]


def _key_from_env(value: str) -> tuple[bytes | None, str | None]:
    if len(value.strip()) < MIN_KEY_CHARS:
        return None, (f"{KEY_ENV} is set but shorter than {MIN_KEY_CHARS} characters; set it to a long random "
                      "secret (python -c 'import secrets; print(secrets.token_hex(32))')")
    return value.strip().encode("utf-8"), None


def _key_from_file(path: Path) -> tuple[bytes | None, str | None]:
    for _ in range(3):
        key, problem = _read_key(path)
        if key is not None or problem is not None:
            return key, problem
        problem = _create_key(path)  # missing: create it (or lose the race to another process and read theirs)
        if problem is not None:
            return None, problem
    return None, f"the cache key {path} could not be read back after it was created"


def _read_key(path: Path) -> tuple[bytes | None, str | None]:
    """`(key, None)`, `(None, None)` when the file does not exist, `(None, reason)` when it cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"the cache key {path} cannot be opened ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"the cache key {path} is not a regular file"
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            return None, f"the cache key {path} belongs to another user"
        if os.name == "posix" and st.st_mode & 0o077:
            return None, (f"the cache key {path} is readable or writable by others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); make it 0600 (chmod 600) or delete it")
        data = os.read(fd, _KEY_FILE_MAX_BYTES + 1)
    except OSError as e:
        return None, f"the cache key {path} cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)
    key = data.strip()
    if len(data) > _KEY_FILE_MAX_BYTES or len(key) < MIN_KEY_CHARS:
        return None, f"the cache key {path} is not a key (expected 64 hex digits); delete it to get a new one"
    return key, None


def _create_key(path: Path) -> str | None:
    """Write a new key to `path` unless one appears there first; a reason when the folder cannot be written."""
    tmp = path.with_name(f".cache-key.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails when another process created the key first
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: exclusive create of the name itself
            if not path.exists():
                os.rename(tmp, path)
    except OSError as e:
        return f"the cache key {path} cannot be created ({e.strerror or e}); set {KEY_ENV} instead"
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return None


def _message(domain: str, body: dict) -> bytes:
    return domain.encode("ascii") + b"\0" + json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                       ensure_ascii=True, default=str).encode("ascii")


def seal(key: bytes, domain: str, body: dict) -> str:
    """The `mac` of an entry: HMAC-SHA256 (hex) of `domain` and the canonical JSON of `body` (the entry without its
    `mac`). `domain` (`"parity"`, `"batch"`) keeps an entry of one cache from being valid in the other."""
    return hmac.new(key, _message(domain, body), hashlib.sha256).hexdigest()


def authentic(key: bytes, domain: str, entry: dict) -> bool:
    """Whether `entry["mac"]` is `seal(key, domain, entry without "mac")` (compared in constant time)."""
    mac = entry.get("mac")
    if not isinstance(mac, str):
        return False
    body = {k: v for k, v in entry.items() if k != "mac"}
    try:
        expected = seal(key, domain, body)
    except (TypeError, ValueError, RecursionError):
        return False
    return hmac.compare_digest(mac, expected)
