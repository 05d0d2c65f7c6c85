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
            (a SARIF result without tpaudit's fingerprint is skipped: other tools' results are not tpaudit's), or
            is a SARIF log that is empty or malformed (see `_sarif_fingerprints`).
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
        return _sarif_fingerprints(doc, path)
    raise UsageError(f"--baseline {path} is neither a tpaudit JSON report (schema tpaudit/check/v1) nor a SARIF log. "
                     "Create one with 'tpaudit check MODEL --tp N --format json -o baseline.json'")


def _sarif_fingerprints(doc: dict, path: str) -> set[str]:
    """The `tpaudit/v1` fingerprints of a SARIF 2.1.0 log's tpaudit runs.

    The log must have the shape tpaudit writes (`report/sarif.py`), or a merge of such runs with other tools' runs:
    `runs` a non-empty list of objects, at least one of them tpaudit's (`tool.driver.name` is `"tpaudit"`); in each
    run `results` (when present) a list of objects; in a tpaudit run every result carries a non-empty string
    `partialFingerprints["tpaudit/v1"]` of the form `CODE:target`. Other tools' runs are not read further. A log
    with no tpaudit run accepts nothing, which is never what a baseline means: it is refused.

    Raises:
        UsageError: the log breaks one of the rules above (the message names the first place that does).
    """
    def refuse(where: str, why: str) -> UsageError:
        return UsageError(f"--baseline {path}: {where} {why}. Pass an earlier 'tpaudit check --format sarif' output, "
                          "unedited")

    runs = doc["runs"]
    if not isinstance(runs, list) or not runs:
        kind = "an empty list" if isinstance(runs, list) else f"not a list (JSON {type(runs).__name__})"
        raise refuse("'runs'", f"is {kind}: the log holds no tpaudit run")
    out: set[str] = set()
    ours = 0
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise refuse(f"runs[{i}]", "is not an object")
        tool = run.get("tool")
        driver = tool.get("driver") if isinstance(tool, dict) else None
        if not (isinstance(driver, dict) and driver.get("name") == "tpaudit"):
            continue
        ours += 1
        results = run.get("results", [])
        if not isinstance(results, list):
            raise refuse(f"runs[{i}].results", "is not a list")
        for j, result in enumerate(results):
            prints = result.get("partialFingerprints") if isinstance(result, dict) else None
            fp = prints.get("tpaudit/v1") if isinstance(prints, dict) else None
            code, colon, _ = fp.partition(":") if isinstance(fp, str) else ("", "", "")
            if not (code and colon):
                raise refuse(f"runs[{i}].results[{j}]", "has no 'partialFingerprints' entry 'tpaudit/v1' of the form "
                             "CODE:target, which a baseline matches findings by")
            out.add(fp)
    if not ours:
        raise refuse("'runs'", "holds no run whose tool.driver.name is 'tpaudit'")
    return out


def apply_baseline(report: Report, accepted: set[str], path: str) -> Report:
    """A copy of `report` without the findings `accepted` lists; its `baseline` section says how many were dropped."""
    from ..model import BaselineSection

    kept = tuple(f for f in report.findings if f.fingerprint not in accepted)
    return dataclasses.replace(report, findings=kept,
                               baseline=BaselineSection(file=path, suppressed=len(report.findings) - len(kept)))
