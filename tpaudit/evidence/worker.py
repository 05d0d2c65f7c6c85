"""The parity check in a subprocess (`python -m tpaudit.evidence.worker SPEC.json`): for a caller that already
belongs to a process group, or sees an accelerator. The spec carries the config as a dict; the result is written as
JSON to the path the spec names, and read back with `ParityResult.from_json` (validated, never trusted). The caller's
side, which writes the spec and starts this module, is `run.run_in_subprocess`."""

from __future__ import annotations

import json
import sys
from pathlib import Path


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
