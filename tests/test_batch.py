"""`tpaudit batch`: many models at several sizes, cached and parallel. Expected bytes come from single `tpaudit check`
runs of the same models and, for Llama-3.1-8B, from the snapshot's shapes by hand; expected exit codes from the
README's contract; nothing is copied from a batch's own output."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, chunk, nbytes, run_cli, run_main, snapshot_tensors

LLAMA = "llama-3.1-8b-instruct"
QWEN3_VL = "qwen3-vl-30b-a3b-instruct"
GRANITE = "granite-3.3-8b-instruct"
MISSING = "fixtures/no-such-model.snapshot.json.gz"

# Which dimension transformers 5.23's llama plan splits (base_model_tp_plan, plus the embedding_rowwise rule it
# injects for embed_tokens and the class-level lm_head colwise_gather_output); norms have no rule.
LLAMA_SPLITS = [
    (r"model\.embed_tokens\.weight", 0),
    (r"lm_head\.weight", 0),
    (r"model\.layers\.\d+\.self_attn\.[qkv]_proj\.weight", 0),
    (r"model\.layers\.\d+\.self_attn\.o_proj\.weight", 1),
    (r"model\.layers\.\d+\.mlp\.(gate|up)_proj\.weight", 0),
    (r"model\.layers\.\d+\.mlp\.down_proj\.weight", 1),
]


def fixture(name: str) -> str:
    return f"fixtures/{name}.snapshot.json.gz"


def llama_by_hand(tp: int) -> tuple[int, int]:
    """(worst-rank bytes, replicated bytes) of Llama-3.1-8B at `tp`, from the snapshot's shapes."""
    ranks, replicated = [0] * tp, 0
    for name, dtype, shape in snapshot_tensors(LLAMA):
        dim = next((d for pattern, d in LLAMA_SPLITS if re.fullmatch(pattern, name)), None)
        if dim is None:
            replicated += nbytes(dtype, shape)
        for r in range(tp):
            local = list(shape)
            if dim is not None:
                local[dim] = chunk(shape[dim], tp, r)
            ranks[r] += nbytes(dtype, local)
    return max(ranks), replicated


def write_list(path: Path, *entries: str) -> Path:
    path.write_text("# models to audit\n\n" + "\n".join(entries) + "\n", encoding="utf-8")
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # list entries are written relative to the repository, as a user in it writes them


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TPAUDIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def audits(monkeypatch):
    """Count the lines computed (`Audit.check` calls: one check of one (model, tp, ep), its fixes re-checked by
    further simulations) made in this process."""
    import tpaudit.run.pipeline

    calls = []
    real = tpaudit.run.pipeline.Audit.check

    def counting(self, request, **kwargs):
        calls.append((self.source.ref, request.sizes.tp_size, request.sizes.ep_size))
        return real(self, request, **kwargs)

    monkeypatch.setattr(tpaudit.run.pipeline.Audit, "check", counting)
    return calls


# ----------------------------------------------------------------------------------------------------------------------
# The list
# ----------------------------------------------------------------------------------------------------------------------
def test_list_comments_revisions_and_duplicates(tmp_path):
    from tpaudit.run.batch import parse_list, read_list

    at_dir = tmp_path / "models@v2"
    at_dir.mkdir()
    refs = parse_list(["# registry", "", "Qwen/Qwen3-30B-A3B@refs/pr/12   # a pull request", "  org/name  ",
                       "org/name", f"{at_dir}", "org/name@", "\tmeta-llama/Llama-3.1-8B@main\t# pinned"])
    assert [(r.text, r.ref, r.revision, r.line) for r in refs] == [
        ("Qwen/Qwen3-30B-A3B@refs/pr/12", "Qwen/Qwen3-30B-A3B", "refs/pr/12", 3),
        ("org/name", "org/name", None, 4),
        (str(at_dir), str(at_dir), None, 6),                  # an existing path keeps its @
        ("org/name@", "org/name", None, 7),
        ("meta-llama/Llama-3.1-8B@main", "meta-llama/Llama-3.1-8B", "main", 8),
    ]
    assert refs[3].problem and "org/name@revision" in refs[3].problem
    assert all(r.problem is None for r in refs[:3] + refs[4:])
    with pytest.raises(Exception, match="names no model"):
        read_list(write_list(tmp_path / "empty.txt", "# nothing", ""))


