"""`ModelFacts` (read once at build time, `tpaudit/metamodel/facts.py`) and what the one vocabulary table lets the checks and the
KV-cache section judge. Expected values come from the configs (config.json, transformers' own config fields) and from
shapes, by hand."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, read_json_any


def _config(model_type: str, **kwargs):
    from tpaudit.compat import backend

    mapping = backend().config_classes()
    if model_type not in mapping:
        pytest.skip(f"transformers {backend().versions['transformers']} has no {model_type}")
    return mapping[model_type](**kwargs)


def test_facts_are_transformers_answers_for_gemma4_global_layers(fixture_path):
    """Gemma-4-31B-it: config.json's text_config has 60 layers in a 5 sliding : 1 full pattern, 16 KV heads of 256 and,
    for the full ("global") layers, `num_global_key_value_heads` 4 and `global_head_dim` 512: the per-layer facts are
    what transformers' `get_head_shapes` makes of them, read once at build time."""
    from tpaudit.metamodel import BuildOptions
    from tpaudit.metamodel import vocabulary as V
    from tpaudit.run.pipeline import Audit
    from tpaudit.sources import open_source

    text = read_json_any(FIXTURES / "gemma-4-31b-it.snapshot.json.gz")["config"]["text_config"]
    built = Audit(open_source(fixture_path("gemma-4-31b-it")), BuildOptions()).built
    facts = built.facts
    assert facts.config_class == "Gemma4TextConfig" and facts.model_type == "gemma4"
    assert facts.value("hidden_size") == text["hidden_size"] and facts.value("vocab_size") == text["vocab_size"]
    expected = [(i, t, text["num_global_key_value_heads"], text["global_head_dim"]) if t == "full_attention"
                else (i, t, text["num_key_value_heads"], text["head_dim"]) for i, t in enumerate(text["layer_types"])]
    assert [(la.index, la.layer_type, la.kv_heads, la.head_dim) for la in facts.layers] == expected
    assert len(expected) == text["num_hidden_layers"] == 60
    assert facts.modules is built.modules and facts.quant is None and facts.notes == ()
    # a value only the raw config.json names (transformers folds it into the per-layer configs) is still named
    assert facts.attribute_for(V.KV_HEADS, 4, text) == \
        ("num_global_key_value_heads", 4)


def test_quantization_layout_is_a_fact_of_the_build(fixture_path):
    """Qwen3-30B-A3B-FP8's config.json: `quant_method` fp8 with `weight_block_size` [128, 128]."""
    from tpaudit.run.pipeline import Audit
    from tpaudit.metamodel.facts import QuantScheme
    from tpaudit.sources import open_source

    qc = read_json_any(FIXTURES / "qwen3-30b-a3b-fp8.snapshot.json.gz")["config"]["quantization_config"]
    assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128]
    facts = Audit(open_source(fixture_path("qwen3-30b-a3b-fp8"))).built.facts
    assert facts.quant == QuantScheme("fp8", bits=8, block=(128, 128))


def _deepseek_v4(**overrides):
    """transformers' own DeepSeek-V4 config (shared-KV multi-query attention: `num_key_value_heads` 1, `kv_proj`
    projecting to one head of `head_dim`), four layers of each attention kind, small widths."""
    kwargs = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, head_dim=64, q_lora_rank=64,
                  o_lora_rank=32, o_groups=2, index_n_heads=4, index_head_dim=32, moe_intermediate_size=128,
                  n_routed_experts=8, num_experts_per_tok=2, vocab_size=1024,
                  layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                               "sliding_attention"],
                  mlp_layer_types=["hash_moe", "moe", "moe", "moe"], architectures=["DeepseekV4ForCausalLM"])
    kwargs.update(overrides)
    return _config("deepseek_v4", **kwargs)


def test_tpa102_judges_deepseek_v4_kv_proj():
    """DeepSeek-V4's key projection is `self_attn.kv_proj` (one KV head read as key and value): split colwise at tp 2,
    each rank holds 32 of its 64 rows, half a head, in all 4 layers. Before `kv_proj` was in the vocabulary TPA102 never
    saw it and the KV section counted the whole head on each rank. The compressor's own `kv_proj` below it is not the
    layer's key projection."""
    import tpaudit
    from tpaudit.shard.kvcache import key_projections

    config = _deepseek_v4()
    assert config.num_key_value_heads == 1 and config.head_dim == 64
    plan = {**type(config).base_model_tp_plan, "layers.*.self_attn.kv_proj": "colwise"}
    report = tpaudit.check(config, tp_size=2, plan=plan, parity=False)
    [f] = [f for f in report.findings if f.code == "TPA102"]
    assert f.target == "num_key_value_heads" and f.severity == "error"
    assert f.facts["kv_heads"] == 1 and f.facts["heads_by_rank"] == [0.5, 0.5] and f.facts["layers"] == [0, 1, 2, 3]
    keys = key_projections(report.shard_map, "model")
    assert {k.name for k in keys.values()} == {"model.layers.*.self_attn.kv_proj.weight"} and len(keys) == 4
    # per token and rank: 4 layers x 0.5 head x (64 + 64) x 2 bytes (bfloat16)
    assert report.kv_cache.bytes_per_token_per_rank == [4 * 64 * 2, 4 * 64 * 2]
    shipped = tpaudit.check(config, tp_size=2, parity=False)  # the shipped plan keeps kv_proj whole
    assert not [f for f in shipped.findings if f.code == "TPA102"]
    assert shipped.kv_cache.bytes_per_token_per_rank == [4 * 128 * 2, 4 * 128 * 2]


