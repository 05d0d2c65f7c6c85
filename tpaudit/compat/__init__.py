"""The seam: every contact tpaudit has with the internals of transformers and torch.

tpaudit answers with transformers' own code (plan merging and resolution, TP/EP application, checkpoint renaming,
quantizer module replacement). Several of those functions are private, so they are called from here only, through
one object per transformers release line (`transformers_5_23.Transformers523` for 5.23.x and 5.24.x,
`transformers_5_25.Transformers525` for 5.25.x). The rest of
tpaudit talks to that object's small typed interface (`backend()`): build a meta model, map checkpoint names,
resolve plans, shard on a fake process group, read local shapes. Copies of transformers logic that must run without
importing it live in `logic.py`, each pinned to the original by a test.

**Gate on capability, not version number.** `backend()` probes, once per process, that the functions a line calls
exist with the parameters it passes (`_probe.Capability`), newest line first. A release whose probes pass runs; when it
is not one tpaudit was tested with, `backend().untested` says so and every report repeats it. A release whose probes
fail raises `UnsupportedVersionError` (exit 2) naming the release and what is missing. A new release line is one new
module with a subclass that overrides what changed, and one entry in `_lines()`. What a line offers is the `Seam`
protocol (`_seam.py`): a line that lacks a member, or takes other parameters, fails when it is imported.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

from ..errors import UnsupportedVersionError
from ._types import (ConfigReadError, EmptyPlanError, LoadStepError, ModuleFacts, PlanRejectedError,  # noqa: F401
                     Placement, QuantizationInfo, Renamer, SeamError, ShardedParam, SourceSpec)

if TYPE_CHECKING:  # imported where a line is (`_lines()`), not at `tpaudit --help`
    from ._seam import Seam

_ACTIVE: Seam | None = None


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or `None` when it is not installed (no import)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _lines() -> tuple[type[Seam], ...]:
    """The release lines, newest first, each checked against the `Seam` protocol (`TypeError` names what is missing).
    """
    from ._seam import require_seam
    from .transformers_5_23 import Transformers523
    from .transformers_5_25 import Transformers525

    lines: tuple[type[Seam], ...] = (Transformers525, Transformers523)  # newest first
    for line in lines:
        require_seam(line)
    return lines


def supported_range() -> str:
    """The transformers releases tpaudit supports, as a pip specifier (`">=5.23,<5.26"`): from the oldest release
    line's lower bound to the newest line's upper bound. The one place the range is written: each line's
    `SUPPORTED`; `pyproject.toml` and the README repeat it, and `tests/test_compat_pins.py` holds them to it."""
    lines = _lines()
    low = lines[-1].SUPPORTED.split(",")[0]
    high = lines[0].SUPPORTED.split(",")[-1]
    return f"{low},{high}"


def _major_minor(version: str) -> str:
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


def require_installed() -> dict[str, str]:
    """The installed transformers, torch and huggingface_hub versions, from distribution metadata: no import, for
    callers that may need no simulation at all (a batch served from its cache). `backend()` probes the rest.

    Raises:
        UnsupportedVersionError: transformers or torch is not installed.
    """
    found = {"transformers": installed_version("transformers"), "torch": installed_version("torch")}
    versions = {"huggingface_hub": installed_version("huggingface_hub") or "unknown"}
    for dist, version in found.items():
        if version is None:
            raise UnsupportedVersionError(
                f"{dist} is not installed, and tpaudit simulates with it. Install it: "
                f"pip install torch==2.13.0 'transformers{supported_range()}'")
        versions[dist] = version
    return {k: versions[k] for k in ("transformers", "torch", "huggingface_hub")}


def backend() -> Seam:
    """The seam for the installed transformers and torch (probed once per process).

    Returns:
        The release line's backend object (`Transformers523`), with `versions` and `untested`.

    Raises:
        UnsupportedVersionError: transformers or torch is missing, or lacks a function the seam calls (the message
            names the release and the first missing pieces).
    """
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    from .._process import resume_gc

    versions = require_installed()
    failures = []
    try:
        for line in _lines():
            gaps = line.probe()
            if not gaps:
                tested = _major_minor(versions["transformers"]) in line.TESTED_RELEASES
                _ACTIVE = line(versions, tested)
                return _ACTIVE
            failures.append((line, gaps))
    finally:  # the probes imported torch and transformers: a tpaudit process's import phase ends here
        resume_gc()
    line, gaps = failures[-1]
    more = f" (and {len(gaps) - 2} more)" if len(gaps) > 2 else ""
    raise UnsupportedVersionError(
        f"transformers {versions['transformers']} (torch {versions['torch']}) lacks what tpaudit calls: "
        f"{'; '.join(gaps[:2])}{more}. tpaudit needs transformers {supported_range()} (tested with "
        f"{tested_releases_text()}): pip install 'transformers{supported_range()}'")


def tested_releases() -> tuple[str, ...]:
    """Every `major.minor` release some line of the seam was tested with, oldest first (`("5.23", "5.24", "5.25")`)."""
    return tuple(sorted({r for line in _lines() for r in line.TESTED_RELEASES}, key=lambda r: tuple(map(int, r.split(".")))))


def tested_releases_text() -> str:
    """`"5.23.x, 5.24.x and 5.25.x"`."""
    names = [r + ".x" for r in tested_releases()]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def untested_note(tf: Seam | None = None) -> str | None:
    """A sentence for reports when the installed transformers passed the probes but is not a tested release."""
    tf = tf or backend()
    if tf.tested:
        return None
    newest = tested_releases()[-1]
    return (f"transformers {tf.versions['transformers']} is not a release tpaudit was tested with (it supports "
            f"{tested_releases_text()}); every function tpaudit calls is present with the expected parameters, but "
            f"results may differ from the loader's. Pin a tested release: pip install 'transformers=={newest}.*'")


def versions() -> dict[str, str]:
    """`tpaudit`, `transformers`, `torch`, `huggingface_hub` versions (and `untested` when it applies)."""
    from .. import __version__

    tf = backend()
    out = {"tpaudit": __version__, **tf.versions}
    note = untested_note(tf)
    if note:
        out["untested"] = note
    return out


def reset_for_tests() -> None:
    """Forget the probed backend (tests that fake a missing capability)."""
    global _ACTIVE
    _ACTIVE = None