def test_size_pairs_follow_transformers():
    from tpaudit.run.batch import size_pairs
    from tpaudit.errors import UsageError

    pairs, refused = size_pairs([4, 8], [1, 4])
    assert pairs == [(4, 1), (4, 4), (8, 1)]          # transformers 5.23 without FSDP: ep is 1 or tp
    assert len(refused) == 1 and "--tp 8 --ep 4" in refused[0]
    with pytest.raises(UsageError, match="--tp 8 --ep 4"):
        size_pairs([8], [4])


# ----------------------------------------------------------------------------------------------------------------------
# Done when: --jobs 2 equals single check runs; a missing model is an error line and the batch finishes
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_jobs_2_equals_single_check_runs(tmp_path):
    models = [fixture(LLAMA), MISSING, fixture(QWEN3_VL)]
    out = tmp_path / "out.jsonl"
    proc = run_cli("batch", str(write_list(tmp_path / "list.txt", *models)), "--tp", "4,8", "--jobs", "2",
                   "-o", str(out), "--format", "markdown", env={"TPAUDIT_CACHE": str(tmp_path / "cache")})
    lines = read_lines(out)
    assert [(d["model"], d["tp_size"], d["ep_size"]) for d in lines] == \
        [(m, tp, 1) for m in models for tp in (4, 8)]            # list order, whatever finished first

    expected_exit = 0
    for d in lines:
        if d["model"] == MISSING:
            assert d["status"] == "error" and d["exit_code"] == 2
            assert "does not exist" in d["reason"] and d["worst_rank_param_bytes"] is None
            continue
        single = run_main("check", d["model"], "--tp", str(d["tp_size"]), "--format", "json")
        report = json.loads(single.stdout)
        expected_exit = max(expected_exit, single.returncode)
        assert d["status"] == "ok" and d["exit_code"] == single.returncode, d["model"]
        assert d["worst_rank_param_bytes"] == report["worst_rank_param_bytes"]
        assert d["replicated_bytes"] == report["replicated_bytes"]
        assert d["total_param_bytes"] == report["total_param_bytes"]
        assert [d["errors"], d["warnings"], d["notes"]] == [report["summary"][k] for k in ("errors", "warnings",
                                                                                            "notes")]
        assert d["findings"] == report["findings"]
        if d["model"] == fixture(LLAMA):
            assert (d["worst_rank_param_bytes"], d["replicated_bytes"]) == llama_by_hand(d["tp_size"])
    # Qwen3-VL-30B-A3B has 4 KV heads: tp 8 splits them (TPA102, an error), so some line fails -> exit 1.
    assert expected_exit == 1
    assert proc.returncode == expected_exit, proc.stderr
    assert "2 with lines that could not run" not in proc.stdout and "1 with lines that could not run" in proc.stdout
    assert f"`{MISSING}` | 4 | 1 | 2 |" in proc.stdout


def test_llama_by_hand_sanity():
    # The hand computation itself: norms are the only weights every rank keeps whole (65 RMSNorm vectors of 4096).
    worst, replicated = llama_by_hand(8)
    assert replicated == (32 * 2 + 1) * 4096 * 2
    assert worst == (16_060_522_496 - replicated) // 8 + replicated


