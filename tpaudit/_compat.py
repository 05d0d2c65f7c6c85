"""The one place where tpaudit touches private transformers and torch APIs, and the versions it supports.

tpaudit simulates loading with the installed transformers' own code (plan merging, plan resolution, TP/EP
application, checkpoint renaming). Several of those functions are private, so every import of them lives here and the
supported range is checked before any is used: outside it tpaudit stops with a clear message (exit 2) rather than
reporting numbers that may have drifted from the loader.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from importlib import metadata

from .errors import UnsupportedVersionError

# Tested ranges (lower bound inclusive, upper bound exclusive). Widen only after `pytest` and
# `../shared/tools/run-cases` pass on the new version.
TRANSFORMERS_RANGE = ((5, 23, 0), (5, 24, 0))
TORCH_RANGE = ((2, 13, 0), (2, 15, 0))


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if len(parts) == 3:
            break
    return tuple(parts + [0] * (3 - len(parts)))


def _fmt(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or `None` when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_versions() -> dict[str, str]:
    """Check that the installed transformers and torch are in the supported ranges.

    Returns:
        `{"transformers": ..., "torch": ..., "huggingface_hub": ...}`, the versions found (plus `"untested"` when
        `TPAUDIT_ALLOW_UNTESTED=1` let an out-of-range version through, e.g. a transformers checkout's dev version).

    Raises:
        UnsupportedVersionError: a package is missing or outside its tested range (and `TPAUDIT_ALLOW_UNTESTED` is
            not set).
    """
    found = {}
    for dist, (low, high) in (("transformers", TRANSFORMERS_RANGE), ("torch", TORCH_RANGE)):
        version = installed_version(dist)
        if version is None:
            raise UnsupportedVersionError(
                f"{dist} is not installed. Install tpaudit with its dependencies: pip install torch==2.13.0 && "
                "pip install tpaudit")
        v = _version_tuple(version)
        if not (low <= v < high) and os.environ.get("TPAUDIT_ALLOW_UNTESTED"):
            found["untested"] = f"{dist} {version} is outside the tested range >={_fmt(low)},<{_fmt(high)}"
        elif not (low <= v < high):
            raise UnsupportedVersionError(
                f"{dist} {version} is outside the range tpaudit was tested against (>={_fmt(low)},<{_fmt(high)}): "
                "plan resolution uses its private functions, whose behaviour may differ. Install "
                f"'{dist}>={_fmt(low)},<{_fmt(high)}' (or set TPAUDIT_ALLOW_UNTESTED=1 to run anyway)")
        found[dist] = version
    found["huggingface_hub"] = installed_version("huggingface_hub") or "unknown"
    return found


@contextlib.contextmanager
def quiet_libraries():
    """Silence transformers' and torch's own warnings while tpaudit simulates (it reports those facts itself)."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    torch_logger = logging.getLogger("torch")
    torch_level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        torch_logger.setLevel(torch_level)


# ----------------------------------------------------------------------------------------------------------------------
# Private APIs (transformers 5.23, torch 2.13). Import lazily: `tpaudit --help` must not import torch.
# ----------------------------------------------------------------------------------------------------------------------
def parallel_styles():
    """transformers 5.23 `distributed.parallel_utils.ALL_PARALLEL_STYLES` (registered by `tensor_parallel.py` and
    `expert_parallel.py` at import)."""
    import transformers.distributed.expert_parallel  # noqa: F401  registers the EP styles
    import transformers.distributed.tensor_parallel  # noqa: F401  registers the TP styles
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES

    return ALL_PARALLEL_STYLES


def style_names() -> list[str]:
    """Every style name the installed transformers registers (`colwise`, `rowwise`, `packed_colwise`, ...)."""
    return sorted(parallel_styles().keys())


def local_shape(global_shape, mesh_shape, coordinate, placements) -> tuple[int, ...]:
    """The shape a rank at mesh `coordinate` holds of a DTensor with `placements`.

    Source: torch 2.13 `distributed.tensor._utils._compute_local_shape_and_global_offset`, the function DTensor itself
    uses for `to_local()` shapes (uneven shards follow `torch.chunk`: low ranks get `ceil(n / size)`).
    """
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    shape, _ = _compute_local_shape_and_global_offset(tuple(global_shape), tuple(mesh_shape), list(coordinate),
                                                     placements, skip_offset=True)
    return tuple(int(x) for x in shape)


def str_to_torch_dtype(name: str):
    """safetensors dtype name -> torch dtype. Source: transformers 5.23 `modeling_utils.str_to_torch_dtype`, with the
    float8 variants `safetensors.torch` also knows."""
    import torch
    from transformers.modeling_utils import str_to_torch_dtype as table

    if name in table:
        return table[name]
    extra = {"F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
             "C64": "complex64"}
    return getattr(torch, extra.get(name, ""), torch.uint8)
