"""Safetensors headers, read and validated by tpaudit itself before any library multiplies a shape.

A shard is `8-byte little-endian length N` + `N bytes of JSON` + the data region
(https://huggingface.co/docs/safetensors/index#format). tpaudit reads the length and the JSON only, parses it once
with `json` and checks every entry the way `safetensors` does when it opens the file (its Rust
`Metadata::validate`), so that `check` never calls clean a file that `from_pretrained` cannot open:

- the header is strict UTF-8 JSON (no NaN/Infinity, no lone surrogate escapes), an object whose optional
  `__metadata__` is null or an object of strings, and whose every other value is an object with `dtype` (a
  safetensors dtype name), `shape` (a list of non-negative JSON integers: no bools, floats, strings or `-0`) and
  `data_offsets` (two non-negative integers); other keys in an entry are ignored, as safetensors ignores them;
- sorted by `data_offsets`, the entries are contiguous from 0 with no gap or overlap, each holding exactly
  `prod(shape) x bits(dtype) / 8` bytes (a whole number of bytes), and the last one ends at the end of the file.

tpaudit is stricter than safetensors on purpose in six ways, each refused with a message naming the file and tensor
(and kept honest by `tests/test_fuzz_headers.py`):

1. a tensor name (or an entry's field) that appears twice: safetensors keeps the last of two identical entries and
   drops the other silently;
2. more than `MAX_RANK` (8) dimensions, a dimension over `MAX_DIM` or more than `MAX_ELEMENTS` elements (2^53):
   safetensors accepts any shape whose byte count fits 64 bits, and any dimension at all beside a 0;
3. an entry written as a JSON array (`["F32", [2], [0, 8]]`) or a dtype written as an object (`{"F32": null}`),
   the positional and map forms serde also accepts, which no writer produces;
4. the dtypes `F6_E2M3` and `F6_E3M2`, which tpaudit cannot size yet (no transformers quantizer stores them);
5. a header longer than `huggingface_hub.constants.SAFETENSORS_MAX_HEADER_LENGTH` (25,000,000 bytes;
   safetensors allows 100,000,000), the cap of the library tpaudit reads Hub headers with;
6. more than `files.JSON_MAX_CONTAINERS` (2,000,000) arrays and objects in one header (a real one has three per
   tensor), which bounds what parsing a 25 MB header can build (8 M empty arrays would be 450 MB).

Validating DeepSeek-V3's 91,991 entries takes a small fraction of a second (`scripts/benchmark.py` measures it).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from ..errors import CheckpointError
from ..units import shorten

# Bits per element of each dtype safetensors 0.8 defines (its Rust `Dtype::bitsize`).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
_UNSIZED_DTYPES = frozenset({"F6_E2M3", "F6_E3M2"})

try:
    from huggingface_hub.constants import SAFETENSORS_MAX_HEADER_LENGTH as MAX_HEADER_BYTES
except ImportError:  # pragma: no cover - every supported huggingface_hub has it
    MAX_HEADER_BYTES = 25_000_000
MAX_RANK = 8
MAX_DIM = 2**53
"""Largest dimension accepted: exact in a JSON number anywhere (2^53), beyond any real tensor by a factor of 10^4."""
MAX_ELEMENTS = 2**53
MAX_EXTRA_DEPTH = 125
"""Nesting of an ignored value inside an entry: serde_json stops at 128 levels (the header and the entry are 2)."""

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_MINUS_ZERO = re.compile(r"-0(?![0-9.eE])")  # the JSON number -0 (and, rarely, the same text inside a string)

Entry = tuple[str, str, tuple[int, ...]]
"""`(name, safetensors dtype, shape)` of one tensor."""


_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


class _Duplicates(dict):
    """A JSON object that named a key twice (`dups`: those keys, `dup`: the first). safetensors refuses a repeated
    `dtype`, `shape` or `data_offsets` in an entry (not a repeated field it ignores) and a repeated `__metadata__`;
    tpaudit also refuses a repeated tensor name."""

    dup: str = ""
    dups: frozenset = frozenset()


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        repeated = [k for k, _ in pairs if k in seen or seen.add(k)]  # type: ignore[func-returns-value]
        out = _Duplicates(pairs)
        out.dup, out.dups = repeated[0], frozenset(repeated)
        return out
    return d


def _minus_zero(s: str):
    # serde_json reads `-0` as a float, which no shape or offset may be; Python's json reads it as the int 0.
    return -0.0 if s == "-0" else int(s)


LOCAL_ADVICE = "download it again"
HUB_ADVICE = "the repo's checkpoint is corrupt: tell its owners"


class Shard(str):
    """A shard's name as messages show it (a `str`), with what to advise when it is corrupt (`advice`)."""

    advice: str = LOCAL_ADVICE

    def __new__(cls, name: str, advice: str = LOCAL_ADVICE) -> "Shard":
        obj = super().__new__(cls, name)
        obj.advice = advice
        return obj


