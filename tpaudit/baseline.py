"""`--baseline FILE`: accept the findings of an earlier report and report only new ones.

A baseline is any earlier `tpaudit check --format json` output (schema `tpaudit/check/v1`) or `--format sarif` log.
Findings are matched by code and target (`Finding.fingerprint`), not by message, so a baseline survives numbers that
move (bytes, ranks) and catches a new family, rule or dimension.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .errors import UsageError
from .model import Report


def load_baseline(path: str) -> set[str]:
    """Fingerprints (`CODE:target`) accepted by the baseline file.

    Raises:
        UsageError: the file is unreadable or neither a tpaudit JSON report nor a SARIF log.
    """
    import gzip

    try:
        raw = Path(path).read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read --baseline {path}: {type(e).__name__}: {e}. Pass an earlier 'tpaudit check "
                         "--format json' output") from None
    if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("tpaudit/check/"):
        findings = doc.get("findings", [])
        if not isinstance(findings, list):
            raise UsageError(f"--baseline {path}: 'findings' is not a list. Pass an earlier 'tpaudit check --format "
                             "json' output")
        return {f"{f['code']}:{f['target']}" for f in findings
                if isinstance(f, dict) and isinstance(f.get("code"), str) and isinstance(f.get("target"), str)}
    if isinstance(doc, dict) and doc.get("version") == "2.1.0" and "runs" in doc:
        out = set()
        for run in doc["runs"] if isinstance(doc["runs"], list) else []:
            results = run.get("results", []) if isinstance(run, dict) else []
            for result in results if isinstance(results, list) else []:
                prints = result.get("partialFingerprints") if isinstance(result, dict) else None
                fp = prints.get("tpaudit/v1") if isinstance(prints, dict) else None
                if isinstance(fp, str):
                    out.add(fp)
        return out
    raise UsageError(f"--baseline {path} is neither a tpaudit JSON report (schema tpaudit/check/v1) nor a SARIF log. "
                     "Create one with 'tpaudit check MODEL --tp N --format json -o baseline.json'")


def apply_baseline(report: Report, accepted: set[str], path: str) -> Report:
    """A copy of `report` without the findings `accepted` lists; its `baseline` section says how many were dropped."""
    from .model import BaselineSection

    kept = tuple(f for f in report.findings if f.fingerprint not in accepted)
    return dataclasses.replace(report, findings=kept,
                               baseline=BaselineSection(file=path, suppressed=len(report.findings) - len(kept)))
