"""Reading the files a user passes without trusting them: config.json, `--plan`, `--baseline`, snapshots, indexes and
safetensors shards.

Every file is `os.stat`-ed first (following symlinks, as the Hugging Face cache needs) and must be a regular file:
a directory, FIFO, socket or device (`/dev/zero`) is refused without being opened for reading, so nothing hangs on a
pipe or reads an endless stream; a dangling symlink (what an interrupted Hub download leaves) or a symlink loop is
refused with what it is. The file is then opened with `O_NONBLOCK` (a FIFO swapped in after the check cannot block
the open either), checked again on the open descriptor, and read up to a cap that is named in the message. JSON is
decoded as strict UTF-8, and its size, nesting and number of containers and items are bounded before and after
parsing, so that no file of a few MB can make the parser build GBs of objects.

Every failure is raised through the caller's error factory (e.g. `lambda m: ConfigError(m, path=...)`), so a bad
config stays a `ConfigError`, a bad plan a `PlanError`, ...: each exit 2 with one line.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
from collections.abc import Callable
from typing import Any, BinaryIO

from ..errors import InputError, TpauditError

MiB = 1 << 20

CONFIG_MAX_BYTES = 16 * MiB
"""config.json: the largest real ones (label maps, long quantization configs) are a few hundred kB."""
PLAN_MAX_BYTES = 16 * MiB
"""`--plan`: a rule is ~50 bytes, so 16 MiB is some 300,000 rules."""
BASELINE_MAX_BYTES = 64 * MiB
"""`--baseline`: a JSON or SARIF report."""
INDEX_MAX_BYTES = 64 * MiB
"""`model.safetensors.index.json`: ~80 bytes per tensor; Kimi-K2.5's 208,550 tensors take ~17 MB."""
SNAPSHOT_MAX_BYTES = 64 * MiB
"""A snapshot file, and separately its JSON once gunzipped (DeepSeek-V3's 91,991 tensors: 0.26 MB / 7.3 MB)."""

JSON_MAX_CONTAINERS = 2_000_000
"""Arrays + objects in one JSON document (counted as `[` and `{` bytes before parsing). A snapshot needs two per
tensor; 22 M empty arrays (a 64 MiB file of `[],`) would take 1.4 GB of Python objects."""
JSON_MAX_ITEMS = 8_000_000
"""Commas in one JSON document, a bound on its items (a snapshot row has about six)."""
JSON_MAX_DEPTH = 64
"""Nesting of a config object (real ones nest 4 to 6 levels); deeper ones break recursive copies downstream."""

ErrorFactory = Callable[[str], TpauditError]