def _advice(file: str) -> str:
    return getattr(file, "advice", LOCAL_ADVICE)


def _bad(file: str, name: str | None, what: str) -> CheckpointError:
    where = f"tensor {name[:80]!r} in the safetensors header" if name is not None else "the safetensors header"
    return CheckpointError(f"{file}: {where} has {what}. The file is corrupt or was not written by safetensors; "
                           f"{_advice(file)}", path=str(file), tensor=name)


def _corrupt(file: str, name: str | None, what: str) -> CheckpointError:
    where = f"tensor {name[:80]!r}: " if name is not None else ""
    return CheckpointError(f"{file}: {where}{what}. The file is corrupt or truncated; {_advice(file)}",
                           path=str(file), tensor=name)


def parse_header(raw: bytes, file: str, data_size: int | None) -> list[Entry]:
    """Parse and validate one shard's JSON header.

    Args:
        raw (`bytes`): the `N` header bytes after the 8-byte length.
        file (`str`): the shard as the user knows it (a path, or `repo@commit/file`), for messages.
        data_size (`int`, *optional*): bytes after the header (file size - 8 - N). `None` when unknown (a Hub
            response without the file's size): everything but "the last tensor ends at the end of the file" is
            still checked.

    Returns:
        `[(name, dtype, shape)]` in data-offset order (the order of the bytes on disk).

    Raises:
        CheckpointError: anything `safetensors` would refuse, or one of the stricter rules in this module's
            docstring; the message names the file and, where there is one, the tensor.
    """
    from .files import JSON_MAX_CONTAINERS

    if raw.count(b"[") + raw.count(b"{") > JSON_MAX_CONTAINERS:
        raise _corrupt(file, None, f"the safetensors header holds more than {JSON_MAX_CONTAINERS:,} arrays/objects, "
                                   "far beyond any real header")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        around = raw[max(0, e.start - 40):e.start + 8].decode("utf-8", "replace")
        raise CheckpointError(f"{file}: the safetensors header is not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                              f"header offset {e.start}, after {around!r}); tensor names are UTF-8. The file is "
                              f"corrupt; {_advice(file)}", path=str(file)) from None
    parse_int = _minus_zero if _MINUS_ZERO.search(text) else None
    header = _loads(text, file, parse_int=parse_int, hook=None)
    checked = _validate_bulk(header, data_size)
    if checked is None:  # something is wrong: find the first fault, entry by entry, and name it
        entries, keys = _validate(header, file)
        checked = _check_layout(entries, file, data_size), keys
    result, keys = checked
    if keys != text.count(":"):
        # Every key of the text has its colon, so more colons than parsed keys means that some key appeared twice
        # (a plain dict keeps the last) or that a string holds a colon: parse again, marking repeated keys.
        header = _loads(text, file, parse_int=parse_int, hook=_pairs)
        _validate(header, file)
    if _SURROGATE_ESCAPE.search(text):
        _check_no_lone_surrogates(header, file)
    return result


