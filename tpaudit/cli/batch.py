"""`tpaudit batch`: audit a list of models at several tp/ep sizes, one JSON line each, cached and parallel."""

from __future__ import annotations

import json
import os
import sys
import time
from enum import Enum
from typing import Annotated, Optional, TextIO

import typer

from ._options import DtypeOpt, PlanOpt, TokenOpt, Units, UnitsOpt, WidthOpt, format_option

BATCH_EXAMPLES = [
    "tpaudit batch registry.txt --tp 4,8 --jobs 2 -o results.jsonl",
    "tpaudit batch registry.txt --tp 4,8 -o today.jsonl --compare yesterday.jsonl --format markdown --report "
    "comment.md",
    "tpaudit batch registry.txt --tp 8 --ep 1,8 --executor ray --ray-address auto -o results.jsonl",
]


class Executor(str, Enum):
    local = "local"
    ray = "ray"


class _Lines:
    """OUT, written as lines finish (flushed, so an interrupted run keeps them for `--resume`) and rewritten in list
    order at the end (a temporary file renamed into place). OUT is opened at the first line: a run that fails before
    it (an executor that cannot start, a Ray cluster that cannot be reached) leaves OUT as it was."""

    def __init__(self, path: str):
        self.path = path
        self.file: TextIO | None = None

    def add(self, line) -> None:
        if self.file is None:
            from ..errors import UsageError

            try:
                self.file = open(self.path, "w", encoding="utf-8")
            except OSError as e:
                raise UsageError(f"cannot write -o {self.path}: {e.strerror or e}. Check the directory") from None
        self.file.write(json.dumps(line.to_json()) + "\n")
        self.file.flush()

    def _write_all(self, lines) -> None:
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line.to_json()) + "\n" for line in lines)
        os.replace(tmp, self.path)

    def rewrite(self, lines) -> None:
        self.close()
        self._write_all(lines)

    def close(self) -> None:
        if self.file is not None and not self.file.closed:
            self.file.close()


