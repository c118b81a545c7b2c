"""A loopback Hugging Face hub: the endpoints `huggingface_hub`'s snapshot_download/hf_hub_download call.

Used by the model action tests (and `reconcile lock` tests). Speaks model_info (`/api/models/R/revision/V`),
the tree listing, HEAD/GET `/R/resolve/V/F` with the hub's headers, LFS files behind a "CDN" on a second
port, HTTP ranges, hub error codes, plus fault knobs (throttle, dropped connections, lying sizes).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf", "*.h5", "*.msgpack")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the hub reports as a regular file's ETag and blobId."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{digest}\nsize {len(data)}\n".encode()


@dataclass
class HubRepo:
    """One repo: commit sha -> {filename: content}, and refs (branches, tags) -> commit sha."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it; `body_bytes` is what was sent of the body (live until done)."""

    method: str
    path: str
    query: str
    range: str | None
    server: str  # "hub" or "cdn"
    status: int
    filename: str | None  # the repo file whose content this request is about, if any
    body_bytes: int
    done: bool

    @property
    def is_file_download(self) -> bool:
        return self.method == "GET" and self.filename is not None and self.status in (200, 206)


class _Entry:
    def __init__(self, method: str, path: str, query: str, rng: str | None, server: str) -> None:
        self.method, self.path, self.query, self.range, self.server = method, path, query, rng, server
        self.status = 0
        self.filename: str | None = None
        self.body_bytes = 0
        self.done = False

    def snapshot(self) -> LoggedRequest:
        return LoggedRequest(
            self.method,
            self.path,
            self.query,
            self.range,
            self.server,
            self.status,
            self.filename,
            self.body_bytes,
            self.done,
        )


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: Mapping[str, str] = {}) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, dict(headers)


