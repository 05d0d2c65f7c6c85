"""Hub source: `config.json` and the safetensors headers of a Hub repo, through `huggingface_hub`; never the weights.

1. `hf_hub_download(config.json)`: one HEAD + GET of the resolve endpoint; the client's cache keeps it, and its
   snapshot path names the resolved commit. Every later request is pinned to that commit.
2. Headers: on the default revision, the Hub's single-request safetensors-metadata endpoint (the one
   `HfApi.get_sharded_safetensors_metadata` calls) where the server offers it; otherwise (or when it answers with an
   error) `model.safetensors` or the index at the commit, then HTTP Range reads of each shard's header (the first
   100 kB, a second read only for larger headers), in parallel threads, the requests `HfApi.get_safetensors_metadata`
   makes. A 60 GB checkpoint costs about 1 MB. The bytes come through huggingface_hub's session (its auth headers,
   redirects and error classes), but tpaudit parses and validates them itself (`safetensors_header`): the library's
   dataclasses would multiply each shape before anything checks it (an 85-byte header with `"shape": ["ab",
   3000000000]` builds a 6 GB string).
3. The parsed table is cached as a `tpaudit/snapshot/v1` file keyed by endpoint, repo and commit under
   `$HF_HOME/tpaudit/`, so a second run reads no header and an `HF_HUB_OFFLINE=1` run works after one online run.

`HF_ENDPOINT`, `HF_TOKEN` (or the stored login, or `--token`), `HF_HOME`/`HF_HUB_CACHE` and `HF_HUB_OFFLINE` are
read when the source is opened. A token is passed to the client only; it is never printed or written.

An endpoint is written by someone else too: reading one model has a total deadline (`TPAUDIT_HUB_TIMEOUT`, 120 s by
default; every request and every retry inside it, so an endpoint that answers the first request and then stalls, or
sends a byte every few seconds, ends in one error line), and every answer tpaudit reads itself is read as a stream
with a byte cap (`RESPONSE_MAX_BYTES`; a ranged read stops at the bytes it asked for), so an endless or 3 GiB body
costs at most the cap.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlparse

from ..errors import (CheckpointError, ConfigError, GatedRepoError, HubConnectionError, HubError,
                      RepoNotFoundError, TpauditError)
from ..model import ModelSource
from ..units import shorten

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "ON", "YES", "TRUE"}

DEADLINE_ENV = "TPAUDIT_HUB_TIMEOUT"
DEFAULT_DEADLINE = 120.0
"""Seconds to read one model's config and headers from the Hub, every request and retry included."""
RESPONSE_MAX_BYTES = 64 * 2**20
"""The largest answer tpaudit reads itself: the single-request metadata of every shard (Kimi-K2.5: ~25 MB), an
index (`files.INDEX_MAX_BYTES`), a header (huggingface_hub's cap: 25 MB)."""
_ERROR_BODY_BYTES = 64 * 2**10  # what an error answer may say (huggingface_hub reads its JSON message)


