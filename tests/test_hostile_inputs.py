"""Hostile and corrupt inputs: every one is exit 2 with one `error:` line naming the file (and the tensor, for a
header), never exit 4, a traceback, a hang or a memory blow-up; and the Hugging Face cache layout, whose shards are
symlinks into `blobs/`, checks exactly like the same files copied.

Each failure class of the issue has a case here. Expected byte counts are computed in the tests from shapes
(`conftest.nbytes`), and what safetensors itself accepts is checked in `test_fuzz_headers.py`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import CASES, FIXTURES, assert_one_error_line, deadline, nbytes, run_bounded, run_main, snapshot_tensors

LLAMA = FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"
GRANITE_CONFIG = (CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text()
NORM = "model.norm.weight"  # a real granite tensor: [2048] BF16 = 4,096 bytes
NORM_BYTES = 2048 * 2


# ----------------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------------
def check(*args: str, seconds: float = 10):
    """`tpaudit ARGS` in this process, interrupted after `seconds`."""
    with deadline(seconds):
        return run_main(*args)


def assert_one_error(proc, *needles: str) -> str:
    """Exit 2, exactly one `error:` line on stderr (no traceback, not an internal error) holding every needle."""
    assert_one_error_line(proc, *needles)
    return proc.stderr.strip()


def shard_bytes(header, data_len: int) -> tuple[bytes, int]:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw, data_len


def write_shard(path: Path, header, data_len: int) -> Path:
    """A safetensors file: length + header + a sparse data region of `data_len` bytes (reads as zeros)."""
    head, data_len = shard_bytes(header, data_len)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + data_len)
    return path


def norm_entry(start: int = 0, shape=(2048,), dtype: str = "BF16", end: int | None = None) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [start, start + NORM_BYTES if end is None else end]}


def model_dir(tmp_path: Path, header=None, data_len: int = NORM_BYTES) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(GRANITE_CONFIG)
    if header is not None:
        write_shard(d / "model.safetensors", header, data_len)
    return d


def run_limited(*args: str, env: dict | None = None, memory: int = 1 << 30, timeout: float = 120):
    """`python -m tpaudit ARGS` with its address space capped at `memory` bytes; returns
    `(exit code, stderr, peak resident bytes)`, the peak measured in the child itself (`conftest.run_bounded`)."""
    proc = run_bounded(*args, seconds=timeout, memory=memory, env=env)
    assert proc.peak_bytes is not None, proc.stderr
    return proc.returncode, proc.stderr, proc.peak_bytes


def sparse_llama(directory: Path, single_file: bool = False) -> list[Path]:
    """Llama-3.1-8B-Instruct's real headers as a sparse checkpoint (16 GB apparent, no data blocks)."""
    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint

    source = open_source(str(LLAMA))
    if single_file:  # forget the recorded shard files: everything packs into one file
        source = dataclasses.replace(source, tensors=tuple(t._replace(file=None) for t in source.tensors))
        paths = write_sparse_checkpoint(source, directory, max_shard_bytes=10**12)
        single = paths[0].rename(directory / "model.safetensors")
        (directory / "model.safetensors.index.json").unlink()
        return [single]
    return write_sparse_checkpoint(source, directory)


# ----------------------------------------------------------------------------------------------------------------------
# the Hugging Face cache layout, model.safetensors first
# ----------------------------------------------------------------------------------------------------------------------
def hub_cache_layout(root: Path, files_from: Path) -> Path:
    """Lay out `files_from` as huggingface_hub's cache does: every file a blob, linked from the snapshot directory
    as `../../blobs/<hash>`. Returns the snapshot directory."""
    import hashlib

    repo = root / "models--meta-llama--Llama-3.1-8B-Instruct"
    commit = hashlib.sha1(b"tpaudit test").hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in sorted(files_from.iterdir()):
        blob = hashlib.sha256(f.name.encode()).hexdigest()
        f.rename(repo / "blobs" / blob)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    return snapshot


