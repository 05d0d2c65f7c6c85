#!/usr/bin/env python3
"""Where tpaudit's time goes, as ratios to transformers alone doing the least a check must do, in one run.

Speed goals live here, not in timed tests. Each row runs a command as a whole process, once per round, for several
rounds; the table shows each row's fastest run (the least disturbed by the rest of the machine) and its peak RSS,
and each ratio is the median over the rounds of its per-round ratio (the two runs of a round are close in time, so
a machine whose speed drifts moves both). The ratios are the ones the project holds itself to (issue #24), on the
2-core reference machine with transformers 5.24.0:

| run                                                                                       | goal   |
|-------------------------------------------------------------------------------------------|--------|
| `check` Qwen3-VL-30B-A3B (882 tensors) tp 4, from the snapshot fixture / transformers alone | 1.15x  |
| `check` Qwen3-VL-30B-A3B tp 4, from a model directory (real headers, sparse shards) / alone | 1.15x  |
| `check` DeepSeek-V3 (91,991 tensors in 163 shards) tp 8, repeat run (caches warm) / alone  | 1.25x  |
|   the same from a model directory                                                          | 1.25x  |
| `check` Kimi-K2.5 (208,550 tensors, compressed-tensors INT4) tp 8 / alone                  | 1.30x  |
|   the same from a model directory                                                          | 1.30x  |
| `size` over tp 1,2,4,8 / one `check` of the same model                                     | 1.10x  |
| `check --suggest` / the same `check`                                                      | 1.30x  |
| `scan` of the whole zoo                                                                   | 45 s   |
| `tpaudit --help` / the yardstick (lazy) import                                            | 0.10x  |

"transformers alone" (`scripts/transformers_alone.py`) is the floor: the imports every check needs (torch,
transformers, `modeling_utils`, transformers' TP code) and the meta build of the same model from its config.json,
with the garbage collector off and no tpaudit code; each check's ratio is to the floor of its own model. The
model directories are written once per run from the snapshots (`tpaudit.sources.sparse`: config.json, the index, the
real safetensors headers, the data regions holes), as a download or the Hub cache holds them. A check reads a local
or snapshot source in a forked child while it imports torch and transformers (`tpaudit.sources.beside`), so on this
2-core machine part of its work runs beside the floor's; peak RSS is the larger of the check's process and that
child (which exits before the check builds anything). Every row runs with `TPAUDIT_CACHE` pointing at
a fresh folder of this run; the DeepSeek-V3 row's parity evidence is served from that cache, filled by one unmeasured
run before the rounds (the row a user sees on a second check of the same model). The yardstick import (a bare,
lazy `import torch, transformers`) and the `import floor` row (adding `modeling_utils` and the TP code) are printed
for reference and for the `--help` ratio.

Then the safetensors headers of DeepSeek-V3 (163 sparse shards, 91,991 tensors): read and validated in a small
fraction of a second (`--section headers`). And the throughput of `tpaudit batch` (models per minute) over every bundled fixture at tp 4 and 8 with --jobs 1,
--jobs 2 and Ray, then again from the cache (`--section batch`).

And the test suite's fast loop, as a wall time and as a multiple of the yardstick import (`--section tests`; goal:
well under two minutes on 2 cores).

And plans of many rules (`--section plans`): `check` of Llama-3.1-8B at tp 2 with a `--plan` of 100,000 rules
that match nothing, drawn as JSON and as the terminal table (goal: under 120 s each; they were timed in the test suite,
which now counts the calls instead: tests/test_bad_input.py, tests/test_inert_output.py).

And the parity check (`--section parity`, `scripts/benchmark_parity.py --section isolation` then `--section cache`):
the isolation re-runs of the breaking plans of tests/test_parity.py against their first run (goal: at most 3x), and
a second check of DeepSeek-V3 at tp 8 served from the parity cache (goal: under 0.5 s in the evidence stage).

And the whole-zoo scan with and without `--parity` (`--section scan-parity`): wall time and peak RSS of every process
of the scan together (psutil samples of the process tree; goal: `scan --parity` under 2 GiB, issue #35).

Usage:
    python scripts/benchmark.py [--repeat 3] [--skip-scan] [--only NAME ...]
                                [--section all|check|headers|batch|tests|plans|parity|scan-parity]
                                [--scan-jobs 2] [--model-type TYPE ...]
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
FIXTURES = ROOT / "fixtures"
PY = sys.executable
# the yardstick: a bare, lazy import of torch and transformers, which every ratio divides by
YARDSTICK = [PY, "-c", "import torch, transformers; from transformers import AutoModelForCausalLM"]


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int]:
    """`(wall seconds, peak RSS bytes, exit code)` of one run of `cmd` as a whole process (`env`: extra variables)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def tpaudit(*args: str) -> list[str]:
    return [PY, "-m", "tpaudit", *args]


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


