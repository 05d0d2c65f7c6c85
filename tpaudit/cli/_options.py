"""Options shared by several commands, declared once."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer


class Units(str, Enum):
    GiB = "GiB"
    GB = "GB"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"


ModelArg = Annotated[str, typer.Argument(
    metavar="MODEL", help="A model directory (config.json, optional safetensors), a snapshot file from "
                          "'tpaudit snapshot', or a Hub id such as Qwen/Qwen3-VL-30B-A3B-Instruct.")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size: how many ranks share each layer.")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel size: 1, or equal to --tp (transformers 5.23-5.25 "
                                                 "without FSDP). Under 5.25 most MoE models need it: their TP plans "
                                                 "leave the routed experts to the EP plan.")]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hub only: branch, tag or commit.")]
TokenOpt = Annotated[Optional[str], typer.Option(
    "--token", help="Hub only: access token for gated/private repos (default: HF_TOKEN or the stored login). Never "
                    "printed.", show_default=False)]
ArchitectureOpt = Annotated[Optional[str], typer.Option(
    "--architecture", help="Model class to build (default: config.json's architectures[0]).")]
TrustRemoteCodeOpt = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Allow the repo's own modeling code (never run otherwise).")]


def format_option(command: str):
    """The `--format/-f` option of `command`, offering exactly the renderers registered for it
    (`tpaudit.report.formats`): a new renderer module is a new choice, with no change here."""
    from ..report import formats

    choices = formats(command)
    return Annotated[str, typer.Option("--format", "-f", help=f"Output format: {', '.join(choices)}.",
                                       show_default=True)]


def _dtype(value: Optional[str]) -> Optional[str]:
    """`--dtype auto` is the default spelled out (from_pretrained's own `dtype="auto"`): the same as no flag."""
    return None if value is not None and value.strip().lower() == "auto" else value


DtypeOpt = Annotated[Optional[str], typer.Option(
    "--dtype", help="The dtype passed to from_pretrained: auto (the default: from config.json or the checkpoint), "
                    "bfloat16, float16 or float32.", callback=_dtype)]
PlanOpt = Annotated[Optional[str], typer.Option(
    "--plan", help="Path of a JSON file holding an object of rule -> style; it replaces the base model's "
                   "base_model_tp_plan (keys relative to the base model, as in configuration_*.py).")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", "-o", help="Write the report to this file instead of "
                                                                         "stdout.")]
WidthOpt = Annotated[Optional[int], typer.Option(
    "--width", min=20, max=4000, help="Columns of the terminal report (tables wrap to it): default the terminal's, 120 "
                                      "in a pipe or a file, or COLUMNS.", show_default=False)]
UnitsOpt = Annotated[Units, typer.Option("--units", help="Units for printed sizes: GiB (2^30 B) or GB (10^9 B). JSON "
                                                         "is always in bytes.")]
