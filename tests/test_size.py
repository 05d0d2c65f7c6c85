"""`tpaudit size`: KV cache and fit per (tp, ep), values derived by hand from the configs."""

from __future__ import annotations

import json

from conftest import FIXTURES, read_json_any, run_cli

GB = 10**9


def config_of(name):
    return read_json_any(FIXTURES / f"{name}.snapshot.json.gz")["config"]


def size(name, **kwargs):
    from tpaudit.sizing import size_model
    from tpaudit.sources import open_source

    return size_model(open_source(str(FIXTURES / f"{name}.snapshot.json.gz")), **kwargs)


def option(report, tp, ep=1):
    return next(o for o in report.options if (o.tp_size, o.ep_size) == (tp, ep))


def test_qwen3_vl_moe_recommendation_and_kv(tmp_path):
    text = config_of("qwen3-vl-30b-a3b-instruct")["text_config"]
    per_token_tp1 = text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 2 * 2
    assert per_token_tp1 == 98_304
    proc = run_cli("size", str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz"), "--gpu-memory", "24GB",
                   "--context", "32768", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "tpaudit/size/v1"
    opts = {o["tp_size"]: o for o in out["options"]}
    assert opts[1]["kv_cache_bytes_per_token_per_rank"] == per_token_tp1
    assert opts[4]["kv_cache_bytes_per_token_per_rank"] == per_token_tp1 // 4 == 24_576
    assert opts[4]["kv_cache_bytes"] == 24_576 * 32_768
    assert opts[8]["valid"] is False and "4 KV heads" in opts[8]["reason"]
    assert opts[4]["worst_rank_param_bytes"] == 16_362_514_912
    assert opts[4]["overhead_bytes"] == (1 << 30) + int(0.08 * 24 * GB)
    assert opts[4]["total_bytes"] == 16_362_514_912 + 24_576 * 32_768 + opts[4]["overhead_bytes"]
    assert not opts[2]["fits"] and opts[4]["fits"]
    assert out["recommended"] == {"tp_size": 4, "ep_size": 1}


def test_dense_llama_kv_scales_with_tp_and_kv_dtype():
    c = config_of("llama-3.1-8b-instruct")
    per_token = c["num_hidden_layers"] * c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 2
    report = size("llama-3.1-8b-instruct", capacity_bytes=80 * GB, gpu_name=None, tp_sizes=[1, 2, 8], context=4096,
                  batch=4, kv_dtype="float8_e4m3fn")
    for tp in (1, 2, 8):
        o = option(report, tp)
        assert o.kv_cache_bytes_per_token_per_rank == per_token * 1 // tp            # 1 byte per fp8 element
        assert o.worst.kv_cache_bytes == per_token // tp * 4096 * 4
    assert report.recommended.tp_size == 1


def test_sliding_window_layers_stop_at_their_window():
    c = config_of("gpt-oss-20b")
    types = c["layer_types"]
    per_layer = c["num_key_value_heads"] * c["head_dim"] * 2 * 2
    full, sliding = types.count("full_attention"), types.count("sliding_attention")
    context = 32_768
    expected = (full * context + sliding * min(c["sliding_window"], context)) * per_layer
    report = size("gpt-oss-20b", capacity_bytes=80 * GB, gpu_name="H100-80GB", tp_sizes=[1], context=context)
    assert option(report, 1).worst.kv_cache_bytes == expected


def test_mla_cache_follows_the_expanded_heads():
    c = config_of("deepseek-v3")
    # transformers caches MLA keys (nope + rope) and values per head; 5.23's plan does not shard kv_b_proj,
    # so every rank caches all heads at any tp.
    per_token = c["num_hidden_layers"] * c["num_attention_heads"] * (
        c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * 2
    report = size("deepseek-v3", capacity_bytes=141 * GB, gpu_name=None, tp_sizes=[8], context=1024)
    o = option(report, 8)
    assert o.kv_cache_bytes_per_token_per_rank == per_token == 4_997_120
    total = o.worst.param_bytes + per_token * 1024 + (1 << 30) + int(0.08 * 141 * GB)
    assert o.worst.total_bytes == total and o.fits == (total <= 141 * GB)


def test_linear_attention_state_is_per_sequence():
    c = config_of("qwen3.5-35b-a3b")["text_config"]
    n_linear = c["layer_types"].count("linear_attention")
    conv_dim = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + \
        c["linear_num_value_heads"] * c["linear_value_head_dim"]
    state = n_linear * (conv_dim * c["linear_conv_kernel_dim"] * 2 + c["linear_num_value_heads"] *
                        c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4)
    report = size("qwen3.5-35b-a3b", capacity_bytes=80 * GB, gpu_name=None, tp_sizes=[2], context=100, batch=3)
    assert option(report, 2).worst.state_bytes == state * 3


def test_size_input_errors():
    proc = run_cli("size", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"))
    assert proc.returncode == 2 and "--gpu" in proc.stderr
    proc = run_cli("size", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--gpu", "Z80")
    assert proc.returncode == 2 and "H100-80GB" in proc.stderr
    proc = run_cli("size", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--gpu", "h100_80gb",
                   "--tp", "1,x")
    assert proc.returncode == 2 and "--tp" in proc.stderr
