"""Worker of `strict_tp`: reads `{"payload", "tp_size", "ep_size"}` JSON on stdin, writes the report JSON (with a
`suggestion` section when errors exist) on stdout. Runs in its own interpreter, outside any torchrun process group."""

from __future__ import annotations

import json
import sys


def main() -> int:
    from .api import check_payload
    from .cli._errors import report_error

    try:
        request = json.loads(sys.stdin.read())
        report = check_payload(request["payload"], tp_size=request["tp_size"], ep_size=request["ep_size"])
        if report.has_errors:
            report = check_payload(request["payload"], tp_size=request["tp_size"], ep_size=request["ep_size"],
                                   suggest=True)
        sys.stdout.write(json.dumps(report.to_json()))
        return 0
    except BaseException as e:  # noqa: BLE001 - the parent reads our one-line error
        return report_error(e) or 1


if __name__ == "__main__":
    sys.exit(main())
