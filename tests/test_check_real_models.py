"""`tpaudit check` on real model metadata (fixtures/), against values worked out by hand from shapes and configs."""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import FIXTURES, CASES, audit, chunk, nbytes, run_main, snapshot_tensors, transformers_release
from releases import EXPERTS_IN_TP_PLANS

QWEN3_VL = "qwen3-vl-30b-a3b-instruct"

# Which checkpoint dimension each rule splits, written from transformers 5.23's qwen3_vl_moe plan and the
# checkpoint layout in fixtures/README.md (fused experts are stored [E, H, 2I] and [E, I, H]).
QWEN3_VL_SPLITS_SHIPPED = [
    (r"model\.language_model\.embed_tokens\.weight", 0),     # embedding_rowwise (injected): vocab
    (r"lm_head\.weight", 0),                                  # colwise_gather_output: vocab
    (r".*self_attn\.[qkv]_proj\.weight", 0),                  # colwise: out features
    (r".*self_attn\.o_proj\.weight", 1),                      # rowwise: in features
    (r".*mlp\.experts\.gate_up_proj", 2),                     # packed_colwise on 2*I (stored last)
    (r".*mlp\.experts\.down_proj", 1),                        # rowwise on I (stored in the middle)
]
QWEN3_VL_SPLITS_PRE_FIX = QWEN3_VL_SPLITS_SHIPPED[:4]         # no experts rules
# transformers 5.25 ships the pre-fix plan again (its experts are split by the EP plan alone)
QWEN3_VL_SPLITS_RELEASE = QWEN3_VL_SPLITS_SHIPPED if EXPERTS_IN_TP_PLANS else QWEN3_VL_SPLITS_PRE_FIX
# transformers 5.23/5.24's text plan for qwen3_vl_moe (`Qwen3VLMoeTextConfig.base_model_tp_plan`), experts included:
# under 5.25 it is handed over as a plan override to show that its load still fails the same way
QWEN3_VL_524_PLAN = {
    "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
    "layers.*.mlp.experts.gate_up_proj": "packed_colwise", "layers.*.mlp.experts.down_proj": "rowwise",
    "layers.*.mlp.experts": "moe_tp_experts"}


def rank_bytes_by_hand(tensors, splits, tp: int) -> list[int]:
    ranks = [0] * tp
    for name, dtype, shape in tensors:
        dim = next((d for pattern, d in splits if re.fullmatch(pattern, name)), None)
        for r in range(tp):
            if dim is None:
                ranks[r] += nbytes(dtype, shape)
            else:
                local = list(shape)
                local[dim] = chunk(shape[dim], tp, r)
                ranks[r] += nbytes(dtype, local)
    return ranks


@pytest.fixture(scope="module")
def qwen_tensors():
    return snapshot_tensors(QWEN3_VL)


def test_qwen3_vl_fixture_is_the_real_listing(qwen_tensors):
    # The listing's own totals (fixtures/README.md): 882 tensors, 31,070,754,032 parameters, 13 shards.
    assert len(qwen_tensors) == 882
    assert sum(math.prod(s) for _, _, s in qwen_tensors) == 31_070_754_032


def test_qwen3_vl_tp4_shipped_plan(qwen_tensors):
    report = audit(str(FIXTURES / f"{QWEN3_VL}.snapshot.json.gz"), tp=4)
    expected_total = sum(nbytes(d, s) for _, d, s in qwen_tensors)
    expected_ranks = rank_bytes_by_hand(qwen_tensors, QWEN3_VL_SPLITS_RELEASE, 4)
    assert expected_total == 62_141_508_064
    assert expected_ranks == ([16_362_514_912] if EXPERTS_IN_TP_PLANS else [59_849_058_784]) * 4
    assert report.total_param_bytes == expected_total
    assert list(report.rank_param_bytes) == expected_ranks
    replicated = {f.name for f in report.replicated}
    experts = {f"model.language_model.layers.*.mlp.experts.{p}" for p in ("gate_up_proj", "down_proj")}
    assert "model.visual.blocks.*.attn.qkv.weight" in replicated          # the vision tower shows ...
    errors = [f for f in report.findings if f.severity == "error" and f.code != "TPA304"]  # ... but is no error
    if EXPERTS_IN_TP_PLANS:
        assert not any("experts" in name for name in replicated) and not errors
    else:  # 5.25: the experts are whole on every rank at tp only, the failure tpaudit exists for
        assert experts <= replicated
        assert {(f.code, f.target) for f in errors} == {("TPA001", t) for t in experts}
    visual = sum(nbytes(d, s) for n, d, s in qwen_tensors if n.startswith("model.visual."))
    assert sum(f.bytes for f in report.replicated if f.name.startswith("model.visual.")) == visual


