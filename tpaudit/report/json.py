"""`--format json`: the `tpaudit/check/v1` contract, exactly `Report.to_json()`."""

from __future__ import annotations

import json

from ..model import Report


def render(report: Report) -> str:
    """The report as indented JSON text (sizes are integer bytes), ending with a newline."""
    return json.dumps(report.to_json(), indent=2) + "\n"
