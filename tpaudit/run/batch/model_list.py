"""The list of models: one reference a line (Hub id, local directory, snapshot), `@revision`, `#` comments,
read with caps on the file, the line and the entry."""


from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from ...errors import UsageError


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
    from ...sources.files import _human, open_regular

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
