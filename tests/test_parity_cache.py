"""The parity verdict cache: a repeat check of the same model and plan runs no parity check; an entry that is
corrupt, forged or malformed is never trusted; anything the result depends on is in the key."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, audit, read_json_any


def _result():
    from tpaudit.model import ParityResult, RuleVerdict, SplitOutput

    split = SplitOutput(module="model.layers.*.mlp.gate_up_proj", rule="model.layers.*.mlp.gate_up_proj",
                        style="colwise", action="chunk into parts of [8, 8] features out of 16, blocks of the whole "
                        "output", cut="blocks", op="chunk", parts=(8, 8), total=16, period=16)
    verdict = RuleVerdict(rule=split.rule, style="colwise", module=split.module, status="error",
                          kind="packed_layout", why="the sharded forward matched once it used `packed_colwise`",
                          observed_at="model.layers.*.mlp", max_abs_error=2.5, rank=0, fix_style="packed_colwise",
                          split=split)
    return ParityResult(ran=True, reason="ran", tp_size=2, passed=False, modules_compared=12, max_abs_error=2.5,
                        first_divergent_module=split.module, rule=split.rule, style="colwise", fused=True,
                        split=(split,), shrunk={"hidden_size": [4096, 32]}, layers=(0,), verdicts=(verdict,),
                        reruns=1, isolation_seconds=0.25, seconds=1.5)


def test_a_result_round_trips_through_the_cache(tmp_path):
    from tpaudit.evidence.cache import ParityCache, digest

    cache, facts = ParityCache(str(tmp_path)), {"plan": {"a": "colwise"}, "tp_size": 2}
    key = digest(facts)
    assert cache.get(key) is None
    cache.put(key, facts, _result())
    hit = cache.get(key)
    assert hit is not None and hit.cached is True
    assert hit.verdicts == _result().verdicts and hit.split == _result().split
    assert hit.to_json() == {**_result().to_json(), "cached": True}


@pytest.mark.parametrize("damage", ["truncated", "not json", "other schema", "key echo", "inputs", "types",
                                    "unknown key", "huge", "not ran"])
def test_a_damaged_entry_is_ignored_never_trusted(tmp_path, damage):
    """Each way an entry can be wrong: a truncated write, bytes that are not JSON, another schema, an entry filed
    under a key it does not name, inputs that do not hash to its key, a field of the wrong type (`passed: "yes"`),
    a field the data model does not have, a file over the size cap, a result that did not run. Each reads as a miss."""
    from tpaudit.evidence import cache as C

    cache, facts = C.ParityCache(str(tmp_path)), {"plan": None, "tp_size": 2}
    key = C.digest(facts)
    cache.put(key, facts, _result())
    path = cache.path(key)
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[:200])
    elif damage == "not json":
        path.write_bytes(b"\xff\xfe garbage")
    elif damage == "other schema":
        path.write_text(json.dumps({**entry, "schema": "tpaudit/parity-cache/v0"}))
    elif damage == "key echo":
        path.write_text(json.dumps({**entry, "key": "0" * 64}))
    elif damage == "inputs":
        path.write_text(json.dumps({**entry, "inputs": {**facts, "tp_size": 4}}))
    elif damage == "types":
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "passed": "yes"}}))
    elif damage == "unknown key":
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "trusted": True}}))
    elif damage == "huge":
        path.write_text(json.dumps({**entry, "pad": "x" * (C.MAX_ENTRY_BYTES + 1)}))
    elif damage == "not ran":
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "ran": False, "reason": "timed out"}}))
    assert cache.get(key) is None
    cache.put(key, facts, _result())     # and a check that runs again rewrites it
    assert cache.get(key) is not None


def test_where_the_cache_lives_and_how_to_switch_it_off(monkeypatch, tmp_path):
    from tpaudit.evidence.cache import cache_dir

    monkeypatch.delenv("TPAUDIT_PARITY_CACHE", raising=False)
    monkeypatch.delenv("TPAUDIT_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_dir() == tmp_path / "hf" / "tpaudit" / "parity"     # beside the batch cache's tpaudit/batch
    monkeypatch.setenv("TPAUDIT_CACHE", str(tmp_path / "shared"))
    assert cache_dir() == tmp_path / "shared" / "parity"
    monkeypatch.setenv("TPAUDIT_PARITY_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("TPAUDIT_NO_PARITY_CACHE", "1")
    assert cache_dir() is None


@pytest.mark.slow
def test_a_repeat_check_runs_no_parity(tmp_path, monkeypatch):
    """Llama-3.1-8B-Instruct's real config at tp 2 with --parity: the first check runs the sharded forward and
    stores it; the second one of the same model and plan reads it (the parity code is not even called), with the same
    verdicts. Another plan or another tp size is another key; with TPAUDIT_NO_PARITY_CACHE=1 nothing is read or
    written."""
    import tpaudit.evidence.stage as stage

    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
                                                  ["config"]))
    first = audit(str(model), tp=2, parity="on").parity
    assert first.ran and first.passed is True and not first.cached
    real = stage.run_parity
    monkeypatch.setattr(stage, "run_parity", lambda *a, **k: pytest.fail("the parity check ran again"))
    second = audit(str(model), tp=2, parity="on").parity
    assert second.cached and second.verdicts == first.verdicts and second.to_json()["cached"] is True
    monkeypatch.setattr(stage, "run_parity", real)
    other = audit(str(model), tp=2, parity="on", plan={"layers.*.self_attn.q_proj": "colwise",
                                                       "layers.*.self_attn.k_proj": "colwise",
                                                       "layers.*.self_attn.v_proj": "colwise",
                                                       "layers.*.self_attn.o_proj": "rowwise"}).parity
    assert not other.cached
    assert not audit(str(model), tp=4, parity="on").parity.cached
    monkeypatch.setenv("TPAUDIT_PARITY_CACHE", str(tmp_path / "off"))
    monkeypatch.setenv("TPAUDIT_NO_PARITY_CACHE", "1")
    assert not audit(str(model), tp=2, parity="on").parity.cached
    assert not (tmp_path / "off").exists()
