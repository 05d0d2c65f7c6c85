#!/usr/bin/env python3
"""What the parity check costs: the trace that decides whether it runs (`split_outputs`) and the sharded forward
(`run_parity`) at tp 4 on real configs with fused or packed projections, in one process after the imports (as
`tpaudit check` pays them once). The goal: at most 20 s per `run_parity` at tp 4 on the 2-core reference machine, and
nothing beyond the trace for a plan that needs no parity. Also times 4 gloo ranks under torchrun against 4 threaded
ranks, the measurement behind running the ranks as threads. Speed goals live here, not in timed tests.

Usage:
    python scripts/benchmark_parity.py [--tp 4] [--skip-gloo]
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 20.0


def snap(name: str):
    from transformers import AutoConfig

    d = dict(json.loads(gzip.decompress((ROOT / "fixtures" / f"{name}.snapshot.json.gz").read_bytes()))["config"])
    return AutoConfig.for_model(d.pop("model_type"), **d)


def keys(name: str) -> list[str]:
    doc = json.loads(gzip.decompress((ROOT / "fixtures" / f"{name}.snapshot.json.gz").read_bytes()))
    return [t[0] for t in doc["tensors"] or []]


GLOO_WORKER = """
import os, sys, torch, transformers
from transformers import LlamaForCausalLM
from transformers.distributed import DistributedConfig
transformers.logging.set_verbosity_error()
tp = int(os.environ["WORLD_SIZE"])
m = LlamaForCausalLM.from_pretrained(sys.argv[1], distributed_config=DistributedConfig(tp_size=tp))
with torch.no_grad():
    m(torch.arange(8)[None])
torch.distributed.destroy_process_group()
"""


def gloo_vs_threads(tp: int) -> list[tuple[str, float]]:
    """A tiny llama (4 heads, 4 KV heads) loaded and run on `tp` ranks: gloo processes vs threads of this process."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tpaudit.evidence import run_parity

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        LlamaForCausalLM(config).to(torch.float32).save_pretrained(tmp)
        worker = Path(tmp) / "worker.py"
        worker.write_text(GLOO_WORKER)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(tp),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), str(worker), tmp],
                              capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                                                                   "PATH": "/usr/bin:/bin"})
        out.append((f"{tp} gloo ranks under torchrun (exit {proc.returncode})", time.perf_counter() - t0))
    result = run_parity(config, LlamaForCausalLM, None, tp)
    out.append((f"{tp} threaded ranks, whole parity check (passed={result.passed})", result.seconds))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--skip-gloo", action="store_true")
    args = parser.parse_args()
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"import torch + transformers: {time.perf_counter() - t0:.2f} s")
    sys.path.insert(0, str(ROOT))
    from tpaudit.evidence import run_parity, split_outputs

    for attempt in ("first call, with transformers' lazy imports", "second call"):
        t = time.perf_counter()
        found = split_outputs(snap("llama-3.1-8b-instruct"), "LlamaForCausalLM", None, 8)
        print(f"trace, llama-3.1-8b shipped plan at tp 8 (needs no parity: {found == []}), {attempt}: "
              f"{time.perf_counter() - t:.2f} s")

    cases = [
        ("gpt-neox-20b defaults, fused query_key_value", transformers.AutoConfig.for_model("gpt_neox"),
         "GPTNeoXForCausalLM", None, None),
        ("qwen3-30b-a3b, packed experts (runtime layout)", snap("qwen3-30b-a3b"), "Qwen3MoeForCausalLM", None, None),
        ("qwen3-30b-a3b-instruct-2507, per-expert checkpoint", snap("qwen3-30b-a3b-instruct-2507"),
         "Qwen3MoeForCausalLM", None, keys("qwen3-30b-a3b-instruct-2507")),
        ("qwen3.5-35b-a3b, linear attention + fused experts", snap("qwen3.5-35b-a3b"),
         "Qwen3_5MoeForConditionalGeneration", None, keys("qwen3.5-35b-a3b")),
        ("qwen3-next-80b-a3b, 512 experts", snap("qwen3-next-80b-a3b-instruct"), "Qwen3NextForCausalLM", None, None),
    ]
    worst = 0.0
    for label, config, cls, plan, ckpt in cases:
        result = run_parity(config, cls, plan, args.tp, checkpoint_keys=ckpt)
        worst = max(worst, result.seconds)
        verdict = "passed" if result.passed else f"diverged ({result.first_divergent_module})"
        print(f"run_parity tp {args.tp}, {label}: {result.seconds:.2f} s, {verdict}")
    print(f"worst run_parity: {worst:.2f} s (goal <= {GOAL_SECONDS:g} s): {'ok' if worst <= GOAL_SECONDS else 'OVER'}")
    if not args.skip_gloo:
        for label, seconds in gloo_vs_threads(args.tp):
            print(f"{label}: {seconds:.2f} s")
    return 0 if worst <= GOAL_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