def _validate_bulk(header: Any, data_size: int | None) -> tuple[list[Entry], int] | None:
    """The common case, checked with whole-list operations (no Python loop over entries): `(entries in data-offset
    order, number of keys parsed)`, or `None` when any check fails (then `_validate` finds and names the fault)."""
    from itertools import chain
    from operator import itemgetter, mul, sub

    if type(header) is not dict:
        return None
    keys = len(header)
    if "__metadata__" in header:
        meta = header["__metadata__"]
        if meta is not None and (type(meta) is not dict or set(map(type, meta.values())) - {str}):
            return None
        keys += len(meta or ())
        infos = [v for k, v in header.items() if k != "__metadata__"]
        names = [k for k in header if k != "__metadata__"]
    else:
        infos = list(header.values())
        names = list(header)
    if not infos:
        return ([], keys) if data_size in (None, 0) else None
    if set(map(type, infos)) != {dict} or set(map(len, infos)) != {3}:
        return None
    keys += 3 * len(infos)
    try:
        dtypes = list(map(itemgetter("dtype"), infos))
        shapes = list(map(itemgetter("shape"), infos))
        offsets = list(map(itemgetter("data_offsets"), infos))
    except KeyError:
        return None
    if set(map(type, dtypes)) != {str} or set(map(type, shapes)) != {list} or set(map(type, offsets)) != {list}:
        return None
    bits = list(map(SAFETENSORS_DTYPE_BITS.get, dtypes))
    if None in bits or not _UNSIZED_DTYPES.isdisjoint(dtypes):
        return None
    if max(map(len, shapes)) > MAX_RANK or set(map(len, offsets)) != {2}:
        return None
    dims = list(chain.from_iterable(shapes))
    if dims and (set(map(type, dims)) != {int} or min(dims) < 0 or max(dims) > MAX_DIM):
        return None
    flat = list(chain.from_iterable(offsets))
    if set(map(type, flat)) != {int} or min(flat) < 0:
        return None
    numels = list(map(math.prod, shapes))
    if max(numels) > MAX_ELEMENTS:
        return None
    nbits = list(map(mul, numels, bits))
    if any(map((8).__rmod__, nbits)):
        return None
    starts, ends = flat[0::2], flat[1::2]
    if list(map(sub, ends, starts)) != list(map((3).__rrshift__, nbits)):
        return None
    if starts[0] == 0 and starts[1:] == ends[:-1]:  # listed in data order, as safetensors writes them
        if data_size is not None and ends[-1] != data_size:
            return None
        return list(zip(names, dtypes, map(tuple, shapes))), keys
    order = sorted(zip(starts, ends, range(len(infos))))
    if order[0][0] != 0 or list(map(itemgetter(0), order[1:])) != list(map(itemgetter(1), order[:-1])):
        return None
    if data_size is not None and order[-1][1] != data_size:
        return None
    return [(names[i], dtypes[i], tuple(shapes[i])) for _, _, i in order], keys