def test_gpt2_style_layers_are_decoder_layers_for_the_kv_section():
    """CodeGen-350M-mono's real config (fixtures/parity): 20 layers `transformer.h.N`, 16 heads of 1024 / 16 = 64,
    float16, and a plan that splits `h.*.attn.qkv_proj` colwise (given here: transformers 5.24 ships it, 5.23 ships no
    CodeGen plan). At tp 4 each rank caches 4 heads: 20 x 4 x (64 + 64) x 2 bytes per token. At tp 3 the 3,072 rows
    split 1,024 a rank, 16 / 3 heads each: TPA102, named by the attribute config.json spells (`n_head`; CodeGen has no
    KV-head attribute, its KV heads are its heads)."""
    import json

    import tpaudit

    raw = json.loads((FIXTURES / "parity" / "codegen-350m-mono.config.json").read_text())
    config = _config("codegen", **{k: v for k, v in raw.items() if k != "model_type"})
    assert (raw["n_layer"], raw["n_head"], raw["n_embd"]) == (20, 16, 1024)
    plan = {"h.*.attn.qkv_proj": "colwise", "h.*.attn.out_proj": "rowwise"}
    report = tpaudit.check(config, tp_size=4, plan=plan, parity=False)
    assert report.kv_cache.kv_heads_per_rank == 4
    assert report.kv_cache.bytes_per_token_per_rank == [20 * 4 * 128 * 2] * 4
    report = tpaudit.check(config, tp_size=3, plan=plan, parity=False)
    [f] = [f for f in report.findings if f.code == "TPA102"]
    assert f.target == "n_head" and f.facts["heads_by_rank"] == [16 / 3] * 3


def test_nemotron_h_mlp_and_moe_layers_keep_no_kv_cache():
    """NemotronH names its layers by block: mamba (a fixed state), attention, MoE-only and MLP-only. Only the attention
    layer caches keys: 8 KV heads x (128 + 128) x 2 bytes per token."""
    import tpaudit

    config = _config("nemotron_h", num_hidden_layers=4, layers_block_type=["mamba", "attention", "moe", "mlp"])
    assert (config.num_key_value_heads, config.head_dim) == (8, 128)
    report = tpaudit.check(config, tp_size=1, parity=False)
    assert report.kv_cache.layers == {"none": 3, "full": 1}
    assert report.kv_cache.bytes_per_token_whole_model == 8 * 256 * 2
    assert not [n for n in report.notes if "unknown" in n]


def test_a_role_the_table_cannot_fill_is_a_note():
    """Gemma 3n's KV-sharing layers (the last `num_kv_shared_layers`, `kv_sharing_modes` "reuse") build no `k_proj` of
    their own: no module the vocabulary names a key projection, so TPA102 cannot judge them and the KV section counts
    them whole. The report says so, per layer type, naming the layers."""
    import tpaudit

    config = _config("gemma3n_text")
    n, shared = config.num_hidden_layers, config.num_kv_shared_layers
    modes = getattr(config, "kv_sharing_modes", None)  # 5.24 spells the sharing out per layer; 5.23: the last layers
    reuse = [i for i, mode in enumerate(modes) if mode == "reuse"] if modes else list(range(n - shared, n))
    assert len(reuse) == shared == 15
    report = tpaudit.check(config, tp_size=2, parity=False)
    notes = [n for n in report.notes if n.startswith("key projection unknown")]
    by_type: dict[str, list[int]] = {}
    for i in reuse:
        by_type.setdefault(config.layer_types[i], []).append(i)
    assert len(notes) == len(by_type) == 2
    for layer_type, indices in by_type.items():
        [note] = [n for n in notes if f"{len(indices)} {layer_type} layer(s) ({indices[0]}, " in n]
        assert f"TPA102 cannot judge the KV heads of layer type {layer_type}" in note
