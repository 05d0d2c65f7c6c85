"""`tpaudit check`: simulate a model's TP/EP sharding with the installed transformers and lint the plan."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ._output import emit_rich, write_output
from ._options import (ArchitectureOpt, DtypeOpt, EpOpt, FailOn, FormatOpt, ModelArg, OutputFormat, OutputOpt,
                       PlanOpt, RevisionOpt, TokenOpt, TpOpt, TrustRemoteCodeOpt, Units, UnitsOpt)

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
    format: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    architecture: ArchitectureOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    max_replicated: Annotated[Optional[str], typer.Option(
        "--max-replicated", help="Fail (TPA004) when more than BYTES (2GiB, 500MB) or PCT% of the model is "
                                 "replicated on every rank.")] = None,
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="Lowest severity that makes the exit code 1.")]
    = FailOn.error,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings (never hides exit 2, 3 "
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
    units: UnitsOpt = Units.GiB,
    quiet_params: Annotated[bool, typer.Option("--no-params", help="Terminal: omit the parameter table.")] = False,
) -> int:
    """Predict every rank's shards, list replicated weights and unused rules, and lint the plan.

    Exit codes: 0 no error finding, 1 at least one, 2 bad input (one line on stderr), 4 a tpaudit bug.
    """
    from ..audit import audit_source
    from ..build import load_plan_file
    from ..checks.registry import CheckOptions
    from ..sources import open_source

    from ..errors import UsageError

    import dataclasses

    options = CheckOptions.from_budget(max_replicated) if max_replicated is not None else CheckOptions()
    options = dataclasses.replace(options, unit=units.value)
    plan_override = load_plan_file(plan) if plan is not None else None
    if write_plan is not None and not suggest:
        raise UsageError("--write-plan needs --suggest. Add --suggest")
    accepted = None
    if baseline is not None:
        from ..baseline import load_baseline

        accepted = load_baseline(baseline)
    progress = format == OutputFormat.table and output is None and sys.stdout.isatty()
    source = open_source(model, revision=revision, token=token, progress=progress)
    report = audit_source(source, tp_size=tp, ep_size=ep, plan_override=plan_override, architecture=architecture,
                          trust_remote_code=trust_remote_code, dtype=dtype, options=options, suggest=suggest)
    if accepted is not None:
        from ..baseline import apply_baseline

        report = apply_baseline(report, accepted, baseline)
    if write_plan is not None:
        import json

        suggested = (report.extra.get("suggestion") or {}).get("plan")
        if suggested is None:
            raise UsageError("--suggest found no rule to propose, so there is no plan to write to --write-plan")
        write_output(json.dumps(suggested, indent=2) + "\n", write_plan)
        print(f"tpaudit: wrote the suggested plan ({len(suggested)} rules) to {write_plan}", file=sys.stderr)
    render_report(report, format, output, units.value, show_params=not quiet_params, plan_path=plan)
    return exit_code_for(report, fail_on.value, exit_zero)


def render_report(report, format: OutputFormat, output: str | None, unit: str, *, show_params: bool = True,
                  plan_path: str | None = None) -> None:
    """Draw `report` in `format` to stdout or `output`."""
    if format == OutputFormat.json:
        from ..report.json import render

        write_output(render(report), output)
    elif format == OutputFormat.markdown:
        from ..report.markdown import render

        write_output(render(report, unit=unit), output)
    elif format == OutputFormat.sarif:
        from ..report.sarif import render

        write_output(render(report, plan_path=plan_path), output)
    else:
        from ..report.terminal import render

        emit_rich(lambda console: render(report, console, unit=unit, show_params=show_params), output)