# ----------------------------------------------------------------------------------------------------------------------
# Cache and resume
# ----------------------------------------------------------------------------------------------------------------------
def test_second_run_is_served_from_the_cache(tmp_path, audits, monkeypatch):
    import tpaudit
    import tpaudit.run.batch as core

    models = [fixture(LLAMA), MISSING]
    cache = tmp_path / "cache"
    first = list(tpaudit.batch(models, tp_sizes=[4, 8], cache=cache))
    assert sorted(audits) == sorted((fixture(LLAMA), tp, 1) for tp in (4, 8))
    assert len(list(cache.glob("*/*.json"))) == 2            # the missing model is retried, never cached

    audits.clear()
    second = list(tpaudit.batch(models, tp_sizes=[4, 8], cache=cache))
    assert audits == []                                       # nothing computed
    assert {r.id: r.worst_rank_param_bytes for r in second} == {r.id: r.worst_rank_param_bytes for r in first}
    assert {r.id: r.findings for r in second} == {r.id: r.findings for r in first}
    llama = [r for r in second if r.model == fixture(LLAMA)]
    assert all(r.cached for r in llama) and not any(r.cached for r in second if r.model == MISSING)
    assert {r.tp_size: r.worst_rank_param_bytes for r in llama} == {tp: llama_by_hand(tp)[0] for tp in (4, 8)}

    # What determines a line is in its key: another plan, dtype or transformers version computes again.
    audits.clear()
    plan = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"}
    list(tpaudit.batch([fixture(LLAMA)], tp_sizes=[4], cache=cache, plan=plan))
    list(tpaudit.batch([fixture(LLAMA)], tp_sizes=[4], cache=cache, dtype="float16"))
    real = core.installed_versions
    monkeypatch.setattr(core.task, "installed_versions", lambda: {**real(), "transformers": "5.23.99"})
    list(tpaudit.batch([fixture(LLAMA)], tp_sizes=[4], cache=cache))
    assert audits == [(fixture(LLAMA), 4, 1)] * 3
    audits.clear()
    list(tpaudit.batch([fixture(LLAMA)], tp_sizes=[4], cache=cache, refresh=True))
    assert len(audits) == 1


def test_interrupted_run_resumes_where_it_stopped(tmp_path, audits):
    models = [fixture(QWEN3_VL), fixture(LLAMA)]
    listing = write_list(tmp_path / "list.txt", *models)
    out = tmp_path / "out.jsonl"
    # Qwen3-VL-30B-A3B has 4 KV heads (text_config.num_key_value_heads): tp 8 splits them (TPA102) -> exit 1.
    assert run_main("batch", str(listing), "--tp", "4,8", "-o", str(out), "--no-cache").returncode == 1
    full = out.read_text().splitlines()
    assert len(full) == 4 and len(audits) == 4

    # Interrupted after two lines, the third cut short mid-write.
    out.write_text("\n".join(full[:2]) + "\n" + full[2][:40])
    audits.clear()
    resumed = run_main("batch", str(listing), "--tp", "4,8", "-o", str(out), "--no-cache", "--resume")
    assert resumed.returncode == 1, resumed.stderr
    assert sorted(audits) == [(fixture(LLAMA), 4, 1), (fixture(LLAMA), 8, 1)]
    again = [json.loads(line) for line in out.read_text().splitlines()]
    before = [json.loads(line) for line in full]
    assert [(d["model"], d["tp_size"]) for d in again] == [(d["model"], d["tp_size"]) for d in before]
    for a, b in zip(again, before):
        assert {k: v for k, v in a.items() if k not in ("seconds", "cached")} == \
            {k: v for k, v in b.items() if k not in ("seconds", "cached")}
    assert [d["cached"] for d in again] == [True, True, False, False]

    # Lines of a run with other inputs (here another dtype) are not reused.
    audits.clear()
    run_main("batch", str(listing), "--tp", "4,8", "-o", str(out), "--no-cache", "--resume", "--dtype", "float16")
    assert len(audits) == 4


def test_internal_error_in_one_model_never_stops_the_batch(tmp_path, monkeypatch):
    import tpaudit
    import tpaudit.run.pipeline

    def broken(self, sizes, **kwargs):
        raise RuntimeError("simulated bug\nsecond line")

    monkeypatch.setattr(tpaudit.run.pipeline.Audit, "report", broken)
    lines = list(tpaudit.batch([fixture(LLAMA), MISSING], tp_sizes=[4], cache=tmp_path / "cache"))
    by_model = {r.model: r for r in lines}
    bug = by_model[fixture(LLAMA)]
    assert (bug.status, bug.exit_code, bug.key) == ("error", 4, None)
    assert bug.reason.startswith("internal error: RuntimeError: simulated bug.") and "\n" not in bug.reason
    assert by_model[MISSING].exit_code == 2
    assert not list((tmp_path / "cache").glob("*/*.json"))   # a bug's line is not cached


