"""The load-time guard on real ranks: tiny models saved with save_pretrained and loaded under torchrun with 2 gloo
ranks (the API and the guard's own logic run in-process in tests/test_api.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=128, dtype="float32")
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny-moe")
    Qwen3MoeForCausalLM(config).save_pretrained(directory)
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, *args: str, nproc: int = 2) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT))
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line]
    assert len(results) == nproc, proc.stdout[-2000:] + proc.stderr[-3000:]
    return sorted(results, key=lambda r: r["rank"])


def test_guard_raises_on_every_rank_before_weights_are_read(tiny_moe):
    results = torchrun(str(ROOT / "tests" / "scripts" / "guard_load.py"), str(tiny_moe), "uncovered")
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["raised"] and not r["loaded"] and r["snippet"]
        assert r["targets"] == ["model.layers.*.mlp.experts.down_proj", "model.layers.*.mlp.experts.gate_up_proj"]
    assert results[0]["targets"] == results[1]["targets"]


def test_guard_passes_the_shipped_plan(tiny_moe):
    """The shipped plan at tp 2: transformers 5.23/5.24's plan splits the experts by TP rules, so the guard lets the
    load through; 5.25's has no expert rules (read from Qwen3MoeConfig itself: `releases.EXPERTS_IN_TP_PLANS`), so at
    tp alone both expert parameters stay whole on every rank and the guard refuses them before any weight is read.
    With ep 2 (the EP plan splits the experts, every release) the shipped plan passes."""
    from releases import EXPERTS_IN_TP_PLANS

    script = str(ROOT / "tests" / "scripts" / "guard_load.py")
    results = torchrun(script, str(tiny_moe), "shipped")
    if EXPERTS_IN_TP_PLANS:
        assert all(not r["raised"] and r["loaded"] for r in results)
    else:
        assert [r["rank"] for r in results] == [0, 1]
        for r in results:
            assert r["raised"] and not r["loaded"]
            assert r["targets"] == ["model.layers.*.mlp.experts.down_proj", "model.layers.*.mlp.experts.gate_up_proj"]
    results = torchrun(script, str(tiny_moe), "shipped-ep")
    assert [r["rank"] for r in results] == [0, 1]
    assert all(not r["raised"] and r["loaded"] for r in results)
