"""Helpers more than one part of the 5.23 line uses."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def _quiet_quantizer_packages() -> Iterator[None]:
    """Silence a quantization package's own output while its module replacement runs on the meta device:
    compressed-tensors logs through loguru (one warning per module whose width its group size does not divide: tpaudit
    reports that as a finding) and draws tqdm progress bars ("Applying quantization config", "Compressing model") on
    stderr. Both are restored afterwards, so a library user's own compressed-tensors logging is untouched."""
    import io
    import sys

    loguru = sys.modules.get("loguru")
    if loguru is None and "compressed_tensors" in sys.modules:
        import loguru
    if loguru is not None:
        loguru.logger.disable("compressed_tensors")
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm writes to the `sys.stderr` of the moment
            yield
    finally:
        if loguru is not None:
            loguru.logger.enable("compressed_tensors")

