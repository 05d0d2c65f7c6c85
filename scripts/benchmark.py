#!/usr/bin/env python3
"""How long `tpaudit check` takes on the DeepSeek-V3 fixture (91,991 tensors), next to the cost of importing torch
and transformers alone, and where the time goes inside one run; and the throughput of `tpaudit batch` (models per
minute) over every bundled fixture at tp 4 and 8 with --jobs 1, --jobs 2 and Ray, then again from the cache. Speed
goals live here, not in timed tests.

Usage:
    python scripts/benchmark.py [--repeat 3] [--fixture fixtures/deepseek-v3.snapshot.json.gz] [--tp 8]
                                [--section all|check|batch] [--batch-tp 4,8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def batch_throughput(tp: str) -> None:
    """`tpaudit batch` over every bundled fixture: wall time of the whole command (imports included) and models per
    minute, for --jobs 1, --jobs 2 and Ray (each computing every line: --no-cache), then a second run served from a
    cache the first one filled."""
    fixtures = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures").glob("*.snapshot.json.gz"))
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="tpaudit-bench-") as tmp:
        listing = Path(tmp) / "fixtures.txt"
        listing.write_text("\n".join(fixtures) + "\n")
        env = {**os.environ, "TPAUDIT_CACHE": str(Path(tmp) / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
        runs = [("--jobs 1", ["--jobs", "1", "--no-cache"]), ("--jobs 2", ["--jobs", "2", "--no-cache"])]
        if importlib.util.find_spec("ray") is not None:
            runs.append(("--executor ray --jobs 2 (local Ray)", ["--executor", "ray", "--jobs", "2", "--no-cache"]))
        else:
            print('  (Ray is not installed: pip install "tpaudit[ray]" to measure it)')
        runs += [("--jobs 1, filling the cache", ["--jobs", "1"]), ("--jobs 1, from the cache", ["--jobs", "1"])]
        print(f"\ntpaudit batch over {len(fixtures)} fixtures at --tp {tp} ({len(fixtures) * len(tp.split(','))} "
              f"lines) on {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} before), wall time of the "
              "command:")
        reference = None
        for name, extra in runs:
            out = Path(tmp) / "out.jsonl"
            t0 = time.perf_counter()
            rc = subprocess.run([py, "-m", "tpaudit", "batch", str(listing), "--tp", tp, "-o", str(out),
                                 "--format", "markdown", *extra], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=ROOT, env=env).returncode
            seconds = time.perf_counter() - t0
            lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
            worst = [(d["model"], d["tp_size"], d["worst_rank_param_bytes"]) for d in lines]
            same = "" if reference is None else (", same lines" if worst == reference else ", LINES DIFFER")
            reference = reference or worst
            cached = sum(1 for d in lines if d.get("cached"))
            print(f"  {seconds:7.1f} s  {len(fixtures) * 60 / seconds:7.1f} models/min  {name}  (exit {rc}, "
                  f"{cached} of {len(lines)} lines from the cache{same})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fixture", default=str(ROOT / "fixtures" / "deepseek-v3.snapshot.json.gz"))
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--section", choices=("all", "check", "batch"), default="all")
    ap.add_argument("--batch-tp", default="4,8", help="tp sizes of the batch section")
    args = ap.parse_args()
    if args.section == "batch":
        batch_throughput(args.batch_tp)
        return 0
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
    if args.section == "all":
        batch_throughput(args.batch_tp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