def _default_error(message: str) -> TpauditError:
    return InputError(message)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (`None` for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _os_reason(e: OSError, path: str) -> str:
    """`OSError` on `path` -> the user's words for it (dangling symlink, loop, permission, ...)."""
    if e.errno == errno.ENOENT and os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:  # pragma: no cover - raced away
            target = "?"
        return (f"it is a symlink to {target}, which does not exist (an interrupted download leaves such links). "
                "Download the file again or remove the link")
    if e.errno == errno.ENOENT:
        return "no such file. Check the path"
    if e.errno == errno.ELOOP:
        return "it is a symlink loop. Fix the link"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied. Check the file's permissions"
    if e.errno == errno.ENOTDIR:
        return "a component of the path is not a directory. Check the path"
    if e.errno == errno.ENAMETOOLONG:
        return "the path is too long. Check the path"
    return f"{e.strerror or e}. Check the file"


def stat_regular(path: str | os.PathLike, what: str, error: ErrorFactory | None = None) -> os.stat_result:
    """`os.stat(path)` (symlinks followed) of a file that must be a readable regular file.

    Args:
        path (`str` or `PathLike`): the file.
        what (`str`): what the file is, for the message (`"config.json"`, `"--plan file"`, `"shard"`).
        error (`Callable[[str], TpauditError]`, *optional*): builds the exception from the message (default:
            `InputError`).

    Returns:
        `os.stat_result` of the file the path leads to.

    Raises:
        The `error` factory's exception (exit 2): the path is missing, a dangling symlink, a symlink loop,
        unreadable, or leads to a directory, FIFO, socket or device.
    """
    error = error or _default_error
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {_os_reason(e, path)}") from None
    except ValueError:  # an embedded NUL byte
        raise error(f"cannot read {what} {path!r}: the path contains a NUL byte. Check the path") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise error(f"cannot read {what} {path}: it is {kind}, not a regular file. Pass a regular file")
    return st


def open_regular(path: str | os.PathLike, what: str, error: ErrorFactory | None = None) -> tuple[BinaryIO, int]:
    """Open a regular file for binary reading, never blocking on a FIFO nor reading a device.

    Returns:
        `(file object, size in bytes)`; the caller closes the file.

    Raises:
        The `error` factory's exception: see `stat_regular`.
    """
    error = error or _default_error
    stat_regular(path, what, error)
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {_os_reason(e, path)}") from None
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind is not None:  # replaced between the stat and the open
            raise error(f"cannot read {what} {path}: it is {kind}, not a regular file. Pass a regular file")
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike, what: str, limit: int, error: ErrorFactory | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes.

    Args:
        path (`str` or `PathLike`): the file (symlinks are followed).
        what (`str`): what the file is, for the message (`"config.json"`, `"--plan file"`).
        limit (`int`): the most bytes tpaudit reads from it; a larger file is refused, naming the cap.
        error (`Callable[[str], TpauditError]`, *optional*): builds the exception from the message (default:
            `InputError`).

    Returns:
        `bytes`, at most `limit` of them.

    Raises:
        The `error` factory's exception (exit 2): missing, dangling symlink, loop, not a regular file (directory,
        FIFO, device), unreadable, or larger than `limit`.
    """
    error = error or _default_error
    f, size = open_regular(path, what, error)
    with f:
        if size > limit:
            raise error(f"cannot read {what} {os.fspath(path)}: it is {size:,} bytes, over tpaudit's cap of "
                        f"{_human(limit)} for a {what}. Pass the real {what}")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise error(f"cannot read {what} {os.fspath(path)}: {e.strerror or e}. Check the file") from None
    if len(data) > limit:  # it grew since the stat
        raise error(f"cannot read {what} {os.fspath(path)}: it is over tpaudit's cap of {_human(limit)} for a "
                    f"{what}. Pass the real {what}")
    return data


def gunzip_capped(raw: bytes, what: str, path: str, limit: int, error: ErrorFactory | None = None) -> bytes:
    """Decompress gzip data as a stream, stopping at `limit` bytes of output (a 6 MB gzip bomb costs `limit`).

    Raises:
        The `error` factory's exception: corrupt or truncated gzip data, or more than `limit` bytes once
        decompressed.
    """
    import gzip
    import zlib

    error = error or _default_error
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw), mode="rb") as g:
            out = g.read(limit + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise error(f"cannot read {what} {path}: its gzip data is corrupt or truncated ({e}). Record or download "
                    "it again") from None
    if len(out) > limit:
        raise error(f"cannot read {what} {path}: it decompresses to more than tpaudit's cap of {_human(limit)} for "
                    f"a {what}. Pass a real {what}")
    return out


def load_json(raw: bytes, what: str, path: str, error: ErrorFactory | None = None, *,
              max_depth: int | None = None) -> Any:
    """Parse a JSON document (strict UTF-8), bounding what the parse may build.

    Args:
        raw (`bytes`): the document, already size-capped (`read_capped`, `gunzip_capped`).
        what (`str`), path (`str`): for the message.
        error (`Callable[[str], TpauditError]`, *optional*): builds the exception (default: `InputError`).
        max_depth (`int`, *optional*): refuse arrays/objects nested deeper than this.

    Returns:
        The parsed value.

    Raises:
        The `error` factory's exception: not UTF-8, not JSON, an integer longer than Python's int-string limit,
        more than `JSON_MAX_CONTAINERS` arrays/objects or `JSON_MAX_ITEMS` items, or nested too deeply.
    """
    error = error or _default_error
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > JSON_MAX_CONTAINERS or raw.count(b",") > JSON_MAX_ITEMS:
        raise error(f"cannot read {what} {path}: it holds more than {JSON_MAX_CONTAINERS:,} arrays/objects or "
                    f"{JSON_MAX_ITEMS:,} items, far beyond any real {what}. Pass the real {what}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"cannot read {what} {path}: it is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}). "
                    f"JSON files are UTF-8; fix the file") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}. Fix the file "
                    "or download it again") from None
    except RecursionError:
        raise error(f"{what} {path} nests JSON too deeply to be a {what}. Fix the file") from None
    except ValueError as e:  # an integer past Python's int-string limit (4,300 digits)
        raise error(f"{what} {path} is not usable JSON: {str(e).split(';')[0]}. Fix the file") from None
    if max_depth is not None and json_depth_exceeds(value, max_depth):
        raise error(f"{what} {path} nests arrays/objects more than {max_depth} levels deep, which no real {what} "
                    "does. Fix the file")
    return value


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """True when `value` nests lists/dicts more than `limit` levels deep (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _human(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


def write_text_atomic(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` so that a reader never sees a torn file: a temporary file in the same folder
    (created exclusively, `tempfile.mkstemp`), then `os.replace` (atomic on POSIX and Windows), which also replaces
    a FIFO or other file squatting on the name without opening it. The folder is created if missing.

    Raises:
        OSError: the folder or the file cannot be written (the temporary file is removed); callers whose file is a
            cache ignore it.
    """
    import contextlib
    import tempfile
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:16]}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
