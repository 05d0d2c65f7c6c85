"""When the pipeline asks the sharded forward for evidence (the parity check), and how its verdict reads.

The engine (`parity.py`) builds a small model of the same architecture and plan, loads it on real gloo ranks with
`from_pretrained(..., distributed_config=...)` and compares its outputs with the unsharded model's. This module decides
when that is needed for a report:

- always for a proposed plan (`--plan`, a `--suggest` candidate: a plan under review is exactly what needs evidence)
  and with `--parity`;
- by itself when the plan splits a projection's output and the model's forward then cuts that output into parts (a
  fused or packed projection, by any name), which only the forward can tell;
- never with `--no-parity`, and never for a plan with no such projection (nothing extra runs).
"""

from __future__ import annotations


def reason_to_run(built, resolved, shard_map, *, forced: bool, proposed: bool) -> str | None:
    """Why the parity check should run for this option, or `None` when it should not (placeholder until the engine
    lands: the static suspicions stay warnings)."""
    return None


def run_for(built, resolved, reason: str):
    """Run the parity check for this option (see `parity.run_parity`)."""
    raise NotImplementedError


def is_layout_divergence(result) -> bool:
    """Whether a failed parity run diverged at a fused or packed split (TPA501) rather than elsewhere (TPA502)."""
    return False
