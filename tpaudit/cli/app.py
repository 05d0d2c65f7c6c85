"""`tpaudit`: assembles the commands and maps every failure to one stderr line and an exit code.

Exit codes: 0 clean · 1 error findings (or verify mismatch) · 2 bad input or usage · 3 verify: load failed on a
rank · 4 internal error (a tpaudit bug) · 130 interrupted.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from .. import __version__
from . import batch as batch_cmd
from . import check as check_cmd
from . import rules as rules_cmd
from . import scan as scan_cmd
from . import size as size_cmd
from . import snapshot as snapshot_cmd
from . import verify as verify_cmd

app = typer.Typer(
    name="tpaudit",
    help="Lint tensor-parallel sharding plans of Hugging Face transformers models before anyone rents GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"tpaudit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Lint tensor-parallel sharding plans of Hugging Face transformers models before anyone rents GPUs."""


EXAMPLE_WIDTH = 76
"""Example lines are at most this wide (with the help's 2-column indent they fit 80 columns)."""


def examples(commands: list[str]) -> str:
    """A command's help epilog: each example command as a block click prints as written (`\\b`: never re-wrapped),
    broken only between words, never between an option and its value, with a shell line continuation (` \\`), so
    that a copied example runs as one command at any width. A trailing `# comment` goes on its own line above."""
    blocks = []
    for command in commands:
        code, hash_, comment = command.partition("  #")
        units: list[str] = []
        for word in code.split():
            if units and units[-1].startswith("-") and " " not in units[-1] and not word.startswith("-"):
                units[-1] += " " + word  # `--tp 4` stays on one line
            else:
                units.append(word)
        lines = [f"#{comment}"] if hash_ else []
        line = ""
        for unit in units:
            if line and len(line) + 1 + len(unit) > EXAMPLE_WIDTH - 2:
                lines.append(line + " \\")
                line = "  " + unit
            else:
                line = f"{line} {unit}" if line else unit
        lines.append(line)
        blocks.append("\b\n" + "\n".join(lines))
    return "Examples:\n\n" + "\n\n".join(blocks)


app.command("check", epilog=examples(check_cmd.CHECK_EXAMPLES))(check_cmd.check)
app.command("snapshot", epilog=examples(snapshot_cmd.SNAPSHOT_EXAMPLES))(snapshot_cmd.snapshot)
app.command("size", epilog=examples(size_cmd.SIZE_EXAMPLES))(size_cmd.size)
app.command("scan", epilog=examples(scan_cmd.SCAN_EXAMPLES))(scan_cmd.scan)
app.command("verify", epilog=examples(verify_cmd.VERIFY_EXAMPLES))(verify_cmd.verify)
app.command("batch", epilog=examples(batch_cmd.BATCH_EXAMPLES))(batch_cmd.batch)
app.command("rules")(rules_cmd.rules)
app.command("explain")(rules_cmd.explain)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (the console script exits with it). The process is tpaudit's: the garbage
    collector is tuned for it first (`tpaudit._process.tune_gc`)."""
    from .._process import end_pause, tune_gc

    tune_gc()
    try:
        return _main(argv)
    finally:
        end_pause()


def _main(argv: list[str] | None) -> int:
    import os

    from ._errors import report_error

    # a stream the process was started without (`>&-`, `2>&-`) is None in Python: what would be written there goes
    # nowhere, and the exit code still says how the command ended
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")

    # rich's help panels need room: below 100 columns they crop option names and help ("--trust-remote-c…"), so a
    # narrow terminal, and a pipe (rich draws 80 columns there), get click's plain help, which wraps and never crops
    import shutil

    wide = sys.stdout.isatty() and shutil.get_terminal_size((80, 24)).columns >= 100
    app.rich_markup_mode = "rich" if wide else None
    if not wide:
        _wrap_between_words()
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv if argv is not None else sys.argv[1:], prog_name="tpaudit",
                              standalone_mode=False)
    except typer.Exit as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # typer turns Ctrl-C into Exit(130): say so, one line
            return report_error(e.__cause__)
        return int(e.exit_code)
    except typer.Abort:
        return report_error(KeyboardInterrupt())
    except typer.TyperException as e:  # usage errors of typer's bundled click: one line, exit 2
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()  # type: ignore[attr-defined]  # click's NoArgsIsHelpError; bare `tpaudit` / `tpaudit CMD`: the help is the answer
            return 2
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        command_path = getattr(getattr(e, "ctx", None), "command_path", None) or "tpaudit"
        text = ' '.join(message.split()).rstrip('.')
        end = "" if text.endswith(("?", "!")) else "."   # "Did you mean 'check'?" keeps its own mark
        print(f"error: {text}{end} See '{command_path} --help'.", file=sys.stderr)
        return int(getattr(e, "exit_code", 2) or 2)
    except KeyboardInterrupt as e:
        return report_error(e)
    except BrokenPipeError:
        return _closed_stdout()
    except SystemExit as e:  # typer's bundled click turns a closed stdout (EPIPE) into exit 1: not a finding
        if isinstance(e.__context__, BrokenPipeError):
            return _closed_stdout()
        raise
    except Exception as e:  # noqa: BLE001 - the single place where failures become exit codes
        return report_error(e)
    if result == 130:  # typer turns Ctrl-C inside a command into exit code 130: say so, one line
        return report_error(KeyboardInterrupt())
    return int(result) if isinstance(result, int) else 0


def _wrap_between_words() -> None:
    """click's plain help wraps with textwrap's defaults, which break after a hyphen (`--gpu-` / `memory`) and cut
    a word longer than the line: its `TextWrapper` is given `break_on_hyphens=False, break_long_words=False`, so help
    wraps only between words (a path longer than the line stays whole). typer 0.2x bundles click as `typer._click`
    (`formatting.wrap_text` imports `_textwrap.TextWrapper` on each call); a plain click is handled alike."""
    import importlib

    for name in ("typer._click._textwrap", "click._textwrap"):
        try:
            module: Any = importlib.import_module(name)
        except ImportError:
            continue
        base: Any = getattr(module, "TextWrapper", None)
        if base is None or getattr(base, "_between_words", False):
            continue

        class TextWrapper(base):
            _between_words = True

            def __init__(self, *args, **kwargs):
                kwargs.setdefault("break_on_hyphens", False)
                kwargs.setdefault("break_long_words", False)
                super().__init__(*args, **kwargs)

        module.TextWrapper = TextWrapper


def run() -> None:
    """The console script (`tpaudit`) and `python -m tpaudit`: `main`, then the process ends at once with its exit
    code (`tpaudit._process.exit_now`: no teardown of the objects a check leaves)."""
    from .._process import exit_now

    exit_now(main())


def _closed_stdout() -> int:
    """The reader of stdout went away (`tpaudit check ... | head`): nothing to report, nobody to report it to. End as
    a process killed by SIGPIPE does (128 + 13), with stdout pointed at /dev/null so that the interpreter's last flush
    does not complain."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


if __name__ == "__main__":  # pragma: no cover
    run()