# ----------------------------------------------------------------------------------------------------------------------
# Exit codes and --compare
# ----------------------------------------------------------------------------------------------------------------------
def line(model: str, tp: int, *, worst: int | None = 100, errors: tuple[str, ...] = (), reason: str | None = None):
    findings = [{"code": c.split(":")[0], "kind": "k", "severity": "error", "target": c.split(":", 1)[1],
                 "message": "m"} for c in errors]
    return {"schema": "tpaudit/batch/v1", "model": model, "tp_size": tp, "ep_size": 1,
            "status": "error" if reason else "ok", "exit_code": 2 if reason else (1 if errors else 0),
            "worst_rank_param_bytes": None if reason else worst,
            "total_param_bytes": None if reason else max(1000, worst or 0),  # a rank holds no more than the model
            "replicated_bytes": None if reason else 10, "errors": len(errors), "warnings": 0, "notes": 0,
            "findings": findings, "seconds": 0.1, "reason": reason}


def write_jsonl(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


def test_compare_new_and_fixed_errors(tmp_path):
    from tpaudit.run.batch import compare, read_results

    old = write_jsonl(tmp_path / "old.jsonl",
                      line("a/x", 4, errors=("TPA001:model.layers.*.mlp.down_proj.weight",)),
                      line("a/y", 4, worst=500),
                      line("a/z", 4, reason="a/z does not exist"),
                      line("a/gone", 4))
    new = write_jsonl(tmp_path / "new.jsonl",
                      line("a/x", 4, worst=90),
                      line("a/y", 4, worst=600, errors=("TPA102:text_config.num_key_value_heads",)),
                      line("a/z", 4, reason="a/z: endpoint timed out"),
                      line("a/new", 8, errors=("TPA003:model",)))
    c = compare(read_results(old), read_results(new), previous="old.jsonl")
    assert [(ch.model, ch.what) for ch in c.new_errors] == [("a/y", "TPA102:text_config.num_key_value_heads"),
                                                             ("a/new", "TPA003:model")]
    assert [(ch.model, ch.what) for ch in c.fixed_errors] == [("a/x", "TPA001:model.layers.*.mlp.down_proj.weight")]
    assert [(ch.model, ch.old_bytes, ch.new_bytes) for ch in c.worse] == [("a/y", 500, 600)]
    assert [(ch.model, ch.old_bytes, ch.new_bytes) for ch in c.better] == [("a/x", 100, 90)]
    assert (c.added, c.removed) == (1, 1)                      # a/z stays unreadable: neither new nor fixed


def test_compare_through_the_cli_gates_on_new_errors_only(tmp_path, cache_env):
    llama, qwen = fixture(LLAMA), fixture(QWEN3_VL)
    by_hand, _ = llama_by_hand(8)
    old = write_jsonl(tmp_path / "old.jsonl",
                      line(llama, 8, worst=by_hand + 4096, errors=("TPA001:model.layers.*.mlp.down_proj.weight",)),
                      line(qwen, 8, worst=1))
    listing = write_list(tmp_path / "list.txt", llama, qwen, MISSING)
    report = tmp_path / "summary.html"
    proc = run_main("batch", str(listing), "--tp", "8", "-o", str(tmp_path / "new.jsonl"), "--compare", str(old),
                    "--format", "html", "--report", str(report))
    # Qwen3-VL-30B-A3B has 4 KV heads (text_config.num_key_value_heads): tp 8 is a new TPA102 error -> exit 1.
    assert proc.returncode == 1, proc.stderr
    page = report.read_text()
    assert "TPA102:text_config.num_key_value_heads" in page
    assert "TPA001:model.layers.*.mlp.down_proj.weight" in page     # fixed
    parser = HTMLParser()
    parser.feed(page)
    rows = re.findall(r"<tr class=\"(\w+)\"><td>([^<]+)</td>", page)
    assert rows == [("ok", llama), ("findings", qwen), ("error", MISSING)]

    # Without the regression: the same run compared with itself has no new error, so it passes even though
    # Qwen3-VL at tp 8 still has its error finding; without --compare that finding fails the batch.
    same = run_main("batch", str(listing), "--tp", "8", "-o", str(tmp_path / "again.jsonl"), "--compare",
                    str(tmp_path / "new.jsonl"), "--format", "markdown")
    assert same.returncode == 0, same.stderr
    assert "0 new errors, 0 fixed" in same.stdout
    assert run_main("batch", str(listing), "--tp", "8", "-o", str(tmp_path / "3.jsonl")).returncode == 1


def test_unreadable_models_fail_only_with_strict(tmp_path, cache_env):
    listing = write_list(tmp_path / "list.txt", fixture(LLAMA), MISSING)
    out = tmp_path / "out.jsonl"
    proc = run_main("batch", str(listing), "--tp", "4", "-o", str(out))
    assert proc.returncode == 0, proc.stderr                  # Llama at tp 4 is clean; MISSING is an error line
    assert [d["status"] for d in read_lines(out)] == ["ok", "error"]
    assert "1 with lines that could not run" in proc.stdout
    strict = run_main("batch", str(listing), "--tp", "4", "-o", str(out), "--strict")
    assert strict.returncode == 1


@pytest.mark.parametrize("args, message", [
    (["no-such-list.txt", "--tp", "4"], "cannot read model list no-such-list.txt"),
    (["LIST", "--tp", "0"], "--tp 0 must list positive integers"),
    (["LIST", "--tp", "8", "--ep", "4"], "--tp 8 --ep 4"),
    (["LIST", "--tp", "4", "--resume", "--refresh"], "Pass only one"),
    (["LIST", "--tp", "4", "--compare", "no-such-old.jsonl"], "cannot read --compare file no-such-old.jsonl"),
    (["LIST", "--tp", "4", "--ray-address", "auto"], "--ray-address needs --executor ray"),
])
def test_bad_usage_is_exit_2_before_any_work(tmp_path, args, message, audits):
    listing = write_list(tmp_path / "list.txt", fixture(LLAMA))
    out = tmp_path / "out.jsonl"
    args = [str(listing) if a == "LIST" else a for a in args]
    proc = run_main("batch", *args, "-o", str(out))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr and proc.stderr.count("\n") == 1
    assert audits == [] and not out.exists()


def test_ray_missing_is_exit_2_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)             # `import ray` fails as when it is not installed
    listing = write_list(tmp_path / "list.txt", fixture(LLAMA))
    proc = run_main("batch", str(listing), "--tp", "4", "-o", str(tmp_path / "out.jsonl"), "--executor", "ray")
    assert proc.returncode == 2
    assert 'pip install "tpaudit[ray]"' in proc.stderr


