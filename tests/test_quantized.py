"""Quantized checkpoints as transformers' load holds them, and what a TP/EP load of them breaks on.

Expected bytes are worked out here from the configs and the formats' layouts (compressed-tensors' pack-quantized
`weight_packed` int32 `[out, in * bits / 32]`, `weight_scale` `[out, 1]` per channel in the model dtype,
`weight_shape` int64 `[2]`; float-quantized FP8 `weight` `[out, in]` + `weight_scale` `[out, 1]`), the Llama plan of
transformers 5.23/5.24 (q/k/v/gate/up `colwise`: dim 0 of every tensor of the module; o/down `rowwise`: the last dim;
`embed_tokens` `embedding_rowwise` and `lm_head` `colwise_gather_output`: the vocab) and `torch.chunk` split sizes.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import FIXTURES, audit, chunk, nbytes, snapshot_tensors

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


def _linears(c: dict) -> dict[str, tuple[int, int]]:
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c.get("head_dim") or c["hidden_size"] // c[
        "num_attention_heads"]
    return {"q_proj": (c["num_attention_heads"] * hd, h), "k_proj": (c["num_key_value_heads"] * hd, h),
            "v_proj": (c["num_key_value_heads"] * hd, h), "o_proj": (h, c["num_attention_heads"] * hd),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}


def _dense_by_hand(c: dict, tp: int, layer_bytes) -> list[int]:
    """Per-rank bytes of a Llama whose Linears other than lm_head are quantized: `layer_bytes(name, out, in, r)` gives
    one quantized Linear's bytes on rank r; embeddings and lm_head are bf16 vocab shards, norms bf16 whole."""
    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    out = []
    for r in range(tp):
        total = 2 * chunk(v, tp, r) * h * 2                           # embed_tokens + lm_head, bf16, vocab split
        total += h * 2                                                 # final norm
        per_layer = 2 * h * 2                                          # two norms
        per_layer += sum(layer_bytes(name, o, i, r) for name, (o, i) in _linears(c).items())
        out.append(total + layers * per_layer)
    return out


def _config(name: str) -> dict:
    import gzip

    return json.loads(gzip.decompress((FIXTURES / f"{name}.snapshot.json.gz").read_bytes()))["config"]


def test_w8a16_per_rank_bytes_are_the_packed_layout_and_rowwise_scales_are_emptied():
    """Llama-3.1-70B, compressed-tensors W8A16 (per-channel int8, pack-quantized) at tp 4: every quantized Linear
    holds `weight_packed` int32 [out, in / 4] (4 int8 values a word), `weight_scale` bf16 [out, 1] and `weight_shape`
    int64 [2], split by its module's rule. Rowwise o_proj / down_proj split the scale's axis of size 1: rank 0 keeps
    [out, 1], ranks 1-3 get [out, 0] (TPA203), and `weight_shape` goes 1 / 1 / 0 / 0 (TPA201)."""
    c = _config("llama-3.1-70b-w8a16")
    tp = 4

    def linear(name, o, i, r):
        words = i * 8 // 32
        if name in COLWISE:
            return chunk(o, tp, r) * words * 4 + chunk(o, tp, r) * 2 + chunk(2, tp, r) * 8
        return o * chunk(words, tp, r) * 4 + o * chunk(1, tp, r) * 2 + chunk(2, tp, r) * 8

    expected = _dense_by_hand(c, tp, linear)
    report = audit(str(FIXTURES / "llama-3.1-70b-w8a16.snapshot.json.gz"), tp=tp)
    assert list(report.rank_param_bytes) == expected
    # rank 0 keeps the rowwise scales; ranks 0 and 1 each keep one value of every weight_shape
    assert expected[0] > expected[1] > expected[2] == expected[3]
    found = {f.target: f for f in report.findings if f.code == "TPA203"}
    assert set(found) == {"model.layers.*.self_attn.o_proj.weight_scale", "model.layers.*.mlp.down_proj.weight_scale"}
    o = found["model.layers.*.self_attn.o_proj.weight_scale"]
    assert o.severity == "error" and o.facts["empty_ranks"] == [1, 2, 3]
    assert o.facts["local_shapes"] == [[c["hidden_size"], 1]] + [[c["hidden_size"], 0]] * 3
    words = c["num_attention_heads"] * c["hidden_size"] // c["num_attention_heads"] * 8 // 32
    assert o.facts["weight_local_shapes"][1] == [c["hidden_size"], chunk(words, tp, 1)]
    # compressed-tensors decompresses each module in place on the first forward pass: the bf16 weight takes the packed
    # weight's split, weight_scale and weight_shape stay
    def decompressed(name, o, i, r):
        if name in COLWISE:
            return chunk(o, tp, r) * i * 2 + chunk(o, tp, r) * 2 + chunk(2, tp, r) * 8
        return o * chunk(i, tp, r) * 2 + o * chunk(1, tp, r) * 2 + chunk(2, tp, r) * 8

    assert list(report.loading.rank_first_forward_bytes) == _dense_by_hand(c, tp, decompressed)
    shape = {f.target for f in report.findings if f.code == "TPA201"}
    assert shape == {f"model.layers.*.{m}.weight_shape" for m in
                     ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}


