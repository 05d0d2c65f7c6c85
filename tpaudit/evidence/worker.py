"""The parity check in a subprocess (`python -m tpaudit.evidence.worker SPEC.json`): for a caller that already
belongs to a process group, or sees an accelerator. The spec carries the config as a dict; the result is written as
JSON to the path the spec names, and read back with `ParityResult.from_json` (validated, never trusted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..model import ParityResult


def run_in_subprocess(config, model_class, tp_plan, tp_size: int, ep_size: int, *, seed: int, timeout: float,
                      checkpoint_keys=None, head_limited=None) -> ParityResult:
    """Run `tpaudit.evidence.run_parity` in a fresh CPU-only interpreter and return its `ParityResult`.

    A subprocess that dies, overruns `timeout` (plus 60 s for its imports) or answers something that is not a
    result is a result with `ran=False` saying so."""
    name = model_class if isinstance(model_class, str) else model_class.__name__
    with tempfile.TemporaryDirectory(prefix="tpaudit-parity-") as tmp:
        spec = {"model_type": config.model_type, "config": config.to_dict(), "model_class": name,
                "tp_plan": tp_plan, "tp_size": tp_size, "ep_size": ep_size, "seed": seed, "timeout": timeout,
                "checkpoint_keys": list(checkpoint_keys) if checkpoint_keys is not None else None,
                "head_limited": dict(head_limited or {}),
                "out": str(Path(tmp) / "result.json")}
        Path(tmp, "spec.json").write_text(json.dumps(spec, default=str))
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                                 "MASTER_PORT")}
        env["CUDA_VISIBLE_DEVICES"] = ""
        try:
            proc = subprocess.run([sys.executable, "-m", "tpaudit.evidence.worker", str(Path(tmp, "spec.json"))],
                                  capture_output=True, text=True, env=env, timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            return ParityResult(ran=False, reason=f"the parity subprocess did not finish within {timeout + 60:g} s",
                                tp_size=tp_size, ep_size=ep_size)
        out = Path(spec["out"])
        if not out.is_file():
            tail = (proc.stderr or proc.stdout or "no output").strip().splitlines()[-1:] or ["no output"]
            return ParityResult(ran=False, reason=f"the parity subprocess failed (exit {proc.returncode}): {tail[0]}",
                                tp_size=tp_size, ep_size=ep_size)
        try:
            return ParityResult.from_json(json.loads(out.read_text()))
        except ValueError as e:
            return ParityResult(ran=False, reason=f"the parity subprocess answered no result: {e}",
                                tp_size=tp_size, ep_size=ep_size)


def main(argv: list[str]) -> int:
    from .._process import tune_gc
    from ..compat import parity as seam
    from .run import run_parity

    tune_gc()
    spec = json.loads(Path(argv[0]).read_text())
    d = dict(spec["config"])
    d.pop("model_type", None)
    config = seam.config_for_model(spec["model_type"], d)
    result = run_parity(config, spec["model_class"], spec["tp_plan"], spec["tp_size"], spec["ep_size"],
                        seed=spec["seed"], timeout=spec["timeout"], checkpoint_keys=spec.get("checkpoint_keys"),
                        head_limited=spec.get("head_limited"))
    Path(spec["out"]).write_text(json.dumps(result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