def header_stages(fixture: str, repeat: int) -> list[tuple[str, float]]:
    """Read and validate the safetensors headers of a sparse checkpoint written from `fixture` (real headers, data
    region a hole), next to what huggingface_hub's reader it replaced costs. Median of `repeat` runs."""
    import os
    import tempfile

    sys.path.insert(0, str(ROOT))
    from huggingface_hub import get_local_safetensors_metadata

    from tpaudit.sources import open_source
    from tpaudit.sources.safetensors_header import parse_header, read_local_header
    from tpaudit.sources.sparse import write_sparse_checkpoint

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


def fast_loop(repeat: int) -> None:
    """The test suite's fast loop (`pytest -m "not slow and not distributed"`, as the README gives it), run as a whole
    command, beside the yardstick import run just before and after it: the loop's wall time alone moves with the
    machine's speed (this 2-core machine's yardstick has measured 3 s to 6 s), the ratio much less."""
    loop = [PY, "-m", "pytest", "-q", "-m", "not slow and not distributed", "-p", "no:cacheprovider"]
    print(f"\nthe fast loop ({' '.join(loop[2:])}) on {os.cpu_count()} CPUs, {repeat} run(s):")
    for _ in range(repeat):
        before, _, _ = run(YARDSTICK)
        wall, _, code = run(loop)
        after, _, _ = run(YARDSTICK)
        import_s = (before + after) / 2
        print(f"  {wall:6.1f} s  exit {code}  {wall / import_s:5.1f}x the yardstick import ({import_s:.1f} s)  "
              f"(goal: well under 120 s)")


PLAN_RULES = 100_000
PLAN_GOAL_S = 120


def big_plans(repeat: int) -> None:
    """`check` with a plan of `PLAN_RULES` dead rules (plus the shipped q_proj rule), as JSON and as the table: the
    fastest of `repeat` runs and its peak RSS, against `PLAN_GOAL_S`."""
    llama = str(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
    plan = {f"layers.*.no_such_module_{i}": "colwise" for i in range(PLAN_RULES)}
    plan["layers.*.self_attn.q_proj"] = "colwise"
    print(f"\ncheck Llama-3.1-8B tp 2 with {PLAN_RULES:,} rules that match nothing (fastest of {repeat}):")
    with tempfile.TemporaryDirectory(prefix="tpaudit-bench-plans-") as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(plan))
        for fmt in ("json", "table"):
            runs = [run(tpaudit("check", llama, "--tp", "2", "--plan", str(path), "--format", fmt, "-o",
                                str(Path(tmp) / f"out.{fmt}"))) for _ in range(repeat)]
            wall, rss, code = min(runs)
            print(f"  {wall:6.1f} s  {rss / 2**20:6.0f} MiB  exit {code}  --format {fmt}  (goal: under {PLAN_GOAL_S} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-scan", action="store_true", help="leave out the whole-zoo scan (about a minute)")
    ap.add_argument("--only", nargs="*", help="rows whose name contains one of these words")
    ap.add_argument("--section", choices=("all", "check", "headers", "batch", "tests", "plans", "parity",
                                          "scan-parity"),
                    default="check")
    ap.add_argument("--batch-tp", default="4,8", help="tp sizes of the batch section")
    ap.add_argument("--scan-jobs", default="2", help="--jobs of the scan-parity section")
    ap.add_argument("--model-type", action="append", help="scan-parity: these model types only (default: all)")
    args = ap.parse_args()
    if args.section == "scan-parity":
        return scan_parity(args.scan_jobs, args.model_type)
    if args.section == "batch":
        batch_throughput(args.batch_tp)
        return 0
    if args.section == "headers":
        _print_headers(args.repeat)
        return 0
    if args.section == "tests":
        fast_loop(args.repeat)
        return 0
    if args.section == "plans":
        big_plans(args.repeat)
        return 0
    if args.section == "parity":
        return parity()

    with tempfile.TemporaryDirectory(prefix="tpaudit-bench-") as tmp:
        check_rows(args, Path(tmp))
    if args.section == "all":
        _print_headers(args.repeat)
        batch_throughput(args.batch_tp)
        fast_loop(1)
        big_plans(1)
        parity()
        scan_parity(args.scan_jobs, None)
    return 0


