#!/usr/bin/env python3
"""How long `tpaudit check` takes on the DeepSeek-V3 fixture (91,991 tensors), next to the cost of importing torch
and transformers alone, where the time goes inside one run, and how long reading and validating the safetensors
headers of the same checkpoint takes (written sparse: real headers, no data). Speed goals live here, not in timed
tests: validating DeepSeek-V3's 163 headers should take a small fraction of a second.

Usage:
    python scripts/benchmark.py [--repeat 3] [--fixture fixtures/deepseek-v3.snapshot.json.gz] [--tp 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], repeat: int) -> tuple[float, int]:
    times, rc = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT).returncode
        times.append(time.perf_counter() - t0)
    return statistics.median(times), rc


def stages(fixture: str, tp: int) -> list[tuple[str, float]]:
    """Time each pipeline stage in this process (imports first, as a cold CLI run pays them)."""
    out = []
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    out.append(("import torch + transformers", time.perf_counter() - t0))
    sys.path.insert(0, str(ROOT))
    from tpaudit._compat import check_versions
    from tpaudit.audit import _lm_head_names, _module_facts, build_report
    from tpaudit.build import build_model
    from tpaudit.checks.registry import CheckContext, run_checks
    from tpaudit.plan import resolve_plan
    from tpaudit.simulate import simulate
    from tpaudit.sources import open_source

    def step(name, fn):
        t = time.perf_counter()
        value = fn()
        out.append((name, time.perf_counter() - t))
        return value

    versions = check_versions()
    source = step("read snapshot (sources)", lambda: open_source(fixture))
    built = step("build meta model + map checkpoint", lambda: build_model(source))
    plan = step("resolve plan (transformers)", lambda: resolve_plan(built, tp, 1))
    names, modules = _lm_head_names(built.model), _module_facts(built.model)
    shard_map = step("simulate on fake process group", lambda: simulate(built, plan))
    ctx = CheckContext(source=source, config=built.config, architecture=built.architecture,
                       text_prefix=built.text_prefix, plan_owner=built.plan_owner, lm_head_names=names, plan=plan,
                       shard_map=shard_map, mapping=built.mapping, quantization=built.quantization,
                       modules=modules)
    findings = step("checks", lambda: run_checks(ctx))
    step("report", lambda: build_report(source, built, plan, shard_map, findings, versions, ctx))
    return out


def header_stages(fixture: str, repeat: int) -> list[tuple[str, float]]:
    """Read and validate the safetensors headers of a sparse checkpoint written from `fixture` (real headers, data
    region a hole), next to what huggingface_hub's reader it replaced costs. Median of `repeat` runs."""
    import os
    import tempfile

    sys.path.insert(0, str(ROOT))
    from huggingface_hub import get_local_safetensors_metadata

    from tpaudit.sources import open_source
    from tpaudit.sources.safetensors_header import parse_header, read_local_header
    from tpaudit.sparse import write_sparse_checkpoint

    source = open_source(fixture)
    if source.tensors is None:
        return []
    with tempfile.TemporaryDirectory(prefix="tpaudit-bench-") as tmp:
        shards = write_sparse_checkpoint(source, tmp)
        headers = []
        for path in shards:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                headers.append((str(path), f.read(n), os.path.getsize(path) - 8 - n))
        size = sum(len(raw) for _, raw, _ in headers)
        count = len(source.tensors)

        def median(fn) -> float:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return statistics.median(times)

        return [
            (f"parse + validate {len(shards)} headers in memory ({count:,} tensors, {size / 1e6:.1f} MB of JSON)",
             median(lambda: [parse_header(raw, name, data) for name, raw, data in headers])),
            ("  of which json.loads alone", median(lambda: [json.loads(raw) for _, raw, _ in headers])),
            ("read + validate them from disk (read_local_header)",
             median(lambda: [read_local_header(path) for path in shards])),
            ("open_source(directory): index, headers, tensor table", median(lambda: open_source(tmp))),
            ("for comparison: huggingface_hub.get_local_safetensors_metadata", median(
                lambda: get_local_safetensors_metadata(tmp))),
        ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fixture", default=str(ROOT / "fixtures" / "deepseek-v3.snapshot.json.gz"))
    ap.add_argument("--tp", type=int, default=8)
    args = ap.parse_args()
    py = sys.executable
    rows = [
        ("python -c 'import torch, transformers'", wall([py, "-c", "import torch, transformers"], args.repeat)),
        ("tpaudit --help", wall([py, "-m", "tpaudit", "--help"], args.repeat)),
        (f"tpaudit check {Path(args.fixture).name} --tp {args.tp} --format json",
         wall([py, "-m", "tpaudit", "check", args.fixture, "--tp", str(args.tp), "--format", "json"], args.repeat)),
    ]
    print(f"median wall time of {args.repeat} runs (seconds):")
    for name, (seconds, rc) in rows:
        print(f"  {seconds:7.2f}  {name}  (exit {rc})")
    base, check = rows[0][1][0], rows[2][1][0]
    print(f"  check costs {check - base:.2f} s beyond the imports ({check / base:.1f}x the import time)")
    print("\nstages of one in-process run:")
    for name, seconds in stages(args.fixture, args.tp):
        print(f"  {seconds:7.2f}  {name}")
    rows = header_stages(args.fixture, args.repeat)
    if rows:
        print(f"\nsafetensors headers of a sparse checkpoint written from {Path(args.fixture).name} (median of "
              f"{args.repeat}):")
        for name, seconds in rows:
            print(f"  {seconds:7.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
