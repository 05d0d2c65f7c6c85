"""The bundled fixtures and the script that makes them (scripts/import_listing.py).

Fixture facts are checked against numbers stated by the public listings (their own totals) or worked out by hand from
the config; the import script is run on small listings written here, in the format of gogongxt/python's
scripts/model_inspector.py reports."""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
import math
import re

import pytest

from conftest import CASES, FIXTURES, ROOT, read_json_any

_spec = importlib.util.spec_from_file_location("import_listing", ROOT / "scripts" / "import_listing.py")
import_listing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_listing)

SNAPSHOTS = sorted(p.name for p in FIXTURES.glob("*.snapshot.json.gz"))
REPORT_COMMIT = "d2644104bc43890ee0cd101aac98cf27a9d81e14"


@functools.lru_cache(maxsize=None)
def _snapshot(name: str) -> dict:
    return read_json_any(FIXTURES / name)


# --- every fixture says where it came from in the world -------------------------------------------------------------

def _snapshot_source(name: str) -> dict:
    """A snapshot's `source` object, decoded from the first 64 KiB of the file (it is the second key, before the
    config and the tensor rows; a whole Kimi-K2.5 snapshot is 19 MB of JSON)."""
    with gzip.open(FIXTURES / name, "rt", encoding="utf-8") as f:
        head = f.read(1 << 16)
    start = head.index('"source":') + len('"source":')
    source, _ = json.JSONDecoder().raw_decode(head, start + len(head[start:]) - len(head[start:].lstrip()))
    return source


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_snapshot_origin_is_world_provenance(name):
    source = _snapshot_source(name)
    origin = source["origin"]
    assert source["repo_id"] and f"Hub repo {source['repo_id']}" in origin
    assert "../" not in origin and "/nfs/" not in origin
    assert re.search(r"sha256 [0-9a-f]{64}: ", origin)


def test_no_fixture_or_case_points_outside_the_project():
    # Fixtures stand on their own: no relative path out of the repository (users have only what is bundled).
    for path in FIXTURES.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
            assert b"../" not in text, path


def test_cases_name_their_public_report():
    # Each case's expected.json tells its story in `notes`; the new ones start with the report they come from.
    for case in ("22-gemma4-31b-tp8-global-kv-heads", "28-phi4-tp4-gathered-qkv-ten-kv-heads-ok",
                 "36-llama4-scout-tp8-transposed-experts-ok", "45-deepseek-v2-lite-tp4-mla-kv-a-proj-ok"):
        notes = json.loads((CASES / case / "expected.json").read_text())["notes"]
        assert notes.startswith("Source: ")
    assert "tenstorrent/tt-xla#4881" in json.loads((CASES / "22-gemma4-31b-tp8-global-kv-heads" /
                                                    "expected.json").read_text())["notes"]