SCAN_PARITY_RSS_GOAL = 2 * 2**30
"""The whole-zoo `scan --parity`'s peak resident memory, every process of it together (issue #35)."""


def run_tree(cmd: list[str], interval: float = 0.2) -> tuple[float, int, int]:
    """`(wall seconds, peak RSS bytes, exit code)` of `cmd`, the RSS summed over the process and all its descendants
    (scan's worker processes), sampled every `interval` seconds with psutil (`ru_maxrss` is one process's peak)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONWARNINGS": "ignore", "TPAUDIT_NO_PARITY_CACHE": "1"})
    peak = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        time.sleep(interval)
    return time.perf_counter() - start, peak, proc.returncode


def scan_parity(jobs: str, model_types: list[str] | None) -> int:
    """The whole-zoo scan with and without `--parity`: wall time and peak RSS of all its processes together."""
    base = [PY, "-m", "tpaudit", "scan", "--tp", "4", "--format", "json", "--jobs", jobs]
    for t in model_types or []:
        base += ["--model-type", t]
    what = f"{len(model_types)} model types" if model_types else "whole zoo"
    print(f"\nscan of the {what}, --jobs {jobs} (peak RSS: every process of the scan together):", flush=True)
    peaks = {}
    for name, cmd in (("scan", base), ("scan --parity", base + ["--parity"])):
        wall, peak, code = run_tree(cmd)
        peaks[name] = peak
        print(f"  {wall:7.1f} s  {peak / 2**20:8.0f} MiB  exit {code}  {name}", flush=True)
    ok = peaks["scan --parity"] <= SCAN_PARITY_RSS_GOAL
    print(f"  scan --parity peak RSS {peaks['scan --parity'] / 2**30:.2f} GiB (goal {SCAN_PARITY_RSS_GOAL / 2**30:.0f} "
          f"GiB)  {'ok' if ok else 'OVER'}")
    return 0


# (row, denominator row, goal, label) of every ratio the project holds itself to (the module docstring's table)
GOALS = (
    ("check qwen3-vl tp 4 (snapshot)", "transformers alone qwen3-vl", 1.15,
     "check Qwen3-VL-30B-A3B tp 4, snapshot / transformers alone"),
    ("check qwen3-vl tp 4 (model directory)", "transformers alone qwen3-vl", 1.15,
     "check Qwen3-VL-30B-A3B tp 4, model directory / transformers alone"),
    ("check deepseek-v3 tp 8 (repeat run)", "transformers alone deepseek-v3", 1.25,
     "check DeepSeek-V3 tp 8, snapshot, repeat run / transformers alone"),
    ("check deepseek-v3 tp 8 (model directory, repeat run)", "transformers alone deepseek-v3", 1.25,
     "check DeepSeek-V3 tp 8, model directory, repeat run / transformers alone"),
    ("check kimi-k2.5 tp 8", "transformers alone kimi-k2.5", 1.30,
     "check Kimi-K2.5 tp 8, snapshot / transformers alone"),
    ("check kimi-k2.5 tp 8 (model directory)", "transformers alone kimi-k2.5", 1.30,
     "check Kimi-K2.5 tp 8, model directory / transformers alone"),
    ("size qwen3-vl tp 1,2,4,8", "check qwen3-vl tp 4 (snapshot)", 1.10, "size over tp 1,2,4,8 / one check"),
    ("check --suggest qwen2-moe tp 4", "check qwen2-moe tp 4", 1.30, "check --suggest / check"),
    ("tpaudit --help", "import", 0.10, "tpaudit --help / the yardstick import"),
)
SCAN_GOAL_S = 45


def check_rows(args, tmp: Path) -> None:
    """The check section: every row, `args.repeat` rounds, then the table, the goals and the floor's shares.
    `tmp` holds this run's cache (`TPAUDIT_CACHE`) and the model directory written from the Qwen3-VL snapshot."""
    qwen = str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")
    deepseek = str(FIXTURES / "deepseek-v3.snapshot.json.gz")
    kimi = str(FIXTURES / "kimi-k2.5.snapshot.json.gz")
    qwen2_moe = str(FIXTURES / "cases" / "18-qwen2-moe-shared-expert-replicated")
    env = {"TPAUDIT_CACHE": str(tmp / "cache")}
    rows = {
        "import": YARDSTICK,
        # what every check imports before tpaudit does anything: the loading machinery (`modeling_utils`) that the
        # yardstick's lazy import leaves out, and transformers' TP code
        "import floor": [PY, "-c", "import torch, transformers; from transformers import AutoModelForCausalLM; "
                         "import transformers.modeling_utils, transformers.distributed.tensor_parallel"],
        # the least a check that uses transformers' own code can do: its imports and the meta build, no tpaudit
        **{f"transformers alone {name}": [PY, str(ROOT / "scripts" / "transformers_alone.py"), snapshot]
           for name, snapshot in (("qwen3-vl", qwen), ("deepseek-v3", deepseek), ("kimi-k2.5", kimi))},
        # the same, ending without the interpreter's teardown as tpaudit's command line does: a stricter floor
        **{f"transformers alone {name} (no teardown)": [PY, str(ROOT / "scripts" / "transformers_alone.py"),
                                                        "--no-teardown", snapshot]
           for name, snapshot in (("qwen3-vl", qwen), ("deepseek-v3", deepseek), ("kimi-k2.5", kimi))},
        "check qwen3-vl tp 4 (snapshot)": tpaudit("check", qwen, "--tp", "4", "--format", "json"),
        # run right after the check it is divided by: the two runs of a ratio are as close in time as they can be
        "size qwen3-vl tp 1,2,4,8": tpaudit("size", qwen, "--gpu-memory", "80GB", "--tp", "1,2,4,8", "--format",
                                            "json"),
        "check qwen3-vl tp 4 (model directory)": tpaudit("check", str(tmp / "qwen3-vl"), "--tp", "4", "--format",
                                                         "json"),
        "check deepseek-v3 tp 8 (repeat run)": tpaudit("check", deepseek, "--tp", "8", "--format", "json"),
        "check deepseek-v3 tp 8 (model directory, repeat run)": tpaudit("check", str(tmp / "deepseek-v3"), "--tp",
                                                                         "8", "--format", "json"),
        "check kimi-k2.5 tp 8": tpaudit("check", kimi, "--tp", "8", "--format", "json"),
        "check kimi-k2.5 tp 8 (model directory)": tpaudit("check", str(tmp / "kimi-k2.5"), "--tp", "8", "--format",
                                                          "json"),
        "check qwen2-moe tp 4": tpaudit("check", qwen2_moe, "--tp", "4", "--format", "json"),
        "check --suggest qwen2-moe tp 4": tpaudit("check", qwen2_moe, "--tp", "4", "--suggest", "--format", "json"),
        "tpaudit --help": tpaudit("--help"),
    }
    if not args.skip_scan:
        rows["scan (whole zoo)"] = tpaudit("scan", "--tp", "4", "--format", "json", "--jobs", "2")
    if not Path(kimi).is_file():
        for name in ("check kimi-k2.5 tp 8", "check kimi-k2.5 tp 8 (model directory)", "transformers alone kimi-k2.5",
                     "transformers alone kimi-k2.5 (no teardown)"):
            rows.pop(name)
    selected = {k: v for k, v in rows.items()
                if k.startswith(("import", "transformers alone")) or not args.only
                or any(word in k for word in args.only)}
    # model directories as a download or the Hub cache holds them: config.json, the index and every safetensors
    # header of the snapshot's checkpoint, each shard file sparse (no weights)
    # (in a child process: Linux carries a process's peak RSS into the children it forks, so reading Kimi-K2.5 here
    # would raise every row's figure to this process's)
    for name, snapshot in (("qwen3-vl", qwen), ("deepseek-v3", deepseek), ("kimi-k2.5", kimi)):
        if any(name in row and "model directory" in row for row in selected):
            subprocess.run([PY, "-c", "import sys; from tpaudit.sources import open_source; from tpaudit.sources.sparse "
                            "import write_sparse_checkpoint; write_sparse_checkpoint(open_source(sys.argv[1]), "
                            "sys.argv[2])", snapshot, str(tmp / name)], cwd=ROOT, check=True)
    for name in selected:  # the first run, unmeasured, fills the caches
        if "repeat run" in name:
            run(selected[name], env)
    # Rounds: each round runs every row once, so the two runs of a ratio are close in time; a ratio is the median of
    # its per-round ratios (a slow or a lucky round does not move it), the table the fastest run of each row.
    walls: dict[str, list[float]] = {name: [] for name in selected}
    results = {}
    for round_ in range(args.repeat):
        for name, cmd in selected.items():
            if name.startswith("scan") and round_:
                continue
            wall, rss, code = run(cmd, env)
            walls[name].append(wall)
            if name not in results or wall < results[name][0]:
                results[name] = (wall, rss, code)
    print(f"fastest of {args.repeat} rounds (scan: 1 run), peak RSS of that run:")
    for name in selected:
        wall, rss, code = results[name]
        print(f"  {wall:7.2f} s  {rss / 2**20:8.0f} MiB  exit {code}  {name}")

    def per_round(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(walls[a], walls[b]))

    print(f"\nratios (median over {args.repeat} rounds of the per-round ratio):")
    for a, b, goal, label in GOALS:
        if a in results and b in results:
            value = per_round(a, b)
            print(f"  {value:5.2f}x  (goal {goal:.2f}x)  {'ok ' if value <= goal else 'OVER'}  {label}  "
                  f"(peak RSS {results[a][1] / 2**20:.0f} MiB; {b}: fastest {results[b][0]:.2f} s)")
    print(f"\nthe same checks / the stricter floor that skips the interpreter's teardown, as tpaudit does (no goal; "
          f"median over {args.repeat} rounds):")
    for a, b, _, label in GOALS:
        strict = f"{b} (no teardown)"
        if a in results and strict in results:
            print(f"  {per_round(a, strict):5.2f}x  {label.replace('transformers alone', 'the stricter floor')}  "
                  f"({strict}: fastest {results[strict][0]:.2f} s)")
    if "scan (whole zoo)" in results:
        wall = results["scan (whole zoo)"][0]
        print(f"  {wall:5.1f} s  (goal {SCAN_GOAL_S} s)  {'ok ' if wall <= SCAN_GOAL_S else 'OVER'}  scan of the "
              f"whole zoo, --jobs 2  (peak RSS {results['scan (whole zoo)'][1] / 2**20:.0f} MiB)")
    print("\nthe floors: each / the yardstick import, and each check / the import floor (tpaudit's own share with "
          "the meta build):")
    for name in ("import floor", "transformers alone qwen3-vl", "transformers alone deepseek-v3",
                 "transformers alone kimi-k2.5"):
        if name in results:
            print(f"  {per_round(name, 'import'):5.2f}x  {name} / import")
    for name in ("check qwen3-vl tp 4 (snapshot)", "check qwen3-vl tp 4 (model directory)",
                 "check deepseek-v3 tp 8 (repeat run)", "check deepseek-v3 tp 8 (model directory, repeat run)",
                 "check kimi-k2.5 tp 8", "check kimi-k2.5 tp 8 (model directory)"):
        if name in results:
            print(f"  {per_round(name, 'import floor'):5.2f}x  {name} / import floor")


def parity() -> int:
    """The parity check's isolation cost and its cache (`scripts/benchmark_parity.py`)."""
    print("\nparity check (scripts/benchmark_parity.py):", flush=True)
    code = 0
    for section in ("isolation", "cache"):
        code |= subprocess.run([PY, str(ROOT / "scripts" / "benchmark_parity.py"), "--section", section],
                               cwd=ROOT).returncode
    return code


def _print_headers(repeat: int) -> None:
    fixture = str(FIXTURES / "deepseek-v3.snapshot.json.gz")
    rows = header_stages(fixture, repeat)
    print(f"\nsafetensors headers of a sparse checkpoint written from {Path(fixture).name} (median of {repeat}):")
    for name, seconds in rows:
        print(f"  {seconds:7.3f} s  {name}")


if __name__ == "__main__":
    sys.exit(main())
