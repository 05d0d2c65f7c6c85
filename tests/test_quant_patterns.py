"""Quantizer work from config.json is bounded: the module-name patterns of a `quantization_config` that compressed-
tensors (`re:` entries of `ignore`/`targets`) or transformers (`modules_to_not_convert`) match with `re.match` against
every module name cannot run away. A backtracking pattern, 400,000 entries, or matching past the time budget ends the
check with exit 2 and one line naming the entry, instead of running until killed.

Expected values come from the patterns the tests write: the entry's position in its list, the entry count."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from conftest import FIXTURES, assert_one_error_line, read_json_any, run_bounded

W8A16 = "llama-3.1-70b-w8a16"  # compressed-tensors, `ignore: ["lm_head"]`, 1,047 modules on the meta model


def _snapshot(tmp_path, quantization_patch: dict) -> str:
    doc = read_json_any(FIXTURES / f"{W8A16}.snapshot.json.gz")
    doc["config"] = copy.deepcopy(doc["config"])
    doc["config"]["quantization_config"].update(quantization_patch)
    path = tmp_path / "patched.snapshot.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return str(path)


@pytest.mark.parametrize("regex, why", [
    ("(.|.)*zzz$", "repeats an alternation"),
    ("(a+)+b", "nested quantifier"),
    ("(model)\\.\\1", "back-reference"),
])
def test_backtracking_shapes_are_named(regex, why):
    from tpaudit.compat.quant_patterns import hazard

    assert why in hazard(regex)


@pytest.mark.parametrize("regex", [".*self_attn.*", "model\\.layers\\.\\d+\\.mlp\\.gate$", "lm_head", "[abc]*d",
                                   "(ab|cd){1,3}", ".*(q|k|v)_proj$"])
def test_patterns_of_real_configs_pass(regex):
    """Shapes real configs use (Kimi-K2.5's `re:.*self_attn.*`, a bounded alternation, an alternation not repeated)."""
    from tpaudit.compat.quant_patterns import hazard

    assert hazard(regex) is None


def test_entries_are_counted_over_every_list():
    """compressed-tensors' `ignore` and each group's `targets` (only `re:` entries are regexes there) and
    `modules_to_not_convert` (every entry is one): 2 + 1 + 3 entries, 1 + 0 + 3 patterns."""
    from tpaudit.compat.quant_patterns import pattern_entries

    qc = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*gate$"],
          "config_groups": {"group_0": {"targets": ["Linear"]}}}
    assert pattern_entries(qc) == (3, [("quantization_config.ignore[1]", ".*gate$")])
    fp8 = {"quant_method": "fp8", "modules_to_not_convert": ["lm_head", "a", "b"]}
    entries, patterns = pattern_entries(fp8)
    assert entries == 3 and [w for w, _ in patterns] == [f"quantization_config.modules_to_not_convert[{i}]"
                                                         for i in range(3)]


def test_exponential_pattern_is_refused_in_seconds(tmp_path):
    """`re:(.|.)*zzz$` in `ignore` backtracks 2^len(name) times on every module name: refused before it runs."""
    ref = _snapshot(tmp_path, {"ignore": ["lm_head", "re:(.|.)*zzz$"]})
    proc = run_bounded("check", ref, "--tp", "4", seconds=120)
    assert_one_error_line(proc, "quantization_config.ignore[1]", "(.|.)*zzz$")


def test_four_hundred_thousand_patterns_are_refused(tmp_path):
    """400,000 `re:` entries (a 13 MB config, under the 16 MiB cap): with `lm_head` and the group's `targets:
    ["Linear"]`, 400,002 entries, over the cap."""
    entries = ["lm_head"] + [f"re:model\\.layers\\.{i}\\.zz" for i in range(400_000)]
    ref = _snapshot(tmp_path, {"ignore": entries})
    proc = run_bounded("check", ref, "--tp", "4", seconds=120)
    assert_one_error_line(proc, "400,002", "10,000")


def test_matching_past_the_budget_is_stopped(tmp_path):
    """Nine `.*` before a literal that never matches: C(len+9, 9) backtracking steps per module name (about 10^11
    for a 40-character name), no shape the static check refuses. The child doing the quantizer's matching is stopped
    at the budget (1 s here) and the entry named."""
    ref = _snapshot(tmp_path, {"ignore": ["lm_head", "re:" + ".*" * 9 + "zzz$"]})
    proc = run_bounded("check", ref, "--tp", "4", seconds=120, env={"TPAUDIT_QUANT_MATCH_BUDGET": "1"})
    assert_one_error_line(proc, "over 1 s", "quantization_config.ignore[1]")