def test_qwen3_vl_tp4_ep4_splits_every_expert_and_is_clean(qwen_tensors):
    """With `--ep 4` every release splits the 128 experts by expert (32 per rank) and reads each stored expert whole:
    the same bytes per rank as the 5.23/5.24 TP split, no error (the fix TPA001 gives under 5.25)."""
    report = audit(str(FIXTURES / f"{QWEN3_VL}.snapshot.json.gz"), tp=4, ep=4)
    expected = rank_bytes_by_hand(qwen_tensors, QWEN3_VL_SPLITS_SHIPPED, 4)   # experts: 128 / 4 on their first axis
    by_expert = rank_bytes_by_hand(qwen_tensors, QWEN3_VL_SPLITS_PRE_FIX + [(r".*mlp\.experts\..*", 0)], 4)
    assert expected == by_expert == [16_362_514_912] * 4
    assert list(report.rank_param_bytes) == expected
    assert not report.has_errors, [(f.code, f.target) for f in report.findings if f.severity == "error"]


def test_qwen3_vl_tp4_load_of_the_stored_experts_fails(qwen_tensors):
    """The bytes above are what each rank would hold, but transformers 5.23/5.24 cannot TP-load this checkpoint.

    The experts are stored [E, H, 2I] and [E, I, H] (the listing) and loaded into [E, 2I, H] / [E, H, I] parameters
    through the checkpoint conversion's `Transpose`. Under TP the loader reads each stored tensor sharded by the
    parameter's placement (`DtensorShardOperation`) BEFORE the Transpose, on the stored tensor's own axes:
    - gate_up_proj, packed_colwise = `_StridedShard(dim=1, sf=2)`: the stored axis 1 is H = 2048, cut into 2 halves
      of 1024, each chunked over 4 ranks = 256 + 256 = 512; Transpose gives [128, 1536, 512] where the rank's shard
      is [128, 2I / 4 = 384, 2048];
    - down_proj, rowwise = `Shard(2)`: the stored axis 2 is H = 2048 / 4 = 512; Transpose gives [128, 512, 768]
      where the shard is [128, 2048, 768 / 4 = 192].
    The load stops with a size mismatch on every rank (a real 2-rank load of a tiny qwen3_vl_moe does the same:
    tests/test_verify.py). So `check` exits 1 with TPA304 on both families, and `size` marks tp 4 invalid.
    transformers 5.25 ships no expert TP rules for this model but reads the same way: its 5.24 plan, handed over,
    fails the same."""
    report = audit(str(FIXTURES / f"{QWEN3_VL}.snapshot.json.gz"), tp=4,
                   plan=None if EXPERTS_IN_TP_PLANS else QWEN3_VL_524_PLAN)
    stored = {n.rsplit(".", 1)[-1]: list(s) for n, _, s in qwen_tensors if ".layers.0.mlp.experts." in n}
    E, H, two_i = stored["gate_up_proj"]
    assert (E, H, two_i) == (128, 2048, 1536) and stored["down_proj"] == [128, two_i // 2, H]
    found = {f.target: f for f in report.findings if f.code == "TPA304"}
    gate_up = found["model.language_model.layers.*.mlp.experts.gate_up_proj"]
    down = found["model.language_model.layers.*.mlp.experts.down_proj"]
    assert gate_up.facts["ranks"] == down.facts["ranks"] == [0, 1, 2, 3]
    half = H // 2
    assert gate_up.facts["local_shape"] == [E, two_i, 2 * chunk(half, 4, 0)]
    assert gate_up.facts["expected_shape"] == [E, 2 * chunk(two_i // 2, 4, 0), H]
    assert down.facts["local_shape"] == [E, chunk(H, 4, 0), two_i // 2]
    assert down.facts["expected_shape"] == [E, H, chunk(two_i // 2, 4, 0)]
    assert report.has_errors and {f.code for f in report.findings if f.severity == "error"} == {"TPA304"}


def test_qwen3_vl_tp4_pre_fix_plan_cli(qwen_tensors):
    plan = CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json"
    proc = run_main("check", str(FIXTURES / f"{QWEN3_VL}.snapshot.json.gz"), "--tp", "4", "--plan", str(plan),
                    "--format", "json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    expected_ranks = rank_bytes_by_hand(qwen_tensors, QWEN3_VL_SPLITS_PRE_FIX, 4)
    assert expected_ranks == [59_849_058_784] * 4
    assert [r["param_bytes"] for r in out["ranks"]] == expected_ranks
    experts = {r["name"]: r for r in out["replicated"] if ".mlp.experts." in r["name"]}
    gate_up = sum(nbytes(d, s) for n, d, s in qwen_tensors if n.endswith("mlp.experts.gate_up_proj"))
    assert experts["model.language_model.layers.*.mlp.experts.gate_up_proj"]["bytes"] == gate_up
    assert experts["model.language_model.layers.*.mlp.experts.gate_up_proj"]["count"] == 48
    assert set(out["unused_rules"]) == {f"model.language_model.layers.*.mlp.{p}" for p in
                                        ("gate_proj", "up_proj", "down_proj")}
    errors = {f["target"] for f in out["findings"] if f["severity"] == "error"}
    assert "model.language_model.layers.*.mlp.experts.down_proj" in errors


def gpt_oss_param_bytes(config: dict) -> tuple[int, int]:
    """(total bytes, lm_head bytes) of GptOssForCausalLM as a GPU holds its MXFP4 checkpoint, from the config's sizes:
    bf16 everywhere but the experts, whose weights stay packed FP4 (two values per uint8 byte: gate_up
    [E, 2I, H/2], down [E, H, I/2]) with float32 biases (transformers' `Mxfp4GptOssExperts`)."""
    h, v, L = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    e, inter = config["num_local_experts"], config["intermediate_size"]
    attn = (h * heads * hd + heads * hd) + 2 * (h * kv * hd + kv * hd) + (heads * hd * h + h) + heads  # +sinks
    router = e * h + e
    bf16_per_layer = attn + router + 2 * h
    experts_bytes = e * 2 * inter * h // 2 + e * 2 * inter * 4 + e * h * inter // 2 + e * h * 4
    total = (v * h + L * bf16_per_layer + h + v * h) * 2 + L * experts_bytes
    return total, v * h * 2


def test_gpt_oss_120b_config_only_tp8_shards_nothing_inside_its_layers():
    from transformers import GptOssConfig

    config = json.loads(__import__("gzip").decompress((FIXTURES / "gpt-oss-120b.snapshot.json.gz").read_bytes())
                        )["config"]
    total, lm_head = gpt_oss_param_bytes(config)
    report = audit(str(FIXTURES / "gpt-oss-120b.snapshot.json.gz"), tp=8)
    assert report.total_param_bytes == total
    # The class-level lm_head rule applies: every rank holds all but 7/8 of the head. transformers 5.24 adds
    # {"embed_tokens": "embedding_rowwise"} to GptOssConfig's plan (5.23 has none): the embedding (same shape as the
    # head) is then split 8 ways too. Attention and experts replicate either way.
    head_shard = chunk(config["vocab_size"], 8, 0) * config["hidden_size"] * 2
    embed_sharded = "embed_tokens" in (GptOssConfig.base_model_tp_plan or {})
    assert embed_sharded == (transformers_release() >= (5, 24))
    expected = total - lm_head + head_shard - (lm_head - head_shard if embed_sharded else 0)
    assert report.worst_rank_param_bytes == expected
    assert report.replicated_share > 0.90
    kinds = {f.kind for f in report.findings if f.severity == "error"}
    assert "no_plan" in kinds
    no_plan = next(f for f in report.findings if f.kind == "no_plan")
    assert "--ep 8" in no_plan.fix  # gpt-oss ships an EP plan


def test_llama_8b_tp4_is_clean():
    tensors = snapshot_tensors("llama-3.1-8b-instruct")
    splits = [(r"model\.embed_tokens\.weight", 0), (r"lm_head\.weight", 0),
              (r".*self_attn\.[qkv]_proj\.weight", 0), (r".*self_attn\.o_proj\.weight", 1),
              (r".*mlp\.(gate|up)_proj\.weight", 0), (r".*mlp\.down_proj\.weight", 1)]
    report = audit(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), tp=4)
    assert list(report.rank_param_bytes) == rank_bytes_by_hand(tensors, splits, 4)
    assert report.total_param_bytes == sum(nbytes(d, s) for _, d, s in tensors) == 16_060_522_496
    assert not report.findings
    # Only 1-D norms stay whole: 32 layers x 2 norms + the final norm, 4096 bf16 each.
    assert report.replicated_bytes == (32 * 2 + 1) * 4096 * 2


def test_uneven_shards_granite_tp5():
    """granite-3.1-2b at tp 5: 2048 q rows -> 410 x 4 + 408; 8192 intermediate -> 1639 x 4 + 1636 (torch.chunk)."""
    config = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    report = audit(str(CASES / "09-granite-tp5-indivisible-dims"), tp=5)
    h, inter, L, v = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    kv_dim = config["num_key_value_heads"] * h // config["num_attention_heads"]
    expected = []
    for r in range(5):
        per_layer = (chunk(h, 5, r) * h + 2 * chunk(kv_dim, 5, r) * h + h * chunk(h, 5, r)   # q, k, v, o
                     + 2 * chunk(inter, 5, r) * h + h * chunk(inter, 5, r) + 2 * h)        # gate, up, down, norms
        expected.append((L * per_layer + chunk(v, 5, r) * h + h) * 2)                     # tied embedding once
    assert list(report.rank_param_bytes) == expected
    assert report.worst_rank == 0 and expected[0] > expected[4]
    q = next(g for g in report.groups if g.generic_name.endswith("self_attn.q_proj.weight"))
    assert q.local_shape_rank0 == (410, h) and q.local_shape_last == (408, h)