def test_hub_cache_layout_checks_like_copied_files(tmp_path):
    from tpaudit.sources import open_source

    copied = tmp_path / "copied"
    sparse_llama(copied)
    staged = tmp_path / "staged"
    sparse_llama(staged)
    snapshot = hub_cache_layout(tmp_path / "hub", staged)
    assert all((snapshot / name).is_symlink() for name in ("config.json", "model.safetensors.index.json",
                                                           "model-00001-of-00004.safetensors"))
    expected = {(n, d, s) for n, d, s in snapshot_tensors("llama-3.1-8b-instruct")}
    assert {(t.name, t.dtype, t.shape) for t in open_source(str(snapshot)).tensors} == expected

    cached = check("check", str(snapshot), "--tp", "4", "--format", "json", seconds=300)
    plain = check("check", str(copied), "--tp", "4", "--format", "json", seconds=300)
    assert cached.returncode == plain.returncode == 0, cached.stderr + plain.stderr
    a, b = json.loads(cached.stdout), json.loads(plain.stdout)
    for key in ("ranks", "total_param_bytes", "worst_rank_param_bytes", "replicated", "unused_rules", "findings",
                "params", "kv_cache", "notes"):
        assert a[key] == b[key], key
    assert a["total_param_bytes"] == sum(nbytes(d, s) for _, d, s in expected) == 16_060_522_496


def test_the_cache_repo_folder_points_at_its_snapshot(tmp_path):
    snapshot = tmp_path / "models--acme--m" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(GRANITE_CONFIG)
    (tmp_path / "models--acme--m" / "refs").mkdir()
    (tmp_path / "models--acme--m" / "refs" / "main").write_text("a" * 40)
    assert_one_error(check("check", str(tmp_path / "models--acme--m"), "--tp", "2"),
                     f"Pass {snapshot}")


def test_model_safetensors_wins_over_a_stale_index(tmp_path):
    """transformers loads model.safetensors when it exists, whatever an index beside it says."""
    from tpaudit.sources import open_source

    d = tmp_path / "m"
    sparse_llama(d, single_file=True)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.norm.weight": "model-00009-of-00009.safetensors"}}))  # stale
    source = open_source(str(d))
    assert {(t.name, t.dtype, t.shape) for t in source.tensors} == set(snapshot_tensors("llama-3.1-8b-instruct"))
    assert {t.file for t in source.tensors} == {"model.safetensors"}
    assert any("model.safetensors.index.json ignored" in n for n in source.notes)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/../../outside.safetensors", "/etc/passwd",
                                   "..\\outside.safetensors", ""])
def test_index_names_that_leave_the_directory(tmp_path, shard):
    d = model_dir(tmp_path)
    write_shard(tmp_path / "outside.safetensors", {NORM: norm_entry()}, NORM_BYTES)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {NORM: shard}}))
    assert_one_error(check("check", str(d), "--tp", "2"), "model.safetensors.index.json")


def test_a_shard_may_be_a_symlink_out_of_the_directory(tmp_path):
    """Only names are checked: a link whose target is elsewhere (the cache's blobs/) is followed."""
    from tpaudit.sources import open_source

    d = model_dir(tmp_path)
    write_shard(tmp_path / "blob", {NORM: norm_entry()}, NORM_BYTES)
    (d / "model-00001-of-00001.safetensors").symlink_to(tmp_path / "blob")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {NORM: "model-00001-of-00001.safetensors"}}))
    tensors = open_source(str(d)).tensors
    assert [(t.name, t.dtype, t.shape, t.file) for t in tensors] == [
        (NORM, "BF16", (2048,), "model-00001-of-00001.safetensors")]