def _loads(text: str, file: str, *, parse_int, hook) -> Any:
    def constant(name: str):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_int=parse_int, parse_constant=constant, object_pairs_hook=hook)
    except json.JSONDecodeError as e:
        msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
        raise _corrupt(file, None, f"the safetensors header is not valid JSON ({msg} at character {e.pos})") from None
    except RecursionError:
        raise _corrupt(file, None, "the safetensors header nests JSON too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer past Python's int-string limit
        raise _corrupt(file, None, f"the safetensors header is not valid JSON ({str(e).split(';')[0]})") from None


def _validate(header: Any, file: str) -> tuple[list[tuple[int, int, str, str, list]], int]:
    """Check every entry on its own; return `[(start, end, name, dtype, shape)]` and the number of keys parsed."""
    if type(header) is not dict:
        if type(header) is _Duplicates:
            if header.dup == "__metadata__":
                raise _bad(file, None, "__metadata__ twice")
            raise CheckpointError(f"{file}: tensor {header.dup[:80]!r} appears twice in the safetensors header, and a "
                                  "loader keeps one of the two silently. The file is corrupt or was not written by "
                                  f"safetensors; {_advice(file)}", path=str(file), tensor=header.dup)
        raise CheckpointError(f"{file}: the safetensors header is a JSON {_json_type(header)}, not an object of "
                              f"tensors. The file is corrupt or not a safetensors file; {_advice(file)}",
                              path=str(file))
    bits_of = SAFETENSORS_DTYPE_BITS
    keys = len(header)
    out: list = []
    append = out.append
    prod = math.prod
    for name, info in header.items():
        if type(info) is not dict:
            if name == "__metadata__":
                keys += _check_metadata(info, file)
                continue
            if type(info) is _Duplicates:
                if info.dups & _FIELDS:
                    raise _bad(file, name, f"the field {sorted(info.dups & _FIELDS)[0]!r} twice")
                info = dict(info)  # a repeated field that safetensors ignores
            else:
                raise _bad(file, name, f"a JSON {_json_type(info)} where an object of dtype, shape and "
                                       "data_offsets belongs")
        if name == "__metadata__":
            keys += _check_metadata(info, file)
            continue
        keys += len(info)
        dtype = info.get("dtype")
        shape = info.get("shape")
        offsets = info.get("data_offsets")
        if len(info) != 3 or dtype is None or shape is None or offsets is None:
            keys += _check_entry_keys(name, info, file)
        bits = bits_of.get(dtype) if type(dtype) is str else None
        if bits is None or dtype in _UNSIZED_DTYPES:
            if type(dtype) is str and dtype in _UNSIZED_DTYPES:
                raise CheckpointError(f"{file}: tensor {name[:80]!r} has dtype {dtype}, which safetensors defines but "
                                      "tpaudit cannot size yet. Report the model to tpaudit", path=str(file), tensor=name)
            raise _bad(file, name, f"dtype {_short(dtype)}, which safetensors does not define")
        if type(shape) is not list:
            raise _bad(file, name, f"shape {_short(shape)}, not a list of non-negative integers")
        if len(shape) > MAX_RANK:
            raise _bad(file, name, f"a shape of {len(shape):,} dimensions (tpaudit accepts at most {MAX_RANK})")
        for d in shape:
            if type(d) is not int or d < 0:
                raise _bad(file, name, f"shape {_short(shape)}, not a list of non-negative integers")
            if d > MAX_DIM:
                raise _bad(file, name, f"shape {_short(shape)}, whose dimension {d} is over tpaudit's cap of 2^53")
        numel = prod(shape)
        if numel > MAX_ELEMENTS:
            raise _bad(file, name, f"shape {_short(shape)}, {numel:,} elements, over tpaudit's cap of 2^53")
        if type(offsets) is not list or len(offsets) != 2:
            raise _bad(file, name, f"data_offsets {_short(offsets)}, not two non-negative integers")
        start, end = offsets
        if type(start) is not int or type(end) is not int or start < 0 or end < 0:
            raise _bad(file, name, f"data_offsets {_short(offsets)}, not two non-negative integers")
        nbits = numel * bits
        if nbits % 8:
            raise _bad(file, name, f"shape {_short(shape)} x {dtype}: {nbits} bits, not a whole number of bytes")
        if end - start != nbits >> 3:
            if end < start:
                raise _bad(file, name, f"data_offsets [{start}, {end}], which end before they start")
            raise _bad(file, name, f"data_offsets [{start}, {end}] ({end - start:,} bytes) where shape "
                                   f"{_short(shape)} x {dtype} needs {nbits >> 3:,} bytes")
        append((start, end, name, dtype, shape))
    return out, keys


def _check_metadata(meta: Any, file: str) -> int:
    """`__metadata__`: null or an object of strings (repeated keys allowed, as safetensors allows them)."""
    if meta is None:
        return 0
    if not isinstance(meta, dict) or not all(type(v) is str for v in meta.values()):
        raise CheckpointError(f"{file}: the safetensors header's __metadata__ is not an object of strings. The file "
                              f"is corrupt or was not written by safetensors; {_advice(file)}", path=str(file))
    return len(meta)


def _check_entry_keys(name: str, info: dict, file: str) -> int:
    """An entry with a missing field, or extra fields (ignored when they are valid JSON serde would read).
    Returns the number of keys in nested objects of the extra fields."""
    for field in ("dtype", "shape", "data_offsets"):
        if info.get(field) is None:
            raise _bad(file, name, f"no {field}" if field not in info else f"{field} null")
    nested = 0
    for key, value in info.items():
        if key in ("dtype", "shape", "data_offsets"):
            continue
        stack = [(value, 0)]
        while stack:
            item, depth = stack.pop()
            if isinstance(item, float) and not math.isfinite(item):
                raise _bad(file, name, f"field {key!r} with a number out of range")
            if type(item) is int and not -2**63 <= item < 2**64:
                try:  # serde_json reads integers past 64 bits as floats, and refuses what overflows one
                    float(item)
                except OverflowError:
                    raise _bad(file, name, f"field {key!r} with a number out of range") from None
            if isinstance(item, (dict, list)):
                if depth + 1 > MAX_EXTRA_DEPTH:
                    raise _bad(file, name, f"field {key!r} nested more than {MAX_EXTRA_DEPTH} levels deep")
                if isinstance(item, dict):
                    nested += len(item)
                stack.extend((c, depth + 1) for c in (item.values() if isinstance(item, dict) else item))
    return nested


def _check_no_lone_surrogates(header: Any, file: str) -> None:
    """Refuse a `\\udXXX` escape that is not half of a pair (serde_json refuses it; Python's json decodes it)."""
    stack = [header]
    while stack:
        item = stack.pop()
        strings = []
        if isinstance(item, dict):
            strings = list(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            strings = [item]
        for s in strings:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise CheckpointError(f"{file}: the safetensors header holds a lone UTF-16 surrogate escape in "
                                      f"{s.encode('utf-8', 'backslashreplace').decode()[:80]!r}, which is not "
                                      f"valid UTF-8 text. The file is corrupt; {_advice(file)}", path=str(file)) \
                    from None


def _check_layout(entries: list, file: str, data_size: int | None) -> list[Entry]:
    """Sorted by data_offsets, entries must tile the data region from 0 without gap or overlap, to its end."""
    entries.sort(key=_offsets)
    pos = 0
    prev: str | None = None
    for start, end, name, _, _ in entries:
        if start != pos:
            if start < pos:
                raise _bad(file, name, f"data_offsets [{start}, {end}] overlapping tensor {prev[:80]!r}, which "
                                       f"ends at {pos}")
            raise _bad(file, name, f"data_offsets [{start}, {end}], leaving bytes {pos} to {start} to no tensor")
        pos = end
        prev = name
    if data_size is not None and pos != data_size:
        if prev is None:
            raise _corrupt(file, None, f"the safetensors header lists no tensor, but the file holds {data_size:,} "
                                       "bytes after it")
        if pos > data_size:
            raise _corrupt(file, prev, f"the last in the data, it ends at byte {pos:,}, but the file holds only "
                                       f"{data_size:,} bytes after its header (truncated)")
        raise _corrupt(file, prev, f"the last in the data, it ends at byte {pos:,}, but the file holds {data_size:,} "
                                   "bytes after its header (bytes no tensor covers)")
    return [(name, dtype, tuple(shape)) for _, _, name, dtype, shape in entries]


def _offsets(entry: tuple) -> tuple[int, int]:
    return entry[0], entry[1]


def read_local_header(path: str | os.PathLike, file: str | None = None) -> list[Entry]:
    """Read and validate the header of a local safetensors file: 8 bytes + the JSON header, never tensor data.

    Args:
        path (`str` or `PathLike`): the shard (symlinks followed: the Hugging Face cache links shards into `blobs/`).
        file (`str`, *optional*): how to name it in messages (default: `path`).

    Returns:
        `[(name, dtype, shape)]` in data-offset order.

    Raises:
        CheckpointError: the file is missing, a dangling symlink, not a regular file, shorter than its header says,
            or its header is malformed (see `parse_header`).
    """
    from .files import open_regular

    file = file or os.fspath(path)

    def error(message: str) -> CheckpointError:
        return CheckpointError(message, path=str(file))

    f, size = open_regular(path, "safetensors file", error)
    with f:
        try:
            n = header_length(f.read(8), file)
            if n > size - 8:
                raise _corrupt(file, None, f"its safetensors header declares {n:,} bytes, but the file holds only "
                                           f"{size - 8:,} after the length")
            raw = f.read(n)
        except OSError as e:
            raise error(f"cannot read safetensors file {file}: {e.strerror or e}. Check the file") from None
    if len(raw) < n:
        raise _corrupt(file, None, f"the file ended after {len(raw):,} of its {n:,} header bytes")
    return parse_header(raw, file, size - 8 - n)


def header_length(first_bytes: bytes, file: str) -> int:
    """The header length `N` from a shard's first 8 bytes, checked against huggingface_hub's cap.

    Raises:
        CheckpointError: fewer than 8 bytes, or `N` over the cap.
    """
    if len(first_bytes) < 8:
        raise _corrupt(file, None, f"the file is {len(first_bytes)} bytes, too short to hold a safetensors header")
    n = int.from_bytes(first_bytes[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise _corrupt(file, None, f"its safetensors header declares {n:,} bytes, over the {MAX_HEADER_BYTES:,}-byte "
                                   "cap of huggingface_hub")
    return n


def validate_header_object(header: Any, file: str, data_size: int | None = None) -> list[Entry]:
    """Validate a header that something else already parsed (the Hub's single-request metadata endpoint).

    Duplicate keys and JSON-level faults cannot be seen any more; everything else is checked as in `parse_header`.

    Returns:
        `[(name, dtype, shape)]` in data-offset order.

    Raises:
        CheckpointError: see `parse_header`.
    """
    entries, _ = _validate(header, file)
    return _check_layout(entries, file, data_size)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _short(value: Any) -> str:
    """A JSON value in a message, at most ~60 characters (never the text of a whole 100,000-entry list)."""
    if isinstance(value, list):
        text = json.dumps(value[:9], default=str)
        return text if len(value) <= 9 and len(text) <= 60 else text[:50].rstrip("]") + ", ...]"
    if isinstance(value, dict):
        return "a JSON object"
    return shorten(json.dumps(value), 60, words=False)