def _progress():
    """A rich progress bar on stderr (a terminal only): lines done/total, errors so far, models per minute."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]tpaudit batch"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("lines · [red]{task.fields[errors]} error lines[/] · {task.fields[rate]}"),
                    TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.realpath(a) == os.path.realpath(b)


def _check_outputs(output: str, report: str | None, inputs: dict[str, str | None]) -> None:
    """Refuse, before anything is read or written, an OUT that is not a regular file (a FIFO would block the
    write, a device or directory cannot hold lines that are read back and renamed into place), and an output that
    is one of the inputs (`batch LIST -o LIST` would overwrite the list) or the other output."""
    import stat

    from ..errors import UsageError

    try:
        st = os.stat(output)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot write -o {output}: {getattr(e, 'strerror', None) or e}. Pass a file path") \
            from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"cannot write -o {output}: it is not a regular file (a directory, FIFO or device). Pass a "
                         "file path for the JSON lines")
    for flag, path in (("-o", output), ("--report", report)):
        if path is None:
            continue
        for name, source in inputs.items():
            if source is not None and _same_file(path, source):
                raise UsageError(f"{flag} {path} is the {name} file: the batch would overwrite its own input. Pass "
                                 f"another path to {flag}")
    if report is not None and _same_file(output, report):
        raise UsageError(f"-o and --report both name {output}. Pass different files")


def batch(
    model_list: Annotated[str, typer.Argument(
        metavar="LIST", help="A text file of model references, one a line (Hub id, local directory or snapshot, as "
                             "'check' takes them), optional @revision, # comments.")],
    output: Annotated[str, typer.Option(
        "--output", "-o", help="OUT.jsonl: one JSON line per (model, tp, ep), written as lines finish.")],
    tp: Annotated[str, typer.Option("--tp", help="tp sizes, comma-separated (4,8).")],
    ep: Annotated[str, typer.Option("--ep", help="ep sizes, comma-separated; combinations transformers refuses "
                                                 "(without FSDP: ep other than 1 or tp) are left out.")] = "1",
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", help="Local worker processes, each importing torch and transformers once (default 1: in this "
                             "process); with --executor ray and no address, the CPUs of the local Ray instance "
                             "(default: all).", show_default=False)] = None,
    executor: Annotated[Executor, typer.Option("--executor", help="local: worker processes on this machine; ray: "
                                                                  "Ray tasks (Ray comes with the ray extra of tpaudit).")]
    = Executor.local,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="With --executor ray: a running cluster (auto, ray://HOST:10001); default: a local "
                              "Ray instance.")] = None,
    format: format_option("batch") = "table",  # type: ignore[valid-type]  # an `Annotated` built per command
    report: Annotated[Optional[str], typer.Option("--report", help="Write the summary to this file instead of "
                                                                   "stdout.")] = None,
    compare: Annotated[Optional[str], typer.Option(
        "--compare", help="A previous OUT file: report new and fixed errors and worst-rank bytes that moved; the "
                          "exit code is then 1 only for new errors.")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Keep the lines already in OUT (an interrupted run) whose inputs still match, and audit "
                         "only the others.")] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Recompute every line (ignore the cache and OUT; the "
                                                            "results are still cached).")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 also when a model cannot be read (error "
                                                          "lines).")] = False,
    top: Annotated[int, typer.Option("--top", help="How many worst offenders (by replicated bytes) the summary "
                                                   "lists.")] = 10,
    plan: PlanOpt = None,
    dtype: DtypeOpt = None,
    token: TokenOpt = None,
    units: UnitsOpt = Units.GiB,
    width: WidthOpt = None,
) -> int:
    """Audit every model of LIST at every tp/ep: one JSON line each in OUT, then a summary.

    Results are cached by what determines them (tpaudit, transformers and torch versions, the model's config and
    tensor listing, the plan, tp, ep) under $TPAUDIT_CACHE (default: $HF_HOME/tpaudit/batch): a second run computes
    nothing. A model that cannot be read is an error line; the batch goes on.

    Exit codes: 0 no line has an error finding, 1 some line has one (with --compare: some error is new; with
    --strict: also a model that could not be read), 2 bad usage or input (LIST, sizes, --plan, --compare, Ray
    missing), 4 some line hit a tpaudit bug (its line says internal error).
    """
    from ..run import batch as core
    from ..errors import UsageError
    from ..report import get
    from ._output import emit
    from .size import _int_list

    get("batch", format)
    tp_sizes, ep_sizes = _int_list(tp, "--tp"), _int_list(ep, "--ep")
    if top < 0:
        raise UsageError(f"--top {top} is invalid. Pass 0 or more")
    if executor == Executor.ray and not core.ray_available():
        raise UsageError(f"--executor ray needs Ray, which is not installed. Install it with: {core.RAY_INSTALL}")
    if ray_address and executor != Executor.ray:
        raise UsageError("--ray-address needs --executor ray. Add --executor ray")
    if resume and refresh:
        raise UsageError("--resume keeps earlier lines and --refresh recomputes them all. Pass only one")
    _check_outputs(output, report, {"LIST": model_list, "--compare": compare, "--plan": plan})
    refs = core.read_list(model_list)
    old = core.read_results(compare, what="--compare file") if compare is not None else None
    pairs, refused = core.size_pairs(tp_sizes, ep_sizes)
    for message in refused:
        print(f"tpaudit: skipped: {message}", file=sys.stderr)
    previous = []
    if resume and os.path.lexists(output):
        previous = core.read_results(output, partial_ok=True, what="-o file")

    total = len(refs) * len(pairs)
    start = time.perf_counter()
    # Sizes, plan, versions and the executor are checked here, before OUT is touched.
    results = core.batch(refs, tp_sizes=tp_sizes, ep_sizes=ep_sizes, plan=plan, dtype=dtype, token=token,
                         jobs=jobs, executor=executor.value, ray_address=ray_address, cache=not no_cache,
                         refresh=refresh, previous=previous)
    done: list = []
    writer = _Lines(output)
    bar = _progress() if sys.stderr.isatty() else None
    try:
        task = bar.add_task("batch", total=total, errors=0, rate="") if bar else None
        if bar:
            bar.start()
        errors = 0
        for line in results:
            done.append(line)
            writer.add(line)
            errors += line.status == "error"
            if bar:
                minutes = (time.perf_counter() - start) / 60
                rate = f"{len(done) / len(pairs) / minutes:.1f} models/min" if minutes > 0 else ""
                bar.update(task, advance=1, errors=errors, rate=rate)
    except KeyboardInterrupt:
        print(f"tpaudit: interrupted; {len(done)} of {total} lines are in {output}: rerun the same command with "
              "--resume to audit only the others", file=sys.stderr)
        raise
    finally:
        if bar:
            bar.stop()
        writer.close()
    ordered = core.order_results(done, refs, pairs)
    writer.rewrite(ordered)
    comparison = core.compare(old, ordered, previous=compare) if old is not None else None
    summary = core.summarize(ordered, pairs=pairs, seconds=time.perf_counter() - start, comparison=comparison,
                             strict=strict, top=top, refused=refused)
    emit("batch", format, summary, report, unit=units.value, columns=width)
    print(f"tpaudit: wrote {len(ordered)} lines to {output}", file=sys.stderr)
    return summary.exit_code

