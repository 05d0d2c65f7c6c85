"""`tpaudit check`: simulate a model's TP/EP sharding with the installed transformers and lint the plan."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ._options import (ArchitectureOpt, DtypeOpt, EpOpt, FailOn, ModelArg, OutputOpt, PlanOpt, RevisionOpt, TokenOpt,
                       TpOpt, TrustRemoteCodeOpt, Units, UnitsOpt, WidthOpt, format_option)
from ._output import emit, write_output

CHECK_EXAMPLES = [
    "tpaudit check Qwen/Qwen3-VL-30B-A3B-Instruct --tp 4",
    "tpaudit check fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz --tp 4 --format json",
    "tpaudit check ./my-model --tp 8 --plan proposed_plan.json --max-replicated 2GiB",
]


def exit_code_for(report, fail_on: str, exit_zero: bool) -> int:
    """0 when clean, 1 when a finding at or above `fail_on` exists (0 anyway with `exit_zero`)."""
    failing = report.count("error") + (report.count("warning") if fail_on == "warning" else 0)
    return 0 if exit_zero or failing == 0 else 1


def check(
    model: ModelArg,
    tp: TpOpt,
    ep: EpOpt = 1,
    plan: PlanOpt = None,
    format: format_option("check") = "table",  # type: ignore[valid-type]  # an `Annotated` built per command
    output: OutputOpt = None,
    width: WidthOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    architecture: ArchitectureOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    max_replicated: Annotated[Optional[str], typer.Option(
        "--max-replicated", help="Fail (TPA004) when more than BYTES (2GiB, 500MB) or PCT% of the model is "
                                 "replicated on every rank.")] = None,
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="Lowest severity that makes the exit code 1.")]
    = FailOn.error,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings (never hides exit 2 "
                                                                "or 4).")] = False,
    dtype: DtypeOpt = None,
    suggest: Annotated[bool, typer.Option(
        "--suggest", help="Propose rules for replicated families from sibling architectures, re-simulate, and print "
                          "a base_model_tp_plan snippet with before/after bytes.")] = False,
    write_plan: Annotated[Optional[str], typer.Option(
        "--write-plan", help="With --suggest: write the suggested plan as JSON, ready for --plan.")] = None,
    baseline: Annotated[Optional[str], typer.Option(
        "--baseline", help="An earlier --format json (or sarif) report: its findings are accepted; only new ones "
                           "are reported and counted.")] = None,
    parity: Annotated[Optional[bool], typer.Option(
        "--parity/--no-parity", help="Run the sharded-forward parity check on a small model of the same "
                                     "architecture (ranks as threads of this CPU process): --parity always, "
                                     "--no-parity never. "
                                     "Default: when the plan splits a fused or packed projection, or with --plan.",
        show_default=False)] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Neither read nor write the parity verdict cache: compute the verdict now.")] = False,
    units: UnitsOpt = Units.GiB,
    params: Annotated[str, typer.Option(
        "--params", help="Terminal: the parameter table: families (by module family, largest first), all (every "
                         "parameter) or none.")] = "families",
    quiet_params: Annotated[bool, typer.Option("--no-params", help="Terminal: omit the parameter table (same as "
                                                                    "--params none).")] = False,
) -> int:
    """Predict every rank's shards, list replicated weights and unused rules, and lint the plan.

    Exit codes: 0 no error finding, 1 at least one, 2 bad input (one line on stderr), 4 a tpaudit bug.
    """
    from ..run.pipeline import Audit, CheckRequest
    from ..metamodel import BuildOptions, load_plan_file
    from ..checks.registry import CheckOptions
    from ..errors import UsageError
    from ..model import ParallelSizes
    from ..report import get

    get("check", format)  # an unknown format fails before any work
    if params not in ("families", "all", "none"):
        raise UsageError(f"--params {params} is not one of families, all, none")
    sizes = ParallelSizes.of(tp, ep, names=("--tp", "--ep"))
    options = CheckOptions.from_budget(max_replicated, unit=units.value, name="--max-replicated") \
        if max_replicated is not None \
        else CheckOptions(unit=units.value)
    plan_override = load_plan_file(plan) if plan is not None else None
    if write_plan is not None and not suggest:
        raise UsageError("--write-plan needs --suggest. Add --suggest")
    accepted = None
    if baseline is not None:
        from ..run.baseline import load_baseline

        accepted = load_baseline(baseline)
    progress = format == "table" and output is None and sys.stdout.isatty()
    audit = Audit.open(model, BuildOptions(plan_override=plan_override, architecture=architecture,
                                           trust_remote_code=trust_remote_code, dtype=dtype),
                       revision=revision, token=token, progress=progress)
    mode = "auto" if parity is None else ("on" if parity else "off")
    from ..evidence.cache import bypassed

    with bypassed(no_cache):
        report = audit.check(CheckRequest(sizes, options=options, parity=mode, plan_path=plan,
                                          suggest="always" if suggest else "never",
                                          baseline=frozenset(accepted) if accepted is not None else None,
                                          baseline_path=baseline))
    if write_plan is not None:
        import json

        suggested = report.suggestion.plan if report.suggestion is not None else None
        if suggested is None:
            raise UsageError("--suggest found no rule to propose, so there is no plan to write to --write-plan")
        write_output(json.dumps(suggested, indent=2) + "\n", write_plan)
        ep_advice = report.suggestion.expert_parallel
        with_ep = (f"; run it with --ep {ep_advice['ep_size']} (expert parallelism for the routed experts)"
                   if ep_advice else "")
        print(f"tpaudit: wrote the suggested plan ({len(suggested)} rules) to {write_plan}{with_ep}", file=sys.stderr)
    emit("check", format, report, output, unit=units.value, params="none" if quiet_params else params,
         columns=width)
    if output is not None:  # the report is in the file: say so, as batch and scan do
        from ..units import plural

        counts = report.summary()
        print(f"tpaudit: wrote the check report ({format}; {plural(counts['errors'], 'error')}, "
              f"{plural(counts['warnings'], 'warning')}, {plural(counts['notes'], 'note')}) to {output}",
              file=sys.stderr)
    return exit_code_for(report, fail_on.value, exit_zero)
