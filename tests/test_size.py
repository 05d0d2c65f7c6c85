"""`tpaudit size`: KV cache and fit per (tp, ep), values derived by hand from the configs."""

from __future__ import annotations

import json

import pytest

from conftest import CASES, FIXTURES, read_json_any, run_main
from releases import plan_524

GB = 10**9


def config_of(name):
    return read_json_any(FIXTURES / f"{name}.snapshot.json.gz")["config"]


def size(name, **kwargs):
    from tpaudit.sizing import size_model
    from tpaudit.sources import open_source

    return size_model(open_source(str(FIXTURES / f"{name}.snapshot.json.gz")), **kwargs)


def size_dir(path, **kwargs):
    from tpaudit.sizing import size_model
    from tpaudit.sources import open_source

    return size_model(open_source(str(path)), gpu_name=None, **kwargs)


def option(report, tp, ep=1):
    return next(o for o in report.options if (o.tp_size, o.ep_size) == (tp, ep))


def test_qwen3_vl_moe_recommendation_and_kv(tmp_path):
    from transformers import Qwen3VLMoeTextConfig

    config = config_of("qwen3-vl-30b-a3b-instruct")
    text = config["text_config"]
    per_token_tp1 = text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 2 * 2
    assert per_token_tp1 == 98_304
    experts = text["num_hidden_layers"] * text["num_experts"] * 3 * text["moe_intermediate_size"] * \
        text["hidden_size"] * 2
    proc = run_main("size", str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz"), "--gpu-memory", "24GB",
                   "--context", "32768", "--format", "json")
    assert not proc.stderr, proc.stderr   # the exit code is asserted below, with the options that decide it
    out = json.loads(proc.stdout)
    assert out["schema"] == "tpaudit/size/v1"
    opts = {(o["tp_size"], o["ep_size"]): o for o in out["options"]}
    assert opts[(1, 1)]["kv_cache_bytes_per_token_per_rank"] == per_token_tp1
    assert opts[(4, 4)]["kv_cache_bytes_per_token_per_rank"] == per_token_tp1 // 4 == 24_576
    assert opts[(4, 4)]["kv_cache_bytes"] == 24_576 * 32_768
    assert opts[(8, 1)]["valid"] is False and "4 KV heads" in opts[(8, 1)]["reason"]
    # tp 4 with the experts split by expert (ep 4, which size tries by itself for a model with an EP plan)
    assert opts[(4, 4)]["worst_rank_param_bytes"] == 16_362_514_912
    assert opts[(4, 4)]["overhead_bytes"] == (1 << 30) + int(0.08 * 24 * GB)
    assert opts[(4, 4)]["total_bytes"] == 16_362_514_912 + 24_576 * 32_768 + opts[(4, 4)]["overhead_bytes"]
    assert opts[(4, 4)]["total_bytes"] <= 24 * GB and opts[(4, 4)]["errors"] == []
    if any("experts" in k for k in Qwen3VLMoeTextConfig.base_model_tp_plan or {}):
        # 5.23/5.24: tp alone splits the experts, but transformers cannot TP-load this checkpoint's stored experts
        # (TPA304, decided in tests/test_check_real_models.py)
        assert opts[(2, 1)]["valid"] is opts[(4, 1)]["valid"] is False
        assert all("TPA304" in opts[(t, 1)]["reason"] for t in (2, 4))
    else:
        # 5.25: the shipped plan leaves the experts to expert parallelism: tp alone holds them whole on every rank
        assert opts[(4, 1)]["worst_rank_param_bytes"] == 16_362_514_912 + experts * 3 // 4
        assert not opts[(4, 1)]["fits"] and any(e.startswith("TPA001") for e in opts[(4, 1)]["errors"])
    assert not opts[(1, 1)]["fits"] and opts[(1, 1)]["valid"]
    assert proc.returncode == 0 and out["recommended"] == {"tp_size": 4, "ep_size": 4}


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


