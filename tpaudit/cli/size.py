"""`tpaudit size`: the smallest tp/ep that fits a GPU, with the KV cache or the training model states, and the longest
context each option holds, from the exact per-rank simulation."""

from __future__ import annotations

import sys
from typing import Annotated, Optional, cast

import typer

from ._options import (ArchitectureOpt, ModelArg, OutputOpt, PlanOpt, RevisionOpt, TokenOpt, TrustRemoteCodeOpt,
                       Units, UnitsOpt, WidthOpt, format_option)

SIZE_EXAMPLES = [
    "tpaudit size Qwen/Qwen3-VL-30B-A3B-Instruct --gpu H100-80GB --context 32768",
    "tpaudit size fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz --gpu-memory 24GB --context 32768",
    "tpaudit size fixtures/llama-3.1-8b-instruct.snapshot.json.gz --gpu H100-80GB --training --activation-budget 8GiB",
    "tpaudit size fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz --gpu H100-80GB --format html -o size.html",
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


def _training_setup(training: bool, optimizer: str, master_weights: bool, grad_dtype: str | None,
                    optimizer_dtype: str, activation_budget: str | None):
    """The `TrainingSetup` the flags ask for, `None` without `--training`.

    Raises:
        UsageError: a training flag without `--training`, an unknown optimizer or dtype, a bad byte size.
    """
    from ..errors import UsageError
    from ..sizing.training import OPTIMIZERS, STATE_DTYPE_BYTES, Optimizer, TrainingSetup
    from ..units import parse_bytes

    if not training:
        given = [flag for flag, value, default in (
            ("--optimizer", optimizer, "adamw"), ("--no-master-weights", master_weights, True),
            ("--grad-dtype", grad_dtype, None), ("--optimizer-dtype", optimizer_dtype, "float32"),
            ("--activation-budget", activation_budget, None)) if value != default]
        if given:
            raise UsageError(f"{', '.join(given)}: training options given without --training. Add --training")
        return None
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer {optimizer}: not an optimizer tpaudit sizes. Pass one of "
                         f"{', '.join(OPTIMIZERS)}")
    for flag, value in (("--grad-dtype", grad_dtype), ("--optimizer-dtype", optimizer_dtype)):
        if value is not None and value not in STATE_DTYPE_BYTES:
            raise UsageError(f"{flag} {value}: not a dtype for training states. Pass one of "
                             f"{', '.join(STATE_DTYPE_BYTES)}")
    budget = 0
    if activation_budget is not None:
        try:
            budget = parse_bytes(activation_budget, unit_required=True)
        except ValueError as e:
            raise UsageError(f"--activation-budget: {e}") from None
    return TrainingSetup(optimizer=cast(Optimizer, optimizer), master_weights=master_weights, grad_dtype=grad_dtype,
                         optimizer_dtype=optimizer_dtype, activation_budget_bytes=budget)


def size(
    model: ModelArg,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU preset: H100-80GB, H200, A100-80GB, A100-40GB, "
                                                              "L40S, L4, A10G, B200, MI300X, ...")] = None,
    gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", help="Memory of one GPU: 80GB, 24GiB, ...")]
    = None,
    tp: Annotated[str, typer.Option("--tp", help="tp sizes to try, comma-separated.")] = "1,2,4,8",
    ep: Annotated[Optional[str], typer.Option(
        "--ep", help="ep sizes to try with every tp size; a pair transformers refuses (ep not 1 or tp in 5.23-5.25) "
                     "is shown invalid. Default: 1, and for a model with an expert-parallel plan also every ep size "
                     "transformers accepts on each tp size's ranks.")] = None,
    context: Annotated[int, typer.Option("--context", help="Tokens per sequence in the KV cache.")] = 8192,
    batch: Annotated[int, typer.Option("--batch", help="Sequences held at once.")] = 1,
    kv_dtype: Annotated[Optional[str], typer.Option("--kv-dtype", help="KV cache dtype (default: the model's): "
                                                                       "bfloat16, float16, float8_e4m3fn.")] = None,
    overhead: Annotated[Optional[str], typer.Option(
        "--overhead", help="Per-GPU overhead: bytes (4GiB) or a share of GPU memory (10%). Default: 1 GiB + 8%.")]
    = None,
    training: Annotated[bool, typer.Option(
        "--training", help="Size training instead of serving: parameters + gradients + master weights + optimizer "
                           "states per rank (activations are not modelled; see --activation-budget).")] = False,
    optimizer: Annotated[str, typer.Option(
        "--optimizer", help="With --training: adamw (2 moments), sgd (1 momentum buffer), adafactor (factored "
                            "second moments) or none.")] = "adamw",
    master_weights: Annotated[bool, typer.Option(
        "--master-weights/--no-master-weights", help="With --training: a float32 copy of every 16-bit trainable "
                                                     "parameter.")] = True,
    grad_dtype: Annotated[Optional[str], typer.Option(
        "--grad-dtype", help="With --training: gradient dtype (default: each parameter's dtype).")] = None,
    optimizer_dtype: Annotated[str, typer.Option(
        "--optimizer-dtype", help="With --training: optimizer state dtype.")] = "float32",
    activation_budget: Annotated[Optional[str], typer.Option(
        "--activation-budget", help="With --training: bytes per GPU reserved for activations (8GiB, 10GB); "
                                    "default 0.")] = None,
    plan: PlanOpt = None,
    format: format_option("size") = "table",  # type: ignore[valid-type]  # an `Annotated` built per command
    output: OutputOpt = None,
    width: WidthOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    architecture: ArchitectureOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    units: UnitsOpt = Units.GiB,
) -> int:
    """Which tp/ep fits a GPU: exact worst-rank weights + KV cache + overhead per option, the longest context each
    holds, and the smallest that fits; with --training, the training model states instead.

    Exit codes: 0 an option fits (recommended), 1 none fits, 2 bad input.
    """
    from ..metamodel import load_plan_file
    from ..errors import UsageError
    from ..sizing.gpus import GPU_MEMORY_MIB, gpu_memory_bytes
    from ..sizing import parse_overhead, size_model
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
            capacity = parse_bytes(gpu_memory, unit_required=True)
        except ValueError as e:
            raise UsageError(f"--gpu-memory: {e}") from None
        if capacity <= 0:
            raise UsageError(f"--gpu-memory {gpu_memory} must be more than 0 bytes")
    get("size", format)
    setup = _training_setup(training, optimizer, master_weights, grad_dtype, optimizer_dtype, activation_budget)
    plan_override = load_plan_file(plan) if plan is not None else None
    from ..compat import versions
    from ..sources.beside import read_beside

    source, _ = read_beside(model, versions, revision=revision, token=token,
                            progress=format == "table" and sys.stdout.isatty())
    report = size_model(source, capacity_bytes=capacity, gpu_name=gpu, tp_sizes=_int_list(tp, "--tp"),
                        ep_sizes=_int_list(ep, "--ep") if ep is not None else None, context=context, batch=batch,
                        kv_dtype=kv_dtype,
                        overhead=parse_overhead(overhead), plan_override=plan_override, architecture=architecture,
                        trust_remote_code=trust_remote_code, training=setup)
    emit("size", format, report, output, unit=units.value, columns=width)
    if output is not None:  # the report is in the file: say so, as check, batch and scan do
        best = report.recommended
        verdict = (f"recommended tp {best.tp_size}, ep {best.ep_size}" if best is not None else "nothing recommended")
        print(f"tpaudit: wrote the size report ({format}; {len(report.options)} options, {verdict}) to {output}",
              file=sys.stderr)
    return 0 if report.recommended is not None else 1
