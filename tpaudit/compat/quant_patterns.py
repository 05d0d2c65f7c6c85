"""Bounds on the module-name patterns of a `quantization_config`, checked before a quantizer matches them.

A quantizer decides which modules it replaces by matching names from config.json against every module name of the
model, with Python's backtracking `re`:

- compressed-tensors: `ignore`, `config_groups.*.targets` (and the same keys of its `sparsity_config` and
  `transform_config`); an entry `re:PATTERN` is `re.match(PATTERN, name)` (`compressed_tensors.utils.match.match_name`),
  any other entry an equality test.
- every other transformers quantizer: `modules_to_not_convert`, where EVERY entry is a regular expression
  (`re.match(rf"(?:{key}){boundary}", name)`, transformers 5.23-5.25 `quantizers/quantizers_utils.should_convert_module`).

A pattern such as `(.|.)*zzz$` backtracks exponentially in the length of the name, and 400,000 entries each cost a
compilation (`re` caches 512) and a match per module: either runs for minutes. So before the quantizer runs, tpaudit

1. caps the entries (`MAX_ENTRIES` over all those lists),
2. refuses a pattern whose shape backtracks without bound (a repeat inside a repeat, an alternation under a repeat, a
   back-reference: `hazard`), and
3. matches every pattern against the model's module names in a child process under a time budget
   (`probe_matching`, `budget_seconds()`; the child does exactly the matching the quantizer will do, so when it ends
   in time the quantizer's own matching does too).

Past any of them the check ends with `ConfigError` (exit 2) and a one-line reason naming the pattern. A pattern that
does not compile is not bounded here: the quantizer's own refusal reports it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from ..units import shorten

MAX_ENTRIES = 10_000
"""Most module-name entries (all `ignore`, `targets` and `modules_to_not_convert` lists together) tpaudit matches.
The largest published configs list a few hundred (Qwen3-30B-A3B-FP8: 145 `modules_to_not_convert`)."""

BUDGET_SECONDS = 20.0
"""Default wall-clock budget for matching every pattern against every module name (`TPAUDIT_QUANT_MATCH_BUDGET`
overrides it, in seconds). A real config's matching takes well under a second."""

_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"  # transformers' `should_convert_module`
_LIST_KEYS = ("ignore", "targets")
_FIX = "Fix quantization_config (a plain module name or a pattern without nested repeats)"


def budget_seconds() -> float:
    """The matching budget in seconds: `TPAUDIT_QUANT_MATCH_BUDGET` when it is a positive number, else
    `BUDGET_SECONDS`."""
    try:
        value = float(os.environ.get("TPAUDIT_QUANT_MATCH_BUDGET", ""))
    except ValueError:
        return BUDGET_SECONDS
    return value if value > 0 else BUDGET_SECONDS


def pattern_entries(qc: dict[str, Any]) -> tuple[int, list[tuple[str, str]]]:
    """The module-name entries of a quantization config.

    Args:
        qc (`dict`): the `quantization_config` as config.json holds it.

    Returns:
        `(entries, patterns)`: how many entries all the lists hold, and `(where, regex)` for each one matched as a
        regular expression, `regex` as the quantizer passes it to `re.match`.
    """
    entries = 0
    patterns: list[tuple[str, str]] = []
    compressed = qc.get("quant_method") == "compressed-tensors"

    def walk(node: Any, where: str, depth: int) -> None:
        nonlocal entries
        if depth > 8 or not isinstance(node, dict):
            return
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(value, list) and (key == "modules_to_not_convert" or (compressed and key in _LIST_KEYS)):
                entries += len(value)
                for i, item in enumerate(value[: MAX_ENTRIES + 1]):
                    if not isinstance(item, str):
                        continue
                    if key == "modules_to_not_convert":
                        patterns.append((f"{path}[{i}]", rf"(?:{item}){_BOUNDARY}"))
                    elif item.startswith("re:"):
                        patterns.append((f"{path}[{i}]", item[3:]))
            elif isinstance(value, dict):
                walk(value, path, depth + 1)

    walk(qc, "quantization_config", 0)
    return entries, patterns


def check_patterns(qc: dict[str, Any]) -> None:
    """Steps 1 and 2 of the module docstring: the entry cap and the shape of each pattern.

    Raises:
        ConfigError: more than `MAX_ENTRIES` entries, or a pattern `hazard` refuses (exit 2).
    """
    entries, patterns = pattern_entries(qc)
    if entries > MAX_ENTRIES:
        raise ConfigError(f"quantization_config lists {entries:,} module-name entries (ignore, targets, "
                          f"modules_to_not_convert); tpaudit matches at most {MAX_ENTRIES:,}, since the quantizer "
                          "tries each against every module name", fix="Fix quantization_config")
    for where, regex in patterns:
        why = hazard(regex)
        if why:
            shown = shorten(regex, 80, words=False)
            raise ConfigError(f"`{where}` is the regular expression {shown!r}, which {why}: matching it against "
                              "module names can take exponential time", fix=_FIX)


