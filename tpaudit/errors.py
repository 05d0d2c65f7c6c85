"""Every exception tpaudit raises, each with the exit code the CLI maps it to.

This module imports nothing from tpaudit (and nothing heavy), so any module may raise from it. An error carries its
facts as attributes; its `str()` is the one-line message a user sees after `error: `, written as
`<what failed>: <why>. <what to do>.` A `hint` adds an optional second line. Tokens are never part of a message.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes of the `tpaudit` command (documented in the README)."""

    OK = 0
    """Ran; no error-severity finding."""
    FINDINGS = 1
    """Ran; at least one error-severity finding (`check`, `scan`), or `verify` measured != predicted."""
    INPUT = 2
    """Could not run: usage, bad or missing input, gated/missing repo, offline cache miss, unsupported versions."""
    LOAD_FAILED = 3
    """`verify`: the model failed to load on some rank."""
    INTERNAL = 4
    """Internal error: a tpaudit bug."""
    INTERRUPTED = 130


class TpauditError(Exception):
    """Base class: a failure the user can act on. `exit_code` says how the CLI ends."""

    exit_code: ExitCode = ExitCode.INPUT

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


# ----------------------------------------------------------------------------------------------------------------------
# INPUT: the model reference, its files, the options
# ----------------------------------------------------------------------------------------------------------------------
class InputError(TpauditError, ValueError):
    """Bad input or usage: a malformed file, an impossible option, an unknown model type."""


class UsageError(InputError):
    """An option value that cannot work (`--tp 0`, `--ep 3 --tp 2`)."""


class ModelReferenceError(InputError):
    """The MODEL argument is neither an existing path, a snapshot file, nor an `org/name` Hub id."""

    def __init__(self, message: str, *, ref: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.ref = ref


class ConfigError(InputError):
    """`config.json` is missing, unreadable, or transformers cannot build a config or model from it.

    Attributes:
        path (`str`, *optional*): the config file at fault.
        reason (`str`): what is wrong, without the advice (`str()` is `"<reason>. <fix>"`): what `scan` reports for
            transformers' own default configs, where "fix the config" does not apply.
        fix (`str`, *optional*): what to do (`"Fix the config"`, `"Fix the config or pass --architecture"`).
    """

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None, fix: str | None = None):
        super().__init__(f"{message}. {fix}" if fix else message, hint=hint)
        self.path = path
        self.reason = message
        self.fix = fix


class ParityUnavailableError(ConfigError):
    """The parity check cannot build or run the small model of this architecture: no evidence either way.

    `check` reports it as an input error (exit 2); `scan` keeps the type's static audit and notes on its row why
    parity could not run.

    Attributes:
        reason (`str`): what failed, without the advice (`"the parity check cannot run a small X: KeyError: ..."`).
        fix (`str`): how to skip the check (`"Skip it with --no-parity"`).
    """

    def __init__(self, message: str, *, fix: str = "Skip it with --no-parity"):
        super().__init__(message, fix=fix)


class CheckpointError(InputError):
    """A safetensors header or index is unreadable, malformed, or lists a shard that is missing.

    Attributes:
        path (`str`, *optional*): the file at fault (shard, index or model directory).
        tensor (`str`, *optional*): the header entry at fault, when one is.
    """

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None,
                 hint: str | None = None):
        super().__init__(message, hint=hint)
        self.path = path
        self.tensor = tensor


class SnapshotError(InputError):
    """A snapshot file is malformed or has an unknown schema."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.path = path


class PlanError(InputError):
    """A `--plan` file is not a JSON object of rule -> style, or names a style transformers does not register."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.path = path


class UnsupportedVersionError(InputError):
    """The installed transformers or torch lacks a function tpaudit's seam calls (or is not installed)."""


