"""`--format json` of every command: the versioned contract of each result (`to_json()`), exactly."""

from __future__ import annotations

import json

from . import renderer


def _dump(result) -> str:
    return json.dumps(result.to_json(), indent=2) + "\n"


@renderer("check", "json")
def render(report, **_) -> str:
    """The `tpaudit/check/v1` object as indented JSON text (sizes are integer bytes), ending with a newline."""
    return _dump(report)


@renderer("size", "json")
def render_size(report, **_) -> str:
    """The `tpaudit/size/v1` object as indented JSON text."""
    return _dump(report)


@renderer("scan", "json")
def render_scan(report, **_) -> str:
    """The `tpaudit/scan/v1` object as indented JSON text."""
    return _dump(report)


@renderer("verify", "json")
def render_verify(result, **_) -> str:
    """The `tpaudit/verify/v1` object as indented JSON text."""
    return _dump(result)
