"""Fuzz: 12,000 mutated safetensors headers, and tpaudit's verdict must agree with `safetensors` itself.

Each case starts from real tensors (names, dtypes, shapes of published checkpoints in `fixtures/`), laid out as
`safetensors` writes them, then gets one to three mutations: numbers changed (0, -1, +-1, 2^53, 2^64, `-0`, floats,
strings, bools, 400-digit integers, NaN), types changed, keys dropped, duplicated or added, tensors renamed (UTF-8,
escapes, lone surrogates, control characters), deleted, reordered or overlapped, `__metadata__` broken, bytes
flipped, inserted, deleted or truncated, the length field or the data region resized. The file is written with a
sparse data region, so `safetensors.safe_open` sees a complete file.

Verdicts: safetensors accepts a file when `safe_open(path, "pt")` opens it and `get_slice(name).get_shape()` reads
every tensor; tpaudit accepts it when `read_local_header` returns (it may raise nothing but `CheckpointError`). They
must agree both ways, except where tpaudit refuses on purpose (the rules in `tpaudit/sources/safetensors_header.py`),
recomputed here from the raw JSON: a tensor name twice, rank > 8, a dimension or element count over 2^53, an entry
written as a JSON array or a dtype as an object, the F6 dtypes, a header over 25,000,000 bytes or with more than
2,000,000 arrays/objects. tpaudit never accepts what safetensors refuses.
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
from pathlib import Path

import pytest

from conftest import FIXTURES, read_json_any

pytestmark = pytest.mark.slow

# 10,000 mutated headers per run (slow set); TPAUDIT_FUZZ_CASES=100000 for a long soak, TPAUDIT_FUZZ_SEED for a
# different sequence.
CASES = int(os.environ.get("TPAUDIT_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("TPAUDIT_FUZZ_SEED", "20261201"))
BITS = {  # bits per element, from the safetensors format documentation (Dtype::bitsize)
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
HF_HUB_MAX_HEADER = 25_000_000


class Raw(str):
    """JSON text emitted verbatim (`-0`, `NaN`, a 400-digit number, an escaped key)."""


class Obj(list):
    """A JSON object as a list of (key, value) pairs, so that a key may appear twice."""


def emit(value) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        return "{" + ",".join(f"{k if isinstance(k, Raw) else json.dumps(k)}:{emit(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(emit(v) for v in value) + "]"
    return json.dumps(value)


def real_tensors() -> list[tuple[str, str, list[int]]]:
    pool = []
    for name in ("llama-3.1-8b-instruct", "gpt-oss-20b", "qwen3-30b-a3b-thinking-2507-fp8", "qwen3.5-35b-a3b"):
        doc = read_json_any(FIXTURES / f"{name}.snapshot.json.gz")
        pool.extend((n, d, s) for n, d, s, _ in doc["tensors"])
    return pool


def base_case(rng: random.Random, pool) -> tuple[Obj, int]:
    """A header as safetensors writes it (offset order, contiguous) for 1-8 real tensors, and its data length."""
    chosen = rng.sample(pool, rng.randint(1, 8))
    entries = Obj([("__metadata__", Obj([("format", "pt")]))])
    offset = 0
    for name, dtype, shape in chosen:
        size = math.prod(shape) * BITS[dtype] // 8
        entries.append((name, Obj([("dtype", dtype), ("shape", list(shape)), ("data_offsets", [offset,
                                                                                               offset + size])])))
        offset += size
    return entries, offset


# ----------------------------------------------------------------------------------------------------------------------
# mutations: each changes the case in place (header pairs, data length, length-field delta, byte edits)
# ----------------------------------------------------------------------------------------------------------------------
def _tensors(case) -> list[int]:
    return [i for i, (k, v) in enumerate(case["header"]) if k != "__metadata__"]


def _number(rng: random.Random, v):
    v = v if type(v) is int else 1
    return rng.choice([0, 1, -1, v + 1, v - 1, v * 2, v // 2, 2**53, 2**53 + 1, 2**63, 2**64, 2**64 + 1, Raw("-0"),
                       float(v), Raw(f"{v}.0"), Raw(f"{v}e0"), str(v), True, False, None, Raw("9" * 400),
                       Raw("9" * 25), Raw("NaN"), Raw("1e999")])


def _entry(case, rng):
    idx = _tensors(case)
    if not idx:
        return None, None
    i = rng.choice(idx)
    return i, case["header"][i][1]


def m_number(case, rng):
    _, e = _entry(case, rng)
    if not isinstance(e, Obj):
        return
    fields = [j for j, (k, v) in enumerate(e) if k in ("shape", "data_offsets") and isinstance(v, list) and v]
    if fields:
        j = rng.choice(fields)
        values = list(e[j][1])
        p = rng.randrange(len(values))
        values[p] = _number(rng, values[p])
        e[j] = (e[j][0], values)


def m_dtype(case, rng):
    _, e = _entry(case, rng)
    if isinstance(e, Obj):
        new = rng.choice(list(BITS) + ["F6_E2M3", "f32", "BF17", "", 5, None, Obj([("F32", None)]), ["F32"]])
        for j, (k, _) in enumerate(e):
            if k == "dtype":
                e[j] = ("dtype", new)


def m_shape(case, rng):
    _, e = _entry(case, rng)
    if not isinstance(e, Obj):
        return
    for j, (k, v) in enumerate(e):
        if k == "shape" and isinstance(v, list):
            e[j] = ("shape", rng.choice([[], v + [1], v + [1] * 8, [1] + v, v[:-1], [0] + v, list(reversed(v)),
                                         "2048", None, Obj([]), v[0] if v else 0, [v]]))


def m_offsets(case, rng):
    _, e = _entry(case, rng)
    if not isinstance(e, Obj):
        return
    for j, (k, v) in enumerate(e):
        if k == "data_offsets" and isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v):
            e[j] = ("data_offsets", rng.choice([[v[0]], [v[0], v[1], v[1]], [v[1], v[0]], Obj([("0", v[0])]), None,
                                                [v[0], v[1] + 1], [v[0] + 1, v[1]], [v[0], v[0]]]))


def m_drop_key(case, rng):
    _, e = _entry(case, rng)
    if isinstance(e, Obj) and e:
        del e[rng.randrange(len(e))]


def m_dup_key(case, rng):
    _, e = _entry(case, rng)
    if isinstance(e, Obj) and e:
        k, v = e[rng.randrange(len(e))]
        e.insert(rng.randrange(len(e) + 1), (k, v if rng.random() < 0.5 else _number(rng, 3)))


def m_extra_key(case, rng):
    _, e = _entry(case, rng)
    if not isinstance(e, Obj):
        return
    depth = rng.choice([1, 5, 124, 125, 126, 130])
    value = rng.choice([1, "x", Raw("NaN"), Raw("1e999"), Raw("-0"), Raw("9" * 400), Raw("-" + "9" * 25), None,
                        Raw("[" * depth + "]" * depth), Obj([("a", 1), ("a", 2)]), 1.5, Raw("1e308")])
    e.insert(rng.randrange(len(e) + 1), (rng.choice(["x", "offsets", "name", "DTYPE"]), value))


def m_entry_type(case, rng):
    i, e = _entry(case, rng)
    if isinstance(e, Obj):
        fields = dict(e)
        positional = [fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")]
        case["header"][i] = (case["header"][i][0], rng.choice([positional, None, "x", 5, Obj([])]))


def m_dup_tensor(case, rng):
    i, e = _entry(case, rng)
    if e is not None:
        if rng.random() < 0.5 or not isinstance(e, Obj):
            copy = e
        else:
            copy = Obj(e)
        case["header"].insert(rng.randrange(len(case["header"]) + 1), (case["header"][i][0], copy))


def m_delete_tensor(case, rng):
    i, _ = _entry(case, rng)
    if i is not None:
        del case["header"][i]


def m_swap_offsets(case, rng):
    idx = _tensors(case)
    if len(idx) >= 2:
        a, b = rng.sample(idx, 2)
        ea, eb = case["header"][a][1], case["header"][b][1]
        if isinstance(ea, Obj) and isinstance(eb, Obj):
            oa = [v for k, v in ea if k == "data_offsets"]
            ob = [v for k, v in eb if k == "data_offsets"]
            if oa and ob:
                ea[:] = [(k, ob[0] if k == "data_offsets" else v) for k, v in ea]
                eb[:] = [(k, oa[0] if k == "data_offsets" else v) for k, v in eb]


def m_shuffle(case, rng):
    rng.shuffle(case["header"])


def m_rename(case, rng):
    i, _ = _entry(case, rng)
    if i is not None:
        name = case["header"][i][0]
        key = rng.choice([Raw(json.dumps(name)[:-1] + '\\ud800"'), Raw(json.dumps(name)[:-1] + '\\ud83d\\ude00"'),
                          Raw('"' + name + 'é"'), Raw('"' + name + '\x01"'), "", name + ":x", "__metadata__",
                          Raw('"' + name[:3] + '\\u0022x"')])
        case["header"][i] = (key, case["header"][i][1])


def m_metadata(case, rng):
    h = case["header"]
    value = rng.choice([None, Obj([("a", 1)]), [], "x", Obj([("a", "1"), ("a", "2")]), Obj([]), Obj([("a", None)])])
    if rng.random() < 0.2:
        h.insert(rng.randrange(len(h) + 1), ("__metadata__", Obj([("format", "pt")])))
    for j, (k, _) in enumerate(h):
        if k == "__metadata__":
            h[j] = ("__metadata__", value)
            return
    h.insert(0, ("__metadata__", value))


def m_zero_tensor(case, rng):
    ends = [0]
    for i in _tensors(case):
        e = case["header"][i][1]
        if isinstance(e, Obj):
            ends += [v[1] for k, v in e if k == "data_offsets" and isinstance(v, list) and len(v) == 2
                     and type(v[1]) is int]
    at = rng.choice(ends)
    case["header"].insert(rng.randrange(len(case["header"]) + 1),
                          ("zero", Obj([("dtype", "F32"), ("shape", [0, rng.choice([3, 2**60])]),
                                        ("data_offsets", [at, at])])))


def m_fit_data(case, rng):
    """Make the data region end where the last tensor says (turns offset mutations into complete files)."""
    ends = []
    for i in _tensors(case):
        e = case["header"][i][1]
        if isinstance(e, Obj):
            ends += [v[1] for k, v in e if k == "data_offsets" and isinstance(v, list) and len(v) == 2
                     and type(v[1]) is int and 0 <= v[1] < 2**40]
    case["data_len"] = max(ends, default=0)


def m_data_len(case, rng):
    case["data_len"] = max(0, case["data_len"] + rng.choice([-1, 1, -8, 8, -case["data_len"], 1000]))


def m_length_field(case, rng):
    case["length_delta"] = rng.choice([-1, 1, -8, 8, -100, 10**6, 2**63, 30_000_000])


def m_bytes(case, rng):
    case["byte_ops"].append((rng.choice(["flip", "insert", "delete", "truncate", "append", "prepend", "non-utf8"]),
                             rng.random(), rng.randrange(256)))


MUTATIONS = [m_number, m_number, m_number, m_dtype, m_shape, m_offsets, m_drop_key, m_dup_key, m_extra_key,
             m_entry_type, m_dup_tensor, m_delete_tensor, m_swap_offsets, m_shuffle, m_rename, m_metadata,
             m_zero_tensor, m_fit_data, m_data_len, m_length_field, m_bytes, m_bytes]


def apply_bytes(raw: bytes, ops) -> bytes:
    for op, where, byte in ops:
        pos = int(where * len(raw))
        if op == "flip" and raw:
            pos = min(pos, len(raw) - 1)
            raw = raw[:pos] + bytes([byte]) + raw[pos + 1:]
        elif op == "insert":
            raw = raw[:pos] + bytes([byte]) + raw[pos:]
        elif op == "delete" and raw:
            raw = raw[:pos] + raw[pos + 1:]
        elif op == "truncate":
            raw = raw[:pos]
        elif op == "append":
            raw = raw + rng_choice(byte, [b" ", b"\t", b"\n", b"\x0c", b"}", b"x", b"\0"])
        elif op == "prepend":
            raw = rng_choice(byte, [b" ", b"\t", b"\n", b"\xef\xbb\xbf", b"x"]) + raw
        elif op == "non-utf8":
            raw = raw[:pos] + rng_choice(byte, [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf"]) + raw[pos:]
    return raw


def rng_choice(byte: int, options: list[bytes]) -> bytes:
    return options[byte % len(options)]


# ----------------------------------------------------------------------------------------------------------------------
# the two verdicts and the documented differences
# ----------------------------------------------------------------------------------------------------------------------
def safetensors_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                f.get_slice(key).get_shape()
        return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


class Tagged(list):
    """A JSON object parsed as its pairs (to see repeated keys), told apart from an array."""


def refused_on_purpose(raw_json: bytes, length: int) -> str | None:
    """Which documented tpaudit rule refuses a header safetensors accepts, or None."""
    if length > HF_HUB_MAX_HEADER:
        return "header over huggingface_hub's cap"
    if raw_json.count(b"[") + raw_json.count(b"{") > 2_000_000:
        return "more than 2,000,000 arrays/objects"
    try:
        top = json.loads(raw_json.decode("utf-8"), object_pairs_hook=Tagged)
    except (ValueError, RecursionError):
        return None
    if not isinstance(top, Tagged):
        return None
    names = [k for k, _ in top if k != "__metadata__"]
    if len(names) != len(set(names)):
        return "a tensor name twice"
    for k, entry in top:
        if k == "__metadata__":
            continue
        if not isinstance(entry, Tagged):
            return "an entry written as an array" if isinstance(entry, list) else None
        fields = dict(entry)
        if isinstance(fields.get("dtype"), Tagged):
            return "a dtype written as an object"
        if fields.get("dtype") in ("F6_E2M3", "F6_E3M2"):
            return "an F6 dtype"
        shape = fields.get("shape")
        if isinstance(shape, list) and not isinstance(shape, Tagged) and \
                all(type(d) is int and d >= 0 for d in shape):
            if len(shape) > 8:
                return "rank over 8"
            if any(d > 2**53 for d in shape) or math.prod(shape) > 2**53:
                return "a dimension or element count over 2^53"
    return None


def test_tpaudit_agrees_with_safetensors_on_mutated_headers(tmp_path):
    from tpaudit.errors import CheckpointError
    from tpaudit.sources.safetensors_header import read_local_header

    rng = random.Random(SEED)
    pool = real_tensors()
    path = tmp_path / "model.safetensors"
    stats = {"safetensors accepts": 0, "safetensors refuses": 0}
    purposes: dict[str, int] = {}
    mismatches = []
    for n in range(CASES):
        header, data_len = base_case(rng, pool)
        case = {"header": header, "data_len": data_len, "length_delta": 0, "byte_ops": []}
        for mutate in rng.sample(MUTATIONS, rng.choice([1, 1, 1, 2, 2, 3])):
            mutate(case, rng)
        text = emit(case["header"]).encode("utf-8", "surrogatepass")
        text += b" " * (-len(text) % 8)
        text = apply_bytes(text, case["byte_ops"])
        length = max(0, len(text) + case["length_delta"])
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", min(length, 2**64 - 1)) + text)
            f.truncate(8 + len(text) + case["data_len"])
        expected_st = safetensors_accepts(path)
        stats["safetensors accepts" if expected_st else "safetensors refuses"] += 1
        purpose = refused_on_purpose(text[:length], length) if expected_st else None
        if purpose:
            purposes[purpose] = purposes.get(purpose, 0) + 1
        try:
            read_local_header(path)
            ours, message = True, ""
        except CheckpointError as e:
            ours, message = False, str(e)
        except Exception as e:  # noqa: BLE001 - anything else is a tpaudit bug (exit 4)
            ours, message = None, f"{type(e).__name__}: {e}"
        if ours != (expected_st and purpose is None):
            mismatches.append((n, expected_st, purpose, ours, message[:200], text[:300]))
    assert not mismatches, f"{len(mismatches)} disagreements, first: " + "\n".join(map(repr, mismatches[:5]))
    # The corpus must exercise both verdicts and the documented rules, or the agreement says little.
    assert stats["safetensors accepts"] > CASES // 10 and stats["safetensors refuses"] > CASES // 3, stats
    assert len(purposes) >= 4, purposes
