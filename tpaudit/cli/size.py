"""`tpaudit size`: the smallest tp/ep that fits a GPU, with the KV cache, from the exact per-rank simulation."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ._options import (ArchitectureOpt, ModelArg, OutputOpt, PlanOpt, RevisionOpt, TokenOpt, TrustRemoteCodeOpt,
                       Units, UnitsOpt, format_option)

SIZE_EXAMPLES = [
    "tpaudit size Qwen/Qwen3-VL-30B-A3B-Instruct --gpu H100-80GB --context 32768",
    "tpaudit size fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz --gpu-memory 24GB --context 32768",
]


def _int_list(text: str, flag: str) -> list[int]:
    from ..errors import UsageError

    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} {text} is not a comma-separated list of integers such as 1,2,4,8") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{flag} {text} must list positive integers such as 1,2,4,8")
    return values


def size(
    model: ModelArg,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU preset: H100-80GB, H200, A100-80GB, A100-40GB, "
                                                              "L40S, L4, A10G, B200, MI300X, ...")] = None,
    gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", help="Memory of one GPU: 80GB, 24GiB, ...")]
    = None,
    tp: Annotated[str, typer.Option("--tp", help="tp sizes to try, comma-separated.")] = "1,2,4,8",
    ep: Annotated[str, typer.Option("--ep", help="ep sizes to try (1, or equal to a tp size).")] = "1",
    context: Annotated[int, typer.Option("--context", help="Tokens per sequence in the KV cache.")] = 8192,
    batch: Annotated[int, typer.Option("--batch", help="Sequences held at once.")] = 1,
    kv_dtype: Annotated[Optional[str], typer.Option("--kv-dtype", help="KV cache dtype (default: the model's): "
                                                                       "bfloat16, float16, float8_e4m3fn.")] = None,
    overhead: Annotated[Optional[str], typer.Option(
        "--overhead", help="Per-GPU overhead: bytes (4GiB) or a share of GPU memory (10%). Default: 1 GiB + 8%.")]
    = None,
    plan: PlanOpt = None,
    format: format_option("size") = "table",
    output: OutputOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    architecture: ArchitectureOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    units: UnitsOpt = Units.GiB,
) -> int:
    """Which tp/ep fits a GPU: exact worst-rank weights + KV cache + overhead per option, and the smallest that fits.

    Exit codes: 0 an option fits (recommended), 1 none fits, 2 bad input.
    """
    from ..build import load_plan_file
    from ..errors import UsageError
    from ..gpus import GPU_MEMORY_MIB, gpu_memory_bytes
    from ..sizing import parse_overhead, size_model
    from ..sources import open_source
    from ..units import parse_bytes
    from ..report import get
    from ._output import emit

    if (gpu is None) == (gpu_memory is None):
        raise UsageError("pass exactly one of --gpu NAME or --gpu-memory BYTES (e.g. --gpu H100-80GB)")
    if gpu is not None:
        try:
            capacity = gpu_memory_bytes(gpu)
        except KeyError:
            raise UsageError(f"--gpu {gpu} is not a known preset. Known: {', '.join(GPU_MEMORY_MIB)}; or pass "
                             "--gpu-memory") from None
    else:
        try:
            capacity = parse_bytes(gpu_memory)
        except ValueError as e:
            raise UsageError(f"--gpu-memory: {e}") from None
        if capacity <= 0:
            raise UsageError(f"--gpu-memory {gpu_memory} must be more than 0 bytes")
    get("size", format)
    plan_override = load_plan_file(plan) if plan is not None else None
    source = open_source(model, revision=revision, token=token,
                         progress=format == "table" and sys.stdout.isatty())
    report = size_model(source, capacity_bytes=capacity, gpu_name=gpu, tp_sizes=_int_list(tp, "--tp"),
                        ep_sizes=_int_list(ep, "--ep"), context=context, batch=batch, kv_dtype=kv_dtype,
                        overhead=parse_overhead(overhead), plan_override=plan_override, architecture=architecture,
                        trust_remote_code=trust_remote_code)
    emit("size", format, report, output, unit=units.value)
    return 0 if report.recommended is not None else 1
