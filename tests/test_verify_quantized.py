"""Real 2-rank gloo loads of tiny checkpoints in every quantized format whose quantizer loads on a CPU host, against
`check`'s prediction for the same host (`tpaudit verify`): each rank holds exactly the predicted bytes, or the load
fails where the prediction said it would (TPA304).

The checkpoints are written by each format's own library (tests/quant_models.py). Formats that cannot load here:
AWQ and GPTQ (their quantizers need `gptqmodel`, whose kernels need a GPU toolchain), MXFP4 (its load operations need
the triton kernels of a GPU): see the README's table of formats.
"""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_cli

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import quant_models as q

    root = tmp_path_factory.mktemp("quantized")
    return {
        "w8a16": q.compressed_tensors_dense(root / "w8a16", "W8A16", "pack-quantized", strategy="channel"),
        "w4a16": q.compressed_tensors_dense(root / "w4a16", "W4A16", "pack-quantized", group_size=32),
        "fp8_dynamic": q.compressed_tensors_dense(root / "fp8-dynamic", "FP8_DYNAMIC", "float-quantized"),
        "fp8_block": q.fp8_block(root / "fp8-block"),
        "int4_moe": q.compressed_tensors_moe(root / "int4-moe"),
        "qwen3_vl_moe": q.qwen3_vl_moe(root / "qwen3-vl-moe"),
        "qwen3_vl_moe_published": q.qwen3_vl_moe_as_published(root / "qwen3-vl-moe-published"),
    }


def _verify(path, *args):
    proc = run_cli("verify", str(path), *args, "--device", "cpu", "--format", "json", timeout=600)
    return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None)


@pytest.mark.parametrize("name", ["w8a16", "w4a16", "fp8_dynamic", "fp8_block"])
def test_dense_formats_load_as_predicted(models, name):
    """compressed-tensors W8A16 (per-channel) and W4A16 (group 32) stay packed, FP8-dynamic stays FP8, and the
    fine-grained FP8 checkpoint is dequantized to bfloat16 on this CPU host (its quantizer's own choice without a
    GPU, which the prediction for `--device cpu` follows): every rank holds the predicted bytes."""
    proc, out = _verify(models[name], "--tp", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert out["match"] is True and out["mismatches"] == []
    assert [r["measured_param_bytes"] for r in out["ranks"]] == [r["predicted_param_bytes"] for r in out["ranks"]]


def test_int4_moe_experts_are_decompressed_on_one_rank(models):
    """Kimi-K2.5's layout on one rank: the loader decompresses the int4 experts to bfloat16, as predicted."""
    proc, out = _verify(models["int4_moe"], "--tp", "1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert out["match"] is True and out["ranks"][0]["measured_param_bytes"] == out["ranks"][0]["predicted_param_bytes"]


@pytest.mark.parametrize("name, sizes", [("int4_moe", ("--tp", "2")), ("qwen3_vl_moe", ("--tp", "2", "--ep", "2")),
                                         ("qwen3_vl_moe_published", ("--tp", "2"))])
def test_a_load_that_fails_was_predicted(models, name, sizes):
    """Kimi-K2.5's layout at tp 2 (its 1-D `weight_shape` cannot be read with the experts' placement); a
    qwen3_vl_moe saved by transformers at ep 2 (stored in the runtime layout, its experts' local pieces are transposed
    by the loader's `Transpose(check_dims=True)`, which compares them with the whole parameter); and one stored as
    Qwen3-VL-30B-A3B is, at tp 2 (sliced on the stored axes before the `Transpose`): the load fails on the ranks
    (exit 3), and `check`'s prediction for the same input said so (TPA304).

    The two tp-only loads need expert TP rules, which transformers 5.25 no longer ships (its experts load whole at tp
    alone): the plan 5.24.0 shipped (DeepseekV3Config's, Qwen3VLMoeTextConfig's) is given with --plan under every
    release, and the ranks load with it as DistributedConfig(tp_plan=...) overrides."""
    plans = {"int4_moe": "deepseek-v3", "qwen3_vl_moe_published": "qwen3-vl-moe"}
    if name in plans:
        sizes = (*sizes, "--plan", str(FIXTURES / "plans" / f"{plans[name]}.transformers-5.24.json"))
    proc = run_cli("verify", str(models[name]), *sizes, "--device", "cpu", timeout=600)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the model failed to load on rank ")
    assert "tpaudit check predicted it: TPA304" in line


def test_qwen3_vl_moe_as_published_loads_under_expert_parallelism(models):
    """The same Qwen3-VL layout at tp 2 with ep 2: each rank reads whole experts, the `Transpose` turns them back, and
    every rank holds exactly the predicted bytes (what TPA304's fix suggests: `--ep`)."""
    proc, out = _verify(models["qwen3_vl_moe_published"], "--tp", "2", "--ep", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert out["match"] is True and out["mismatches"] == []
