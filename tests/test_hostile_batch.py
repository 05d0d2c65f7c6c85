"""`tpaudit batch` reads files strangers may have written (a registry LIST, yesterday's OUT from CI, a restored cache):
none of them can hang it, blow up its memory or give a wrong verdict.

- Every place batch reads (LIST, `--compare`, `-o` when resuming, the cache entries) refuses a FIFO, `/dev/zero`
  and a directory before any read, and caps what it reads (a LIST of one 100 MB line). Each case runs in a child
  with a deadline of a few seconds and an address-space cap, and the child measures its own peak memory.
- Cache entries are validated, not trusted: forged or malformed entries are recomputed and rewritten.
- `-o` onto an input is refused; `--compare` lines are schema-checked; a path with ` #` stays whole; a NUL byte in
  a LIST entry is an error line.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from conftest import CASES, assert_one_error_line, deadline, run_bounded, run_env, run_main

MiB = 1 << 20
CAP = 768 * MiB          # address space of each child: the batch never imports torch before it refuses
PEAK = 200 * MiB         # a refusal costs the interpreter and tpaudit's imports (~40 MB here), nothing more
SECONDS = 8              # a hang or a multi-GB read would take minutes


def small_model(directory: Path) -> Path:
    """A 2-layer granite (config + one real header entry): the tp 2 audit takes well under a second."""
    config = json.loads((CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text())
    config["num_hidden_layers"] = 2
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    hidden = config["hidden_size"]
    raw = json.dumps({"model.norm.weight": {"dtype": "BF16", "shape": [hidden],
                                            "data_offsets": [0, 2 * hidden]}}).encode()
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2 * hidden)
    return directory


def special(tmp_path: Path, kind: str) -> str:
    """A path that is a FIFO, /dev/zero (through a symlink), a directory, or a sparse regular file of 100 MB."""
    path = tmp_path / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:  # oversized: 100 MB, one line, no newline (sparse: costs no disk)
        with open(path, "wb") as f:
            f.write(b"org/name")
            f.truncate(100 * MiB)
    return str(path)


WORDS = {"fifo": "FIFO", "devzero": "character device", "directory": "directory", "oversized": "over tpaudit's cap"}


def assert_refused(proc, *needles: str) -> None:
    """Exit 2 with one `error:` line, quickly and small."""
    assert_one_error_line(proc, *needles, peak=PEAK)


@pytest.fixture
def listing(tmp_path):
    model = small_model(tmp_path / "model")
    path = tmp_path / "list.txt"
    path.write_text(f"{model}\n")
    return path


def batch_child(*args: str, tmp_path: Path):
    return run_bounded("batch", *args, seconds=SECONDS, memory=CAP,
                       env={"TPAUDIT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"})


# ----------------------------------------------------------------------------------------------------------------------
# every place batch reads
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(WORDS))
def test_the_list(tmp_path, kind):
    path = special(tmp_path, kind)
    proc = batch_child(path, "--tp", "2", "-o", str(tmp_path / "out.jsonl"), tmp_path=tmp_path)
    assert_refused(proc, "model list", path, WORDS[kind])
    assert not (tmp_path / "out.jsonl").exists()


def test_a_list_with_one_huge_line_is_refused_by_its_line(tmp_path):
    """Under the file cap (64 MiB) but one 8 MB line: no model reference is longer than 4,096 bytes."""
    path = tmp_path / "list.txt"
    path.write_bytes(b"org/name\n" + b"a" * (8 * MiB) + b"\n")
    proc = batch_child(str(path), "--tp", "2", "-o", str(tmp_path / "out.jsonl"), tmp_path=tmp_path)
    assert_refused(proc, "line 2 is longer than 4,096 bytes")


@pytest.mark.parametrize("kind", list(WORDS))
def test_the_compare_file(tmp_path, listing, kind):
    path = special(tmp_path, kind)
    proc = batch_child(str(listing), "--tp", "2", "-o", str(tmp_path / "out.jsonl"), "--compare", path,
                       tmp_path=tmp_path)
    # an OUT file may be large (every line of a registry), so a 100 MB one is refused by its 100 MB line
    assert_refused(proc, "--compare file", path, "line 1 is longer than" if kind == "oversized" else WORDS[kind])
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("kind", ["fifo", "devzero", "directory"])
@pytest.mark.parametrize("resume", [False, True])
def test_the_output_file(tmp_path, listing, kind, resume):
    """OUT is read back with --resume and renamed into place: it must be a regular file (or not exist yet); a FIFO
    would block the open for writing even without --resume."""
    path = special(tmp_path, kind)
    proc = batch_child(str(listing), "--tp", "2", "-o", path, *(["--resume"] if resume else []), tmp_path=tmp_path)
    assert_refused(proc, f"-o {path}", "not a regular file")


def test_an_oversized_output_file_when_resuming(tmp_path, listing):
    path = special(tmp_path, "oversized")  # 100 MB without a newline: one line over the 64 MiB line cap
    proc = batch_child(str(listing), "--tp", "2", "-o", path, "--resume", tmp_path=tmp_path)
    assert_refused(proc, "-o file", "line 1 is longer than")


@pytest.mark.parametrize("kind", ["fifo", "devzero", "directory", "oversized"])
def test_a_cache_entry_that_is_not_a_small_regular_file_is_a_miss(tmp_path, kind):
    """Read in a child with a deadline and a memory cap: `ResultCache.get` returns a miss at once (the batch then
    recomputes the line and replaces the entry, `test_bad_cache_entries_are_recomputed_and_rewritten`)."""
    import subprocess
    import sys

    from tpaudit.run.batch import ResultCache

    cache = ResultCache(str(tmp_path / "cache"), b"k" * 32)
    key = "ab" * 32
    cache.path(key).parent.mkdir(parents=True)
    made = Path(special(tmp_path, kind))
    made.rename(cache.path(key)) if kind != "devzero" else cache.path(key).symlink_to("/dev/zero")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
            "from tpaudit.run.batch import ResultCache; print(ResultCache(sys.argv[1], b'k' * 32).get(sys.argv[2]))"
            % (CAP, CAP))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache"), key], capture_output=True,
                          text=True, timeout=SECONDS)
    assert (proc.returncode, proc.stdout.strip()) == (0, "None"), proc.stderr


# ----------------------------------------------------------------------------------------------------------------------
# the cache is validated, not trusted
# ----------------------------------------------------------------------------------------------------------------------
def _tamper_result(**change):
    def tamper(entry):
        entry["result"].update(change)
        return entry
    return tamper


TAMPER = {
    "forged clean verdict, counts disagree": _tamper_result(exit_code=0, errors=0),
    "negative bytes": _tamper_result(worst_rank_param_bytes=-5),
    "bytes as a string": _tamper_result(worst_rank_param_bytes="huge"),
    "exit code 1e400": lambda e: json.loads(json.dumps(e).replace('"exit_code": 1', '"exit_code": 1e400')),
    "exit code 3": _tamper_result(exit_code=3),
    "a float count": _tamper_result(errors=1.0),
    "tp 64 in a tp 2 entry": _tamper_result(tp_size=64),
    "findings as a string": _tamper_result(findings="none"),
    "no key echo (an older entry)": lambda e: {k: v for k, v in e.items() if k != "inputs"},
    "echo of other versions": lambda e: {**e, "inputs": {**e["inputs"], "transformers": "0.0.1"}},
    "echo of another plan": lambda e: {**e, "inputs": {**e["inputs"], "plan_sha256": "0" * 64}},
    "echo of another tp": lambda e: {**e, "inputs": {**e["inputs"], "tp_size": 4}},
    "not JSON": lambda e: "{not json",
    "a list": lambda e: [e],
}


@pytest.mark.parametrize("name", list(TAMPER))
def test_bad_cache_entries_are_recomputed_and_rewritten(tmp_path, name):
    import tpaudit

    model = str(small_model(tmp_path / "model"))
    cache = tmp_path / "cache"
    with deadline(60):
        first = list(tpaudit.batch([model], tp_sizes=[2], cache=cache))
    assert first[0].status == "ok" and first[0].errors >= 1 and not first[0].cached  # vocab 49155 is odd
    (entry_path,) = cache.glob("*/*.json")
    entry = json.loads(entry_path.read_text())
    assert entry["inputs"]["tp_size"] == 2 and entry["result"]["tp_size"] == 2
    tampered = TAMPER[name](json.loads(json.dumps(entry)))
    entry_path.write_text(tampered if isinstance(tampered, str) else json.dumps(tampered))
    with deadline(60):
        second = list(tpaudit.batch([model], tp_sizes=[2], cache=cache))
    assert not second[0].cached                                                  # recomputed, not served
    same = ("worst_rank_param_bytes", "total_param_bytes", "replicated_bytes", "errors", "exit_code", "findings")
    assert {k: getattr(second[0], k) for k in same} == {k: getattr(first[0], k) for k in same}
    rewritten = json.loads(entry_path.read_text())                              # and rewritten as it was
    assert rewritten["inputs"] == entry["inputs"] and rewritten["key"] == entry["key"]
    assert {k: v for k, v in rewritten["result"].items() if k != "seconds"} == \
        {k: v for k, v in entry["result"].items() if k != "seconds"}
    with deadline(60):
        third = list(tpaudit.batch([model], tp_sizes=[2], cache=cache))
    assert third[0].cached


FORGE = {
    # a consistent line with 2 bytes less, its mac left as it was (the rest of the entry no longer matches it)
    "edited, mac kept": lambda e, key: {**e, "result": {**e["result"],
                                                        "worst_rank_param_bytes": e["result"]["worst_rank_param_bytes"]
                                                        - 2}},
    # a clean verdict (no findings, exit 0), the mac dropped
    "clean verdict, no mac": lambda e, key: {k: v for k, v in {**e, "result": {
        **e["result"], "exit_code": 0, "errors": 0, "warnings": 0, "notes": 0, "findings": []}}.items() if k != "mac"},
    # the same clean verdict sealed by someone with another key (whoever can write the cache, not this user)
    "clean verdict, sealed with another key": lambda e, key: _sealed({**e, "result": {
        **e["result"], "exit_code": 0, "errors": 0, "warnings": 0, "notes": 0, "findings": []}}, b"x" * 32),
}


def _sealed(entry: dict, key: bytes) -> dict:
    """`entry` with the mac the batch cache's scheme gives under `key`: HMAC-SHA256 of "batch", a NUL byte and the
    canonical JSON (sorted keys, no spaces, ASCII) of the entry without its mac, written here from the scheme."""
    import hashlib
    import hmac

    body = {k: v for k, v in entry.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**body, "mac": hmac.new(key, b"batch\0" + text.encode(), hashlib.sha256).hexdigest()}


@pytest.mark.parametrize("name", list(FORGE))
def test_a_forged_entry_is_recomputed_and_said(tmp_path, name):
    """Whoever can write the cache folder can write an entry for any key (keys are hashes of public inputs); without
    this user's cache key (kept outside the cache) they cannot seal it, so the line is computed again, and the line
    and the summary say which entry was refused."""
    import tpaudit
    from tpaudit.run.batch import summarize

    model = str(small_model(tmp_path / "model"))
    cache = tmp_path / "cache"
    with deadline(60):
        (first,) = tpaudit.batch([model], tp_sizes=[2], cache=cache)
    assert first.errors >= 1 and first.exit_code == 1            # granite's vocab 49155 does not split in 2
    (entry_path,) = cache.glob("*/*.json")
    entry = json.loads(entry_path.read_text())
    assert entry == _sealed(entry, _user_key())                  # the scheme above is the one the cache uses
    entry_path.write_text(json.dumps(FORGE[name](entry, _user_key())))
    with deadline(60):
        (second,) = tpaudit.batch([model], tp_sizes=[2], cache=cache)
    assert not second.cached and second.exit_code == 1 and second.errors == first.errors
    assert second.worst_rank_param_bytes == first.worst_rank_param_bytes
    assert str(entry_path) in second.cache_problem and "not authenticated" in second.cache_problem
    assert second.to_json()["cache_problem"] == second.cache_problem
    summary = summarize([second], pairs=[(2, 1)])
    assert summary.cache_refused == 1 and summary.cache_problems == (second.cache_problem,)
    assert json.loads(entry_path.read_text()) == _sealed(json.loads(entry_path.read_text()), _user_key())
    (third,) = tpaudit.batch([model], tp_sizes=[2], cache=cache)  # rewritten, sealed: served again
    assert third.cached and third.cache_problem is None


def test_a_forged_entry_is_named_in_every_summary_format(tmp_path):
    model = small_model(tmp_path / "model")
    listing = tmp_path / "list.txt"
    listing.write_text(f"{model}\n")
    env = {"TPAUDIT_CACHE": str(tmp_path / "cache"), "COLUMNS": "400"}
    assert run_env("batch", str(listing), "--tp", "2", "-o", str(tmp_path / "a.jsonl"), env=env).returncode == 1
    (entry_path,) = (tmp_path / "cache").glob("*/*.json")
    for fmt in ("table", "markdown", "html"):
        entry = json.loads(entry_path.read_text())
        entry_path.write_text(json.dumps({k: v for k, v in entry.items() if k != "mac"}))
        proc = run_env("batch", str(listing), "--tp", "2", "-o", str(tmp_path / f"{fmt}.jsonl"), "--format", fmt,
                       env=env)
        assert proc.returncode == 1, proc.stderr
        assert "0 from the cache (1 refused by the cache check and computed again)" in proc.stdout, proc.stdout
        assert "not authenticated" in proc.stdout and entry_path.name in proc.stdout, proc.stdout
        (line,) = [json.loads(x) for x in (tmp_path / f"{fmt}.jsonl").read_text().splitlines()]
        assert line["cached"] is False and entry_path.name in line["cache_problem"]
        if fmt == "html":
            assert "<td>computed</td>" in proc.stdout and "<td>cache</td>" not in proc.stdout
    proc = run_env("batch", str(listing), "--tp", "2", "-o", str(tmp_path / "again.jsonl"), "--format", "html",
                   env=env)                                      # the rewritten entry is sealed: served, and said
    assert "1 from the cache" in proc.stdout and "<td>cache</td>" in proc.stdout and "refused" not in proc.stdout


def _user_key() -> bytes:
    from tpaudit.sources.cache_key import cache_key

    key, problem = cache_key()
    assert key is not None, problem
    return key


# ----------------------------------------------------------------------------------------------------------------------
# the batch's own files
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("onto", ["LIST", "--compare", "--plan", "--report"])
def test_output_onto_an_input_is_refused(tmp_path, listing, onto):
    compare = tmp_path / "old.jsonl"
    compare.write_text("")
    plan = tmp_path / "plan.json"
    plan.write_text('{"layers.*.self_attn.q_proj": "colwise"}')
    report = tmp_path / "summary.md"
    target = {"LIST": listing, "--compare": compare, "--plan": plan, "--report": report}[onto]
    before = {p: p.read_bytes() for p in (listing, compare, plan)}
    proc = run_main("batch", str(listing), "--tp", "2", "-o", str(target), "--compare", str(compare),
                    "--plan", str(plan), "--report", str(report))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert {p: p.read_bytes() for p in before} == before                         # nothing was overwritten
    # the same path through another spelling (a symlink) is the same file
    link = tmp_path / "link.txt"
    link.symlink_to(listing)
    assert run_main("batch", str(listing), "--tp", "2", "-o", str(link)).returncode == 2
    assert listing.read_bytes() == before[listing]


@pytest.mark.parametrize("change, words", [
    ({"findings": "TPA001"}, "findings is not a list"),
    ({"findings": [{"code": "TPA001", "severity": "fatal", "target": "x"}]}, "severity"),
    ({"tp_size": "4"}, "tp_size"),
    ({"exit_code": 7}, "exit_code 7"),
    ({"worst_rank_param_bytes": -1}, "worst_rank_param_bytes -1"),
    ({"schema": "tpaudit/batch/v0"}, "schema"),
])
def test_compare_lines_are_schema_checked(tmp_path, listing, change, words):
    good = {"schema": "tpaudit/batch/v1", "model": "a/b", "tp_size": 4, "ep_size": 1, "status": "ok",
            "exit_code": 0, "worst_rank_param_bytes": 10, "total_param_bytes": 40, "replicated_bytes": 0,
            "errors": 0, "warnings": 0, "notes": 0, "findings": [], "seconds": 1.5}
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
    proc = run_main("batch", str(listing), "--tp", "2", "-o", str(tmp_path / "out.jsonl"), "--compare", str(old))
    assert proc.returncode == 2, proc.stderr
    assert "line 2 is not a tpaudit batch result" in proc.stderr and words in proc.stderr, proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_path_with_space_hash_stays_whole(tmp_path):
    from tpaudit.run.batch import parse_list

    model = small_model(tmp_path / "fine-tune #3")
    refs = parse_list([f"{model}", f"{model}   # the third fine-tune", "org/name # a comment", "#org/other",
                       "org/x\t# tab comment", f"{tmp_path}/missing #1 # gone"])
    assert [r.text for r in refs] == [str(model), "org/name", "org/x", f"{tmp_path}/missing"]


def test_a_nul_byte_in_a_list_entry_is_a_clear_error_line(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"# one bad entry\nbad\0entry\n")
    out = tmp_path / "out.jsonl"
    proc = run_main("batch", str(listing), "--tp", "2", "-o", str(out), "--no-cache")
    assert proc.returncode == 0, proc.stderr  # an unreadable entry is counted, not failed (README: exit codes)
    (bad,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert (bad["model"], bad["status"], bad["exit_code"]) == ("bad\0entry", "error", 2)
    assert "NUL byte" in bad["reason"] and "internal error" not in bad["reason"]
    assert "1 with lines that could not run" in proc.stdout
    assert run_main("batch", str(listing), "--tp", "2", "-o", str(out), "--no-cache", "--strict").returncode == 1
