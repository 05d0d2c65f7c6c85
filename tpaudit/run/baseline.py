"""`--baseline FILE`: accept the findings of an earlier report and report only new ones.

A baseline is any earlier `tpaudit check --format json` output (schema `tpaudit/check/v1`) or `--format sarif` log.
Findings are matched by code and target (`Finding.fingerprint`), not by message, so a baseline survives numbers that
move (bytes, ranks) and catches a new family, rule or dimension.
"""

from __future__ import annotations

import dataclasses

from ..errors import UsageError
from ..model import Report


def load_baseline(path: str) -> set[str]:
    """Fingerprints (`CODE:target`) accepted by the baseline file.

    Args:
        path (`str`): a `tpaudit check --format json` report (optionally gzip-compressed) or a `--format sarif` log,
            a regular file of at most 64 MiB (`sources.files.BASELINE_MAX_BYTES`).

    Returns:
        `set[str]` of `CODE:target` fingerprints.

    Raises:
        UsageError: the file is missing, not a regular file (FIFO, device, directory), over the size cap, not JSON,
            neither a tpaudit JSON report nor a SARIF log, or holds a finding without a string `code` and `target`
            (a SARIF result without tpaudit's fingerprint is skipped: other tools' results are not tpaudit's).
    """
    from ..sources.files import BASELINE_MAX_BYTES, gunzip_capped, load_json, read_capped

    error = UsageError
    raw = read_capped(path, "--baseline file", BASELINE_MAX_BYTES, error)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_capped(raw, "--baseline file", path, BASELINE_MAX_BYTES, error)
    doc = load_json(raw, "--baseline file", path, error)
    if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("tpaudit/check/"):
        findings = doc.get("findings", [])
        if not isinstance(findings, list):
            raise UsageError(f"--baseline {path}: 'findings' is not a list. Pass an earlier 'tpaudit check --format "
                             "json' output, unedited")
        out = set()
        for i, f in enumerate(findings):
            code = f.get("code") if isinstance(f, dict) else None
            target = f.get("target") if isinstance(f, dict) else None
            if not isinstance(code, str) or not isinstance(target, str):
                raise UsageError(f"--baseline {path}: findings[{i}] has no string 'code' and 'target', which a "
                                 "baseline matches findings by. Pass an earlier 'tpaudit check --format json' output, "
                                 "unedited")
            out.add(f"{code}:{target}")
        return out
    if isinstance(doc, dict) and doc.get("version") == "2.1.0" and "runs" in doc:
        out = set()
        runs = doc["runs"]
        for run in runs if isinstance(runs, list) else ():
            results = run.get("results") if isinstance(run, dict) else None
            for result in results if isinstance(results, list) else ():
                prints = result.get("partialFingerprints") if isinstance(result, dict) else None
                fp = prints.get("tpaudit/v1") if isinstance(prints, dict) else None
                if isinstance(fp, str) and fp:
                    out.add(fp)
        return out
    raise UsageError(f"--baseline {path} is neither a tpaudit JSON report (schema tpaudit/check/v1) nor a SARIF log. "
                     "Create one with 'tpaudit check MODEL --tp N --format json -o baseline.json'")


def apply_baseline(report: Report, accepted: set[str], path: str) -> Report:
    """A copy of `report` without the findings `accepted` lists; its `baseline` section says how many were dropped."""
    from ..model import BaselineSection

    kept = tuple(f for f in report.findings if f.fingerprint not in accepted)
    return dataclasses.replace(report, findings=kept,
                               baseline=BaselineSection(file=path, suppressed=len(report.findings) - len(kept)))
