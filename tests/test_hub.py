"""The Hub source against a loopback server that answers like the Hub's file endpoints (no internet here).

The server holds Qwen3-VL-30B-A3B-Instruct as 13 sparse shards with the real headers (62 GB apparent, a few hundred
kB on disk). tpaudit must read only headers, give the local directory's numbers, cache them, work offline after one
online run, and turn 401/404 into exit 2 with advice, never printing a token.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from unittest import mock

import pytest

from conftest import FIXTURES, run_cli, run_env
from hubserver import FakeHub
from releases import EXPERTS_IN_TP_PLANS, QWEN_VL_TP4

REPO = "Qwen/Qwen3-VL-30B-A3B-Instruct"
TOKEN = "hf_tpauditTestSecret0123456789"
# `check` of this model at tp 4 exits 1 wherever it is read from: transformers 5.23/5.24 cannot TP-load its stored
# experts ([E, hidden, 2 x intermediate] is sliced on its axis 1 before the loader's Transpose: TPA304, decided in
# tests/test_check_real_models.py), and 5.25 holds them whole on every rank (TPA001), so "the run worked" is exit 1
# with the same report as the local directory's.
QWEN_TP4_EXIT = 1


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from tpaudit.sources import open_source
    from tpaudit.sources.sparse import write_sparse_checkpoint

    directory = tmp_path_factory.mktemp("qwen")
    shards = write_sparse_checkpoint(open_source(str(FIXTURES / "qwen3-vl-30b-a3b-instruct.snapshot.json.gz")),
                                     directory)
    assert len(shards) == 13
    return directory


@pytest.fixture(scope="module")
def hub(qwen_dir):
    with FakeHub() as server:
        server.add(REPO, qwen_dir)
        server.add("acme/gated-model", qwen_dir, token=TOKEN)
        bin_only = qwen_dir.parent / "bin-only"
        bin_only.mkdir()
        (bin_only / "config.json").write_text((qwen_dir / "config.json").read_text())
        (bin_only / "pytorch_model.bin").write_bytes(b"\0" * 16)
        server.add("acme/bin-only", bin_only)
        broken = qwen_dir.parent / "broken-header"
        broken.mkdir()
        (broken / "config.json").write_text((qwen_dir / "config.json").read_text())
        (broken / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")  # declares an absurd header length
        server.add("acme/broken-header", broken)
        yield server


def env_for(hub, home: Path, **extra) -> dict:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_TOKEN": "", **extra}


def repo_requests(hub):
    return [r for r in hub.requests if r.repo]


def test_hub_equals_local_and_reads_only_headers(hub, qwen_dir, tmp_path):
    hub.clear()
    proc = run_env("check", REPO, "--tp", "4", "--format", "json", env=env_for(hub, tmp_path / "hf"))
    assert proc.returncode == QWEN_TP4_EXIT, proc.stderr
    remote = json.loads(proc.stdout)
    local = json.loads(run_env("check", str(qwen_dir), "--tp", "4", "--format", "json").stdout)
    for key in ("ranks", "total_param_bytes", "replicated", "unused_rules", "findings", "params", "kv_cache"):
        assert remote[key] == local[key], key
    assert remote["model"]["repo_id"] == REPO and remote["model"]["commit"] == hub.repos[REPO].commit
    checkpoint = sum(os.path.getsize(p) for p in qwen_dir.glob("*.safetensors"))
    assert checkpoint > 62e9
    shard_reads = [r for r in repo_requests(hub) if r.file.endswith(".safetensors") and r.method == "GET"]
    assert len(shard_reads) == 13 and all(r.range for r in shard_reads)     # Range reads only
    assert hub.bytes_sent() < 1e-4 * checkpoint
    assert proc.stderr == ""  # no progress bar with --format json / when stdout is not a terminal


def test_single_request_variant_when_the_server_offers_it(qwen_dir, tmp_path):
    with FakeHub(offer_sharded_metadata=True) as server:
        server.add(REPO, qwen_dir)
        proc = run_env("check", REPO, "--tp", "4", "--format", "json", env=env_for(server, tmp_path))
        assert proc.returncode == QWEN_TP4_EXIT, proc.stderr
        assert json.loads(proc.stdout)["worst_rank_param_bytes"] == QWEN_VL_TP4
        assert [r.file for r in repo_requests(server) if r.file == "safetensors-metadata"] == ["safetensors-metadata"]
        assert not [r for r in repo_requests(server) if r.file.endswith(".safetensors")]


def test_second_run_and_offline_run_use_the_cache(hub, tmp_path):
    env = env_for(hub, tmp_path / "hf")
    assert run_env("check", REPO, "--tp", "4", "--format", "json", env=env).returncode == QWEN_TP4_EXIT
    hub.clear()
    second = run_env("check", REPO, "--tp", "4", "--format", "json", env=env)
    assert second.returncode == QWEN_TP4_EXIT
    assert not [r for r in repo_requests(hub) if r.file.endswith(".safetensors")]   # no header read
    hub.clear()
    offline = run_env("check", REPO, "--tp", "4", "--format", "json", env={**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == QWEN_TP4_EXIT, offline.stderr
    assert repo_requests(hub) == []
    assert json.loads(offline.stdout)["worst_rank_param_bytes"] == QWEN_VL_TP4


@contextlib.contextmanager
def _sleeps():
    """The seconds every `time.sleep` call in this process asks for while the block runs (they still sleep): how long
    a retry loop backs off, counted rather than timed."""
    real = time.sleep
    asked: list[float] = []

    def recording(seconds):
        asked.append(seconds)
        real(seconds)

    with mock.patch.object(time, "sleep", recording):
        yield asked


def test_an_endpoint_that_went_down_falls_back_to_the_cache_at_once(qwen_dir, tmp_path):
    """After one online run the endpoint stops answering: the next run refuses no work and waits for no retries
    (huggingface_hub alone would back off ~25 s between retries: what it asks `time.sleep` for is counted, not the
    clock); it reads config and headers from the caches and says so."""
    with FakeHub() as server:
        server.add(REPO, qwen_dir)
        env = env_for(server, tmp_path)
        assert run_env("check", REPO, "--tp", "4", "--format", "json", env=env).returncode == QWEN_TP4_EXIT
    with _sleeps() as slept:
        proc = run_env("check", REPO, "--tp", "4", "--format", "json", env=env)  # the same endpoint, now closed
    assert proc.returncode == QWEN_TP4_EXIT, proc.stderr
    assert sum(slept) < 1, slept
    out = json.loads(proc.stdout)
    assert out["worst_rank_param_bytes"] == QWEN_VL_TP4
    assert any("refused the connection" in n for n in out["notes"])
    other = run_env("check", "acme/never-seen", "--tp", "4", env=env)
    assert other.returncode == 2 and other.stderr.startswith(f"error: cannot reach {server.url}")


def test_an_endpoint_that_never_answers_is_one_line_within_its_timeout(tmp_path):
    """A server that accepts connections and never answers: huggingface_hub alone retries for minutes. tpaudit
    waits HF_HUB_ETAG_TIMEOUT seconds once, then says so (exit 2)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])   # kept open, never answered
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with _sleeps() as slept:
            proc = run_env("check", "acme/anything", "--tp", "2",
                           env={"HF_ENDPOINT": url, "HF_HOME": str(tmp_path), "HF_TOKEN": "",
                                "HF_HUB_ETAG_TIMEOUT": "1"})
        asked = len(held)
    finally:
        stop.set()
        for conn in held:
            conn.close()
        listener.close()
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: cannot reach {url}") and "no answer within 1 s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # a question or two, no back-off worth the name (huggingface_hub alone asks again and again and backs off for
    # minutes: 5 retries of up to 8 s each); on a loaded machine one request may be retried once, after 1-2 s
    assert asked <= 2 and sum(slept) < 5, (asked, slept)