class FakeHub:
    """A threaded loopback hub. Use as a context manager; `url` is what HF_ENDPOINT must be set to."""

    def __init__(
        self,
        repos: Mapping[str, HubRepo] | None = None,
        *,
        throttle_bps: int | None = None,
        lfs_patterns: Iterable[str] = LFS_PATTERNS,
    ) -> None:
        self.repos: dict[str, HubRepo] = dict(repos or {})
        self.throttle_bps = throttle_bps
        self.lfs_patterns = tuple(lfs_patterns)
        self._lock = threading.Lock()
        self._log: list[_Entry] = []
        self._size_lies: dict[tuple[str, str], int] = {}
        self._drops: dict[str, list[int]] = {}  # filename -> [after_bytes, times_left]
        self._hub = _Server(("127.0.0.1", 0), self, "hub")
        self._cdn = _Server(("127.0.0.1", 0), self, "cdn")
        self._threads: list[threading.Thread] = []

    # -- life cycle ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def start(self) -> FakeHub:
        for srv in (self._hub, self._cdn):
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._hub, self._cdn):
            srv.shutdown()
            srv.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- describing the hub -------------------------------------------------------------------------
    def add_commit(self, repo: str, files: Mapping[str, bytes], *, ref: str | None = "main") -> str:
        """Add a commit holding exactly `files`; move `ref` to it. Returns its 40-hex sha."""
        r = self.repos.setdefault(repo, HubRepo())
        digest = hashlib.sha1(repo.encode() + str(len(r.commits)).encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\x00" + hashlib.sha256(files[name]).digest())
        sha = digest.hexdigest()
        with self._lock:
            r.commits[sha] = dict(files)
            if ref is not None:
                r.refs[ref] = sha
        return sha

    def set_ref(self, repo: str, ref: str, commit: str) -> None:
        """Move a branch or tag (e.g. `main` moves on after a spec pinned a commit)."""
        with self._lock:
            if commit not in self.repos[repo].commits:
                raise KeyError(f"{repo} has no commit {commit}")
            self.repos[repo].refs[ref] = commit

    def lie_about_size(self, repo: str, filename: str, size: int) -> None:
        """Listings (model_info siblings, tree) report `size` for this file; downloads stay truthful."""
        with self._lock:
            self._size_lies[(repo, filename)] = size

    def drop_connection(self, filename: str, after_bytes: int, *, times: int = 1) -> None:
        """The next `times` downloads of `filename` are cut (socket shut) after `after_bytes` of body."""
        with self._lock:
            self._drops[filename] = [after_bytes, times]

    # -- what happened --------------------------------------------------------------------------------
    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return [e.snapshot() for e in self._log]

    def downloads(self, filename: str | None = None) -> list[LoggedRequest]:
        """GETs that served file content (from /resolve or the CDN), optionally for one file."""
        return [r for r in self.requests() if r.is_file_download and filename in (None, r.filename)]

    def bytes_sent(self, filename: str) -> int:
        return sum(r.body_bytes for r in self.requests() if r.method == "GET" and r.filename == filename)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # -- internals used by the handler --------------------------------------------------------------------
    def _log_entry(self, entry: _Entry) -> None:
        with self._lock:
            self._log.append(entry)

    def _take_drop(self, filename: str) -> int | None:
        with self._lock:
            d = self._drops.get(filename)
            if not d or d[1] <= 0:
                return None
            d[1] -= 1
            return d[0]

    def _repo(self, repo: str) -> HubRepo:
        r = self.repos.get(repo)
        if r is None:
            raise _HubError(404, "RepoNotFound", f"Repository Not Found for url: {repo}.")
        return r

    def _commit(self, repo: str, revision: str) -> tuple[str, dict[str, bytes]]:
        r = self._repo(repo)
        with self._lock:
            sha = r.refs.get(revision, revision)
            files = r.commits.get(sha)
        if files is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha, files

    def _is_lfs(self, filename: str) -> bool:
        return any(fnmatch(filename.rsplit("/", 1)[-1], p) for p in self.lfs_patterns)

    def _listed_size(self, repo: str, filename: str, data: bytes) -> int:
        with self._lock:
            return self._size_lies.get((repo, filename), len(data))

    def _blob(self, sha256: str) -> bytes | None:
        with self._lock:
            for r in self.repos.values():
                for files in r.commits.values():
                    for data in files.values():
                        if hashlib.sha256(data).hexdigest() == sha256:
                            return data
        return None

    def _tree_entry(self, repo: str, name: str, data: bytes) -> dict[str, Any]:
        size = self._listed_size(repo, name, data)
        if self._is_lfs(name):
            pointer = lfs_pointer(data)
            lfs = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": len(pointer)}
            return {"type": "file", "oid": git_blob_sha1(pointer), "size": size, "path": name, "lfs": lfs}
        return {"type": "file", "oid": git_blob_sha1(data), "size": size, "path": name}

    def model_info(self, repo: str, revision: str, blobs: bool) -> dict[str, Any]:
        sha, files = self._commit(repo, revision)
        siblings: list[dict[str, Any]] = []
        for name in sorted(files):
            sib: dict[str, Any] = {"rfilename": name}
            if blobs:
                e = self._tree_entry(repo, name, files[name])
                sib.update(size=e["size"], blobId=e["oid"])
                if "lfs" in e:
                    lfs = e["lfs"]
                    sib["lfs"] = {"sha256": lfs["oid"], "size": e["size"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sib)
        return {
            "_id": hashlib.md5(repo.encode()).hexdigest()[:24],
            "id": repo,
            "modelId": repo,
            "sha": sha,
            "private": False,
            "gated": False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }

    def tree(self, repo: str, revision: str, path: str, recursive: bool) -> list[dict[str, Any]]:
        _, files = self._commit(repo, revision)
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        out: list[dict[str, Any]] = []
        dirs: set[str] = set()
        for name in sorted(files):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            parts = rest.split("/")
            for i in range(1, len(parts)):
                d = prefix + "/".join(parts[:i])
                if d not in dirs and (recursive or i == 1):
                    dirs.add(d)
                    oid = hashlib.sha1(d.encode()).hexdigest()
                    out.append({"type": "directory", "oid": oid, "size": 0, "path": d})
            if recursive or len(parts) == 1:
                out.append(self._tree_entry(repo, name, files[name]))
        if prefix and not out:
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}")
        return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], hub: FakeHub, role: str) -> None:
        super().__init__(address, _Handler)
        self.hub, self.role = hub, role


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # the request log replaces stderr noise
        pass

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    # -- routing ---------------------------------------------------------------------------------------
    def _dispatch(self, *, head: bool) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        entry = _Entry(self.command, path, split.query, self.headers.get("Range"), self.server.role)
        self.server.hub._log_entry(entry)
        try:
            if self.server.role == "cdn":
                self._cdn(entry, split.path, parse_qs(split.query), head)
            elif split.path.startswith("/api/models/"):
                self._api(entry, split.path[len("/api/models/") :], parse_qs(split.query), head)
            elif "/resolve/" in split.path:
                self._resolve(entry, split.path, head)
            else:
                raise _HubError(404, None, f"no route for {path}")
        except _HubError as err:
            headers = {"X-Error-Code": err.code} if err.code else {}
            headers.update(err.headers)
            headers["X-Error-Message"] = err.message
            self._send(
                entry,
                err.status,
                json.dumps({"error": err.message}).encode(),
                headers,
                head=head,
                content_type="application/json",
            )
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            entry.done = True

    def _api(self, entry: _Entry, rest: str, query: dict[str, list[str]], head: bool) -> None:
        hub = self.server.hub
        for kind in ("revision", "tree"):
            repo, sep, tail = self._split_repo(rest, kind)
            if not sep:
                continue
            rev, _, sub = tail.partition("/")
            rev = unquote(rev)
            if kind == "revision":
                blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
                body: Any = hub.model_info(repo, rev, blobs)
            else:
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                body = hub.tree(repo, rev, unquote(sub), recursive)
            self._send(entry, 200, json.dumps(body).encode(), {}, head=head, content_type="application/json")
            return
        repo = unquote(rest.rstrip("/"))
        sha, _ = hub._commit(repo, "main")
        self._send(
            entry,
            200,
            json.dumps(hub.model_info(repo, sha, False)).encode(),
            {},
            head=head,
            content_type="application/json",
        )

    def _split_repo(self, rest: str, kind: str) -> tuple[str, bool, str]:
        # A repo id holds one "/" at most, so a known repo is matched first, then the first marker.
        marker = f"/{kind}/"
        for repo in sorted(self.server.hub.repos, key=len, reverse=True):
            if rest.startswith(repo + marker):
                return repo, True, rest[len(repo) + len(marker) :]
        if marker in rest:
            repo, tail = rest.split(marker, 1)
            return unquote(repo), True, tail
        return "", False, ""

    def _resolve(self, entry: _Entry, raw: str, head: bool) -> None:
        hub = self.server.hub
        repo_part, tail = raw.lstrip("/").split("/resolve/", 1)
        repo = unquote(repo_part)
        rev, _, filename = tail.partition("/")
        rev, filename = unquote(rev), unquote(filename)
        sha, files = hub._commit(repo, rev)
        entry.filename = filename
        if filename not in files:
            raise _HubError(404, "EntryNotFound", f"{filename} not on {rev}", {"X-Repo-Commit": sha})
        data = files[filename]
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if hub._is_lfs(filename):
            digest = hashlib.sha256(data).hexdigest()
            headers.update(
                {
                    "ETag": f'"{git_blob_sha1(lfs_pointer(data))}"',
                    "X-Linked-Etag": f'"{digest}"',
                    "X-Linked-Size": str(len(data)),
                    "Location": f"{hub.cdn_url}/lfs/{digest}?filename={quote(filename)}",
                }
            )
            self._send(entry, 302, b"", headers, head=True)
            return
        headers["ETag"] = f'"{git_blob_sha1(data)}"'
        self._send_file(entry, data, headers, head)

    def _cdn(self, entry: _Entry, raw: str, query: dict[str, list[str]], head: bool) -> None:
        if not raw.startswith("/lfs/"):
            raise _HubError(404, None, "no such object")
        data = self.server.hub._blob(raw[len("/lfs/") :])
        if data is None:
            raise _HubError(404, None, "no such object")
        entry.filename = query.get("filename", [None])[0]
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        self._send_file(entry, data, {"ETag": etag, "Accept-Ranges": "bytes"}, head)

    # -- responses ------------------------------------------------------------------------------------
    def _send_file(self, entry: _Entry, data: bytes, headers: dict[str, str], head: bool) -> None:
        start, end, status = 0, len(data), 200
        rng = self.headers.get("Range")
        if rng:
            try:
                unit, _, spec = rng.partition("=")
                first, _, last = spec.split(",")[0].strip().partition("-")
                if unit.strip() != "bytes" or not first:
                    raise ValueError(rng)
                start, end = int(first), (int(last) + 1 if last else len(data))
                if start >= len(data) or end <= start:
                    raise ValueError(rng)
                end = min(end, len(data))
            except ValueError:
                raise _HubError(
                    416, None, f"unsatisfiable range {rng}", {"Content-Range": f"bytes */{len(data)}"}
                ) from None
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self._send(
            entry,
            status,
            data[start:end],
            headers,
            head=head,
            content_type="application/octet-stream",
            stream=not head,
        )

    def _send(
        self,
        entry: _Entry,
        status: int,
        body: bytes,
        headers: Mapping[str, str],
        *,
        head: bool,
        content_type: str = "text/plain",
        stream: bool = False,
    ) -> None:
        entry.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head or not body:
            return
        hub = self.server.hub
        drop = hub._take_drop(entry.filename) if (stream and entry.filename) else None
        bps = hub.throttle_bps if stream else None
        chunk = max(1024, min(64 * 1024, bps // 20)) if bps else 256 * 1024
        began, sent = time.monotonic(), 0
        while sent < len(body):
            piece = body[sent : sent + chunk]
            if drop is not None and sent + len(piece) >= drop:
                piece = piece[: max(0, drop - sent)]
                self.wfile.write(piece)
                self.wfile.flush()
                entry.body_bytes += len(piece)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(piece)
            sent += len(piece)
            entry.body_bytes = sent
            if bps:
                ahead = sent / bps - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)
