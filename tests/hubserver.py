"""A loopback server that answers like the Hugging Face Hub's file endpoints, for tests (no internet here).

`/{org}/{name}/resolve/{revision}/{file}`: HEAD (`X-Repo-Commit`, `ETag`, `Content-Length`, `Accept-Ranges`), GET,
and GET with `Range: bytes=a-b` (206 + `Content-Range`). Errors carry the Hub's `X-Error-Code` header
(`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, `GatedRepo`) so huggingface_hub raises its own error classes.
Every request is logged with the bytes of body sent. It listens on 127.0.0.1 on a free port and serves files from
disk: sparse safetensors shards cost nothing to serve until someone reads their data.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_SHARDED = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/safetensors-metadata/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Repo:
    directory: Path
    commit: str
    branches: dict[str, str] = field(default_factory=dict)
    token: str | None = None  # gated: only this bearer token may read


@dataclass
class Request:
    method: str
    repo: str
    file: str
    range: str | None
    status: int
    sent: int


class FakeHub:
    """Start with `with FakeHub() as hub:`; `hub.url` is the `HF_ENDPOINT`."""

    def __init__(self, *, offer_sharded_metadata: bool = False, intercept=None):
        """`intercept(handler, head, path) -> bool`, when given, sees every request first and answers it itself by
        returning True (a hostile endpoint: stall, trickle, an endless body)."""
        self.offer_sharded_metadata = offer_sharded_metadata
        self.intercept = intercept
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def add(self, repo_id: str, directory: Path, *, token: str | None = None, branches=("main",)) -> str:
        """Serve `directory` as `repo_id`; returns its (made-up, stable) commit sha."""
        commit = hashlib.sha1(f"{repo_id}:{directory}".encode()).hexdigest()
        self.repos[repo_id] = Repo(Path(directory), commit, {b: commit for b in branches}, token)
        return commit

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def bytes_sent(self, suffix: str = "") -> int:
        return sum(r.sent for r in self.requests if r.file.endswith(suffix))

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def __enter__(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _error(self, status: int, code: str, repo: str = "", file: str = "") -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Length", "0")
                self.end_headers()
                hub._log(self.command, repo, file, self.headers.get("Range"), status, 0)

            def _sharded(self, repo_id: str, name: str) -> None:
                """The Hub's single-request variant: the index plus every shard's parsed header (main only)."""
                import json
                import struct

                repo = hub.repos.get(repo_id)
                index_file = repo.directory / name if repo else None
                if not hub.offer_sharded_metadata or index_file is None or not index_file.is_file():
                    return self._error(404, "EntryNotFound", repo_id or "", name)
                index = json.loads(index_file.read_text())
                headers = {}
                for shard in sorted(set(index["weight_map"].values())):
                    with open(repo.directory / shard, "rb") as f:
                        (n,) = struct.unpack("<Q", f.read(8))
                        headers[shard] = json.loads(f.read(n))
                body = json.dumps({"index": {"metadata": index.get("metadata")}, "headers": headers}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                hub._log(self.command, repo_id, "safetensors-metadata", None, 200, len(body))

            def _serve(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                if hub.intercept is not None and hub.intercept(self, head, path):
                    return
                sharded = _SHARDED.match(path)
                if sharded:
                    return self._sharded(sharded.group("repo"), sharded.group("file"))
                m = _RESOLVE.match(path)
                if not m:
                    return self._error(404, "EntryNotFound", "", path)
                repo_id, rev, name = m.group("repo"), m.group("rev"), m.group("file")
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(404 if self.headers.get("Authorization") else 401, "RepoNotFound", repo_id, name)
                if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    return self._error(403 if self.headers.get("Authorization") else 401, "GatedRepo", repo_id, name)
                commit = repo.branches.get(rev) or (rev if rev == repo.commit else None)
                if commit is None:
                    return self._error(404, "RevisionNotFound", repo_id, name)
                file = repo.directory / name
                if ".." in Path(name).parts or not file.is_file():
                    return self._error(404, "EntryNotFound", repo_id, name)
                size = os.path.getsize(file)
                start, end, status = 0, size - 1, 200
                rng = self.headers.get("Range")
                if rng and not head:
                    r = _RANGE.match(rng.strip())
                    if not r:
                        return self._error(416, "InvalidRange", repo_id, name)
                    start = int(r.group(1))
                    end = min(int(r.group(2)) if r.group(2) else size - 1, size - 1)
                    status = 206
                length = max(0, end - start + 1)
                self.send_response(status)
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", '"' + hashlib.sha1(f"{commit}:{name}:{size}".encode()).hexdigest() + '"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(size if head else length))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                sent = 0
                if not head:
                    with open(file, "rb") as f:
                        f.seek(start)
                        remaining = length
                        while remaining:
                            chunk = f.read(min(remaining, 1 << 20))
                            if not chunk:
                                break
                            self.wfile.write(chunk)
                            sent += len(chunk)
                            remaining -= len(chunk)
                hub._log(self.command, repo_id, name, rng, status, sent)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _log(self, method, repo, file, rng, status, sent) -> None:
        with self._lock:
            self.requests.append(Request(method, repo, file, rng, status, sent))

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