# ----------------------------------------------------------------------------------------------------------------------
# Ray and the Hub
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ray_executor_gives_the_same_lines(tmp_path):
    import tpaudit

    models = [fixture(LLAMA), MISSING]
    out = tmp_path / "ray.jsonl"
    proc = run_cli("batch", str(write_list(tmp_path / "list.txt", *models)), "--tp", "4,8", "--executor", "ray",
                   "--jobs", "2", "--no-cache", "--strict", "-o", str(out), env={"RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode == 1, proc.stderr                 # --strict: a model that could not be read fails
    local = {r.id: r for r in tpaudit.batch(models, tp_sizes=[4, 8], cache=False)}
    ray_lines = read_lines(out)
    assert [(d["model"], d["tp_size"]) for d in ray_lines] == [(m, tp) for m in models for tp in (4, 8)]
    for d in ray_lines:
        mine = local[(d["model"], d["tp_size"], d["ep_size"])].to_json()
        assert {k: v for k, v in d.items() if k != "seconds"} == {k: v for k, v in mine.items() if k != "seconds"}
    assert {d["worst_rank_param_bytes"] for d in ray_lines if d["model"] == fixture(LLAMA)} == \
        {llama_by_hand(4)[0], llama_by_hand(8)[0]}


def test_a_ray_cluster_that_cannot_be_reached_is_exit_2_and_leaves_out_as_it_was(tmp_path):
    """`--ray-address` names a cluster this process cannot reach (here a `ray://` address, whose client the plain
    `ray` package lacks: Ray raises ValueError at once). That is bad input, exit 2 with one `error:` line and a hint,
    not "a tpaudit bug" (exit 4), and OUT from an earlier run is not truncated to nothing."""
    pytest.importorskip("ray")
    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n")
    proc = run_main("batch", str(write_list(tmp_path / "list.txt", fixture(LLAMA))), "--tp", "4", "-o", str(out),
                    "--executor", "ray", "--ray-address", "ray://127.0.0.1:1")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: cannot reach the Ray cluster at --ray-address 'ray://127.0.0.1:1'")
    assert "internal error" not in proc.stderr and lines[1].startswith("hint: ")
    assert out.read_text() == "earlier\n"


@pytest.mark.slow
def test_hub_models_with_a_revision(tmp_path):
    from hubserver import FakeHub
    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint

    directory = tmp_path / "llama"
    write_sparse_checkpoint(open_source(str(FIXTURES / f"{LLAMA}.snapshot.json.gz")), directory)
    with FakeHub() as hub:
        commit = hub.add("meta-llama/Llama-3.1-8B-Instruct", directory, branches=("main", "v1"))
        listing = write_list(tmp_path / "list.txt", "meta-llama/Llama-3.1-8B-Instruct@v1",
                             "meta-llama/Llama-3.1-8B-Instruct@no-such-branch", "meta-llama/Llama-3.1-8B-Instruct")
        out = tmp_path / "out.jsonl"
        proc = run_cli("batch", str(listing), "--tp", "8", "-o", str(out),
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "",
                            "TPAUDIT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    lines = read_lines(out)
    assert [d["model"] for d in lines] == ["meta-llama/Llama-3.1-8B-Instruct@v1",
                                            "meta-llama/Llama-3.1-8B-Instruct@no-such-branch",
                                            "meta-llama/Llama-3.1-8B-Instruct"]
    ok, missing, default = lines
    assert ok["status"] == "ok" and ok["commit"] == commit and ok["worst_rank_param_bytes"] == llama_by_hand(8)[0]
    assert missing["status"] == "error" and missing["exit_code"] == 2 and "no-such-branch" in missing["reason"]
    # The same files at another revision: the same hash, so the default branch's line comes from the cache.
    assert default["cached"] and default["worst_rank_param_bytes"] == ok["worst_rank_param_bytes"]


def test_a_batch_served_from_the_cache_imports_neither_torch_nor_transformers(tmp_path):
    import subprocess

    import tpaudit

    cache = tmp_path / "cache"
    first = list(tpaudit.batch([fixture(LLAMA)], tp_sizes=[2, 4], cache=cache))
    assert [r.cached for r in first] == [False, False]
    code = ("import sys, tpaudit\n"
            f"lines = list(tpaudit.batch([{fixture(LLAMA)!r}], tp_sizes=[2, 4], cache={str(cache)!r}))\n"
            "print([l.cached for l in lines], [l.worst_rank_param_bytes for l in lines],"
            " sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[True, True] {[llama_by_hand(2)[0], llama_by_hand(4)[0]]} []", out.stdout


@pytest.mark.slow
def test_an_unguarded_script_with_jobs_2_gets_lines_that_say_so(tmp_path):
    """Python's spawn start method re-runs an unguarded calling script in each worker; the worker refuses to start a
    batch while it is starting, and the parent's lines name the `__main__` guard instead of blaming tpaudit."""
    import subprocess

    script = tmp_path / "unguarded.py"
    script.write_text("import json, tpaudit\n"
                      f"lines = list(tpaudit.batch([{fixture(LLAMA)!r}, {fixture(QWEN3_VL)!r}], tp_sizes=[4], "
                      "jobs=2, cache=False))\n"
                      "print('LINES', json.dumps([[l.status, l.exit_code, l.reason] for l in lines]))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=str(tmp_path),
                         timeout=300)
    lines = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("LINES "))[6:])
    assert len(lines) == 2
    for status, code, reason in lines:
        assert (status, code) == ("error", 2), reason
        assert 'if __name__ == "__main__":' in reason and "tpaudit bug" not in reason
