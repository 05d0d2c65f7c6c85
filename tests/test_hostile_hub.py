"""An endpoint written by someone else: one that answers tpaudit's first request and then stalls, one that trickles a
byte at a time, one that streams an endless body where tpaudit reads the safetensors metadata or a shard's header.
Each `check` ends with one error line (exit 2) within the deadline (`TPAUDIT_HUB_TIMEOUT`, set to 2 s here) and
with little memory, measured in the child itself."""

from __future__ import annotations

import time

import pytest

from conftest import CASES, assert_one_error_line, run_bounded
from hubserver import FakeHub

GRANITE_CONFIG = (CASES / "09-granite-tp5-indivisible-dims" / "config.json").read_text()
DEADLINE = 2
CHILD_SECONDS = 30      # the child's whole life: interpreter, imports (a few s on a busy machine), the deadline
CAP = 1 << 30           # the Hub source is read before torch is imported: 1 GiB of address space is plenty
PEAK = 400 * 2**20
CAP_DEADLINE = 20       # the cap tests: room for a loaded machine, under the child's own limit


def _is_probe(path: str) -> bool:
    return path in ("", "/")  # tpaudit's reachability probe asks the endpoint's root once


def stall(handler, head, path) -> bool:
    if _is_probe(path):
        return False
    time.sleep(60)
    return True


def trickle(handler, head, path) -> bool:
    """Headers at once, then one byte of body every half second: no single read ever times out."""
    if _is_probe(path):
        return False
    handler.send_response(200)
    handler.send_header("Content-Length", str(10**6))
    handler.send_header("X-Repo-Commit", "a" * 40)
    handler.send_header("ETag", '"x"')
    handler.end_headers()
    if head:
        return True
    try:
        for _ in range(120):
            handler.wfile.write(b"{")
            handler.wfile.flush()
            time.sleep(0.5)
    except OSError:
        pass
    return True


def endless(suffix: str, status: int):
    """An answer to GET `...suffix` that never ends: 1 MiB chunks until the client goes away."""
    def intercept(handler, head, path) -> bool:
        if head or not path.endswith(suffix):
            return False
        handler.send_response(status)
        handler.send_header("Connection", "close")
        if status == 206:
            handler.send_header("Content-Range", f"bytes 0-100000/{3 * 2**30}")
        handler.end_headers()
        chunk = b"[" * (1 << 20)
        try:
            for _ in range(4096):  # 4 GiB at most
                handler.wfile.write(chunk)
        except OSError:
            pass
        handler.close_connection = True
        return True
    return intercept


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    (d / "config.json").write_text(GRANITE_CONFIG)
    return d


def check(hub, tmp_path, deadline: float = DEADLINE):
    """The cap tests give the deadline room (a loaded machine streams 64 MiB over loopback slowly): what they show is
    that the body is cut at the cap, not by the clock (the message says which; a child still running after
    `CHILD_SECONDS` fails the test as a hang)."""
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "",
           "TPAUDIT_HUB_TIMEOUT": str(deadline)}
    return run_bounded("check", "acme/model", "--tp", "2", seconds=CHILD_SECONDS, memory=CAP, env=env)


def assert_one_error(proc, *needles):
    assert_one_error_line(proc, *needles, peak=PEAK)


@pytest.mark.parametrize("behaviour", [stall, trickle], ids=["stalls", "trickles"])
def test_an_endpoint_that_answers_the_probe_then_stalls_or_trickles(model_dir, tmp_path, behaviour):
    with FakeHub(intercept=behaviour) as hub:
        hub.add("acme/model", model_dir)
        proc = check(hub, tmp_path)
    assert_one_error(proc, "acme/model", f"within {DEADLINE} s", "TPAUDIT_HUB_TIMEOUT")


