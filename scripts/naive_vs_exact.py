#!/usr/bin/env python3
"""Where the usual `total / N` estimate of per-rank weights is wrong, on the real fixtures.

For each fixture and tp size, prints the exact worst-rank bytes from tpaudit's simulation next to `total / tp` and
the error of the naive figure. Replicated weights (no rule), uneven shards and tied embeddings make the naive
estimate too low; the bigger the replicated share, the worse.

Usage: python scripts/naive_vs_exact.py [--tp 2,4,8] [FIXTURE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = ["qwen3-vl-30b-a3b-instruct", "llama-3.1-8b-instruct", "deepseek-v3", "gpt-oss-120b", "qwen3-vl-8b-instruct",
           "qwen3.5-35b-a3b", "mixtral-8x7b-v0.1"]


def main() -> int:
    from tpaudit.run.pipeline import Audit
    from tpaudit.errors import TpauditError
    from tpaudit.model import ParallelSizes
    from tpaudit.sources import open_source
    from tpaudit.units import format_bytes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", default="2,4,8")
    ap.add_argument("fixtures", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    tps = [int(x) for x in args.tp.split(",")]
    print(f"{'model':34} {'tp':>3} {'exact worst rank':>18} {'total / tp':>14} {'naive error':>12}")
    for name in args.fixtures:
        path = ROOT / "fixtures" / f"{name}.snapshot.json.gz"
        audit = Audit(open_source(str(path) if path.is_file() else name))  # built once, simulated per tp
        for tp in tps:
            try:
                r = audit.report(ParallelSizes.of(tp), parity="off")
            except TpauditError as e:
                print(f"{name:34} {tp:>3} {'-':>18} {'-':>14}  ({e})")
                continue
            naive = r.total_param_bytes / tp
            exact = r.worst_rank_param_bytes
            print(f"{name:34} {tp:>3} {format_bytes(exact):>18} {format_bytes(int(naive)):>14} "
                  f"{(naive - exact) / exact:>+11.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