@pytest.mark.slow  # the 91,991-tensor DeepSeek-V3 fixture
def test_mla_cache_follows_the_expanded_heads():
    c = config_of("deepseek-v3")
    # transformers caches MLA keys (nope + rope) and values per head; 5.23/5.24's plan does not shard kv_b_proj,
    # so every rank caches all heads at any tp; 5.25's splits it colwise, so each of 8 ranks caches 128 / 8 heads.
    from transformers import DeepseekV3Config

    per_token = c["num_hidden_layers"] * c["num_attention_heads"] * (
        c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * 2
    assert per_token == 4_997_120
    split = 8 if DeepseekV3Config.base_model_tp_plan.get("layers.*.self_attn.kv_b_proj") == "colwise" else 1
    report = size("deepseek-v3", capacity_bytes=141 * GB, gpu_name=None, tp_sizes=[8], context=1024)
    o = option(report, 8)
    assert o.kv_cache_bytes_per_token_per_rank == per_token // split
    total = o.worst.param_bytes + per_token // split * 1024 + (1 << 30) + int(0.08 * 141 * GB)
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
    proc = run_main("size", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"))
    assert proc.returncode == 2 and "--gpu" in proc.stderr
    proc = run_main("size", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--gpu", "Z80")
    assert proc.returncode == 2 and "H100-80GB" in proc.stderr
    proc = run_main("size", str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), "--gpu", "h100_80gb",
                   "--tp", "1,x")
    assert proc.returncode == 2 and "--tp" in proc.stderr


# ----------------------------------------------------------------------------------------------------------------------
# Training model states: pure arithmetic on a hand-built ShardMap
# ----------------------------------------------------------------------------------------------------------------------
def _param(name, shape, dtype, local_shapes, *, itemsize=None, tied_to=None, origin="checkpoint"):
    from tpaudit.model import ParamShard, generic_name

    sizes = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "int32": 4, "int64": 8}
    return ParamShard(name=name, generic_name=generic_name(name), global_shape=tuple(shape), dtype=dtype,
                      itemsize=itemsize or sizes[dtype], local_shapes=tuple(tuple(s) for s in local_shapes),
                      style=None, rule=None, plan=None, placement="whole", sharding="unsharded", origin=origin,
                      tied_to=tied_to)


def _toy_map():
    """Two ranks: a colwise bf16 weight split unevenly (5 rows -> 3 + 2), a replicated bf16 norm, an fp32 bias,
    an fp8 weight with its fp32 block scale and a bf16 bias in one module, an int32 packed weight, experts split by
    expert (EP), and a tied lm_head."""
    from tpaudit.model import ShardMap

    params = (
        _param("m.embed.weight", (5, 4), "bfloat16", [(3, 4), (2, 4)]),
        _param("m.norm.weight", (4,), "bfloat16", [(4,), (4,)]),
        _param("m.proj.bias", (6,), "float32", [(3,), (3,)]),
        _param("m.fp8.weight", (8, 4), "float8_e4m3fn", [(4, 4), (4, 4)]),
        _param("m.fp8.weight_scale_inv", (2, 1), "float32", [(1, 1), (1, 1)]),
        _param("m.fp8.bias", (8,), "bfloat16", [(4,), (4,)]),
        _param("m.awq.qweight", (4, 2), "int32", [(4, 1), (4, 1)]),
        _param("m.experts.gate_up_proj", (4, 6, 3), "bfloat16", [(2, 6, 3), (2, 6, 3)]),
        _param("lm_head.weight", (5, 4), "bfloat16", [(3, 4), (2, 4)], tied_to="m.embed.weight"),
    )
    return ShardMap(tp_size=2, ep_size=2, params=params)


def test_training_states_by_hand_on_a_toy_shard_map():
    from tpaudit.sizing.training import TrainingSetup, frozen_families, rank_training

    sm = _toy_map()
    # trainable local elements per rank: embed 12 / 8, norm 4, bias fp32 3, fp8 bias 4, experts 36; the fp8 weight,
    # its scale and the int32 qweight get nothing; the tied lm_head counts once (it is the embedding).
    half = [12 + 4 + 4 + 36, 8 + 4 + 4 + 36]          # 16-bit trainable elements
    fp32 = [3, 3]
    ranks = rank_training(sm, TrainingSetup())
    assert [r.trainable_elements for r in ranks] == [h + f for h, f in zip(half, fp32)] == [59, 55]
    assert [r.frozen_elements for r in ranks] == [16 + 1 + 4] * 2
    assert [r.param_bytes for r in ranks] == list(sm.rank_param_bytes)
    assert [r.param_bytes for r in ranks] == [2 * 56 + 4 * 3 + 16 + 4 + 16, 2 * 52 + 4 * 3 + 16 + 4 + 16]
    assert [r.grad_bytes for r in ranks] == [2 * h + 4 * f for h, f in zip(half, fp32)]
    assert [r.master_weight_bytes for r in ranks] == [4 * h for h in half]        # fp32 params have no master copy
    assert [r.optimizer_bytes for r in ranks] == [8 * (h + f) for h, f in zip(half, fp32)]
    assert ranks[0].model_state_bytes == ranks[0].param_bytes + 2 * 56 + 4 * 3 + 4 * 56 + 8 * 59
    # bf16 elements cost 2 + 2 + 4 + 8 = 16 B each
    assert ranks[0].model_state_bytes - ranks[1].model_state_bytes == 16 * 4
    frozen = {f["name"]: f["reason"] for f in frozen_families(sm)}
    assert frozen == {"m.fp8.weight": "quantized or integer tensor", "m.fp8.weight_scale_inv": "quantization metadata",
                      "m.awq.qweight": "quantized or integer tensor"}


def test_training_optimizer_variants_by_hand():
    from tpaudit.sizing.training import TrainingSetup, rank_training

    sm = _toy_map()
    # sgd: one momentum buffer; fp32 gradients; no master weights
    r0 = rank_training(sm, TrainingSetup(optimizer="sgd", master_weights=False, grad_dtype="float32"))[0]
    assert (r0.grad_bytes, r0.master_weight_bytes, r0.optimizer_bytes) == (4 * 59, 0, 4 * 59)
    # none, bf16 optimizer dtype does not matter then
    r0 = rank_training(sm, TrainingSetup(optimizer="none", optimizer_dtype="bfloat16"))[0]
    assert r0.optimizer_bytes == 0 and r0.master_weight_bytes == 4 * 56
    # adafactor: rows + cols of the local shard's last two dims for >= 2-D, full for 1-D
    r0, r1 = rank_training(sm, TrainingSetup(optimizer="adafactor"))
    embed0, embed1 = 3 + 4, 2 + 4
    vectors = 4 + 3 + 4                      # norm, fp32 bias, fp8 module's bias
    experts = 2 * (6 + 3)                    # local (2, 6, 3): 2 x (rows 6 + cols 3)
    assert r0.optimizer_bytes == 4 * (embed0 + vectors + experts)
    assert r1.optimizer_bytes == 4 * (embed1 + vectors + experts)
    # with bf16 states
    r0 = rank_training(sm, TrainingSetup(optimizer="adamw", optimizer_dtype="bfloat16"))[0]
    assert r0.optimizer_bytes == 2 * 2 * 59
    # the activation budget is added per rank, outside the model states
    r0 = rank_training(sm, TrainingSetup(activation_budget_bytes=1000))[0]
    assert r0.total_bytes == r0.model_state_bytes + 1000


def test_adafactor_elements_follow_transformers_adafactor():
    """Cross-check against the state transformers' Adafactor actually allocates, on real tensors."""
    import math

    import torch
    from transformers.optimization import Adafactor

    from tpaudit.sizing.training import optimizer_elements

    shapes = [(6, 5), (4, 3, 7), (9,), (2, 3, 4, 5)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    opt = Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    for p, shape in zip(params, shapes):
        # scalars (the RMS, the step) are not counted by tpaudit
        state = sum(v.numel() for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        assert optimizer_elements(shape, "adafactor") == state, shape
    adamw = torch.optim.AdamW(params, lr=1e-3)
    adamw.step()
    for p, shape in zip(params, shapes):
        moments = sum(v.numel() for v in adamw.state[p].values() if v.dim() > 0)
        assert optimizer_elements(shape, "adamw") == moments == 2 * math.prod(shape)


def test_training_setup_rejects_unknown_values():
    from tpaudit.sizing.training import TrainingSetup

    for kwargs in ({"optimizer": "adam"}, {"grad_dtype": "int8"}, {"optimizer_dtype": "float128"},
                   {"activation_budget_bytes": -1}):
        with pytest.raises(ValueError):
            TrainingSetup(**kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# Training model states on real models, worked out by hand from the snapshots' shapes and the configs
# ----------------------------------------------------------------------------------------------------------------------
def _local_elements_by_hand(tensors, splits, tp):
    """Local elements per rank: each tensor split on the dimension its rule splits (torch.chunk sizes), or whole."""
    import math
    import re

    from conftest import chunk

    ranks = [0] * tp
    for name, _, shape in tensors:
        dim = next((d for pattern, d in splits if re.fullmatch(pattern, name)), None)
        for r in range(tp):
            local = list(shape)
            if dim is not None:
                local[dim] = chunk(shape[dim], tp, r)
            ranks[r] += math.prod(local)
    return ranks


@pytest.mark.slow
def test_training_qwen3_vl_tp4_shipped_and_pre_fix_plans():
    """The issue's figures: 16 B x local elements of a bf16 model, with the plan transformers 5.23/5.24 shipped (the
    experts split by TP) and the one before the fix (experts replicated on every rank, as 5.25 ships it again)."""
    from conftest import CASES, snapshot_tensors
    from test_check_real_models import QWEN3_VL_SPLITS_PRE_FIX, QWEN3_VL_SPLITS_SHIPPED

    from tpaudit.sizing.training import TrainingSetup

    tensors = snapshot_tensors("qwen3-vl-30b-a3b-instruct")
    assert {d for _, d, _ in tensors} == {"BF16"}
    shipped = _local_elements_by_hand(tensors, QWEN3_VL_SPLITS_SHIPPED, 4)
    pre_fix = _local_elements_by_hand(tensors, QWEN3_VL_SPLITS_PRE_FIX, 4)
    assert shipped == [8_181_257_456] * 4 and pre_fix == [29_924_529_392] * 4
    plan = json.loads((CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json").read_text())
    for elements, plan_override in ((shipped, plan_524("qwen3-vl-moe")), (pre_fix, plan)):
        report = size("qwen3-vl-30b-a3b-instruct", capacity_bytes=80 * GB, gpu_name=None, tp_sizes=[4],
                      plan_override=plan_override, training=TrainingSetup())
        tr = option(report, 4).training
        assert [r.param_bytes for r in tr.ranks] == [2 * n for n in elements]
        assert [r.grad_bytes for r in tr.ranks] == [2 * n for n in elements]
        assert [r.master_weight_bytes for r in tr.ranks] == [4 * n for n in elements]
        assert [r.optimizer_bytes for r in tr.ranks] == [8 * n for n in elements]
        assert tr.worst.total_bytes == 16 * elements[0]
        assert not tr.fits and report.recommended is None
    assert 16 * shipped[0] == 130_900_119_296 and 16 * pre_fix[0] == 478_792_470_272
    out = report.to_json()["options"][0]["training"]
    assert out["worst_rank_total_bytes"] == 478_792_470_272
    assert out["required_bytes"] == 478_792_470_272 + (1 << 30) + int(0.08 * 80 * GB)


def test_training_uneven_granite_tp5_adamw_and_adafactor():
    """granite at tp 5: torch.chunk gives ranks 0-3 the larger shards, so rank 0 carries the most states."""
    from conftest import CASES, chunk

    from tpaudit.sizing.training import TrainingSetup

    c = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    h, inter, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    elements, adafactor = [], []
    for r in range(5):
        q, k, i = chunk(h, 5, r), chunk(kv, 5, r), chunk(inter, 5, r)
        shards = [(q, h), (k, h), (k, h), (h, q), (i, h), (i, h), (h, i)]         # q k v o gate up down
        per_layer = sum(a * b for a, b in shards) + 2 * h                         # + 2 norms
        elements.append(L * per_layer + chunk(v, 5, r) * h + h)                   # tied embedding once, final norm
        adafactor.append(L * (sum(a + b for a, b in shards) + 2 * h) + chunk(v, 5, r) + h + h)
    report = size_dir(CASES / "09-granite-tp5-indivisible-dims", capacity_bytes=80 * GB, tp_sizes=[5],
                      training=TrainingSetup())
    tr = option(report, 5).training
    assert [r.model_state_bytes for r in tr.ranks] == [16 * n for n in elements]
    assert tr.worst.rank == 0 and elements[0] > elements[4]
    report = size_dir(CASES / "09-granite-tp5-indivisible-dims", capacity_bytes=80 * GB, tp_sizes=[5],
                      training=TrainingSetup(optimizer="adafactor", master_weights=False))
    tr = option(report, 5).training
    assert [r.optimizer_bytes for r in tr.ranks] == [4 * n for n in adafactor]
    assert [r.model_state_bytes for r in tr.ranks] == [4 * n + 4 * a for n, a in zip(elements, adafactor)]
    assert not option(report, 5).valid and not option(report, 5).training_fits   # TPA102: invalid even if it fits


def test_training_fp8_experts_with_ep(tmp_path):
    """FP8 Qwen3-VL-MoE at tp 4 / ep 4: experts split by expert; fp8 weights and their fp32 block scales get no
    gradient; the bf16 rest (vision tower, norms, routers, embeddings) trains."""
    from conftest import CASES, read_json_any
    from test_cases import materialise

    from tpaudit.sizing.training import TrainingSetup

    case = "10-fp8-qwen3-vl-moe-expert-scales-ep"
    spec = read_json_any(CASES / case / "tensors.json.gz")
    c = json.loads((CASES / case / "config.json").read_text())["text_config"]
    import math

    h, vocab = c["hidden_size"], c["vocab_size"]
    bf16 = sum(math.prod(v if not isinstance(v[0], str) else v[1]) for v in spec["tensors"].values()
               if not isinstance(v[0], str) or v[0] == "BF16")
    # embed_tokens (embedding_rowwise) and lm_head (colwise_gather_output) split the vocabulary; the rest is whole
    trainable = bf16 - 2 * vocab * h + 2 * (vocab // 4) * h
    model_dir, _ = materialise(case, tmp_path)
    report = size_dir(model_dir, capacity_bytes=80 * GB, tp_sizes=[4], ep_sizes=[4], training=TrainingSetup())
    o = option(report, 4, 4)
    for r in o.training.ranks:
        assert r.trainable_elements == trainable
        assert (r.grad_bytes, r.master_weight_bytes, r.optimizer_bytes) == (2 * trainable, 4 * trainable,
                                                                            8 * trainable)
        assert r.param_bytes == o.ranks[r.rank].param_bytes
    experts = c["num_experts"] // 4 * (2 * c["moe_intermediate_size"] * h + h * c["moe_intermediate_size"])
    assert o.training.ranks[0].frozen_elements > c["num_hidden_layers"] * experts   # fp8 experts, 32 per rank
    frozen = {f["name"]: f["reason"] for f in report.frozen}
    assert frozen["model.language_model.layers.*.mlp.experts.gate_up_proj"] == "quantized or integer tensor"
    assert frozen["model.language_model.layers.*.mlp.experts.gate_up_proj_scale_inv"] == "quantization metadata"
    assert "model.language_model.layers.*.mlp.gate.weight" not in frozen


def test_training_ep_adafactor_on_expert_shards():
    """qwen3-30b-a3b at tp 4 / ep 4: each rank holds 32 whole experts [32, 2I, H], so Adafactor keeps
    32 x (2I + H) row + column statistics per expert tensor, not the TP figure."""
    from tpaudit.sizing.training import TrainingSetup

    c = config_of("qwen3-30b-a3b")
    h, L, vocab, E, I = (c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_experts"],
                         c["moe_intermediate_size"])
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    attn = [(q // 4, h), (kv // 4, h), (kv // 4, h), (h, q // 4)]
    experts = [(E // 4, 2 * I, h), (E // 4, h, I)]
    vectors = 2 * c["head_dim"] + 2 * h                                       # q/k norm, 2 layer norms
    layer = sum(a * b for a, b in attn) + sum(e * a * b for e, a, b in experts) + E * h + vectors
    elements = L * layer + 2 * (vocab // 4) * h + h
    layer_af = sum(a + b for a, b in attn) + sum(e * (a + b) for e, a, b in experts) + (E + h) + vectors
    adafactor = L * layer_af + 2 * (vocab // 4 + h) + h
    report = size("qwen3-30b-a3b", capacity_bytes=80 * GB, gpu_name=None, tp_sizes=[4], ep_sizes=[4],
                  training=TrainingSetup(optimizer="adafactor"))
    tr = option(report, 4, 4).training
    assert [r.trainable_elements for r in tr.ranks] == [elements] * 4
    assert [r.optimizer_bytes for r in tr.ranks] == [4 * adafactor] * 4
    assert tr.worst.model_state_bytes == 2 * elements + 2 * elements + 4 * elements + 4 * adafactor


# ----------------------------------------------------------------------------------------------------------------------
# The longest context that fits
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_max_context_qwen3_vl_tp4_is_the_exact_largest():
    """24 GB GPUs: 24e9 - 16,362,514,912 B of weights - (1 GiB + 8%) overhead, at 24,576 B per token per rank, with
    the experts split by TP as transformers 5.23/5.24 shipped the plan (5.25 leaves them to the EP plan)."""
    text = config_of("qwen3-vl-30b-a3b-instruct")["text_config"]
    per_token = text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 2 * 2 // 4
    left = 24 * GB - 16_362_514_912 - ((1 << 30) + int(0.08 * 24 * GB))
    expected = left // per_token
    assert expected == 188_954
    assert 16_362_514_912 + expected * per_token + (1 << 30) + int(0.08 * 24 * GB) <= 24 * GB
    assert 16_362_514_912 + (expected + 1) * per_token + (1 << 30) + int(0.08 * 24 * GB) > 24 * GB
    plan = plan_524("qwen3-vl-moe")
    report = size("qwen3-vl-30b-a3b-instruct", capacity_bytes=24 * GB, gpu_name=None, tp_sizes=[2, 4], ep_sizes=[1],
                  plan_override=plan)
    o = option(report, 4).to_json()
    assert o["bytes_left_for_kv_cache"] == left
    assert o["max_context_tokens"] == expected
    assert o["max_context_cap_tokens"] == text["max_position_embeddings"] == 262_144
    assert o["max_context_limited_by"] == "memory"
    # tp 2: the weights alone (about 29 GiB a rank) leave no room
    o2 = option(report, 2).to_json()
    assert o2["bytes_left_for_kv_cache"] < 0 and o2["max_context_tokens"] == 0
    assert o2["max_context_limited_by"] == "weights"
    # The context the report says fits, sized as a normal option, fits in memory; one more token does not (the
    # option itself is invalid: this checkpoint's TP load fails, TPA304, which the arithmetic does not depend on).
    for context, fits in ((expected, True), (expected + 1, False)):
        again = size("qwen3-vl-30b-a3b-instruct", capacity_bytes=24 * GB, gpu_name=None, tp_sizes=[4], ep_sizes=[1],
                     context=context, plan_override=plan)
        assert (option(again, 4).worst.total_bytes <= 24 * GB) is fits and option(again, 4).valid is False


def test_max_context_uneven_kv_heads_granite_tp5():
    """granite at tp 5: k/v rows 512 -> 103 on ranks 0-3, 100 on rank 4; rank 0 has the largest weights and the
    largest cache, so it limits the context; batch 3 sequences."""
    from conftest import CASES, chunk

    c = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    h, L = c["hidden_size"], c["num_hidden_layers"]
    kv_rows = c["num_key_value_heads"] * h // c["num_attention_heads"]
    per_token = [L * 2 * chunk(kv_rows, 5, r) * 2 for r in range(5)]         # k and v rows, bf16
    assert per_token[0] == 16_480 and per_token[4] == 16_000
    report = size_dir(CASES / "09-granite-tp5-indivisible-dims", capacity_bytes=3 * GB, tp_sizes=[5], batch=3)
    o = option(report, 5)
    weights0 = o.ranks[0].param_bytes
    over = (1 << 30) + int(0.08 * 3 * GB)
    expected = min((3 * GB - r.param_bytes - over) // (per_token[r.rank] * 3) for r in o.ranks)
    assert expected == (3 * GB - weights0 - over) // (16_480 * 3)
    assert o.context_fit.max_context_tokens == expected < c["max_position_embeddings"]
    assert o.context_fit.rank == 0
    assert weights0 + expected * 16_480 * 3 + over <= 3 * GB < weights0 + (expected + 1) * 16_480 * 3 + over


def test_max_context_sliding_layers_stop_at_their_window():
    c = config_of("gpt-oss-20b")
    types = c["layer_types"]
    per_layer = c["num_key_value_heads"] * c["head_dim"] * 2 * 2
    full, sliding, window = types.count("full_attention"), types.count("sliding_attention"), c["sliding_window"]
    capacity = 17 * GB                      # the MXFP4 weights (about 12 GiB, as a GPU holds them) leave about 1.7 GB
    report = size("gpt-oss-20b", capacity_bytes=capacity, gpu_name=None, tp_sizes=[1])
    o = option(report, 1)
    left = capacity - o.ranks[0].param_bytes - ((1 << 30) + int(0.08 * capacity))
    expected = (left - sliding * window * per_layer) // (full * per_layer)
    assert window < expected < c["max_position_embeddings"]
    assert o.context_fit.bytes_left_for_kv_cache == left
    assert o.context_fit.max_context_tokens == expected and o.context_fit.limited_by == "memory"


def test_max_context_capped_by_max_position_embeddings():
    c = config_of("llama-3.1-8b-instruct")
    report = size("llama-3.1-8b-instruct", capacity_bytes=80 * GB, gpu_name=None, tp_sizes=[2])
    fit = option(report, 2).context_fit
    per_token = c["num_hidden_layers"] * c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 2
    assert fit.bytes_left_for_kv_cache // (per_token // 2) > c["max_position_embeddings"]
    assert fit.max_context_tokens == fit.cap_tokens == c["max_position_embeddings"] == 131_072
    assert fit.limited_by == "max_position_embeddings"


def test_max_context_for_rank_matches_a_linear_scan():
    """The search agrees with a plain scan of the KV formula (full layers grow, windowed layers stop at the window,
    one rounding), also with a cache dtype half the model's (odd bytes x 0.5 round half to even)."""
    from tpaudit.sizing import max_context_for_rank

    from tpaudit.model import KVCacheSection

    full_per_rank, window_per_rank = [3, 0], [10, 5]   # bytes per token: full-context layers, one window of 4 tokens
    kv = KVCacheSection(dtype="bfloat16", itemsize=2, layers={"full": 1, "sliding": 1}, kv_heads=2,
                        kv_heads_per_rank=1.0, bytes_per_token_per_rank=[13, 5],
                        full_context_bytes_per_token_per_rank=full_per_rank, window_bytes_per_token_per_rank=[10, 5],
                        windows=[4], window_bytes_per_token_by_window={"4": window_per_rank},
                        bytes_per_token_whole_model=18, linear_state_bytes_per_sequence=0)

    def scan(rank, batch, scale, budget):
        best = 0
        for c in range(1, 2000):
            full = full_per_rank[rank] * c
            windowed = window_per_rank[rank] * min(4, c)
            if round((full + windowed) * batch * scale) <= budget:
                best = c
        return best

    for budget in (0, 7, 20, 21, 22, 100, 1001):
        for batch, scale in ((1, 1.0), (2, 0.5), (3, 0.5)):
            assert max_context_for_rank(kv, 0, batch, scale, budget) == scan(0, batch, scale, budget)
    # rank 1 has only windowed layers: past the window the cache stops growing
    assert max_context_for_rank(kv, 1, 1, 1.0, 20) is None
    assert max_context_for_rank(kv, 1, 1, 1.0, 12) == 2


def test_linear_attention_state_comes_off_the_budget():
    c = config_of("qwen3.5-35b-a3b")["text_config"]
    n_linear = c["layer_types"].count("linear_attention")
    conv_dim = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + \
        c["linear_num_value_heads"] * c["linear_value_head_dim"]
    state = n_linear * (conv_dim * c["linear_conv_kernel_dim"] * 2 + c["linear_num_value_heads"] *
                        c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4)
    report = size("qwen3.5-35b-a3b", capacity_bytes=80 * GB, gpu_name=None, tp_sizes=[2], batch=2)
    o = option(report, 2)
    over = (1 << 30) + int(0.08 * 80 * GB)
    assert o.context_fit.bytes_left_for_kv_cache == 80 * GB - max(r.param_bytes for r in o.ranks) - over - 2 * state


# ----------------------------------------------------------------------------------------------------------------------
# The command: --training, JSON, table, HTML, bad input
# ----------------------------------------------------------------------------------------------------------------------
GRANITE_DIR = str(CASES / "09-granite-tp5-indivisible-dims")
LLAMA = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")


def granite_elements(tp: int) -> list[int]:
    """Local elements of each rank of granite-3.1-2b (fixtures/cases/09-*) at `tp`, torch.chunk sizes."""
    from conftest import chunk

    c = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    h, inter, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    out = []
    for r in range(tp):
        q, k, i = chunk(h, tp, r), chunk(kv, tp, r), chunk(inter, tp, r)
        layer = q * h + 2 * k * h + h * q + 2 * i * h + h * i + 2 * h
        out.append(L * layer + chunk(v, tp, r) * h + h)          # tied embedding once, final norm
    return out


def test_cli_training_json_and_recommendation():
    # 16 B a bf16 element + a 2 GiB activation budget + the overhead, on a 40 GB GPU: tp 1 does not fit, tp 2 does
    # (rank 0 of tp 2 holds the larger half of the odd 49,155-row vocabulary)
    over = (1 << 30) + int(0.08 * 40 * GB)
    elements = {tp: granite_elements(tp) for tp in (1, 2)}
    assert elements[2][0] > elements[2][1]
    need = {tp: 16 * elements[tp][0] + 2 * 2**30 + over for tp in (1, 2)}
    assert need[1] > 40 * GB >= need[2]
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "40GB", "--tp", "1,2", "--training", "--activation-budget",
                    "2GiB", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["recommended"] == {"tp_size": 2, "ep_size": 1} and out["recommended_for"] == "training"
    assert out["training"]["optimizer"] == "adamw" and out["training"]["master_weights"] is True
    assert any("activations are not modelled" in n for n in out["training"]["notes"])
    for o in out["options"]:
        tr = o["training"]
        n = elements[o["tp_size"]][0]
        assert (tr["worst_rank"], tr["param_bytes"], tr["grad_bytes"], tr["master_weight_bytes"],
                tr["optimizer_bytes"]) == (0, 2 * n, 2 * n, 4 * n, 8 * n)
        assert tr["activation_budget_bytes"] == 2 * 2**30
        assert tr["worst_rank_total_bytes"] == 16 * n + 2 * 2**30
        assert tr["required_bytes"] == need[o["tp_size"]] and tr["fits"] is (o["tp_size"] == 2)
        assert [r["total_bytes"] for r in tr["ranks"]] == [16 * m + 2 * 2**30 for m in elements[o["tp_size"]]]
        assert o["fits"] is True                                  # serving fits either way
        assert o["max_context_tokens"] == 131_072 and o["max_context_limited_by"] == "max_position_embeddings"
    # sgd with bf16 momentum, fp32 gradients, no master weights: 2 + 4 + 0 + 2 = 8 B an element; now tp 1 fits
    assert 8 * elements[1][0] + over <= 40 * GB
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "40GB", "--tp", "1", "--training", "--optimizer", "sgd",
                    "--no-master-weights", "--grad-dtype", "float32", "--optimizer-dtype", "bfloat16",
                    "--format", "json")
    out = json.loads(proc.stdout)
    assert out["options"][0]["training"]["worst_rank_total_bytes"] == 8 * elements[1][0]
    assert out["recommended"] == {"tp_size": 1, "ep_size": 1} and proc.returncode == 0
    # serving JSON keeps its keys and gets the context ones; training is null
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "40GB", "--tp", "1", "--format", "json")
    o = json.loads(proc.stdout)["options"][0]
    assert o["training"] is None and o["max_context_tokens"] == 131_072
    assert {"worst_rank_param_bytes", "kv_cache_bytes", "total_bytes", "free_bytes", "fits"} <= set(o)


def test_cli_training_exit_1_when_nothing_fits_and_table():
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "16GB", "--tp", "1,2,5", "--training")
    assert proc.returncode == 1, proc.stderr
    assert "Training (model states)" in proc.stdout and "max context" in proc.stdout
    assert "activations are not modelled" in proc.stdout
    # tp 5 would fit in 16 GB but splits heads and KV heads: "no valid option", not "no memory"
    assert "No valid option fits" in proc.stdout and "No option fits for training" not in proc.stdout
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "16GB", "--tp", "1,2", "--training")
    assert proc.returncode == 1 and "No option fits for training" in proc.stdout, proc.stdout
    # granite (bf16) at tp 2 on 40 GB: 16 B a local element + overhead fits
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "40GB", "--tp", "2", "--training")
    assert proc.returncode == 0, proc.stdout
    assert "Recommended for training: tp_size 2" in proc.stdout


def test_cli_html_is_self_contained_with_one_bar_per_option(tmp_path):
    import re

    page = tmp_path / "size.html"
    proc = run_main("size", GRANITE_DIR, "--gpu-memory", "16GB", "--tp", "1,2,4,5", "--training", "--format", "html",
                    "-o", str(page))
    # training states are 16 B per local element (bf16 AdamW recipe) + 1 GiB + 8% of the GPU: only tp 4 fits 16 GB
    # (tp 5 splits the KV heads: invalid), so an option fits and the exit code is 0
    overhead = 2**30 + 16 * 10**9 * 8 // 100
    fits = [tp for tp in (1, 2, 4) if 16 * max(granite_elements(tp)) + overhead <= 16 * 10**9]
    assert fits == [4]
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<style>" in text
    assert not re.search(r"https?://|<script|<link|<img|@import|url\(", text)   # nothing fetched at view time
    assert text.count('class="track"') == 4 and text.count('class="cap"') == 4   # one bar per option
    for tp in (1, 2, 4, 5):
        assert f"tp {tp} · ep 1" in text
    # tp 5 splits KV heads (TPA102): marked invalid with its reason; tp 1 does not fit 16 GB, tp 4 does
    assert text.count('<span class="badge invalid">invalid</span>') == 1 and "KV heads" in text
    assert text.count('<span class="badge nofit">does not fit</span>') >= 1
    assert "GiB = 2^10, 2^20, 2^30 bytes" in text
    assert "activations are not modelled" in text
    for label in ("weights", "gradients", "master weights", "optimizer states", "overhead"):
        assert f"{label}</p>" in text or f">{label}<" in text or f"</span>{label}" in text


def test_cli_training_flags_bad_input():
    cases = [
        (["--training", "--optimizer", "adam"], "--optimizer adam"),
        (["--training", "--grad-dtype", "int8"], "--grad-dtype int8"),
        (["--training", "--optimizer-dtype", "fp32"], "--optimizer-dtype fp32"),
        (["--training", "--activation-budget", "lots"], "--activation-budget"),
        (["--optimizer", "sgd"], "--training"),
        (["--no-master-weights"], "--training"),
        (["--format", "svg"], "html"),
    ]
    for extra, needle in cases:
        proc = run_main("size", LLAMA, "--gpu", "H100-80GB", *extra)
        assert proc.returncode == 2, (extra, proc.stdout)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (extra, proc.stderr)
        assert proc.stdout == ""


def test_pairs_transformers_refuses_stay_as_invalid_rows_and_error_plans_say_so():
    """Every (tp, ep) pair asked for gets a row: ep 4 with tp 2 is not a pair transformers 5.23/5.24 accept
    (`DistributedConfig`: ep_size must divide fsdp_size x tp_size), so it is invalid with transformers' reason. A plan with error findings (the
    pre-fix Qwen3-VL plan replicates the experts: TPA001) loads, and the terminal report says its bytes are that
    plan's."""
    moe = str(FIXTURES / "qwen3-30b-a3b-instruct-2507.snapshot.json.gz")
    proc = run_main("size", moe, "--gpu-memory", "80GB", "--tp", "2,4", "--ep", "1,4", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    opts = {(o["tp_size"], o["ep_size"]): o for o in json.loads(proc.stdout)["options"]}
    assert set(opts) == {(2, 1), (2, 4), (4, 1), (4, 4)}
    assert opts[(2, 4)]["valid"] is False and "rejected by transformers" in opts[(2, 4)]["reason"]
    assert all(opts[p]["valid"] for p in [(2, 1), (4, 1), (4, 4)])

    snap = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")

    plan = CASES / "01-qwen3-vl-moe-experts-replicated" / "tp_plan.json"
    proc = run_main("size", snap, "--gpu-memory", "80GB", "--tp", "4", "--plan", str(plan))
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("tp 4 ep 1 loads, but its plan has"))
    assert "TPA001" in line and "tpaudit check --tp 4" in proc.stdout.replace("\n", " ")


def test_a_context_beyond_max_position_embeddings_is_noted():
    config = config_of("qwen3-vl-30b-a3b-instruct")
    cap = config["text_config"]["max_position_embeddings"]
    proc = run_main("size", str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz"), "--gpu-memory", "80GB",
                    "--tp", "4", "--context", str(cap + 1), "--format", "json")
    notes = json.loads(proc.stdout)["notes"]
    assert any(f"--context {cap + 1:,} exceeds the model's max_position_embeddings ({cap:,})" in n for n in notes)
    proc = run_main("size", str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz"), "--gpu-memory", "80GB",
                    "--tp", "4", "--context", str(cap), "--format", "json")
    assert not any("exceeds" in n for n in json.loads(proc.stdout)["notes"])


def test_no_fit_advice_names_the_activation_budget_only_when_there_is_one():
    snap = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
    plain = run_main("size", snap, "--gpu-memory", "24GB", "--tp", "4", "--training")
    assert plain.returncode == 1 and "No option fits for training" in plain.stdout
    assert "activation budget" not in plain.stdout.split("No option fits for training")[1]
    budget = run_main("size", snap, "--gpu-memory", "24GB", "--tp", "4", "--training", "--activation-budget", "1GiB")
    assert "smaller activation budget" in " ".join(budget.stdout.split())


def test_no_fit_advice_points_an_ep_plan_at_ep_and_an_invalid_fit_at_its_reasons():
    # Qwen3-30B-A3B: 30.5 B bf16 parameters (~57 GiB) with an expert-parallel plan; at tp 1 and 2 on 16 GB nothing fits
    snap = str(FIXTURES / "qwen3-30b-a3b.snapshot.json.gz")
    proc = run_main("size", snap, "--gpu-memory", "16GB", "--tp", "1,2", "--ep", "1", "--format", "json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["recommended"] is None
    assert out["no_fit_advice"].startswith("No option fits:") and "pass --ep 1,2,4,8" in out["no_fit_advice"]
    # asking for an EP layout drops the hint; a layout that fits is recommended and the advice is null
    proc = run_main("size", snap, "--gpu-memory", "80GB", "--tp", "1,2", "--ep", "1,2", "--format", "json")
    out = json.loads(proc.stdout)
    assert out["recommended"] is not None and out["no_fit_advice"] is None
    proc = run_main("size", snap, "--gpu-memory", "16GB", "--tp", "1", "--ep", "1,2", "--format", "json")
    assert "--ep" not in (json.loads(proc.stdout)["no_fit_advice"] or "")


def test_an_option_whose_plan_cuts_fp8_blocks_is_invalid_even_though_it_loads():
    # Qwen3-30B-A3B-FP8: 128 x 128 weight blocks; moe_intermediate_size 768 = 6 blocks. tp 2 gives 3 blocks a rank,
    # tp 4 gives 192 rows = 1.5 blocks a rank, so a rank boundary cuts a block of every expert's projections (TPA202)
    assert 768 // 2 % 128 == 0 and 768 // 4 % 128 != 0
    # (the experts split by TP as transformers 5.23/5.24 shipped qwen3_moe's plan: 5.25 ships no expert TP rules)
    snap = str(FIXTURES / "qwen3-30b-a3b-fp8.snapshot.json.gz")
    plan = str(FIXTURES / "plans" / "qwen3-moe.transformers-5.24.json")
    out = json.loads(run_main("size", snap, "--gpu-memory", "80GB", "--tp", "2,4", "--ep", "1", "--plan", plan,
                              "--format", "json").stdout)
    valid = {o["tp_size"]: (o["valid"], o["reason"]) for o in out["options"]}
    # the FP8 layout is the quantizer's (transformers' FineGrainedFP8HfQuantizer on the meta device, as on a GPU); if
    # not, every note whole (the reason the quantizer gave)
    if not any("sized as the target GPUs hold it" in n for n in out["notes"]):
        pytest.fail("the FP8 quantizer did not lay the model out: " + " | ".join(out["notes"]))
    assert valid[2] == (True, None), (valid, out["notes"])
    assert valid[4][0] is False and valid[4][1].startswith("the plan breaks the forward: TPA202"), (valid, out["notes"])
    assert out["recommended"] == {"tp_size": 2, "ep_size": 1}
