"""Each finding family on real models, with the expected numbers worked out here from configs and shapes."""

from __future__ import annotations

import json

import pytest

from conftest import CASES, FIXTURES, audit, chunk, nbytes, snapshot_tensors, transformers_release
from releases import plan_524

QWEN3_VL = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")


def by_code(report, code):
    return [f for f in report.findings if f.code == code]


def test_indivisible_heads_and_intermediate_granite_tp5():
    config = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    report = audit(str(CASES / "09-granite-tp5-indivisible-dims"), tp=5)
    found = {f.target: f for f in by_code(report, "TPA101")}
    assert set(found) == {"num_attention_heads", "intermediate_size"}  # vocab 49155 = 5 x 9831 divides
    assert config["vocab_size"] % 5 == 0
    inter = config["intermediate_size"]
    assert found["intermediate_size"].facts["per_rank"] == [chunk(inter, 5, r) for r in range(5)] \
        == [1639, 1639, 1639, 1639, 1636]
    assert found["num_attention_heads"].facts["value"] == config["num_attention_heads"] == 32
    kv = by_code(report, "TPA102")
    assert len(kv) == 1 and kv[0].facts["kv_heads"] == config["num_key_value_heads"] == 8
    assert kv[0].facts["kv_heads_per_rank"] == pytest.approx(8 / 5)
    assert len(kv[0].facts["layers"]) == config["num_hidden_layers"]


def test_kv_heads_qwen3_vl_tp8_and_kv_cache_bytes():
    text = json.loads(__import__("gzip").decompress(open(QWEN3_VL, "rb").read()))["config"]["text_config"]
    layers, kv_heads, head_dim = text["num_hidden_layers"], text["num_key_value_heads"], text["head_dim"]
    report = audit(QWEN3_VL, tp=8)
    kv = by_code(report, "TPA102")
    assert kv and kv[0].target == "text_config.num_key_value_heads" and kv[0].facts["kv_heads_per_rank"] == 0.5
    assert not by_code(report, "TPA101")  # 32 heads, vocab 151936, moe_intermediate 768: all divide by 8
    for tp in (1, 4):
        section = audit(QWEN3_VL, tp=tp).to_json()["kv_cache"]
        expected = layers * kv_heads * head_dim * 2 * 2 // tp           # K and V, bf16
        assert section["bytes_per_token_per_rank"] == [expected] * tp
    assert expected * 4 == 98_304 and expected == 24_576