def test_fp8_dynamic_per_rank_bytes_keep_fp8_weights():
    """Llama-3.1-8B-Instruct, compressed-tensors FP8-dynamic (float-quantized, per-channel) at tp 4: every quantized
    Linear keeps an FP8 `weight` [out, in] (1 byte a value, what the load keeps: no decompression) and a bf16
    `weight_scale` [out, 1]; the activations are quantized on the fly (no input scale). About half the bf16 bytes."""
    c = _config("llama-3.1-8b-instruct-fp8-dynamic")
    tp = 4

    def linear(name, o, i, r):
        if name in COLWISE:
            return chunk(o, tp, r) * i + chunk(o, tp, r) * 2
        return o * chunk(i, tp, r) + o * chunk(1, tp, r) * 2

    expected = _dense_by_hand(c, tp, linear)
    report = audit(str(FIXTURES / "llama-3.1-8b-instruct-fp8-dynamic.snapshot.json.gz"), tp=tp)
    assert list(report.rank_param_bytes) == expected
    bf16 = audit(str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz"), tp=tp)
    assert report.rank_param_bytes[1] < 0.6 * bf16.rank_param_bytes[1]
    assert {f.target for f in report.findings if f.code == "TPA203"} == {
        "model.layers.*.self_attn.o_proj.weight_scale", "model.layers.*.mlp.down_proj.weight_scale"}
    assert not [f for f in report.findings if f.code == "TPA201"]       # float-quantized stores no weight_shape


# ----------------------------------------------------------------------------------------------------------------------
# Kimi-K2.5: compressed-tensors int4 routed experts, decompressed while loading
# ----------------------------------------------------------------------------------------------------------------------
KIMI = "kimi-k2.5"
EXPERT = re.compile(r"\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight_\w+)$")


@pytest.fixture(scope="module")
def kimi_experts():
    rows = [(n, d, s) for n, d, s in snapshot_tensors(KIMI) if EXPERT.search(n)]
    assert len(rows) == 60 * 384 * 3 * 3
    return rows


def _expert_reads(rows, tp: int, rank: int) -> dict[str, int]:
    """Bytes rank `rank` reads of the experts at tp `tp`: gate/up are split on their output rows (packed_colwise on
    the fused [E, 2I, H]: each of gate and up contributes its own rows), down on its input columns (rowwise: the
    packed words and the group scales along the input); `weight_shape` (1-D) cannot be read (transformers raises),
    so it contributes nothing."""
    out = {"gate_up_proj": 0, "down_proj": 0}
    for name, dtype, shape in rows:
        proj, leaf = EXPERT.search(name).group(3, 4)
        if leaf == "weight_shape":
            continue
        local = list(shape)
        if proj == "down_proj":
            local[1] = chunk(shape[1], tp, rank)
            out["down_proj"] += nbytes(dtype, local)
        else:
            local[0] = chunk(shape[0], tp, rank)
            out["gate_up_proj"] += nbytes(dtype, local)
    return out


@pytest.mark.slow  # builds the 1-trillion-parameter Kimi-K2.5 on the meta device (~8 s)
def test_kimi_k25_tp8_experts_are_decompressed_and_the_load_fails(kimi_experts):
    """Kimi-K2.5 at tp 8. transformers' compressed-tensors quantizer makes the model's per-expert merge collect each
    expert's `weight_packed`, `weight_scale` and `weight_shape` and dequantize them first (`CompressedTensorsDequantize`):
    the fused experts hold bfloat16, 3.5x what a rank reads of the int4 checkpoint. Both figures are exact: read =
    the rank's rows (gate/up) or columns (down) of every packed word and group scale; held = the rank's shard of
    [E, 2I, H] and [E, H, I] in bfloat16. But the load fails on every rank: the 1-D `weight_shape` is read with the
    3-D experts' placement and transformers' shard-on-read raises IndexError (a real 2-rank load of a tiny checkpoint
    in this layout does the same: tests/test_verify_quantized.py).

    transformers 5.25 ships no expert TP rules for its DeepseekV3Config text model (at tp alone the experts load
    whole, by EP only with --ep): from that release on the plan 5.24.0 shipped is handed over, so the experts are
    split by TP as above."""
    from releases import EXPERTS_IN_TP_PLANS, plan_524

    report = audit(str(FIXTURES / f"{KIMI}.snapshot.json.gz"), tp=8,
                   plan=None if EXPERTS_IN_TP_PLANS else plan_524("deepseek-v3"))
    load = report.loading
    families = {f.name.rsplit(".", 1)[-1]: f for f in load.families if ".mlp.experts." in f.name}
    config = json.loads(__import__("gzip").decompress((FIXTURES / f"{KIMI}.snapshot.json.gz").read_bytes()))["config"]
    text = config["text_config"]
    E, H, I, moe_layers = text["n_routed_experts"], text["hidden_size"], text["moe_intermediate_size"], 60
    for r in range(8):
        reads = _expert_reads(kimi_experts, 8, r)
        assert families["gate_up_proj"].rank_stored_bytes[r] == reads["gate_up_proj"]
        assert families["down_proj"].rank_stored_bytes[r] == reads["down_proj"]
        assert families["gate_up_proj"].rank_resident_bytes[r] == moe_layers * E * 2 * chunk(I, 8, r) * H * 2
        assert families["down_proj"].rank_resident_bytes[r] == moe_layers * E * H * chunk(I, 8, r) * 2
    assert all(f.decompressed and f.dtype == "bfloat16" and "CompressedTensorsDequantize" in f.operations
               for f in families.values())
    # no per-expert tensor is left unmapped and no fused parameter lacks its source: the quantizer's conversions map
    assert not [f for f in report.findings if f.code in ("TPA301", "TPA302") and ".mlp.experts" in f.target]
    note = next(n for n in report.notes if "decompresses" in n)
    assert f"reads {load.rank_stored_bytes[0]:,} B" in note and f"holds {load.rank_resident_bytes[0]:,} B" in note
    assert load.rank_resident_bytes[0] > 3 * load.rank_stored_bytes[0] * 0.9
    failing = {f.target: f for f in report.findings if f.code == "TPA304"}
    assert set(failing) == {"model.language_model.layers.*.mlp.experts.gate_up_proj",
                            "model.language_model.layers.*.mlp.experts.down_proj"}
    assert all(f.facts["ranks"] == list(range(8)) and f.facts["error"].startswith("IndexError")
               and f.facts["source"].endswith("weight_shape") for f in failing.values())
    assert report.model["bytes_caveat"] is None


# ----------------------------------------------------------------------------------------------------------------------
# compressed-tensors MoE under EP: which ranks lose weight_shape, and what the loader rebuilds there
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ct_moe(tmp_path_factory):
    from quant_models import compressed_tensors_moe

    root = tmp_path_factory.mktemp("ct-moe")
    return {bits: compressed_tensors_moe(root / f"int{bits}", bits=bits) for bits in (3, 4)}


@pytest.mark.parametrize("bits", [3, 4])
def test_ct_moe_weight_shape_lost_under_ep(ct_moe, bits):
    """A compressed-tensors MoE (4 experts, in = 64 for every projection) at tp 4 / ep 4. Each expert's `weight_shape`
    [2] is 1-D, so the loader reads it with the dense path of the experts' Shard(0): ranks 0 and 1 get one of its two
    values, ranks 2 and 3 none. On ranks 2-3 `CompressedTensorsDequantize` rebuilds in_features from the packed width:
    compressed-tensors packs the 64 values of a row densely into ceil(64 * bits / 32) words, so 8 words x (32 // 4) =
    64 at 4 bits (right) but 6 words x (32 // 3) = 60 at 3 bits (wrong); on ranks 0-1 the one-value shape breaks the
    unpacking (the load fails)."""
    report = audit(str(ct_moe[bits]), tp=4, ep=4)
    lost = {f.target: f for f in report.findings if f.code == "TPA201"}
    down = lost["model.layers.*.mlp.experts.*.down_proj.weight_shape"]
    assert down.facts["local_shapes"] == {"0": [1], "1": [1], "2": [0], "3": [0]}
    words = math.ceil(64 * bits / 32)
    rebuilt = words * (32 // bits)
    assert rebuilt == (64 if bits == 4 else 60)
    assert f"on ranks 2-3 the loader rebuilds the input size from the packed width: {rebuilt}, the true one 64 " \
           f"({'right' if rebuilt == 64 else 'wrong'})" in down.message
    failing = [f for f in report.findings if f.code == "TPA304" and f.target.endswith("down_proj")]
    assert any(f.facts["ranks"] == [0, 1] for f in failing)
    if bits == 3:   # compressed-tensors itself then refuses the 60 columns of its 32-value groups
        assert any(f.facts["ranks"] == [2, 3] and "60" in f.facts["error"] for f in failing)


def test_an_int64_weight_shape_gives_the_verdict_of_an_int32_one(ct_moe, tmp_path):
    # compressed-tensors' own compressor writes weight_shape as int64, which safetensors stores first, so its pattern
    # comes first among the experts' sources; at tp 4 / ep 4 it reaches ranks 2-3 for all 4 experts while they hold 1
    # packed expert, and CompressedTensorsDequantize stacks the packed ones (zip(quantized, scales)): ranks 2-3 load
    # [1, 64, 64], as with int32. Only ranks 0-1 fail (the one-value shape breaks the unpacking)
    import struct

    from quant_models import compressed_tensors_moe

    wide = compressed_tensors_moe(tmp_path / "int64", bits=4, shape_dtype="int64")
    with open(wide / "model.safetensors", "rb") as f:  # the precondition: the int64 metadata is stored first
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    start = {name.rpartition(".")[2]: entry["data_offsets"][0] for name, entry in header.items()
             if ".mlp.experts.0.down_proj." in name}
    assert start["weight_shape"] < start["weight_packed"], start

    def errors(path) -> list:
        report = audit(str(path), tp=4, ep=4)
        return sorted((f.code, f.target, tuple(f.facts.get("ranks", ()))) for f in report.findings
                      if f.severity == "error")

    int32 = errors(ct_moe[4])
    assert errors(wide) == int32
    failing = [e for e in int32 if e[0] == "TPA304"]
    assert failing and all(ranks == (0, 1) for _, _, ranks in failing), failing


def test_a_config_that_quantizes_modules_the_checkpoint_stores_plain(tmp_path):
    """The Kimi-like MoE with `re:.*shared_experts.*` dropped from `ignore`: its `targets: ["Linear"]` now cover the
    shared experts, which the checkpoint stores as plain bf16 `weight`s. transformers' own load (one process, with
    `output_loading_info`) reports exactly those weights as unexpected and their packed parameters as missing:
    TPA204 names the three shared-expert projections, and TPA301/TPA302 do not repeat them."""
    from quant_models import compressed_tensors_moe
    from transformers import AutoModelForCausalLM

    path = compressed_tensors_moe(tmp_path / "moe", ignore=("lm_head", "re:.*self_attn.*",
                                                             "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"))
    _, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    unexpected = {k for k in info["unexpected_keys"] if "shared_experts" in k}
    missing = {k for k in info["missing_keys"] if "shared_experts" in k}
    projections = ("gate_proj", "up_proj", "down_proj")
    assert unexpected == {f"model.layers.1.mlp.shared_experts.{p}.weight" for p in projections}
    assert {k.rsplit(".", 1)[-1] for k in missing} == {"weight_packed", "weight_scale", "weight_shape"}
    report = audit(str(path), tp=1)
    found = {f.target for f in report.findings if f.code == "TPA204"}
    assert found == {f"model.layers.*.mlp.shared_experts.{p}" for p in projections}
    assert all(f.severity == "error" for f in report.findings if f.code == "TPA204")
    assert not [f for f in report.findings if f.code in ("TPA301", "TPA302") and "shared_experts" in f.target]


@pytest.mark.parametrize("preset, fmt", [("W8A16", "pack-quantized"), ("FP8_DYNAMIC", "float-quantized")])
def test_first_forward_decompression_is_measured_as_predicted(tmp_path, preset, fmt):
    """transformers loads a compressed-tensors checkpoint compressed (no `dequantize`), and compressed-tensors'
    `ct_decompress_hook` decompresses every compressed module in place on the first forward pass. A tiny checkpoint
    written by compressed-tensors, loaded by transformers in this process: the parameter bytes after the load and
    after one forward are the report's `rank_resident_bytes` and `rank_first_forward_bytes`."""
    import torch
    from quant_models import compressed_tensors_dense
    from transformers import AutoModelForCausalLM

    path = compressed_tensors_dense(tmp_path / preset, preset, fmt, strategy="channel")
    model = AutoModelForCausalLM.from_pretrained(str(path))

    def held() -> int:
        return sum(p.numel() * p.element_size() for p in model.parameters())

    loaded = held()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    after = held()
    assert after > loaded
    report = audit(str(path), tp=1)
    assert report.loading.rank_resident_bytes == (loaded,)
    assert report.loading.rank_first_forward_bytes == (after,)


def test_suggest_keeps_split_quantization_metadata_whole():
    """Llama-3.1-70B W8A16 at tp 8: TPA201 (7 `weight_shape`s) and TPA203 (the rowwise o_proj/down_proj
    `weight_scale`s) each name the rule that fixes them; --suggest proposes exactly those nine `replicate` rules,
    re-simulates (no error left), and gives them with full keys as `DistributedConfig(tp_plan=...)` overrides, which
    transformers' own plan resolution accepts (a report with those overrides has no error either)."""
    from tpaudit.model import ParallelSizes
    from tpaudit.run.pipeline import Audit, CheckRequest

    audit = Audit.open(str(FIXTURES / "llama-3.1-70b-w8a16.snapshot.json.gz"))
    report = audit.check(CheckRequest(ParallelSizes.of(8), suggest="always"))
    s = report.suggestion
    shapes = {f"layers.*.{m}.weight_shape" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                       "mlp.down_proj")}
    scales = {"layers.*.self_attn.o_proj.weight_scale", "layers.*.mlp.down_proj.weight_scale"}
    assert s.rules == {k: "replicate" for k in shapes | scales}
    assert s.before["errors"] == 9 and s.after["errors"] == 0 and s.remaining_errors == []
    assert s.tp_plan_override == {f"model.{k}": "replicate" for k in shapes | scales}
    loaded = audit.report(ParallelSizes.of(8), dist_overrides={"tp_plan": s.tp_plan_override})
    assert not [f for f in loaded.findings if f.severity == "error"]


def test_kv_heads_of_a_packed_key_projection_are_split_like_its_weight():
    """compressed-tensors stores `k_proj` as `weight_packed` [out, in / 4] (int8 values in int32 words): its rows
    are the key heads' output features, split by the colwise rule. Llama-3.1-70B W8A16 at tp 4: 8 KV heads / 4 = 2
    per rank, 80 layers x 2 heads x 128 x (key + value) x 2 bytes = 81,920 B per token per rank, as the bf16 model."""
    c = _config("llama-3.1-70b-w8a16")
    tp = 4
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    per_token = c["num_hidden_layers"] * (c["num_key_value_heads"] // tp) * head_dim * 2 * 2
    assert per_token == 81_920
    kv = audit(str(FIXTURES / "llama-3.1-70b-w8a16.snapshot.json.gz"), tp=tp).kv_cache
    assert max(kv.bytes_per_token_per_rank) == per_token


def test_the_report_header_names_the_quantization_method_and_the_quantizer_that_laid_it_out():
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING

    from conftest import run_main

    snap = str(FIXTURES / "gpt-oss-20b.snapshot.json.gz")
    with __import__("gzip").open(snap, "rt") as fh:
        method = json.load(fh)["config"]["quantization_config"]["quant_method"]
    quantizer = AUTO_QUANTIZER_MAPPING[method].__name__
    assert (method, quantizer) == ("mxfp4", "Mxfp4HfQuantizer")
    md = run_main("check", snap, "--tp", "2", "--no-parity", "--format", "markdown").stdout
    assert f"| quantization | {method}: laid out by transformers' {quantizer} (weights kept quantized) |" in md
    term = run_main("check", snap, "--tp", "2", "--no-parity").stdout
    assert re.search(rf"quantization\s+{method}: laid out by transformers' {quantizer}", term)
    # an unquantized checkpoint has no such row
    plain = run_main("check", str(FIXTURES / "llama-3.1-8b.snapshot.json.gz"), "--tp", "2", "--no-parity",
                     "--format", "markdown").stdout
    assert "| quantization |" not in plain


@pytest.mark.parametrize("name, tp, ep", [("kimi-k2.5", 8, 1), ("kimi-k2.5", 8, 8), ("deepseek-v3", 8, 1),
                                          ("deepseek-v3", 8, 8), ("gpt-oss-20b", 4, 1),
                                          ("qwen3-30b-a3b-thinking-2507-fp8", 4, 4)])
def test_pieces_read_alike_give_the_load_of_the_piece_by_piece_loop(name, tp, ep):
    # `_read_alike` reads one piece per kind (owned by the rank or not) where every piece of a source pattern has one
    # shape and dtype; the load section must be the one the loop over every piece computes, errors included
    from unittest import mock

    from tpaudit.model import ParallelSizes
    from tpaudit.plan import resolve_plan
    from tpaudit.run.pipeline import Audit
    from tpaudit.shard import simulate
    from tpaudit.shard import load

    built = Audit.open(str(FIXTURES / f"{name}.snapshot.json.gz")).built
    shard_map = simulate(built, resolve_plan(built, ParallelSizes.of(tp, ep), None))
    alike = load.simulate_load(built, shard_map)
    with mock.patch.object(load, "_alike_patterns", lambda specs: set()):
        one_by_one = load.simulate_load(built, shard_map)
    assert alike == one_by_one
    assert alike.families and any(r for r in alike.rank_stored_bytes)


# ----------------------------------------------------------------------------------------------------------------------
# the load stage's shortcuts give what the plain run gives
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits, tp, ep", [(4, 4, 4), (3, 4, 4), (4, 2, 1), (4, 4, 1), (4, 1, 1)])
def test_one_piece_on_zeros_gives_the_load_of_two(ct_moe, bits, tp, ep):
    # where the operations run on zeros of the real size (some piece carries `weight_shape` values), they run on one
    # piece per pattern (`KEEP_DATA`): the load section, failures and rebuilt input sizes included, must be the one
    # two pieces per pattern give
    from unittest import mock

    from tpaudit.model import ParallelSizes
    from tpaudit.plan import resolve_plan
    from tpaudit.run.pipeline import Audit
    from tpaudit.shard import load, simulate

    built = Audit.open(str(ct_moe[bits])).built
    shard_map = simulate(built, resolve_plan(built, ParallelSizes.of(tp, ep), None))
    one = load.simulate_load(built, shard_map)
    with mock.patch.object(load, "KEEP_DATA", 2):
        two = load.simulate_load(built, shard_map)
    assert one == two
    experts = [f for f in one.families if ".mlp.experts." in f.name]
    assert experts and all(f.decompressed for f in experts)


@pytest.mark.parametrize("bits", [3, 4])
def test_a_rank_with_an_empty_weight_shape_shares_the_run_of_the_input_it_rebuilds(ct_moe, bits):
    # at tp 4 / ep 4, ranks 2-3 get each expert's weight_shape empty and the converter rebuilds [rows, in] from the
    # packed width (tests/test_compat_pins.py pins that it then converts as with those values); ranks 0-1 get one
    # value each, the same one, and fail. After tp 1 (whole experts, the stored [64, 64]), ranks 2-3's input is one
    # already run at 4 bits (64 rebuilt: one new run per expert family, for ranks 0-1) and a new one at 3 bits (60)
    from unittest import mock

    from tpaudit.compat import backend
    from tpaudit.model import ParallelSizes
    from tpaudit.run.pipeline import Audit

    tf = type(backend())
    real = tf.load_convert
    calls: list[str] = []

    def counted(self, renamer, pattern, target, collected, model):
        calls.append(target)
        return real(self, renamer, pattern, target, collected, model)

    shared = Audit.open(str(ct_moe[bits]))
    shared.report(ParallelSizes.of(1, 1), parity="off")
    with mock.patch.object(tf, "load_convert", counted):
        report = shared.report(ParallelSizes.of(4, 4), parity="off")
    runs = {target.rpartition(".")[2]: calls.count(target) for target in calls}
    assert runs == {"gate_up_proj": 1 if bits == 4 else 2, "down_proj": 1 if bits == 4 else 2}
    assert report == Audit.open(str(ct_moe[bits])).report(ParallelSizes.of(4, 4), parity="off")


def test_a_load_that_fails_leaves_none_of_its_pieces_behind(ct_moe):
    # tp 4 / ep 4 fails the load on ranks 0-1 (the one-value weight_shape breaks the unpacking): the outcome the memo
    # keeps for the model's later options must not hold the exception's traceback, whose frames hold the pieces
    # (Kimi-K2.5: 35 MiB of zeros kept through the rest of its check)
    import gc

    import torch

    from tpaudit.model import ParallelSizes
    from tpaudit.run.pipeline import Audit

    def cpu_tensors() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.device.type == "cpu")

    # a first audit of the option imports what the quantizer imports lazily (its lookup tables are tensors) and makes
    # the process's device meshes; the second, on a fresh build (an empty memo), runs the operations again
    Audit.open(str(ct_moe[4])).report(ParallelSizes.of(4, 4), parity="off")
    before = cpu_tensors()
    shared = Audit.open(str(ct_moe[4]))
    for _ in range(2):  # the second time from the memo
        report = shared.report(ParallelSizes.of(4, 4), parity="off")
        assert any(f.code == "TPA304" and f.facts["ranks"] == [0, 1] for f in report.findings)
        del report
    assert cpu_tensors() == before


def test_options_of_one_model_share_the_load_stage(ct_moe):
    # every option of one built model shares the load stage's work that no placement changes (`LoadMemo`): the
    # converter runs once per distinct input (what it sees: each piece's shape, dtype and metadata values), so a
    # second report of the same option runs it no more, and each report is the one a fresh build gives
    from unittest import mock

    from tpaudit.compat import backend
    from tpaudit.model import ParallelSizes
    from tpaudit.run.pipeline import Audit

    tf = type(backend())
    real = tf.load_convert
    calls = []

    def counted(self, renamer, pattern, target, collected, model):
        calls.append(target)
        return real(self, renamer, pattern, target, collected, model)

    shared = Audit.open(str(ct_moe[4]))
    with mock.patch.object(tf, "load_convert", counted):
        first = shared.report(ParallelSizes.of(4, 4), parity="off")
        ran = len(calls)
        again = shared.report(ParallelSizes.of(4, 4), parity="off")
        assert len(calls) == ran > 0
        other = shared.report(ParallelSizes.of(2, 1), parity="off")
    assert again == first
    assert other == Audit.open(str(ct_moe[4])).report(ParallelSizes.of(2, 1), parity="off")
    assert first == Audit.open(str(ct_moe[4])).report(ParallelSizes.of(4, 4), parity="off")