class _Budget:
    """The deadline of one model's reads (monotonic clock)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, base: float) -> float:
        """A per-request timeout that never reaches past the deadline (at least 0.1 s)."""
        return max(0.1, min(float(base), self.left()))

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise _DeadlineExceeded(what)


class _DeadlineExceeded(TimeoutError):
    """The budget ran out while reading `args[0]` (a `TimeoutError`, but not one huggingface_hub retries)."""


class _TooLarge(Exception):
    """An answer longer than the cap: `args` = (what, cap)."""


_missed: dict[str, str] | None = None
"""While a batch runs (`remembering_missed_endpoints`): endpoint -> why it is not asked again (it missed its deadline,
or refused connections, for an earlier model). `None` outside a batch: each `check` asks the endpoint afresh."""


@contextlib.contextmanager
def remembering_missed_endpoints():
    """Within the block (a batch, in this process), an endpoint that misses its deadline or refuses connections for
    one model is not asked again for the next ones: they are read from the local caches as when it refuses
    connections, or fail at once with a line saying which earlier model it failed (instead of each waiting the whole
    `TPAUDIT_HUB_TIMEOUT`). Nested blocks share the outer memory; a batch's worker processes keep theirs for their
    life (`remember_missed_endpoints`)."""
    global _missed
    outer = _missed
    if outer is None:
        _missed = {}
    try:
        yield
    finally:
        if outer is None:
            _missed = None


def remember_missed_endpoints() -> None:
    """From now on in this process, remember missed endpoints (a batch worker process, which only runs a batch)."""
    global _missed
    if _missed is None:
        _missed = {}


def _remember_missed(endpoint: str, why: str) -> None:
    if _missed is not None:
        _missed.setdefault(endpoint, why)


def _deadline() -> float:
    """`TPAUDIT_HUB_TIMEOUT` in seconds (a positive number), else `DEFAULT_DEADLINE`."""
    import math

    raw = os.environ.get(DEADLINE_ENV)
    try:
        value = float(raw) if raw else DEFAULT_DEADLINE
    except ValueError:
        value = DEFAULT_DEADLINE
    return value if math.isfinite(value) and value > 0 else DEFAULT_DEADLINE


def _within(budget: _Budget, fn, what: str):
    """`fn()` in a daemon thread, waited for until the budget runs out: a request that hangs where no timeout
    reaches (huggingface_hub's retries and back-off, a server trickling its headers) cannot hold the caller past the
    deadline. The thread's own reads stop at the deadline too (`_stream`), so it ends soon after.

    Raises:
        Whatever `fn` raised; `_DeadlineExceeded` when the budget ran out first.
    """
    import threading

    outcome: dict = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="tpaudit-hub", daemon=True)
    thread.start()
    while thread.is_alive():
        left = budget.left()
        if left <= 0:
            raise _DeadlineExceeded(what)
        thread.join(min(left, 0.5))
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _stream(session, url: str, headers: dict, budget: _Budget, *, limit: int, what: str, strict: bool,
            timeout: float):
    """GET `url` as a stream and read at most `limit` bytes of its body before the deadline.

    Args:
        strict (`bool`): an answer longer than `limit` is an error (`_TooLarge`: a JSON document cut short is
            useless); otherwise reading stops at `limit` (a ranged read needs no more than it asked for).

    Returns:
        `(response, body)`: the response (status, headers) and the bytes read.

    Raises:
        `_DeadlineExceeded`, `_TooLarge`, huggingface_hub's HTTP errors (`hf_raise_for_status`, on an error body
        read up to 64 KiB).
    """
    from huggingface_hub.utils import hf_raise_for_status

    budget.check(what)
    with session.stream("GET", url, headers=headers, timeout=budget.timeout(timeout)) as r:
        cap = _ERROR_BODY_BYTES if r.status_code >= 400 else limit
        declared = r.headers.get("Content-Length") or ""
        if strict and r.status_code < 400 and declared.isdigit() and int(declared) > limit:
            raise _TooLarge(what, limit)
        chunks, received = [], 0
        for chunk in r.iter_bytes():
            budget.check(what)
            chunks.append(chunk)
            received += len(chunk)
            if received > cap:
                if strict and r.status_code < 400:
                    raise _TooLarge(what, limit)
                break
        body = b"".join(chunks)[:cap]
        if r.status_code >= 400:
            hf_raise_for_status(type(r)(r.status_code, headers=r.headers, content=body, request=r.request))
        return r, body


def _endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _refuses_connections(endpoint: str) -> str | None:
    """One request to `endpoint` before any download: the reason when the connection fails (refused, no such host)
    or nothing answers within `HF_HUB_ETAG_TIMEOUT` s (huggingface_hub's own timeout for metadata requests, 10 by
    default); `None` when anything answers (any HTTP status).

    huggingface_hub retries a failed or silent connection 5 times with back-off (`utils/_http.py` `http_backoff`),
    each try waiting up to its own timeout: an endpoint that refuses connections takes ~25 s to report, one that
    accepts connections and never answers several minutes. tpaudit asks once and then uses the caches.
    """
    import importlib

    from huggingface_hub.utils import get_session

    # the HTTP package huggingface_hub's session comes from (httpx, or httpx2 in huggingface_hub 2.x); a one-off
    # request on a new connection, so a pooled connection to a server that has since gone cannot answer for it
    http = importlib.import_module(type(get_session()).__module__.split(".")[0])
    from huggingface_hub import constants

    try:
        timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or constants.HF_HUB_ETAG_TIMEOUT)
    except ValueError:
        timeout = 10.0
    try:
        http.head(endpoint, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - only a failed or silent connection counts; the rest is huggingface_hub's
        names = {cls.__name__ for cls in type(e).__mro__}
        if "ConnectError" in names:
            return f"ConnectError: {shorten(str(e), 120)}"
        if "TimeoutException" in names or isinstance(e, TimeoutError):
            return f"{type(e).__name__}: no answer within {timeout:g} s"
    return None


def _offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return constants.HF_HUB_OFFLINE or (env or "").upper() in _TRUE


def _hf_home() -> Path:
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HOME") or constants.HF_HOME).expanduser()


def _hub_cache() -> str:
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    return constants.HF_HUB_CACHE


def header_cache_path(endpoint: str, repo_id: str, commit: str) -> Path:
    """Where the parsed safetensors table of `repo_id@commit` on `endpoint` is cached."""
    host = urlparse(endpoint).netloc or "hub"
    tag = hashlib.sha256(endpoint.encode()).hexdigest()[:8]
    return _hf_home() / "tpaudit" / "headers" / f"{host.replace(':', '_')}-{tag}" / \
        repo_id.replace("/", "--") / f"{commit}.snapshot.json.gz"


def _raise_hub_error(e: Exception, repo_id: str, revision: str | None, endpoint: str, what: str) -> NoReturn:
    """Translate a huggingface_hub / httpx failure into a one-line `HubError`."""
    from huggingface_hub import errors as hf

    at = f"{repo_id}@{revision}" if revision else repo_id
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, _DeadlineExceeded):
        raise HubConnectionError(f"cannot read {at}: {endpoint} did not finish answering for {e.args[0]} within "
                                 f"{_deadline():g} s ({DEADLINE_ENV}). Check the network or HF_ENDPOINT; raise "
                                 f"{DEADLINE_ENV} for a slow link", repo_id=repo_id, revision=revision) from None
    if isinstance(e, _TooLarge):
        raise HubError(f"cannot read {at}: {endpoint} answered more than {e.args[1] // 2**20} MiB for {e.args[0]}, "
                       "far beyond any real answer. Check HF_ENDPOINT (it must serve the Hub's API)",
                       repo_id=repo_id, revision=revision) from None
    if isinstance(e, hf.GatedRepoError):
        raise GatedRepoError(
            f"cannot read {at}: the repo is gated (HTTP {status or 401}). Accept its terms on the Hub, then run 'hf "
            "auth login' or set HF_TOKEN (or pass --token)", repo_id=repo_id, revision=revision) from None
    if isinstance(e, hf.RevisionNotFoundError):
        raise RepoNotFoundError(f"cannot read {at}: revision {revision!r} does not exist (HTTP 404). Pass an existing "
                                "branch, tag or commit with --revision", repo_id=repo_id, revision=revision) from None
    if isinstance(e, hf.RepositoryNotFoundError):
        private = " or is private and you are not logged in" if status == 401 else ""
        raise RepoNotFoundError(f"cannot read {at}: the repo does not exist on {endpoint}{private} (HTTP "
                                f"{status or 404}). Check the repo id; for a private repo run 'hf auth login' or pass "
                                "--token", repo_id=repo_id, revision=revision) from None
    if status in (401, 403):
        raise GatedRepoError(f"cannot read {at}: access denied (HTTP {status}). Log in with 'hf auth login', set "
                             "HF_TOKEN or pass --token", repo_id=repo_id, revision=revision) from None
    if isinstance(e, hf.EntryNotFoundError) and not isinstance(e, hf.LocalEntryNotFoundError):
        raise ConfigError(f"cannot read {at}: the repo has no {what}. tpaudit needs a transformers model repo with "
                          "a config.json") from None
    if isinstance(e, hf.LocalEntryNotFoundError) or isinstance(e, hf.OfflineModeIsEnabled):
        if _offline():
            raise HubConnectionError(f"cannot read {at} offline: {what} is not in the cache. Run once without "
                                     "HF_HUB_OFFLINE=1, or record a snapshot with 'tpaudit snapshot'",
                                     repo_id=repo_id, revision=revision) from None
        cause = e.__cause__ or e.__context__
        answered = getattr(getattr(cause, "response", None), "status_code", None)
        if answered is not None:  # the endpoint answered, with an error: not a network failure
            raise HubError(f"cannot read {at}: {endpoint} answered HTTP {answered} for {what}, and it is not in the "
                           "cache. Check HF_ENDPOINT (it must serve the Hub's API) and the repo id",
                           repo_id=repo_id, revision=revision) from None
        reason = (f"{type(cause).__name__}: {shorten(str(cause), 120)}" if cause
                  else shorten(str(e).splitlines()[0], 160))
        raise HubConnectionError(f"cannot reach {endpoint} for {at} ({reason}). Check the network or HF_ENDPOINT; "
                                 "HF_HUB_OFFLINE=1 uses the cache", repo_id=repo_id, revision=revision) from None
    if isinstance(e, hf.SafetensorsParsingError):
        raise CheckpointError(f"cannot read the safetensors headers of {at}: {str(e).rstrip('.')}. The shard is "
                              "malformed or its header exceeds huggingface_hub's size cap") from None
    if isinstance(e, (AttributeError, TypeError, KeyError, ValueError)) and what != "config.json" and \
            not isinstance(e, hf.HfHubHTTPError):
        raise CheckpointError(f"cannot read the safetensors headers of {at}: a header is malformed "
                              f"({type(e).__name__}: {shorten(str(e), 160)}). The repo's checkpoint is corrupt") from None
    if isinstance(e, hf.HfHubHTTPError):
        raise HubError(f"cannot read {at}: {endpoint} answered HTTP {status}. Retry later or check HF_ENDPOINT",
                       repo_id=repo_id, revision=revision) from None
    # httpx transport errors: connection refused, DNS, timeouts; a server that hangs up or does not speak HTTP
    name = type(e).__name__
    names = {cls.__name__ for cls in type(e).__mro__}
    if names & {"RemoteProtocolError", "RemoteDisconnected", "IncompleteRead"}:
        raise HubConnectionError(f"cannot read {at}: {endpoint} closed the connection without answering for {what} "
                                 f"({name}: {shorten(str(e), 120)}). Check HF_ENDPOINT (it must serve the Hub's "
                                 "API); retry later", repo_id=repo_id, revision=revision) from None
    if "Timeout" in name or "Connect" in name or "Network" in name or isinstance(e, (ConnectionError, TimeoutError)):
        kind = "timed out" if "Timeout" in name or isinstance(e, TimeoutError) else "is unreachable"
        raise HubConnectionError(f"cannot read {at}: {endpoint} {kind} ({name}). Check the network or HF_ENDPOINT; "
                                 "HF_HUB_OFFLINE=1 uses the cache", repo_id=repo_id, revision=revision) from None
    if names & {"ProtocolError", "DecodingError", "TransportError", "HTTPException"}:
        raise HubConnectionError(f"cannot read {at}: {endpoint} did not answer {what} in HTTP ({name}: "
                                 f"{shorten(str(e), 120)}). Check HF_ENDPOINT (it must serve the Hub's API)",
                                 repo_id=repo_id, revision=revision) from None
    raise e


_FIRST_READ = 100_000  # bytes of a shard read first: as huggingface_hub, one request for 97% of real headers
_METADATA_MAX_BYTES = RESPONSE_MAX_BYTES  # the single-request endpoint's answer: every shard's header


def _label(repo_id: str, revision: str | None, filename: str) -> str:
    rev = (revision[:12] if revision and _COMMIT.match(revision) else revision) or "main"
    return f"{repo_id}@{rev}/{filename}"


def _fetch_tensors(api, repo_id: str, commit: str | None, default_revision: bool, endpoint: str, token,
                   budget: _Budget):
    """Every checkpoint tensor of `repo_id` at `commit`, validated; `None` for a repo without safetensors.

    Raises:
        CheckpointError: a header is malformed (naming the shard and tensor), or the index names a shard outside
            the repo.
        huggingface_hub / httpx errors for `_raise_hub_error` to translate.
    """
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub import errors as hf
    from huggingface_hub.utils import build_hf_headers, get_session, hf_thread_map
    from urllib.parse import quote

    from .local import (SAFETENSORS_INDEX_FILE, SAFETENSORS_SINGLE_FILE, check_index_entries, check_shard_name,
                        tensors_from_headers)
    from .safetensors_header import HUB_ADVICE, Shard, header_length, parse_header, validate_header_object

    http_headers = build_hf_headers(token=token)
    timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
    if default_revision:
        shards = None
        try:
            _, content = _stream(get_session(), f"{endpoint}/api/models/{repo_id}/safetensors-metadata/"
                                 f"{quote(SAFETENSORS_INDEX_FILE, safe='/')}", http_headers, budget,
                                 limit=_METADATA_MAX_BYTES, what="the safetensors metadata", strict=True,
                                 timeout=timeout)
            from .files import load_json

            body = load_json(content, "safetensors metadata", f"{endpoint}/api/models/{repo_id}")
            shards = body["headers"] if isinstance(body, dict) else None
        except (hf.HfHubHTTPError, KeyError, TypeError, ValueError):  # ValueError: InputError from load_json
            shards = None  # not offered by this server, or not a sharded repo: read the headers one by one
        if isinstance(shards, dict) and shards:
            # This answer gives no file sizes, so "the last tensor ends at the end of the file" cannot be checked
            # here; dtypes, shapes and contiguous data_offsets from 0 are. Duplicate names were merged by the
            # server's JSON encoder before tpaudit sees them.
            return tensors_from_headers([
                (check_shard_name(shard, _label(repo_id, commit, SAFETENSORS_INDEX_FILE)),
                 validate_header_object(header, Shard(_label(repo_id, commit, shard), HUB_ADVICE)))
                for shard, header in shards.items()], HUB_ADVICE)

    weight_map = None
    if api.file_exists(repo_id, SAFETENSORS_SINGLE_FILE, revision=commit):
        filenames = [SAFETENSORS_SINGLE_FILE]
    elif api.file_exists(repo_id, SAFETENSORS_INDEX_FILE, revision=commit):
        from huggingface_hub import hf_hub_download

        from .files import INDEX_MAX_BYTES, load_json, read_capped

        _refuse_oversized(repo_id, SAFETENSORS_INDEX_FILE, commit, token, endpoint, INDEX_MAX_BYTES,
                          "safetensors index", budget)
        index_file = hf_hub_download(repo_id, SAFETENSORS_INDEX_FILE, revision=commit, token=token,
                                     endpoint=endpoint, cache_dir=_hub_cache())
        label = _label(repo_id, commit, SAFETENSORS_INDEX_FILE)

        def error(message: str) -> CheckpointError:
            return CheckpointError(message, path=label)

        index = load_json(read_capped(index_file, "safetensors index", INDEX_MAX_BYTES, error),
                          "safetensors index", label, error)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{label} has no weight_map of tensor name -> shard file. The repo's index is "
                                  "corrupt", path=label)
        for value in weight_map.values():
            if not isinstance(value, str):
                check_shard_name(value, label)
        filenames = sorted({check_shard_name(v, label) for v in set(weight_map.values())})
    else:
        return None

    def one(filename: str):
        url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint)
        label = Shard(_label(repo_id, commit, filename), HUB_ADVICE)
        session = get_session()
        r, content = _stream(session, url, {**http_headers, "range": f"bytes=0-{_FIRST_READ}"}, budget,
                             limit=_FIRST_READ + 1, what=filename, strict=False, timeout=timeout)
        size = _file_size(r, len(content))
        n = header_length(content[:8], label)
        if size is not None and n > size - 8:
            raise CheckpointError(f"{label}: its safetensors header declares {n:,} bytes, but the file holds only "
                                  f"{size - 8:,} after the length. The file is corrupt; {HUB_ADVICE}", path=str(label))
        if n <= len(content) - 8:
            raw = content[8:8 + n]
        else:
            r, raw = _stream(session, url, {**http_headers, "range": f"bytes=8-{n + 7}"}, budget, limit=n + 8,
                             what=filename, strict=False, timeout=timeout)
            raw = raw if r.status_code == 206 else raw[8:8 + n]
            if len(raw) < n:
                raise CheckpointError(f"{label}: the server sent {len(raw):,} of the {n:,} header bytes. Retry",
                                      path=str(label))
            raw = raw[:n]
        # The end-of-file check uses the size the server reports (Content-Range of the ranged read); without one,
        # everything else is still checked (see `parse_header`).
        return filename, parse_header(raw, label, None if size is None else size - 8 - n)

    headers = hf_thread_map(one, filenames, desc="Parse safetensors files")
    tensors = tensors_from_headers(headers, HUB_ADVICE)
    if weight_map is not None:
        check_index_entries(weight_map, headers, _label(repo_id, commit, SAFETENSORS_INDEX_FILE), HUB_ADVICE)
    return tensors


def _file_size(response, received: int) -> int | None:
    """The whole file's size from a ranged answer (`Content-Range: bytes 0-99999/SIZE`), or from a whole-file
    answer (a server that ignored the range); `None` when the server does not say."""
    content_range = response.headers.get("Content-Range") or ""
    total = content_range.rpartition("/")[2].strip()
    if response.status_code == 206:
        return int(total) if total.isdigit() else None
    if response.status_code == 200:  # the range was ignored: the whole file, whose length the server declared
        declared = response.headers.get("Content-Length") or ""
        return int(declared) if declared.isdigit() else (received if received <= _FIRST_READ else None)
    return None


def load_hub(repo_id: str, *, revision: str | None = None, token: str | None = None,
             progress: bool = False) -> ModelSource:
    """Read a Hub repo's config and safetensors headers (never its weights).

    Args:
        repo_id (`str`): `org/name`.
        revision (`str`, *optional*): branch, tag or commit; default: the repo's default branch.
        token (`str`, *optional*): access token; default: `HF_TOKEN` or the stored login.
        progress (`bool`, *optional*, defaults to `False`): show huggingface_hub's progress bar on header fetches.

    Returns:
        `ModelSource` of kind `"hub"` with the resolved `commit`.

    Raises:
        GatedRepoError: HTTP 401/403.
        RepoNotFoundError: no such repo or revision (HTTP 404).
        ConfigError: the repo has no `config.json`.
        HubConnectionError: the endpoint is unreachable or timed out, did not finish within `TPAUDIT_HUB_TIMEOUT`
            seconds, or an offline run misses the cache.
        HubError: an answer over `RESPONSE_MAX_BYTES`.
        CheckpointError: a header is malformed or over the client's size cap.
    """
    from huggingface_hub.utils import logging as hf_logging  # configures its root logger on first import

    endpoint = _endpoint()
    offline = _offline()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its retry warnings would break the one-line error; tpaudit says what failed
    budget = _Budget(_deadline())
    try:
        return _within(budget, lambda: _load(repo_id, revision, token, progress, endpoint, offline, budget),
                       "config.json and the safetensors headers")
    except _DeadlineExceeded as e:
        _remember_missed(endpoint, f"it did not finish answering within {_deadline():g} s ({DEADLINE_ENV}) for "
                                   f"{repo_id} earlier in this batch")
        _raise_hub_error(e, repo_id, revision, endpoint, "config.json")
    except HubConnectionError as e:
        if "within" in str(e) and DEADLINE_ENV in str(e):  # a deadline missed inside (a header read)
            _remember_missed(endpoint, f"it did not finish answering within {_deadline():g} s ({DEADLINE_ENV}) for "
                                       f"{repo_id} earlier in this batch")
        raise
    finally:
        hf_logging.set_verbosity(verbosity)


def _refuse_oversized(repo_id: str, filename: str, revision: str | None, token, endpoint: str, cap: int,
                      what: str, budget: _Budget) -> None:
    """Ask the endpoint for `filename`'s size (one HEAD request, no body) before `hf_hub_download` fetches it, and
    refuse a file over `cap` bytes: the download itself is bounded by the read's total deadline only.

    Raises:
        CheckpointError: the endpoint says the file is larger than `cap`.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        meta = get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint),
                                    token=token, timeout=budget.timeout(10), endpoint=endpoint)
    except Exception:  # noqa: BLE001 - hf_hub_download asks again and its error is the one to report
        return
    size = getattr(meta, "size", None)
    if isinstance(size, int) and size > cap:
        label = _label(repo_id, revision, filename)
        raise CheckpointError(f"{label} is {size:,} B, more than tpaudit reads for a {what} ({cap:,} B). The repo's "
                              f"{filename} is not what a model repo holds", path=label)


