"""The key the caches' entries are sealed with (`tpaudit.sources.cache_key`): kept outside every cache folder, created on
first use readable by its owner only, created once even by processes racing for it, refused when others can read or
write it, and taken from `TPAUDIT_CACHE_KEY` when a CI shares one cache on purpose."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    from tpaudit.sources import cache_key as _cache_auth

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("TPAUDIT_CACHE_KEY", raising=False)
    monkeypatch.setattr(_cache_auth, "_memo", {})
    return tmp_path / "config"


def test_the_key_is_created_on_first_use_for_its_owner_only(config_home):
    from tpaudit.sources.cache_key import cache_key, key_path

    assert key_path() == config_home / "tpaudit" / "cache-key"
    key, problem = cache_key()
    assert problem is None and len(key) == 64 and bytes.fromhex(key.decode())   # 32 random bytes, in hex
    st = os.stat(key_path())
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(key_path().parent).st_mode) == 0o700
    assert [p.name for p in key_path().parent.iterdir()] == ["cache-key"]      # no temporary file left


def test_the_default_place_is_under_home(monkeypatch, tmp_path):
    from tpaudit.sources.cache_key import key_path

    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert key_path() == tmp_path / ".config" / "tpaudit" / "cache-key"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")      # the XDG spec: a relative path is ignored
    assert key_path() == tmp_path / ".config" / "tpaudit" / "cache-key"


def test_processes_racing_to_create_the_key_all_use_one(config_home):
    """Eight processes start at once with no key file: exactly one key results, and every one of them uses it."""
    code = ("import sys; from tpaudit.sources.cache_key import cache_key; k, p = cache_key(); "
            "sys.stdout.write(k.decode() if k else 'NONE ' + p)")
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(8)]
    keys = {p.communicate(timeout=120)[0] for p in procs}
    assert len(keys) == 1 and not next(iter(keys)).startswith("NONE"), keys
    assert (config_home / "tpaudit" / "cache-key").read_text().strip() == keys.pop()


@pytest.mark.parametrize("mode", [0o644, 0o620, 0o604])
def test_a_key_others_can_read_or_write_is_not_used(config_home, mode):
    from tpaudit.sources.cache_key import cache_key, key_path

    key_path().parent.mkdir(parents=True)
    key_path().write_text("a" * 64)
    os.chmod(key_path(), mode)
    key, problem = cache_key()
    assert key is None and str(key_path()) in problem and f"{mode:04o}" in problem and "chmod 600" in problem


def test_a_fifo_as_the_key_is_refused_without_blocking(config_home):
    """The thread only guards the test run against a hang."""
    from tpaudit.sources.cache_key import cache_key, key_path

    key_path().parent.mkdir(parents=True)
    os.mkfifo(key_path(), 0o600)
    answer = []
    reader = threading.Thread(target=lambda: answer.append(cache_key()), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert answer, "cache_key blocked on the FIFO"
    key, problem = answer[0]
    assert key is None and "not a regular file" in problem


def test_the_environment_key_wins_and_must_be_long(config_home, monkeypatch):
    from tpaudit.sources.cache_key import MIN_KEY_CHARS, cache_key, key_path

    monkeypatch.setenv("TPAUDIT_CACHE_KEY", "s" * MIN_KEY_CHARS)
    assert cache_key() == (b"s" * MIN_KEY_CHARS, None)
    assert not key_path().exists()                           # nothing written to the config folder
    monkeypatch.setenv("TPAUDIT_CACHE_KEY", "short")
    key, problem = cache_key()
    assert key is None and "TPAUDIT_CACHE_KEY" in problem and str(MIN_KEY_CHARS) in problem


def test_a_cache_without_a_usable_key_is_not_used(config_home, monkeypatch, tmp_path):
    """Neither cache reads or writes anything without a key, and says why."""
    from tpaudit.evidence.cache import open_cache
    from tpaudit.run.batch.cache import open_result_cache

    monkeypatch.setenv("TPAUDIT_CACHE_KEY", "short")
    monkeypatch.setenv("TPAUDIT_PARITY_CACHE", str(tmp_path / "parity"))
    cache, problem = open_cache()
    assert cache is None and problem.startswith("the cache is not used: TPAUDIT_CACHE_KEY")
    cache, problem = open_result_cache(str(tmp_path / "batch"))
    assert cache is None and problem.startswith("the cache is not used: TPAUDIT_CACHE_KEY")


def test_one_cache_entry_is_never_valid_in_the_other():
    from tpaudit.sources.cache_key import authentic, seal

    body = {"schema": "s", "key": "k"}
    assert authentic(b"k" * 32, "parity", {**body, "mac": seal(b"k" * 32, "parity", body)})
    assert not authentic(b"k" * 32, "batch", {**body, "mac": seal(b"k" * 32, "parity", body)})
    assert not authentic(b"j" * 32, "parity", {**body, "mac": seal(b"k" * 32, "parity", body)})
