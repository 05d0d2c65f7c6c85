"""Sources: local directories (headers only), snapshots (round trip), reference recognition."""

from __future__ import annotations

import json
import os

import pytest

from conftest import FIXTURES, audit, read_json_any, snapshot_tensors

LLAMA = FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"


def test_local_sparse_checkpoint_matches_snapshot(tmp_path):
    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint

    snap = open_source(str(LLAMA))
    shards = write_sparse_checkpoint(snap, tmp_path / "llama")
    # Real sizes on disk (apparent), almost no blocks: 16 GB apparent.
    apparent = sum(os.path.getsize(p) for p in shards)
    assert apparent > 16_060_522_496
    assert sum(os.stat(p).st_blocks * 512 for p in shards) < 50 * 2**20
    local = open_source(str(tmp_path / "llama"))
    assert {(t.name, t.dtype, t.shape) for t in local.tensors} == {(n, d, s) for n, d, s in snapshot_tensors(
        "llama-3.1-8b-instruct")}
    a = audit(str(LLAMA), tp=4).to_json()
    b = audit(str(tmp_path / "llama"), tp=4).to_json()
    for key in ("ranks", "total_param_bytes", "replicated", "unused_rules", "findings", "params"):
        assert a[key] == b[key], key


def test_sparse_headers_read_by_safetensors(tmp_path):
    from safetensors import safe_open

    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint

    shards = write_sparse_checkpoint(open_source(str(LLAMA)), tmp_path / "m")
    expected = {n: list(s) for n, _, s in snapshot_tensors("llama-3.1-8b-instruct")}
    seen = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                seen[key] = list(f.get_slice(key).get_shape())
    assert seen == expected
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 16_060_522_496


def test_snapshot_round_trip(tmp_path):
    from tpaudit.sources import open_source
    from tpaudit.sources.snapshot import write_snapshot

    src = open_source(str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz"))
    for name in ("copy.json", "copy.json.gz"):
        path = write_snapshot(src, tmp_path / name, origin="test")
        doc = read_json_any(path)
        assert doc["schema"] == "tpaudit/snapshot/v1" and doc["source"]["origin"] == "test"
        again = open_source(str(path))
        assert again.tensors == src.tensors and again.config == src.config
        assert again.repo_id == "Qwen/Qwen3-VL-30B-A3B-Instruct"


def test_config_only_directory_says_so(tmp_path):
    from tpaudit.sources import open_source

    (tmp_path / "config.json").write_text(json.dumps(read_json_any(LLAMA)["config"]))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    src = open_source(str(tmp_path))
    assert src.config_only and "pytorch_model.bin" in src.notes[0]
    report = audit(str(tmp_path), tp=2)
    assert report.total_param_bytes == 16_060_522_496  # meta-model shapes x config dtype (bf16)
    assert any("config only" in n for n in report.notes)


@pytest.mark.parametrize("ref, kind", [
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", "hub"),
    ("meta-llama/Llama-3.1-8B-Instruct", "hub"),
])
def test_hub_ids_are_recognised(ref, kind):
    from tpaudit.sources import classify_reference

    assert classify_reference(ref) == kind


@pytest.mark.parametrize("ref", ["just-a-name", "a/b/c", "./missing/dir", "org/name.json", "../tpaudit-no-such-sibling-7f3a"])
def test_unrecognised_references(ref):
    from tpaudit.errors import ModelReferenceError
    from tpaudit.sources import classify_reference

    with pytest.raises(ModelReferenceError):
        classify_reference(ref)


def test_existing_path_wins_over_hub_id(tmp_path, monkeypatch):
    from tpaudit.sources import classify_reference

    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert classify_reference("org/name") == "local"


def test_bulk_tensor_tables_equal_their_one_by_one_forms():
    from tpaudit.model import CheckpointTensor, checkpoint_tensors, total_bytes

    rows = [("a", "BF16", (3, 5), "x.safetensors"), ("b", "F32", (2,), None), ("c", "F8_E4M3", (7,), "y"),
            ("d", "F4", (3,), None), ("e", "F4", (3,), None)]
    built = checkpoint_tensors(*zip(*rows))
    assert built == tuple(CheckpointTensor(*r) for r in rows)
    assert all(type(t) is CheckpointTensor for t in built) and built[2].shape == (7,) and built[1].file is None
    # bytes worked out by hand: 15 x 2, 2 x 4, 7 x 1. F4 packs two values a byte and `nbytes` rounds each tensor
    # down (the reader refuses a real header with an odd F4 count), so two 3-value F4 tensors count 1 + 1, not 3
    assert total_bytes(built[:3]) == 30 + 8 + 7
    assert total_bytes(built) == 30 + 8 + 7 + 1 + 1
    assert total_bytes(built[:1] * 4) == 120 and total_bytes(()) == 0
    assert total_bytes(iter(built[3:])) == 2