# ----------------------------------------------------------------------------------------------------------------------
# something that exists but is not a readable regular file, where a file must be
# ----------------------------------------------------------------------------------------------------------------------
def _replace(path: Path, kind: str, tmp_path: Path) -> str:
    """Put `kind` at `path`; returns the words the error must use."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "dangling symlink":
        path.symlink_to(tmp_path / "blobs" / "gone.incomplete")
        return "does not exist"
    if kind == "directory":
        path.mkdir()
        return "a directory"
    if kind == "fifo":
        os.mkfifo(path)
        return "FIFO"
    if kind == "symlink loop":
        path.symlink_to(path.name)
        return "symlink loop"
    if kind == "/dev/zero":
        path.symlink_to("/dev/zero")
        return "character device"
    raise AssertionError(kind)


KINDS = ["dangling symlink", "directory", "fifo", "symlink loop", "/dev/zero"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", ["config.json", "model.safetensors", "model.safetensors.index.json",
                                    "model-00001-of-00001.safetensors"])
def test_unreadable_files_are_errors_not_config_only(tmp_path, target, kind):
    d = model_dir(tmp_path)
    if target == "model-00001-of-00001.safetensors":
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {NORM: target}}))
    words = _replace(d / target, kind, tmp_path)
    assert_one_error(check("check", str(d), "--tp", "2"), str(d / target), words)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("option", ["--plan", "--baseline"])
def test_unreadable_option_files(tmp_path, option, kind):
    path = tmp_path / "file.json"
    words = _replace(path, kind, tmp_path)
    assert_one_error(check("check", str(LLAMA), "--tp", "2", option, str(path)), option, str(path), words)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_unreadable_snapshot_reference(tmp_path, kind):
    path = tmp_path / "x.snapshot.json.gz"
    _replace(path, kind, tmp_path)
    line = assert_one_error(check("check", str(path), "--tp", "2"), str(path))
    assert kind != "directory" or "config.json" in line  # a directory is a model directory without config.json


# ----------------------------------------------------------------------------------------------------------------------
# corrupt safetensors headers
# ----------------------------------------------------------------------------------------------------------------------
def _dup_name() -> bytes:
    e = json.dumps(norm_entry())
    return f'{{"{NORM}": {e}, "{NORM}": {e}}}'.encode()


HEADERS = [
    # (id, header, data bytes after it, words the message must hold besides the file and tensor)
    ("shape contradicts offsets", {NORM: norm_entry(end=4000)}, 4000, f"needs {2048 * 2:,} bytes"),
    ("offsets past the file end", {NORM: norm_entry()}, 100, "holds only 100 bytes"),
    ("bytes no tensor covers", {NORM: norm_entry()}, NORM_BYTES + 8, f"holds {NORM_BYTES + 8:,} bytes"),
    ("overlap", {"a": norm_entry(), NORM: norm_entry(start=NORM_BYTES // 2)}, NORM_BYTES * 3 // 2, "overlapping"),
    ("gap", {"a": norm_entry(), NORM: norm_entry(start=NORM_BYTES + 4)}, 2 * NORM_BYTES + 4, "leaving bytes"),
    ("negative offset", {NORM: norm_entry(start=-NORM_BYTES)}, 0, "not two non-negative integers"),
    ("end before start", {NORM: norm_entry(start=8, shape=[0], end=0)}, 8, "end before they start"),
    ("offsets not two", {NORM: {"dtype": "BF16", "shape": [2048], "data_offsets": [0]}}, NORM_BYTES,
     "not two non-negative integers"),
    ("duplicate name", _dup_name(), NORM_BYTES, "appears twice"),
    ("duplicate field", f'{{"{NORM}": {{"dtype": "BF16", "shape": [2048], "shape": [2048], '
                        f'"data_offsets": [0, {NORM_BYTES}]}}}}'.encode(), NORM_BYTES, "'shape' twice"),
    ("string dims (6 GB string bomb)", {NORM: {"dtype": "BF16", "shape": ["ab", 3000000000],
                                               "data_offsets": [0, 4]}}, 4, "not a list of non-negative integers"),
    ("float dim", {NORM: norm_entry(shape=[2048.0])}, NORM_BYTES, "not a list of non-negative integers"),
    ("bool dim", {NORM: norm_entry(shape=[True, 2048])}, NORM_BYTES, "not a list of non-negative integers"),
    ("-0 dim", f'{{"{NORM}": {{"dtype": "BF16", "shape": [-0], "data_offsets": [0, 0]}}}}'.encode(), 0,
     "not a list of non-negative integers"),
    ("100,000 dimensions", {NORM: norm_entry(shape=[1] * 99_999 + [2048])}, NORM_BYTES, "100,000 dimensions"),
    ("dimension over 2^53", {NORM: norm_entry(shape=[0, 2**60], end=0)}, 0, "over tpaudit's cap"),
    ("unknown dtype", {NORM: norm_entry(dtype="BF17")}, NORM_BYTES, 'dtype "BF17"'),
    ("dtype tpaudit cannot size", {NORM: norm_entry(dtype="F6_E2M3", end=2048 * 6 // 8)}, 2048 * 6 // 8,
     "cannot size"),
    ("missing data_offsets", {NORM: {"dtype": "BF16", "shape": [2048]}}, NORM_BYTES, "no data_offsets"),
    ("entry is an array", {NORM: ["BF16", [2048], [0, NORM_BYTES]]}, NORM_BYTES, "JSON array where an object"),
    ("sub-byte tensor", {NORM: {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, "not a whole number"),
]
HEADER_FILE_FAULTS = [
    ("NaN", f'{{"{NORM}": {{"dtype": "BF16", "shape": [2048], "x": NaN, "data_offsets": [0, {NORM_BYTES}]}}}}'
     .encode(), NORM_BYTES, "NaN is not JSON"),
    ("top-level array", b"[1, 2]", 0, "a JSON array, not an object of tensors"),
    ("not JSON", b'{"model.norm.weight": {"dtype": "BF16", ', 0, "not valid JSON"),
    ("non-UTF-8 name", b'{"model.norm.weight\xff": {"dtype": "BF16", "shape": [2048], "data_offsets": [0, 4096]}}',
     NORM_BYTES, "not valid UTF-8"),
    ("lone surrogate", b'{"model.norm.weight\\ud800": {"dtype": "BF16", "shape": [2048], "data_offsets": [0, '
                       b'4096]}}', NORM_BYTES, "lone UTF-16 surrogate"),
    ("metadata not strings", {"__metadata__": {"format": 1}, NORM: norm_entry()}, NORM_BYTES,
     "__metadata__ is not an object of strings"),
    ("2 M empty arrays", b'{"model.norm.weight": {"dtype": "BF16", "shape": [2048], "x": [' + b"[]," * 2_000_000
     + b'[]], "data_offsets": [0, 4096]}}', NORM_BYTES, "more than 2,000,000 arrays/objects"),
    ("integer past Python's limit", b'{"model.norm.weight": {"dtype": "BF16", "shape": [' + b"9" * 5001 + b"], "
                                    b'"data_offsets": [0, 4096]}}', NORM_BYTES, "not valid JSON"),
]


@pytest.mark.parametrize("case", HEADERS, ids=[c[0] for c in HEADERS])
def test_corrupt_headers_name_file_and_tensor(tmp_path, case):
    _, header, data_len, words = case
    d = model_dir(tmp_path, header, data_len)
    assert_one_error(check("check", str(d), "--tp", "2"), f"{d / 'model.safetensors'}: tensor ", f"'{NORM}'",
                     words)


@pytest.mark.parametrize("case", HEADER_FILE_FAULTS, ids=[c[0] for c in HEADER_FILE_FAULTS])
def test_corrupt_headers_name_the_file(tmp_path, case):
    _, header, data_len, words = case
    d = model_dir(tmp_path, header, data_len)
    assert_one_error(check("check", str(d), "--tp", "2"), f"{d / 'model.safetensors'}: ", words)


@pytest.mark.parametrize("length, size, words", [
    (30_000_000, 100, "over the 25,000,000-byte cap"),   # huggingface_hub.constants.SAFETENSORS_MAX_HEADER_LENGTH
    (2**64 - 1, 100, "over the 25,000,000-byte cap"),
    (1000, 100, "holds only 92 after the length"),
    (None, 3, "3 bytes, too short"),
    (None, 0, "0 bytes, too short"),
])
def test_header_length_faults(tmp_path, length, size, words):
    d = model_dir(tmp_path)
    raw = (struct.pack("<Q", length) if length is not None else b"") + b"{" * size
    (d / "model.safetensors").write_bytes(raw[:size] if length is None else raw[:8] + raw[8:size])
    assert_one_error(check("check", str(d), "--tp", "2"), str(d / "model.safetensors"), words)


def test_a_tensor_in_two_shards(tmp_path):
    d = model_dir(tmp_path)
    for name in ("a.safetensors", "b.safetensors"):
        write_shard(d / name, {NORM: norm_entry()}, NORM_BYTES)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {NORM: "a.safetensors",
                                                                               "x": "b.safetensors"}}))
    assert_one_error(check("check", str(d), "--tp", "2"), f"'{NORM}' is in both a.safetensors and b.safetensors")


@pytest.mark.parametrize("index, words", [
    ("{", "not valid JSON"),
    ('{"weight_map": [1]}', "no weight_map"),
    ('{"weight_map": {"a": 5}}', "not a file name"),
    ('{"weight_map": {"a": "missing.safetensors"}}', "missing"),
])
def test_malformed_index(tmp_path, index, words):
    d = model_dir(tmp_path)
    (d / "model.safetensors.index.json").write_text(index)
    assert_one_error(check("check", str(d), "--tp", "2"), "model.safetensors.index.json" if words != "missing"
                     else "missing.safetensors", words)


# ----------------------------------------------------------------------------------------------------------------------
# config.json, --plan, --baseline
# ----------------------------------------------------------------------------------------------------------------------
def _sparse_file(path: Path, size: int, head: bytes = b"{") -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


@pytest.mark.parametrize("raw, words", [
    ('{"num_hidden_layers": ' + "9" * 5001 + "}", "Exceeds the limit"),      # Python's int-string limit
    ("[" * 500 + "]" * 500, "more than 64 levels"),
    ('{"a": "\xff"}'.encode("latin-1"), "not UTF-8"),
    ("[" * 100_000 + "]" * 100_000, "nests JSON too deeply"),
])
def test_hostile_config_json(tmp_path, raw, words):
    d = model_dir(tmp_path)
    (d / "config.json").write_bytes(raw.encode() if isinstance(raw, str) else raw)
    assert_one_error(check("check", str(d), "--tp", "2"), str(d / "config.json"), words)


def test_oversized_config_plan_baseline_name_the_cap(tmp_path):
    d = model_dir(tmp_path)
    _sparse_file(d / "config.json", 16 * 2**20 + 1)
    assert_one_error(check("check", str(d), "--tp", "2"), str(d / "config.json"), f"{16 * 2**20 + 1:,} bytes",
                     "cap of 16 MiB")
    plan = _sparse_file(tmp_path / "plan.json", 16 * 2**20 + 1)
    assert_one_error(check("check", str(LLAMA), "--tp", "2", "--plan", str(plan)), "--plan", "cap of 16 MiB")
    baseline = _sparse_file(tmp_path / "baseline.json", 64 * 2**20 + 1)
    assert_one_error(check("check", str(LLAMA), "--tp", "2", "--baseline", str(baseline)), "--baseline",
                     "cap of 64 MiB")


def test_plan_with_a_huge_integer(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"layers.*.mlp": ' + "1" * 5001 + "}")
    assert_one_error(check("check", str(LLAMA), "--tp", "2", "--plan", str(plan)), "--plan", str(plan))


@pytest.mark.parametrize("doc, words", [
    ({"schema": "tpaudit/check/v1", "findings": [{"code": "TPA001"}]}, "findings[0]"),
    ({"schema": "tpaudit/check/v1", "findings": [{"target": "x"}]}, "findings[0]"),
    ({"schema": "tpaudit/check/v1", "findings": [{"code": "TPA001", "target": "x"}, 5]}, "findings[1]"),
    ({"schema": "tpaudit/check/v1", "findings": {"code": "TPA001"}}, "'findings' is not a list"),
])
def test_baseline_items_without_code_or_target(tmp_path, doc, words):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    assert_one_error(check("check", str(LLAMA), "--tp", "2", "--baseline", str(path)), "--baseline", words)


TPAUDIT_RUN = {"tool": {"driver": {"name": "tpaudit"}}}


@pytest.mark.parametrize("runs, words", [
    ([], "'runs' is an empty list"),
    (5, "'runs' is not a list"),
    ([5], "runs[0] is not an object"),
    ([{"tool": {"driver": {"name": "other"}}, "results": []}], "no run whose tool.driver.name is 'tpaudit'"),
    ([{**TPAUDIT_RUN, "results": 5}], "runs[0].results is not a list"),
    ([{**TPAUDIT_RUN, "results": [5]}], "runs[0].results[0]"),
    ([{**TPAUDIT_RUN, "results": [{"partialFingerprints": 3}]}], "runs[0].results[0]"),
    ([{**TPAUDIT_RUN, "results": [{"partialFingerprints": {"tpaudit/v1": "TPA001"}}]}], "CODE:target"),
])
def test_empty_or_malformed_sarif_baseline_is_refused(tmp_path, runs, words):
    """A SARIF log with no tpaudit run, or one of whose results has no fingerprint, would accept nothing (or
    silently part of what it lists): exit 2 naming the place."""
    path = tmp_path / "baseline.sarif"
    path.write_text(json.dumps({"version": "2.1.0", "runs": runs}))
    assert_one_error(check("check", str(LLAMA), "--tp", "2", "--baseline", str(path)), "--baseline", words)


def test_sarif_baseline_skips_other_tools_runs(tmp_path):
    from tpaudit.run.baseline import load_baseline

    path = tmp_path / "baseline.sarif"
    other = {"tool": {"driver": {"name": "other"}}, "results": [{"ruleId": "X1"}, 5]}
    ours = {**TPAUDIT_RUN, "results": [{"partialFingerprints": {"tpaudit/v1": "TPA001:model.norm.weight"}}]}
    path.write_text(json.dumps({"version": "2.1.0", "runs": [other, ours, {**TPAUDIT_RUN, "results": []}]}))
    assert load_baseline(str(path)) == {"TPA001:model.norm.weight"}


# ----------------------------------------------------------------------------------------------------------------------
# snapshots
# ----------------------------------------------------------------------------------------------------------------------
def _snapshot(tmp_path: Path, rows, config=None, name="x.snapshot.json") -> Path:
    path = tmp_path / name
    doc = {"schema": "tpaudit/snapshot/v1", "config": config if config is not None else json.loads(GRANITE_CONFIG),
           "files": ["model.safetensors"], "tensors": rows}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("row, words", [
    ([NORM, "BF16", ["ab", 3000000000], 0], "non-negative integers"),
    ([NORM, "BF16", [True], 0], "non-negative integers"),
    ([NORM, "BF16", [2048.0], 0], "non-negative integers"),
    ([NORM, "BF16", [1] * 100_000, 0], "at most 8 dimensions"),
    ([NORM, "BF16", [2**60], 0], "2^53"),
    ([NORM, "BF16", [2**26, 2**26, 2**26], 0], "more than 2^53 elements"),
    ([NORM, "BF17", [2048], 0], "BF17"),
    ([NORM, "BF16", [2048], 1], "file index 1"),
    ([NORM, "BF16", [2048]], "is not [name, dtype, shape, file index]"),
])
def test_corrupt_snapshot_rows(tmp_path, row, words):
    path = _snapshot(tmp_path, [row])
    assert_one_error(check("check", str(path), "--tp", "2"), f"{path}: tensors[0]", words)


def test_snapshot_with_a_tensor_twice(tmp_path):
    path = _snapshot(tmp_path, [[NORM, "BF16", [2048], 0], [NORM, "BF16", [2048], 0]])
    assert_one_error(check("check", str(path), "--tp", "2"), f"{path}: tensors[1]", "already lists")


def test_snapshot_config_nested_too_deeply(tmp_path):
    config = json.loads(GRANITE_CONFIG)
    deep: list = []
    config["x"] = deep
    for _ in range(300):
        deep.append([])
        deep = deep[0]
    path = _snapshot(tmp_path, None, config)
    assert_one_error(check("check", str(path), "--tp", "2"), str(path), "more than 64 levels")


def test_snapshot_over_the_file_cap(tmp_path):
    path = _sparse_file(tmp_path / "x.snapshot.json.gz", 64 * 2**20 + 1, head=b"\x1f\x8b")
    assert_one_error(check("check", str(path), "--tp", "2"), str(path), "cap of 64 MiB")


# ----------------------------------------------------------------------------------------------------------------------
# memory and time bombs, in a process whose address space is capped at 1 GiB
# ----------------------------------------------------------------------------------------------------------------------
def _gzip_bomb(path: Path) -> Path:
    """~6 MB of gzip that would decompress to ~6 GB: one 16 MiB member of spaces, repeated (gzip allows members in
    a row)."""
    head = gzip.compress(b'{"schema": "tpaudit/snapshot/v1", "tensors": null, "config": {"a": "', mtime=0)
    member = gzip.compress(b" " * (16 << 20), mtime=0)
    with open(path, "wb") as f:
        f.write(head)
        for _ in range(6_000_000 // len(member) + 1):
            f.write(member)
    assert 5_000_000 < path.stat().st_size < 64 << 20
    return path


def _container_bomb(path: Path) -> Path:
    """A 21 MB JSON snapshot of 7 M empty arrays: 1.4 GB of Python lists if parsed."""
    with open(path, "w") as f:
        f.write('{"schema": "tpaudit/snapshot/v1", "tensors": null, "config": {"a": [')
        f.write("[]," * 7_000_000)
        f.write("[]]}}")
    return path


BOMBS = {
    "gzip bomb snapshot": (lambda tmp: [str(_gzip_bomb(tmp / "bomb.snapshot.json.gz")), "--tp", "2"],
                           "decompresses to more than"),
    "container bomb snapshot": (lambda tmp: [str(_container_bomb(tmp / "bomb.snapshot.json")), "--tp", "2"],
                                "arrays/objects"),
    "header string bomb": (lambda tmp: [str(model_dir(tmp, {NORM: {"dtype": "BF16", "shape": ["ab", 3000000000],
                                                                   "data_offsets": [0, 4]}}, 4)), "--tp", "2"],
                           "not a list of non-negative integers"),
    "snapshot string bomb": (lambda tmp: [str(_snapshot(tmp, [[NORM, "BF16", ["ab", 3000000000], 0]])), "--tp", "2"],
                             "non-negative integers"),
    "/dev/zero as config.json": (lambda tmp: [str(_devzero_config(tmp)), "--tp", "2"], "character device"),
    "/dev/zero as --baseline": (lambda tmp: [str(LLAMA), "--tp", "2", "--baseline", "/dev/zero"],
                                "character device"),
}


def _devzero_config(tmp: Path) -> Path:
    d = model_dir(tmp)
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    return d


@pytest.mark.parametrize("name", list(BOMBS))
def test_memory_bombs_stay_small(tmp_path, name):
    make, words = BOMBS[name]
    code, stderr, peak = run_limited("check", *make(tmp_path))
    proc = subprocess.CompletedProcess([], code, "", stderr)
    assert_one_error(proc, words)
    assert peak < 1 << 30, f"peak resident memory {peak / 2**20:.0f} MiB"


# ----------------------------------------------------------------------------------------------------------------------
# the Hub source: the same validation on headers served over HTTP
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_hub(tmp_path_factory):
    from hubserver import FakeHub

    root = tmp_path_factory.mktemp("hostile-hub")
    repos = {
        "acme/string-bomb": ({NORM: {"dtype": "BF16", "shape": ["ab", 3000000000], "data_offsets": [0, 4]}}, 4),
        "acme/truncated": ({NORM: norm_entry()}, 100),
        "acme/overlap": ({"a": norm_entry(), NORM: norm_entry(start=NORM_BYTES // 2)}, NORM_BYTES * 3 // 2),
    }
    with FakeHub() as hub:
        for repo_id, (header, data_len) in repos.items():
            d = root / repo_id.replace("/", "--")
            d.mkdir()
            (d / "config.json").write_text(GRANITE_CONFIG)
            write_shard(d / "model.safetensors", header, data_len)
            hub.add(repo_id, d)
        escape = root / "escape"
        escape.mkdir()
        (escape / "config.json").write_text(GRANITE_CONFIG)
        (escape / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {NORM: "../x.safetensors"}}))
        hub.add("acme/escape", escape)
        yield hub


# Each case is a whole interpreter under a memory limit (about 1.5 s). The fast loop keeps the one that needs the
# Hub's own answer (the file size from Content-Range); the same faults are checked in-process on local files
# (test_corrupt_headers_name_file_and_tensor, test_index_names_that_leave_the_directory); all four run in the full
# suite.
@pytest.mark.parametrize("repo_id, words", [
    pytest.param("acme/string-bomb", "not a list of non-negative integers", marks=pytest.mark.slow),
    ("acme/truncated", "holds only 100 bytes"),     # the size comes from the server's Content-Range
    pytest.param("acme/overlap", "overlapping", marks=pytest.mark.slow),
    pytest.param("acme/escape", "outside the model directory", marks=pytest.mark.slow),
])
def test_hub_headers_are_validated_too(hostile_hub, tmp_path, repo_id, words):
    env = {"HF_ENDPOINT": hostile_hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
    code, stderr, peak = run_limited("check", repo_id, "--tp", "2", env=env)
    line = assert_one_error(subprocess.CompletedProcess([], code, "", stderr), repo_id, words)
    assert repo_id == "acme/escape" or f"'{NORM}'" in line
    assert peak < 1 << 30