def test_awq_group_misaligned_case_13_numbers(tmp_path):
    from test_cases import materialise

    model_dir, _ = materialise("13-awq-internvl3-78b-down-proj-group-misaligned", tmp_path)
    report = audit(str(model_dir), tp=2)
    inter = json.loads((model_dir / "config.json").read_text())["text_config"]["intermediate_size"]
    found = by_code(report, "TPA202")
    assert [f.target for f in found] == ["model.language_model.layers.*.mlp.down_proj"]
    assert found[0].facts["per_rank"] == [inter // 2, inter // 2] == [14784, 14784]
    assert (inter // 2) % 128 == 64 and found[0].facts["block"] == 128
    assert found[0].facts["largest_aligned_tp_size"] == 1


def test_compressed_tensors_metadata_case_11(tmp_path):
    from test_cases import materialise

    model_dir, _ = materialise("11-compressed-tensors-weight-shape-g-idx-sharded", tmp_path)
    report = audit(str(model_dir), tp=4)
    found = {f.target: f for f in by_code(report, "TPA201")}
    # weight_shape of all 7 projections; weight_g_idx only under the 5 colwise ones (q, k, v, gate, up).
    shapes = {t for t in found if t.endswith("weight_shape")}
    g_idx = {t for t in found if t.endswith("weight_g_idx")}
    assert len(shapes) == 7 and len(g_idx) == 5
    assert not any(t.endswith(("o_proj.weight_g_idx", "down_proj.weight_g_idx")) for t in g_idx)
    shape = found["model.layers.*.self_attn.q_proj.weight_shape"]
    assert shape.facts["local_shapes"] == [[chunk(2, 4, r)] for r in range(4)] == [[1], [1], [0], [0]]
    assert not by_code(report, "TPA202")  # 4096/4 = 8 groups, 14336/4 = 28 groups of 128


def test_three_bit_packing_is_a_layout_error(tmp_path):
    from test_cases import materialise

    model_dir, _ = materialise("11-compressed-tensors-weight-shape-g-idx-sharded", tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 3
    (model_dir / "config.json").write_text(json.dumps(config))
    report = audit(str(model_dir), tp=2)
    layout = {f.target for f in by_code(report, "TPA501")}
    # rowwise splits the packed input axis of o_proj and down_proj; 3 does not divide 32
    assert layout == {"model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"}
    assert any("cannot be recovered" in f.message for f in by_code(report, "TPA201"))


def test_fused_name_split_colwise_without_parity_is_only_a_warning():
    """Without the parity check a fused name split by plain colwise is a suspicion: a warning, never an error (the
    parity tests show the evidence turning it into an error or clearing it)."""
    plan = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
            "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.experts.gate_up_proj": "colwise", "layers.*.mlp.experts.down_proj": "rowwise",
            "layers.*.mlp.experts": "moe_tp_experts"}
    report = audit(QWEN3_VL, tp=4, plan=plan, parity="off")
    layout = by_code(report, "TPA501")
    assert [(f.target, f.severity) for f in layout] == \
        [("model.language_model.layers.*.mlp.experts.gate_up_proj", "warning")]
    assert layout[0].facts["evidence"] == "name" and "--parity" in layout[0].fix
    plan["layers.*.mlp.experts.gate_up_proj"] = "packed_colwise"
    assert not by_code(audit(QWEN3_VL, tp=4, plan=plan, parity="off"), "TPA501")


@pytest.mark.slow  # the FP8 quantizer on a 62,636-tensor checkpoint, written once per session (about 6 s)
def test_fp8_block_misaligned_case_14(tmp_path):
    from test_cases import materialise

    model_dir, _ = materialise("14-fp8-block-shards-smaller-than-block", tmp_path)
    text = json.loads((model_dir / "config.json").read_text())["text_config"]
    report = audit(str(model_dir), tp=8, plan=plan_524("qwen3-5-moe"))  # experts split by TP, as 5.23/5.24 shipped
    found = {f.target.rsplit(".", 2)[-2] + "." + f.target.rsplit(".", 1)[-1]: f for f in by_code(report, "TPA202")}
    moe = text["moe_intermediate_size"]
    assert found["experts.gate_up_proj"].facts["per_rank"] == [moe // 8] * 8 == [64] * 8   # each packed half
    assert found["shared_expert.down_proj"].facts["per_rank"] == [text["shared_expert_intermediate_size"] // 8] * 8
    assert "self_attn.q_proj" not in found                       # 16 heads x 256 x 2 / 8 = 1024 rows
    assert found["experts.gate_up_proj"].facts["largest_aligned_tp_size"] == 4


@pytest.mark.slow  # the 91,991-tensor DeepSeek-V3 fixture, parity included
def test_unmapped_mtp_layer_deepseek_v3():
    tensors = snapshot_tensors("deepseek-v3")
    mtp = [(n, d, s) for n, d, s in tensors if n.startswith("model.layers.61.")]
    report = audit(str(FIXTURES / "deepseek-v3.snapshot.json.gz"), tp=8)
    found = by_code(report, "TPA301")
    assert [f.target for f in found] == ["model.layers.61.*"]
    assert found[0].facts["count"] == len(mtp) == 1564
    assert found[0].facts["bytes"] == sum(nbytes(d, s) for _, d, s in mtp)
    # Every other checkpoint tensor maps: the model's parameter bytes are the checkpoint's minus the MTP layer and
    # minus the routers' e_score_correction_bias, which DeepseekV3 registers as a buffer (buffers are not counted).
    buffers = sum(nbytes(d, s) for n, d, s in tensors if n.endswith("e_score_correction_bias") and n not in
                  {m for m, _, _ in mtp})
    assert buffers == 58 * 256 * 4
    # transformers 5.24 keeps the routers' gate.weight in float32 (DeepseekV3PreTrainedModel's
    # _keep_in_fp32_modules_strict); the checkpoint stores it in bfloat16, so each of the 58 MoE layers' [256, 7168]
    # router weighs 2 more bytes per element once loaded.
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3PreTrainedModel

    fp32_router = "gate.weight" in (DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict or [])
    assert fp32_router == (transformers_release() >= (5, 24))
    upcast = 58 * 256 * 7168 * 2 if fp32_router else 0
    assert report.total_param_bytes == (sum(nbytes(d, s) for _, d, s in tensors) - found[0].facts["bytes"] - buffers
                                        + upcast)
    # MLA attention of deepseek_v3 has no TP rules in transformers 5.23/5.24 (a known gap; 5.25 adds them)
    from transformers import DeepseekV3Config

    errors = {f.target for f in report.findings if f.code == "TPA001" and f.severity == "error"}
    mla_rules = "layers.*.self_attn.q_b_proj" in DeepseekV3Config.base_model_tp_plan
    assert ("model.layers.*.self_attn.q_b_proj.weight" in errors) == (not mla_rules)
    assert report.model["bytes_caveat"] is None   # 2% of the checkpoint unmapped, nothing missing: no caveat


def test_ep_overrides_tp_note(tmp_path):
    from test_cases import materialise

    model_dir, _ = materialise("10-fp8-qwen3-vl-moe-expert-scales-ep", tmp_path)
    # the experts' TP rules as transformers 5.23/5.24 shipped them (5.25 ships none for EP to replace)
    report = audit(str(model_dir), tp=4, ep=4, plan=plan_524("qwen3-vl-moe"))
    note = by_code(report, "TPA401")
    assert note and note[0].severity == "note"
    assert "model.language_model.layers.*.mlp.experts.gate_up_proj" in note[0].facts["dropped_tp_rules"]
    experts = next(g for g in report.groups if g.generic_name.endswith("experts.gate_up_proj"))
    assert experts.style == "grouped_gemm" and experts.local_shape_rank0[0] == 128 // 4


def test_experts_not_divisible_by_ep_is_input_error():
    from tpaudit.errors import UsageError

    with pytest.raises(UsageError, match="experts"):
        audit(str(CASES / "18-qwen2-moe-shared-expert-replicated"), tp=8, ep=8)  # 60 experts


def test_every_rule_has_a_catalogue_entry():
    from tpaudit.checks.registry import all_rules

    rules = all_rules()
    kinds = {r.kind for r in rules}
    assert {"replicated_weight", "unused_rule", "no_plan", "indivisible_dim", "kv_heads_per_rank",
            "quant_metadata_sharded", "quant_block_misaligned", "packed_layout",
            "unmapped_checkpoint_tensor"} <= kinds
    for r in rules:
        sections = r.sections()
        assert all(sections.get(k) for k in ("What it detects", "Why it matters", "Example", "Fix")), r.code


def test_missing_checkpoint_tensor(tmp_path):
    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint
    import dataclasses

    src = open_source(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"))
    dropped = [t for t in src.tensors if t.name.endswith("layers.3.mlp.up_proj.weight")]
    kept = tuple(t for t in src.tensors if t not in dropped)
    write_sparse_checkpoint(dataclasses.replace(src, tensors=kept), tmp_path / "m")
    report = audit(str(tmp_path / "m"), tp=2)
    found = by_code(report, "TPA302")
    assert [(f.target, f.facts["count"], f.facts["example"]) for f in found] == [
        ("model.layers.*.mlp.up_proj.weight", 1, "model.layers.3.mlp.up_proj.weight")]
    assert found[0].severity == "warning"


def test_fp8_fix_lists_the_tp_sizes_that_keep_whole_blocks():
    """Qwen3-30B-A3B-FP8 (128 x 128 blocks) at tp 8: the experts' down_proj has moe_intermediate_size = 768 input
    features = 6 blocks, whole at tp 1, 2, 3, 6 (not 4: 192 rows, not 5: uneven); k_proj has 4 KV heads x 128 = 512
    output features = 4 blocks, whole at tp 1, 2, 4."""
    path = str(FIXTURES / "qwen3-30b-a3b-fp8.snapshot.json.gz")
    report = audit(path, tp=8, plan=plan_524("qwen3-moe"))  # experts split by TP, as 5.23/5.24 shipped
    found = {f.target.rsplit(".", 2)[-2] + "." + f.target.rsplit(".", 1)[-1]: f for f in by_code(report, "TPA202")}
    down, k = found["experts.down_proj"], found["self_attn.k_proj"]
    assert down.facts["aligned_tp_sizes"] == [t for t in range(1, 8) if 768 % t == 0 and (768 // t) % 128 == 0]
    assert down.facts["aligned_tp_sizes"] == [1, 2, 3, 6] and "(1, 2, 3, 6;" in down.fix
    assert k.facts["aligned_tp_sizes"] == [1, 2, 4] and "(1, 2, 4;" in k.fix


@pytest.mark.slow  # builds the 1-trillion-parameter Kimi-K2.5 (384 experts x 60 layers) on the meta device
def test_kimi_k25_per_expert_tensors_load_into_the_fused_experts():
    """Kimi-K2.5's checkpoint stores each routed expert as compressed-tensors int4 (`experts.E.down_proj.weight_packed`,
    `weight_scale`, `weight_shape`), while the runtime model has fused experts. transformers' compressed-tensors
    quantizer makes the model's own per-expert merge collect those companions and dequantize them first
    (`HfQuantizer.update_weight_conversions`, `CompressedTensorsDequantize`), so every per-expert tensor loads into
    `experts.gate_up_proj` / `experts.down_proj`: no TPA301 for them, no TPA302 for the fused parameters."""
    import re

    tensors = snapshot_tensors("kimi-k2.5")
    per_expert = [n for n, _, _ in tensors if re.search(r"\.layers\.\d+\.mlp\.experts\.\d+\.", n)]
    assert len(per_expert) == 60 * 384 * 3 * 3   # 60 MoE layers x 384 experts x 3 projections x 3 tensors
    report = audit(str(FIXTURES / "kimi-k2.5.snapshot.json.gz"), tp=8)
    assert not [f.target for f in by_code(report, "TPA301") if ".mlp.experts" in f.target]
    assert not [f.target for f in by_code(report, "TPA302") if ".mlp.experts" in f.target]


def test_no_plan_under_ep_says_the_experts_are_sharded_by_expert():
    """granite-3.1-1b-a400m at tp 4 / ep 4: the EP plan shards the experts inside the layers, no TP rule shards
    attention. TPA003 says exactly that, with the ep_size, instead of "shards nothing" followed by a list of layer
    experts."""
    # granitemoe's plan as transformers 5.23/5.24 shipped it: expert rules only (5.25 adds attention rules)
    report = audit(str(FIXTURES / "granite-3.1-1b-a400m-instruct.snapshot.json.gz"), tp=4, ep=4,
                   plan=plan_524("granitemoe"))
    (f,) = by_code(report, "TPA003")
    assert "only the expert-parallel plan shards (ep_size 4" in f.message
    assert "block_sparse_moe.experts.gate_up_proj" in f.message and "the plan shards only" not in f.message
    attention = sum(g.total_bytes for g in report.shard_map.groups if ".self_attn." in g.generic_name)
    assert attention > 0 and f.facts["layer_bytes"] >= attention


def test_an_unused_rule_of_the_shipped_plan_is_not_told_to_be_removed():
    # Qwen3-30B-A3B: every layer is sparse (decoder_sparse_step 1, no mlp_only_layers), so the dense mlp.* rules that
    # transformers' Qwen3MoeConfig.base_model_tp_plan carries for dense layers match nothing
    from transformers import Qwen3MoeConfig

    dense = {k for k in Qwen3MoeConfig.base_model_tp_plan if k.startswith("layers.*.mlp.") and "experts" not in k
             and "gate" != k.rpartition(".")[2]}
    assert dense == {"layers.*.mlp.gate_proj", "layers.*.mlp.up_proj", "layers.*.mlp.down_proj"}
    ref = str(FIXTURES / "qwen3-30b-a3b.snapshot.json.gz")
    unused = {f.facts["relative_key"]: f for f in audit(ref, 4).findings if f.code == "TPA002"}
    assert set(unused) == dense
    for f in unused.values():
        assert "Qwen3MoeConfig.base_model_tp_plan" in f.fix and not f.fix.startswith("Remove")
    # the same rules in a --plan file are the user's to remove
    mine = audit(ref, 4, plan=dict(Qwen3MoeConfig.base_model_tp_plan))
    fixes = {f.facts["relative_key"]: f.fix for f in mine.findings if f.code == "TPA002"}
    assert set(fixes) == dense and all(x.startswith(f"Remove `{k}`") for k, x in fixes.items())