def hazard(regex: str) -> str | None:
    """Why `regex` can backtrack without bound, or `None`: a repeat (`*`, `+`, `{n,}`, `{n,m}` with m > 16) whose
    body holds another such repeat, an alternation, or a back-reference anywhere. A pattern that does not compile
    answers `None` (the quantizer refuses it itself).

    Source: the shapes of catastrophic backtracking in Python's `re` (`sre_parse` tree: `MAX_REPEAT`, `MIN_REPEAT`,
    `BRANCH`, `GROUPREF`)."""
    import importlib

    c: Any
    parser: Any
    try:
        c, parser = importlib.import_module("re._constants"), importlib.import_module("re._parser")  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        c, parser = importlib.import_module("sre_constants"), importlib.import_module("sre_parse")
    try:
        tree = parser.parse(regex)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT) + ((c.POSSESSIVE_REPEAT,) if hasattr(c, "POSSESSIVE_REPEAT") else ())

    def walk(items: Any, under: bool) -> str | None:
        for op, av in items:
            if op in repeats:
                low, high, body = av
                wide = high == c.MAXREPEAT or high > 16
                if wide and under:
                    return "repeats a group that itself repeats (a nested quantifier)"
                if wide and any(o == c.BRANCH for o, _ in _flat(body, c)):
                    return "repeats an alternation"
                why = walk(body, under or wide)
            elif op == c.SUBPATTERN:
                why = walk(av[-1], under)
            elif op == c.BRANCH:
                why = next((w for alt in av[1] if (w := walk(alt, under))), None)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                why = walk(av[1], under)
            elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
                why = "uses a back-reference"
            elif hasattr(c, "ATOMIC_GROUP") and op == c.ATOMIC_GROUP:
                why = walk(av, under)
            else:
                why = None
            if why:
                return why
        return None

    try:
        return walk(tree, False)
    except RecursionError:
        return "nests too deeply to analyse"


def _flat(items: Any, c: Any) -> Iterator[tuple[Any, Any]]:
    """Every `(op, av)` of a parsed pattern, depth first (groups and alternatives opened)."""
    for op, av in items:
        yield op, av
        if op == c.SUBPATTERN:
            yield from _flat(av[-1], c)
        elif op == c.BRANCH:
            for alt in av[1]:
                yield from _flat(alt, c)


_CHILD = r"""
import json, re, sys
job = json.loads(sys.stdin.buffer.read())
names = job["names"]
for i, regex in enumerate(job["patterns"]):
    sys.stdout.write(f"{i}\n"); sys.stdout.flush()
    try:
        compiled = re.compile(regex)
    except Exception:
        continue
    for name in names:
        compiled.match(name)
sys.stdout.write("done\n")
"""


def probe_matching(qc: dict[str, Any], names: list[str]) -> None:
    """Step 3 of the module docstring: match every pattern of `qc` against every module name in a child Python
    (`sys.executable -I -S`, which imports nothing but `re` and `json`) under `budget_seconds()`.

    Args:
        qc (`dict`): the `quantization_config`.
        names (`list[str]`): the meta model's module names (`named_modules()`), the strings the quantizer matches.

    Raises:
        ConfigError: the matching did not end within the budget; the message names the pattern it was on.
    """
    _, patterns = pattern_entries(qc)
    if not patterns or not names:
        return
    job = json.dumps({"patterns": [p for _, p in patterns], "names": names}).encode()
    budget = budget_seconds()
    try:
        child = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:  # no child can be started here: steps 1 and 2 still bound the patterns
        return
    try:
        out, _ = child.communicate(job, timeout=budget)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        lines = out.decode(errors="replace").split()
        at = int(lines[-1]) if lines and lines[-1].isdigit() else 0
        where, regex = patterns[min(at, len(patterns) - 1)]
        shown = shorten(regex, 80, words=False)
        raise ConfigError(f"matching quantization_config's module-name patterns against the model's {len(names):,} "
                          f"modules took over {budget:g} s (stopped at `{where}`, {shown!r}); the quantizer would "
                          "run at least as long", fix=_FIX) from None
    except BaseException:
        child.kill()
        child.wait()
        raise