def test_kimi_k25_snapshot_matches_listing_and_config():
    doc = _snapshot("kimi-k2.5.snapshot.json.gz")
    tensors = {n: (d, tuple(s)) for n, d, s, _ in doc["tensors"]}
    # The listing's own totals (gogongxt/python@d2644104 scripts/models/kimi_k2.5.md): 208,550 tensors,
    # 170,738,182,128 parameters (stored elements: int32 words of 8 packed int4 values count once), 64 files.
    assert len(doc["tensors"]) == 208_550
    assert sum(math.prod(s) for _, s in tensors.values()) == 170_738_182_128
    assert len(doc["files"]) == 64 and doc["files"][0] == "model-00001-of-000064.safetensors"
    text = doc["config"]["text_config"]
    hidden, inter = text["hidden_size"], text["moe_intermediate_size"]  # 7168, 2048
    group = text["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"]  # 32
    assert (hidden, inter, group) == (7168, 2048, 32)
    prefix = "language_model.model.layers.60.mlp.experts.383."
    # pack-quantized int4: 8 values per int32 along the input dim; one bf16 scale per group of 32 inputs.
    assert tensors[prefix + "down_proj.weight_packed"] == ("I32", (hidden, inter // 8))
    assert tensors[prefix + "down_proj.weight_scale"] == ("BF16", (hidden, inter // group))
    assert tensors[prefix + "gate_proj.weight_packed"] == ("I32", (inter, hidden // 8))
    assert tensors[prefix + "up_proj.weight_scale"] == ("BF16", (inter, hidden // group))
    assert tensors[prefix + "up_proj.weight_shape"] == ("I32", (2,))
    n_routed = text["n_routed_experts"] * (text["num_hidden_layers"] - text["first_k_dense_replace"])  # 384 x 60
    assert sum(n.endswith(".gate_proj.weight_packed") and ".experts." in n for n in tensors) == n_routed == 23_040
    assert "language_model.model.layers.0.mlp.experts.0.gate_proj.weight_packed" not in tensors  # layer 0 is dense


# --- scripts/import_listing.py ---------------------------------------------------------------------------------------

def test_expand_segment_ranges_and_progressions():
    assert import_listing.expand_segment("0-2,4-6") == ["0", "1", "2", "4", "5", "6"]
    assert import_listing.expand_segment("3,7,...,35,39") == [str(i) for i in range(3, 40, 4)]
    assert [n for n, _ in import_listing.expand_name("l.1-2.e.0-1.w")] == ["l.1.e.0.w", "l.1.e.1.w", "l.2.e.0.w",
                                                                          "l.2.e.1.w"]


def _listing(rows: list[str], tensors: int, params: int, files: int, compressed: int | None = None) -> str:
    head = ("<!-- Verbatim excerpt of gogongxt/python scripts/models/kimi_k2.5.md\n"
            f"     @ {REPORT_COMMIT} (scripts/model_inspector.py). -->\n# 权重统计\n\n"
            f"- **权重文件**: {files} 个 `safetensors` 文件\n- **权重张量数**: {tensors:,}\n"
            f"- **参数总量**: {params:,}\n- **压缩**: {tensors} → {compressed or len(rows)} 行\n\n"
            "| 权重名称 | 形状 | 数据类型 | 大小 | 文件 |\n| --- | --- | --- | --- | --- |\n")
    return head + "\n".join(rows) + "\n"


KIMI_ROWS = [
    "| `lm.embed.weight` | `[16, 8]` | `torch.bfloat16` | 256 B | model-00003-of-000003.safetensors |",
    "| `lm.layers.1-2.mlp.experts.0-2.down_proj.weight_packed` (×2 layers, ×3 experts) | `[8, 4]` | `torch.int32` "
    "| 1 KB | Multi Files |",
    "| `lm.layers.1-2.mlp.experts.0-2.down_proj.weight_shape` (×2 layers, ×3 experts) | `[2]` | `torch.int32` "
    "| 48 B | Multi Files |",
]
# 1 + 6 + 6 tensors; 16*8 + 6*32 + 6*2 parameters.
KIMI_TENSORS, KIMI_PARAMS = 13, 128 + 192 + 12


def test_listing_with_layer_and_expert_counts_and_six_digit_shard_totals_expands():
    rows, totals = import_listing.parse_listing(_listing(KIMI_ROWS, KIMI_TENSORS, KIMI_PARAMS, 3))
    assert [r["count"] for r in rows] == [None, 6, 6]
    tensors = import_listing.build_tensors(rows, totals)
    import_listing.check_totals(tensors, rows, totals)
    assert len(tensors) == KIMI_TENSORS and sum(math.prod(t.shape) for t in tensors) == KIMI_PARAMS
    by_name = {t.name: t for t in tensors}
    assert by_name["lm.layers.2.mlp.experts.2.down_proj.weight_packed"].dtype == "I32"
    assert by_name["lm.layers.2.mlp.experts.2.down_proj.weight_packed"].shape == (8, 4)
    assert by_name["lm.embed.weight"].file == "model-00003-of-000003.safetensors"
    assert {t.file for t in tensors} <= {f"model-0000{i}-of-000003.safetensors" for i in (1, 2, 3)}


def test_zero_based_shard_names_are_kept():
    # gpt-oss-20b: 3 files named model-00000-of-00002 .. model-00002-of-00002.
    rows_text = ["| `lm_head.weight` | `[4, 4]` | `torch.bfloat16` | 32 B | model-00002-of-00002.safetensors |",
                 "| `layers.0-5.w` (×6 layers) | `[64, 64]` | `torch.bfloat16` | 48 KB | Multi Files |"]
    rows, totals = import_listing.parse_listing(_listing(rows_text, 7, 16 + 6 * 4096, 3))
    tensors = import_listing.build_tensors(rows, totals)
    import_listing.check_totals(tensors, rows, totals)
    assert {t.file for t in tensors} == {f"model-0000{i}-of-00002.safetensors" for i in (0, 1, 2)}


@pytest.mark.parametrize("change, message", [
    ({"tensors": KIMI_TENSORS + 1}, "tensors 13 vs 14"),
    ({"params": KIMI_PARAMS - 2}, "params 332 vs 330"),
    ({"compressed": 4}, "rows 3 vs 4"),
])
def test_expansion_that_misses_the_listing_totals_is_refused(change, message):
    args = {"tensors": KIMI_TENSORS, "params": KIMI_PARAMS, "files": 3, **change}
    rows, totals = import_listing.parse_listing(_listing(KIMI_ROWS, **args))
    with pytest.raises(import_listing.ListingError, match=message):
        import_listing.check_totals(import_listing.build_tensors(rows, totals), rows, totals)


def test_row_count_annotation_and_unknown_rows_are_checked():
    wrong = KIMI_ROWS[1].replace("×3 experts", "×4 experts")
    rows, totals = import_listing.parse_listing(_listing([KIMI_ROWS[0], wrong], 7, 320, 3))
    with pytest.raises(import_listing.ListingError, match="expands to 6 tensors, the listing says 8"):
        import_listing.build_tensors(rows, totals)
    with pytest.raises(import_listing.ListingError, match="not understood"):
        import_listing.parse_listing(_listing(["| `x.weight` | [4] | bf16 | 8 B | a.safetensors |"], 1, 4, 1))


def _model_dir(tmp_path, config_sha: str | None = None):
    model = tmp_path / "src" / "tiny-moe"
    model.mkdir(parents=True)
    config = b'{"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"]}\n'
    (model / "config.json").write_bytes(config)
    sha = config_sha or hashlib.sha256(config).hexdigest()
    (model / "SOURCE.md").write_text(
        "# tiny\n\n- Hub repo id: `moonshotai/Kimi-K2.5`\n- model_type: kimi_k25\n"
        "- Copy found at: ai-dynamo/aiconfigurator @ 095f58a51c4ca8e61b66ec108d86f223f8d559ce, path `a/b.json`. "
        "git show.\n- Cross-checks:\n  - Blog notes (index id 123) show the same values.\n"
        f"- Files (sha256):\n  - `config.json` {sha}\n")
    (model / "tensors.md").write_text(_listing(KIMI_ROWS, KIMI_TENSORS, KIMI_PARAMS, 3))
    return model, hashlib.sha256(config).hexdigest()


def test_import_writes_world_provenance_and_keeps_recorded_at(tmp_path):
    model, sha = _model_dir(tmp_path)
    out = tmp_path / "kimi.snapshot.json.gz"
    assert import_listing.main([str(model), "moonshotai/Kimi-K2.5", str(out)]) == 0
    doc = json.loads(gzip.decompress(out.read_bytes()))
    origin = doc["source"]["origin"]
    assert origin.startswith("Hub repo moonshotai/Kimi-K2.5; Hub revision not recorded.")
    assert f"config.json, sha256 {sha}: ai-dynamo/aiconfigurator @ 095f58a51c4ca8e61b66ec108d86f223f8d559ce" in origin
    assert f"gogongxt/python@{REPORT_COMMIT} scripts/models/kimi_k2.5.md" in origin
    assert "Cross-checks: Blog notes show the same values." in origin
    assert f"{KIMI_TENSORS:,} tensors, {KIMI_PARAMS:,} parameters" in origin
    assert "src" not in origin and "index id" not in origin and "git show" not in origin
    assert len(doc["tensors"]) == KIMI_TENSORS

    doc["source"]["recorded_at"] = "2020-01-01T00:00:00Z"
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert import_listing.main([str(model), "moonshotai/Kimi-K2.5", str(out)]) == 0
    assert json.loads(gzip.decompress(out.read_bytes()))["source"]["recorded_at"] == "2020-01-01T00:00:00Z"


def test_import_refuses_a_config_whose_sha256_differs_from_source_md(tmp_path, capsys):
    model, _ = _model_dir(tmp_path, config_sha="0" * 64)
    out = tmp_path / "x.snapshot.json.gz"
    assert import_listing.main([str(model), "moonshotai/Kimi-K2.5", str(out)]) == 1
    assert capsys.readouterr().err.startswith("error: ") and not out.exists()
    assert import_listing.main([str(_model_dir(tmp_path / "b")[0]), "other/repo", str(out)]) == 1
    assert "names Hub repo moonshotai/Kimi-K2.5, not other/repo" in capsys.readouterr().err