def test_an_endpoint_that_answers_404_to_everything_says_it_answered(tmp_path):
    """A proxy or a wrong HF_ENDPOINT that answers 404 to every path: not "cannot reach", and never a message cut
    mid-word."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        proc = run_env("check", "acme/anything", "--tp", "2",
                       env={"HF_ENDPOINT": url, "HF_HOME": str(tmp_path), "HF_TOKEN": ""})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "cannot reach" not in line and "404" in line, line


def test_offline_without_cache_is_exit_2(hub, tmp_path):
    proc = run_env("check", REPO, "--tp", "4", env=env_for(hub, tmp_path / "empty", HF_HUB_OFFLINE="1"))
    assert proc.returncode == 2 and "offline" in proc.stderr and "Traceback" not in proc.stderr


def test_gated_repo_needs_a_token_which_is_never_printed(hub, tmp_path):
    home = tmp_path / "hf"
    denied = run_env("check", "acme/gated-model", "--tp", "4", "--token", "hf_wrongToken999", env=env_for(hub, home))
    assert denied.returncode == 2
    assert "gated" in denied.stderr and "hf auth login" in denied.stderr
    assert "hf_wrongToken999" not in denied.stderr + denied.stdout
    ok = run_env("check", "acme/gated-model", "--tp", "4", "--token", TOKEN, "--format", "json",
                 env=env_for(hub, home))
    assert ok.returncode == QWEN_TP4_EXIT, ok.stderr
    out = tmp_path / "snap.json.gz"
    snap = run_env("snapshot", "acme/gated-model", "--token", TOKEN, "-o", str(out), env=env_for(hub, home))
    assert snap.returncode == 0, snap.stderr
    assert TOKEN not in ok.stdout + ok.stderr + snap.stdout + snap.stderr
    for path in [*home.rglob("*"), out]:
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
            if path.suffix == ".gz":
                import gzip

                assert TOKEN.encode() not in gzip.decompress(path.read_bytes()), path


def test_missing_repo_and_revision_are_exit_2_with_advice(hub, tmp_path):
    proc = run_env("check", "acme/no-such-model", "--tp", "2", env=env_for(hub, tmp_path))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "repo id" in proc.stderr
    proc = run_env("check", REPO, "--tp", "2", "--revision", "v999", env=env_for(hub, tmp_path))
    assert proc.returncode == 2 and "revision 'v999' does not exist" in proc.stderr
    assert all("Traceback" not in p for p in (proc.stderr,))


# a refused connection fails at once (tpaudit probes the endpoint before huggingface_hub retries it for ~25 s)
def test_unreachable_endpoint_names_it(tmp_path):
    proc = run_cli("check", "acme/anything", "--tp", "2",
                   env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "HF_TOKEN": ""})
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr  # huggingface_hub's retry warnings are silenced
    assert lines[0].startswith("error: cannot reach http://127.0.0.1:9") and "HF_ENDPOINT" in lines[0]


def test_bin_only_repo_falls_back_to_config_only(hub, tmp_path):
    proc = run_env("check", "acme/bin-only", "--tp", "4", "--format", "json", env=env_for(hub, tmp_path))
    # no headers, no load stage: clean where the plan splits the experts, TPA001 where 5.25's leaves them whole
    assert proc.returncode == (0 if EXPERTS_IN_TP_PLANS else 1), proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"]["config_only"] is True
    assert any("no model.safetensors" in n for n in out["notes"])
    assert out["worst_rank_param_bytes"] == QWEN_VL_TP4     # meta-model shapes x bf16 give the same bytes


def test_snapshot_records_repo_and_commit(hub, tmp_path):
    out = tmp_path / "qwen.snapshot.json.gz"
    proc = run_env("snapshot", REPO, "-o", str(out), env=env_for(hub, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    from conftest import read_json_any

    doc = read_json_any(out)
    assert doc["source"]["repo_id"] == REPO and doc["source"]["commit"] == hub.repos[REPO].commit
    assert len(doc["tensors"]) == 882 and len(doc["files"]) == 13
    offline = run_env("check", str(out), "--tp", "4", "--format", "json")
    assert json.loads(offline.stdout)["worst_rank_param_bytes"] == QWEN_VL_TP4


def test_malformed_header_is_exit_2(hub, tmp_path):
    proc = run_env("check", "acme/broken-header", "--tp", "2", env=env_for(hub, tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    # names the repo, the file and what is wrong: 8 bytes of 0xff declare a header of 2^64 - 1 bytes
    assert lines[0].startswith("error: acme/broken-header@") and "/model.safetensors:" in lines[0]
    assert f"header declares {2**64 - 1:,} bytes" in lines[0] and "tell its owners" in lines[0]
