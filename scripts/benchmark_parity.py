#!/usr/bin/env python3
"""What the parity check costs: the trace that decides whether it runs (`split_outputs`) and the sharded forward
(`run_parity`) at tp 4 on real configs with fused or packed projections, in one process after the imports (as
`tpaudit check` pays them once). The goal: at most 20 s per `run_parity` at tp 4 on the 2-core reference machine, and
nothing beyond the trace for a plan that needs no parity. Also times 4 gloo ranks under torchrun against 4 threaded
ranks, the measurement behind running the ranks as threads. Speed goals live here, not in timed tests.

`--section isolation`: the plans of tests/test_parity.py whose forward breaks (Qwen3.5's in_proj_qkv, Qwen3-Next's
in_proj_ba, and two wrong rules at once in Llama, Qwen3-MoE and Phi-3): the first run (build, trace, reference and
the sharded run of the plan as given) and the isolation re-runs that give every rule its verdict, side by side; goal:
the re-runs cost at most 3x the first run.

`--section cache`: `tpaudit check` of DeepSeek-V3 at tp 8 twice, as two processes sharing a fresh parity cache; the
seconds each spends in the evidence stage. Goal: the second under 0.5 s.

Usage:
    python scripts/benchmark_parity.py [--tp 4] [--skip-gloo] [--section all|runs|isolation|cache]
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


ISOLATION_GOAL = 3.0
CACHE_GOAL_SECONDS = 0.5


def isolation() -> bool:
    """The first run and the isolation re-runs of each breaking plan of tests/test_parity.py."""
    import transformers

    from tpaudit.evidence import run_parity

    def shipped(name, **changes):
        return {**getattr(transformers, name).base_model_tp_plan, **changes}

    llama = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
             "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "colwise",
             "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "colwise"}
    phi3 = json.loads((ROOT / "fixtures" / "parity" / "phi-3-medium-4k-instruct.config.json").read_text())
    phi3.pop("model_type")
    cases = [
        ("qwen3.5-35b-a3b, in_proj_qkv colwise", snap("qwen3.5-35b-a3b"), "Qwen3_5MoeForConditionalGeneration",
         shipped("Qwen3_5MoeTextConfig", **{"layers.*.linear_attn.in_proj_qkv": "colwise"}),
         keys("qwen3.5-35b-a3b")),
        ("qwen3-next-80b-a3b, in_proj_ba packed_colwise", snap("qwen3-next-80b-a3b-instruct"),
         "Qwen3NextForCausalLM", shipped("Qwen3NextConfig", **{"layers.*.linear_attn.in_proj_ba": "packed_colwise"}),
         None),
        ("llama-3.1-8b, o_proj and down_proj colwise", snap("llama-3.1-8b-instruct"), "LlamaForCausalLM", llama, None),
        ("qwen3-30b-a3b, experts gate_up_proj and o_proj colwise", snap("qwen3-30b-a3b"), "Qwen3MoeForCausalLM",
         shipped("Qwen3MoeConfig", **{"layers.*.mlp.experts.gate_up_proj": "colwise",
                                      "layers.*.self_attn.o_proj": "colwise"}), None),
        ("phi-3-medium, qkv_proj and gate_up_proj colwise", transformers.AutoConfig.for_model("phi3", **phi3),
         "Phi3ForCausalLM", {"layers.*.self_attn.qkv_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
                             "layers.*.mlp.gate_up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise"}, None),
    ]
    ok = True
    print("isolation at tp 2 (first run = build + trace + reference + the sharded run of the plan as given):")
    for label, config, cls, plan, ckpt in cases:
        result = run_parity(config, cls, plan, 2, checkpoint_keys=ckpt)
        first = result.seconds - result.isolation_seconds
        ratio = result.isolation_seconds / first if first else 0.0
        ok = ok and ratio <= ISOLATION_GOAL
        errors = ", ".join(f"{v.target.rsplit('.', 2)[-2]}.{v.target.rsplit('.', 1)[-1]} ({v.kind})"
                           for v in result.errors())
        print(f"  first run {first:5.2f} s, {result.reruns} re-runs {result.isolation_seconds:5.2f} s = {ratio:4.2f}x "
              f"(goal <= {ISOLATION_GOAL:g}x) {'ok ' if ratio <= ISOLATION_GOAL else 'OVER'}  {label}: {errors}")
    return ok


CACHE_DRIVER = """
import sys, time
import tpaudit.run.pipeline as audit
real = audit.gather_evidence
spent = []
def timed(*a, **k):
    t = time.perf_counter()
    try:
        return real(*a, **k)
    finally:
        spent.append(time.perf_counter() - t)
audit.gather_evidence = timed
from tpaudit.cli.app import main
code = main(sys.argv[1:])
sys.stderr.write("EVIDENCE %.4f" % sum(spent) + chr(10))
"""


def cache() -> bool:
    """Two `tpaudit check` processes of DeepSeek-V3 at tp 8 sharing a fresh parity cache."""
    fixture = str(ROOT / "fixtures" / "deepseek-v3.snapshot.json.gz")
    spent = []
    with tempfile.TemporaryDirectory(prefix="tpaudit-parity-cache-") as tmp:
        for attempt in ("first", "second"):
            proc = subprocess.run([sys.executable, "-c", CACHE_DRIVER, "check", fixture, "--tp", "8", "--format",
                                   "json"], capture_output=True, text=True, cwd=ROOT,
                                  env={**__import__("os").environ, "TPAUDIT_PARITY_CACHE": tmp,
                                       "PYTHONWARNINGS": "ignore"})
            line = next((x for x in proc.stderr.splitlines() if x.startswith("EVIDENCE ")), "EVIDENCE nan")
            seconds = float(line.split()[1])
            section = json.loads(proc.stdout).get("parity", {}) if proc.stdout.strip().startswith("{") else {}
            spent.append(seconds)
            print(f"  {attempt} check of deepseek-v3 tp 8: {seconds:6.3f} s in the evidence stage "
                  f"(parity ran: {section.get('ran')}, cached: {section.get('cached', False)}, exit {proc.returncode})")
    ok = spent[1] < CACHE_GOAL_SECONDS
    print(f"  second check: {spent[1]:.3f} s (goal < {CACHE_GOAL_SECONDS} s): {'ok' if ok else 'OVER'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--skip-gloo", action="store_true")
    parser.add_argument("--section", choices=("all", "runs", "isolation", "cache"), default="all")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.section == "cache":
        return 0 if cache() else 1
    if args.section == "isolation":
        import transformers

        transformers.logging.set_verbosity_error()
        return 0 if isolation() else 1
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
    ok = worst <= GOAL_SECONDS
    if args.section == "all":
        ok = isolation() and ok
        print("parity cache:")
        ok = cache() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
