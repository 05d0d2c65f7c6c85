"""`tpaudit verify`: load on real ranks (torchrun, gloo or NCCL) and compare every shard with the prediction."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ._options import (ArchitectureOpt, DtypeOpt, EpOpt, ModelArg, OutputOpt, RevisionOpt, TokenOpt, TpOpt,
                       TrustRemoteCodeOpt, Units, UnitsOpt, WidthOpt, format_option)

VerifyPlanOpt = Annotated[Optional[str], typer.Option(
    "--plan", help="Path of a JSON file holding an object of rule -> style (keys relative to the base model, as in "
                   "configuration_*.py): the ranks load with these rules as DistributedConfig(tp_plan=...) "
                   "overrides, which transformers merges into the model's plan (rules not named keep their style), "
                   "and the prediction resolves the same. Verifies a plan override before it is deployed.")]

VERIFY_EXAMPLES = [
    "tpaudit verify ./tiny-moe --tp 2 --device cpu",
    "tpaudit verify ./tiny-moe --tp 2 --plan my_plan.json --device cpu      # a plan override, before deploying it",
    "tpaudit verify fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz --zero-weights --tp 1 --device cuda",
    "torchrun --nproc-per-node 2 -m tpaudit verify ./tiny-moe --tp 2      # already under torchrun: worker mode",
]


def verify(
    model: ModelArg,
    tp: TpOpt,
    ep: EpOpt = 1,
    device: Annotated[str, typer.Option("--device", help="cpu (gloo) or cuda (NCCL).")] = "cpu",
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="Ranks to start (default: max(--tp, --ep)).")]
    = None,
    zero_weights: Annotated[bool, typer.Option(
        "--zero-weights", help="Load a sparse checkpoint with the model's real headers and zero data (any source: "
                               "Hub, directory, snapshot); nothing is downloaded but headers.")] = False,
    dtype: DtypeOpt = None,
    plan: VerifyPlanOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds before a hung load is stopped.")] = 900,
    format: format_option("verify") = "table",  # type: ignore[valid-type]  # an `Annotated` built per command
    output: OutputOpt = None,
    width: WidthOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    architecture: ArchitectureOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    units: UnitsOpt = Units.GiB,
) -> int:
    """Load the model with from_pretrained(distributed_config=...) on real ranks and confirm the predicted shards.

    Exit codes: 0 every rank holds what was predicted, 1 a mismatch, 2 bad input or torchrun not starting,
    3 the model failed to load on some rank (the rank and the loader's error are named).
    """
    from ..verify import run_as_worker, run_verify, under_torchrun
    from ..metamodel import load_plan_file
    from ..report import get
    from ._output import emit

    get("verify", format)
    rules = load_plan_file(plan) if plan is not None else None   # a bad plan is exit 2 before any rank starts
    if under_torchrun():
        result, code = run_as_worker(model, tp_size=tp, ep_size=ep, dtype=dtype, architecture=architecture,
                                     trust_remote_code=trust_remote_code, plan=rules, plan_path=plan)
        if result is None:
            return code
    else:
        progress = Progress(sys.stderr)
        try:
            result = run_verify(model, tp_size=tp, ep_size=ep, device=device, nproc=nproc,
                                zero_weights=zero_weights, dtype=dtype, architecture=architecture,
                                trust_remote_code=trust_remote_code, revision=revision, token=token, timeout=timeout,
                                progress=progress, plan=rules, plan_path=plan)
        finally:
            progress.close()
        code = 0 if result.match else 1
    emit("verify", format, result, output, unit=units.value, columns=width)
    return code


class Progress:
    """`verify`'s progress on stderr (stdout keeps the report): on a terminal one line rewritten in place with the
    phase and its detail (ranks started and loaded, seconds), cleared at the end; otherwise (a CI log) one line per
    phase as it starts, `tpaudit verify: <phase>: <detail>`, with no counts repeated."""

    def __init__(self, stream):
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())
        self.phase: str | None = None
        self.drawn = False

    def __call__(self, phase: str, detail: str) -> None:
        try:
            if self.live:
                import shutil

                width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
                self.stream.write("\r\x1b[K" + f"tpaudit verify: {phase}: {detail}"[:width])
                self.stream.flush()
                self.drawn = True
            elif phase != self.phase:
                print(f"tpaudit verify: {phase}: {detail}", file=self.stream, flush=True)
        except (OSError, ValueError):  # stderr closed: progress is a courtesy
            pass
        self.phase = phase

    def close(self) -> None:
        """Clear the live line, so the report or an error starts on a clean line."""
        if self.live and self.drawn:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                pass
