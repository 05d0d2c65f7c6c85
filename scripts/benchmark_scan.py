#!/usr/bin/env python3
"""Time a full `tpaudit scan` of the installed transformers (the issue's goal: under 180 s on 2 cores).

Usage: python scripts/benchmark_scan.py [--tp 4] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", default="4")
    ap.add_argument("--jobs", default="2")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scan.json"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tpaudit", "scan", "--tp", args.tp, "--jobs", args.jobs,
                               "--format", "json", "-o", str(out)], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode not in (0, 1):
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        doc = json.loads(out.read_text())
    slowest = sorted(doc["models"], key=lambda m: -m["seconds"])[:5]
    print(f"full scan: {wall:.1f} s wall ({doc['seconds']} s inside), {len(doc['models'])} model types, "
          f"{doc['counts']}, --jobs {args.jobs}")
    print("slowest: " + ", ".join(f"{m['model_type']} {m['seconds']:.1f} s" for m in slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