def test_an_endless_safetensors_metadata_answer_is_cut_at_the_cap(model_dir, tmp_path):
    (model_dir / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    with FakeHub(offer_sharded_metadata=True, intercept=endless("safetensors-metadata/model.safetensors.index.json",
                                                                200)) as hub:
        hub.add("acme/model", model_dir)
        proc = check(hub, tmp_path, deadline=CAP_DEADLINE)
    assert_one_error(proc, "acme/model", "answered more than 64 MiB for the safetensors metadata")


def test_an_endless_ranged_read_stops_at_the_bytes_asked_for(model_dir, tmp_path):
    """The shard's answer claims to be 3 GiB and never ends: tpaudit reads the 100 kB it asked for, finds no valid
    header there (`[[[[` as the length) and stops."""
    (model_dir / "model.safetensors").write_bytes(b"\0" * 16)
    with FakeHub(intercept=endless("model.safetensors", 206)) as hub:
        hub.add("acme/model", model_dir)
        proc = check(hub, tmp_path, deadline=CAP_DEADLINE)
    assert_one_error(proc, "acme/model", "model.safetensors")
    sent = [r for r in hub.requests if r.file == "model.safetensors" and r.method == "GET"]
    assert not sent  # the intercepted answer is not logged: nothing else was served


def test_a_config_json_larger_than_the_cap_is_refused_before_its_download(model_dir, tmp_path):
    """The endpoint says config.json is 17 MiB (HEAD), over the 16 MiB a config may be: the check stops with one error
    line naming the file and both sizes, having downloaded none of it (no GET of config.json reaches the server)."""
    (model_dir / "config.json").write_bytes(b" " * (17 * 2**20))
    with FakeHub() as hub:
        hub.add("acme/model", model_dir)
        proc = check(hub, tmp_path, deadline=CAP_DEADLINE)
        gets = [r for r in hub.requests if r.file == "config.json" and r.method == "GET"]
    assert_one_error(proc, "config.json", f"{17 * 2**20:,} B", f"{16 * 2**20:,} B")
    assert gets == []


def hang_up(handler, head, path) -> bool:
    """Reads the request, then closes the connection without a byte of answer."""
    if _is_probe(path):
        return False
    handler.close_connection = True
    return True


def test_an_endpoint_that_closes_without_answering(model_dir, tmp_path):
    """A server that hangs up on every request after the probe: an input error naming the endpoint and what it did
    (exit 2), not an internal error (exit 4). The deadline leaves room for a loaded machine: what is shown is the
    reason, not the clock."""
    with FakeHub(intercept=hang_up) as hub:
        hub.add("acme/model", model_dir)
        proc = check(hub, tmp_path, deadline=CAP_DEADLINE)
        url = hub.url
    assert_one_error(proc, "acme/model", url, "closed the connection without answering")


def test_a_batch_stops_asking_an_endpoint_that_missed_its_deadline(tmp_path):
    """Three models on an endpoint that answers the probe and then stalls: the first model waits out the deadline;
    the next two are not requested at all, and their lines say which earlier model the endpoint failed. The server's
    own log of requests is the witness (none names the later models)."""
    import json

    from conftest import run_env

    asked: list[str] = []

    def stall_and_log(handler, head, path) -> bool:
        if _is_probe(path):
            return False
        asked.append(path)
        time.sleep(30)
        return True

    model = tmp_path / "repo"
    model.mkdir()
    (model / "config.json").write_text(GRANITE_CONFIG)
    listing = tmp_path / "list.txt"
    listing.write_text("acme/first\nacme/second\nacme/third\n")
    out = tmp_path / "out.jsonl"
    with FakeHub(intercept=stall_and_log) as hub:
        for name in ("first", "second", "third"):
            hub.add(f"acme/{name}", model)
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "",
               "TPAUDIT_HUB_TIMEOUT": str(DEADLINE), "TPAUDIT_CACHE": str(tmp_path / "cache")}
        proc = run_env("batch", str(listing), "--tp", "2", "-o", str(out), "--jobs", "1", env=env)
    lines = {d["model"]: d for d in map(json.loads, out.read_text().splitlines())}
    assert proc.returncode == 0, proc.stderr                     # error lines fail a batch only with --strict
    assert all(d["status"] == "error" and d["exit_code"] == 2 for d in lines.values())
    assert f"within {DEADLINE} s" in lines["acme/first"]["reason"]
    for name in ("second", "third"):
        reason = lines[f"acme/{name}"]["reason"]
        assert f"not asked again: it did not finish answering within {DEADLINE} s (TPAUDIT_HUB_TIMEOUT) for acme/first " \
            "earlier in this batch" in reason, reason
    assert asked and not any("/acme/second/" in p or "/acme/third/" in p for p in asked), asked
