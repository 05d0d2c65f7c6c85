"""Worker of `strict_tp`: reads `{"payload", "tp_size", "ep_size"}` JSON on stdin, writes the report JSON (with a
`suggestion` section when errors exist) on stdout. Runs in its own interpreter, outside any torchrun process group;
the model is built once for both the check and the suggestion."""

from __future__ import annotations

import json
import sys


def main() -> int:
    from .._process import tune_gc

    tune_gc()
    from ..api import payload_audit
    from ..run.pipeline import CheckRequest
    from ..errors import format_error
    from ..model import ParallelSizes

    try:
        request = json.loads(sys.stdin.read())
        sizes = ParallelSizes.of(request["tp_size"], request["ep_size"])
        report = payload_audit(request["payload"]).check(CheckRequest(
            sizes, dist_overrides=request["payload"].get("overrides") or None, suggest="on_errors"))
        sys.stdout.write(json.dumps(report.to_json()))
        return 0
    except BaseException as e:  # noqa: BLE001 - the parent reads our one-line error
        lines, code = format_error(e)
        for line in lines:
            print(line, file=sys.stderr)
        return code or 1


if __name__ == "__main__":
    sys.exit(main())