# ----------------------------------------------------------------------------------------------------------------------
# HUB: reading a repository's metadata
# ----------------------------------------------------------------------------------------------------------------------
class HubError(InputError, OSError):
    """The Hub (or the server `HF_ENDPOINT` names) could not give what was asked for."""

    def __init__(self, message: str, *, repo_id: str, revision: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.repo_id = repo_id
        self.revision = revision


class GatedRepoError(HubError):
    """HTTP 401/403: the repo is gated or private and the token (if any) has no access."""


class RepoNotFoundError(HubError):
    """HTTP 404: no such repo, or no such revision in it."""


class HubConnectionError(HubError):
    """The endpoint did not answer (DNS, refused connection, timeout) or the cache cannot serve an offline run."""


# ----------------------------------------------------------------------------------------------------------------------
# VERIFY: real ranks
# ----------------------------------------------------------------------------------------------------------------------
class LoadFailedError(TpauditError):
    """`from_pretrained` failed on at least one rank under `tpaudit verify`."""

    exit_code = ExitCode.LOAD_FAILED

    def __init__(self, message: str, *, rank: int | None = None, loader_message: str | None = None, hint=None):
        super().__init__(message, hint=hint)
        self.rank = rank
        self.loader_message = loader_message


class LaunchError(InputError):
    """`torchrun` could not be started, or a rank hung past the timeout."""


# ----------------------------------------------------------------------------------------------------------------------
# GUARD: the load-time guard of the Python API
# ----------------------------------------------------------------------------------------------------------------------
class ReplicatedWeightsError(TpauditError, RuntimeError):
    """Raised by `tpaudit.strict_tp()` before any weight is read when error-severity findings exist.

    Attributes:
        report (`dict`): the full analysis of the model the loader built, as the JSON contract (`Report.to_json()`,
            `tpaudit/check/v1`) with a `suggestion` section: it crossed a process boundary.
        findings (`list[Finding]`): the error-severity findings that were not allowed.
        plan_snippet (`str`): a `base_model_tp_plan` snippet that covers the replicated weights, when one is known.
    """

    exit_code = ExitCode.FINDINGS

    def __init__(self, message: str, *, report=None, findings=(), plan_snippet: str | None = None):
        super().__init__(message)
        self.report = report
        self.findings = list(findings)
        self.plan_snippet = plan_snippet


# ----------------------------------------------------------------------------------------------------------------------
# How a failure reads: one `error:` line (+ an optional `hint:` line), and the exit code
# ----------------------------------------------------------------------------------------------------------------------
def format_error(error: BaseException, *, debug: bool = False) -> tuple[list[str], int]:
    """The lines a user sees for `error` on stderr and the exit code it maps to.

    A `TpauditError` is its message (and hint); `KeyboardInterrupt` is exit 130; a full disk or closed stdout is an
    input/output error (exit 2); anything else is an internal error (exit 4) whose line says to rerun with
    `TPAUDIT_DEBUG=1`. Messages are folded onto one line each.
    """
    import errno

    def one(line: str) -> str:
        return " ".join(str(line).split())

    if isinstance(error, TpauditError):
        lines = [one(f"error: {error}")]
        if error.hint:
            lines.append(one(f"hint: {error.hint}"))
        return lines, int(error.exit_code)
    if isinstance(error, KeyboardInterrupt):
        return ["error: interrupted"], int(ExitCode.INTERRUPTED)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EPIPE, errno.EDQUOT, errno.EROFS):
        return [one(f"error: cannot write the output: {error.strerror or error}. Free space or pass -o FILE on "
                    "another device")], int(ExitCode.INPUT)
    if isinstance(error, MemoryError):
        return ["error: tpaudit ran out of memory on this input. Check the input's sizes; report it if they are "
                "plausible"], int(ExitCode.INPUT)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return [one(f"error: internal error: {type(error).__name__}: {first[:300]}. This is a tpaudit bug: rerun with "
                "TPAUDIT_DEBUG=1 and report the traceback")], int(ExitCode.INTERNAL)