def _cached_config(repo_id: str, revision: str | None, endpoint: str, missed: str) -> str:
    """`config.json` from huggingface_hub's cache for an endpoint not asked again (`_missed`), read from the file
    system only: even a `local_files_only` download builds a user agent that may wait on a request to the endpoint.

    Raises:
        HubConnectionError: the config is not in the cache (the message says why the endpoint was not asked).
    """
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=_hub_cache(), revision=revision)
    if isinstance(found, str):
        return found
    at = f"{repo_id}@{revision}" if revision else repo_id
    raise HubConnectionError(f"cannot read {at}: {endpoint} was not asked again: {missed}; config.json is not in the "
                             "local cache. Check the network or HF_ENDPOINT", repo_id=repo_id, revision=revision)


def _load(repo_id, revision, token, progress, endpoint, offline, budget: _Budget) -> ModelSource:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.utils import disable_progress_bars

    from .local import read_config
    from .snapshot import load_snapshot, write_snapshot

    missed = None if offline else (_missed or {}).get(endpoint)
    if missed is not None:
        config_file = _cached_config(repo_id, revision, endpoint, missed)
    down = None if offline else missed or _refuses_connections(endpoint)
    if down is not None and not offline:
        _remember_missed(endpoint, f"{down}, for an earlier model of this batch")
    if not offline and down is None:
        from .files import CONFIG_MAX_BYTES

        _refuse_oversized(repo_id, "config.json", revision, token, endpoint, CONFIG_MAX_BYTES, "config.json", budget)
    try:
        # an endpoint that refuses connections: the cache answers, as huggingface_hub's own fallback does
        if missed is None:
            config_file = hf_hub_download(repo_id, "config.json", revision=revision, token=token,
                                          endpoint=endpoint, cache_dir=_hub_cache(),
                                          local_files_only=offline or down is not None)
    except Exception as e:  # noqa: BLE001 - translated into one-line errors, re-raised otherwise
        if down is not None:
            at = f"{repo_id}@{revision}" if revision else repo_id
            raise HubConnectionError(f"cannot reach {endpoint} for {at} ({down}). Check the network or HF_ENDPOINT; HF_HUB_OFFLINE=1 uses the cache",
                                     repo_id=repo_id, revision=revision) from None
        _raise_hub_error(e, repo_id, revision, endpoint, "config.json")
    config_path = Path(config_file)
    commit = config_path.parent.name if _COMMIT.match(config_path.parent.name) else None
    config = read_config(config_path)
    notes: list[str] = []
    if down is not None:
        notes.append(f"{endpoint} refused the connection ({down}): config and headers come from the local caches")
    tensors = None
    cache = header_cache_path(endpoint, repo_id, commit) if commit else None
    if cache is not None and cache.is_file():
        tensors = load_snapshot(str(cache)).tensors
        notes.append("checkpoint headers read from tpaudit's cache (" + str(cache) + ")")
        if tensors is None:
            notes.append("config only: the repo has no safetensors checkpoint at this commit")
    elif down is not None:
        raise HubConnectionError(f"cannot reach {endpoint} for the safetensors headers of {repo_id} ({down}), and "
                                 "they are not in tpaudit's cache. Check the network or HF_ENDPOINT",
                                 repo_id=repo_id, revision=revision)
    elif offline:
        raise HubConnectionError(f"cannot read {repo_id}@{revision or 'default branch'} offline: its safetensors "
                                 "headers are not in tpaudit's cache. Run once without HF_HUB_OFFLINE=1",
                                 repo_id=repo_id, revision=revision)
    else:
        api = HfApi(endpoint=endpoint, token=token)
        default_revision = revision in (None, "main")
        try:
            if progress:
                tensors = _fetch_tensors(api, repo_id, commit or revision, default_revision, endpoint, token, budget)
            else:
                with disable_progress_bars():
                    tensors = _fetch_tensors(api, repo_id, commit or revision, default_revision, endpoint, token,
                                             budget)
        except TpauditError:
            raise
        except Exception as e:  # noqa: BLE001 - translated into one-line errors, re-raised otherwise (as above)
            _raise_hub_error(e, repo_id, revision, endpoint, "safetensors index")
        if tensors is None:
            notes.append("config only: the repo has no model.safetensors or model.safetensors.index.json (.bin/.pth "
                         "weights cannot be listed without downloading them); shapes come from the meta model and "
                         "bytes from the config's dtype")
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            source = ModelSource(ref=repo_id, kind="hub", config=config, tensors=tensors, repo_id=repo_id,
                                 revision=revision, commit=commit)
            tmp = cache.with_name(f"{commit}.{os.getpid()}.tmp.json.gz")  # write, then rename: no torn cache file
            write_snapshot(source, tmp, origin=f"safetensors headers of {repo_id}@{commit} on {endpoint}")
            os.replace(tmp, cache)
    return ModelSource(ref=repo_id, kind="hub", config=config, tensors=tensors, repo_id=repo_id, revision=revision,
                       commit=commit, config_path=str(config_path), config_dir=str(config_path.parent),
                       notes=tuple(notes))
