"""The model's files: a pinned hub commit downloaded (or a local source copied) into `[model].dir`.

The executor calls `download` for the `model.files` Change and `reconcile lock` calls `resolve_revision`.
What was fetched is recorded in `<dir>/.reconcile-model.json`, which the model probe reads.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeVar

from actions.model_config import (
    BACKUP,
    deep_merge,
    desired_config,
    drop_stale_backup,
    git_blob_sha1,
    original_path,
    patch_config,
    place_source_config,
)
from reconcile.errors import ActionError
from reconcile.host import atomic_write, fsync_dir
from reconcile.plan import ActionResult
from reconcile.spec import Model

__all__ = ["MANIFEST", "deep_merge", "desired_config", "download", "patch_config", "resolve_revision"]

MANIFEST = ".reconcile-model.json"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ATTEMPTS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class RemoteFile:
    """One file of a hub commit as the hub lists it; `etag` is what /resolve answers for it."""

    size: int
    blob_id: str | None  # git blob sha1 (of the LFS pointer, for LFS files)
    sha256: str | None  # LFS files only

    @property
    def etag(self) -> str | None:
        return self.sha256 or self.blob_id


def resolve_revision(repo: str, revision: str, endpoint: str | None = None) -> str:
    """The commit sha that a branch, tag or commit of `repo` stands for now."""
    return _listing(repo, revision, endpoint or _endpoint())[0]


def download(model: Model, *, progress: bool) -> ActionResult:
    """Make `model.dir` hold the model's files and the manifest saying which commit they are."""
    if model.offline:
        return _check_offline(model)
    if model.source is not None:
        return _copy_source(model, model.source)
    if model.repo is None:
        raise ActionError("[model] needs `repo` (a hub repo id) or `source` (a local directory)")
    repo, endpoint = model.repo, _endpoint()
    commit, listing = _listing(repo, model.revision, endpoint)
    wanted = {n: f for n, f in sorted(listing.items()) if selected(n, model.allow_patterns)}
    if not wanted:
        raise ActionError(f"{repo}@{commit[:12]}: no file matches allow_patterns {model.allow_patterns}")
    sizes = {n: f.size for n, f in wanted.items()}
    manifest = {"repo": repo, "revision": model.revision, "commit": commit, "files": sizes}
    recorded = _read_manifest(model.dir) or {}
    # Same commit and sizes: nothing to fetch. Another commit: snapshot_download compares each file's etag.
    on_disk = recorded.get("commit") == commit and not _size_problems(model.dir, sizes)
    if on_disk and recorded == manifest:
        return ActionResult(False, f"{repo}@{commit[:12]}: all {len(sizes)} files present")
    if not on_disk:
        os.makedirs(model.dir, exist_ok=True)
        for name, size in sizes.items():  # huggingface_hub trusts its own record over a damaged file
            path = os.path.join(model.dir, name)
            if name != "config.json" and os.path.isfile(path) and os.path.getsize(path) != size:
                os.unlink(path)
        quiet = None if progress else _quiet_tqdm()
        _retrying(lambda: _resume_partials(repo, commit, model.dir, wanted, endpoint, quiet), repo, commit)
        _retrying(lambda: _snapshot(model, commit, endpoint, quiet), repo, commit)
    drop_stale_backup(model.dir, wanted["config.json"].blob_id if "config.json" in wanted else None)
    problems = _size_problems(model.dir, sizes)
    if problems:
        raise ActionError(
            f"{repo}@{commit[:12]}: not the size the hub lists: {'; '.join(problems)} (apply again; if it "
            "persists, the hub or a proxy serves other bytes than it lists)"
        )
    for part in Path(model.dir, ".cache", "huggingface", "download").rglob("*.incomplete"):
        part.unlink(missing_ok=True)  # partials of killed runs that could not be resumed
    _write_manifest(model.dir, manifest)
    what = f"downloaded {len(sizes)} files" if not on_disk else "files already there, recorded"
    return ActionResult(True, f"{repo}@{commit[:12]}: {what} ({_human(sum(sizes.values()))})")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}"


def selected(name: str, patterns: Iterable[str]) -> bool:
    """snapshot_download's allow_patterns rule: fnmatch, and a trailing "/" means everything below."""
    patterns = list(patterns)
    return not patterns or any(fnmatchcase(name, p + "*" if p.endswith("/") else p) for p in patterns)


def _endpoint() -> str | None:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, when first imported.
    return os.environ.get("HF_ENDPOINT") or None


def _listing(repo: str, revision: str, endpoint: str | None) -> tuple[str, dict[str, RemoteFile]]:
    from huggingface_hub import HfApi

    def call() -> tuple[str, dict[str, RemoteFile]]:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=revision, files_metadata=True)
        if not info.sha or not _COMMIT.match(info.sha):
            raise ActionError(f"{repo}@{revision}: the hub answered without a commit sha ({info.sha!r})")
        files = {
            s.rfilename: RemoteFile(
                size=int(s.lfs.size if s.lfs is not None else (s.size or 0)),
                blob_id=s.blob_id,
                sha256=s.lfs.sha256 if s.lfs is not None else None,
            )
            for s in info.siblings or []
        }
        return info.sha, files

    return _retrying(call, repo, revision, endpoint)


def _snapshot(model: Model, commit: str, endpoint: str | None, tqdm_class: Any) -> None:
    from huggingface_hub import snapshot_download

    # The commit, never the branch: a branch that moves mid-download cannot mix two commits' files.
    snapshot_download(
        model.repo or "",
        revision=commit,
        local_dir=model.dir,
        allow_patterns=list(model.allow_patterns) or None,
        max_workers=model.max_workers,
        endpoint=endpoint,
        tqdm_class=tqdm_class,
    )


def _retrying(fn: Callable[[], T], repo: str, revision: str, endpoint: str | None = None) -> T:
    """Run `fn`, retrying network failures and hub 5xx/429 a bounded number of times; else ActionError."""
    import tenacity

    try:
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transient),
            stop=tenacity.stop_after_attempt(_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=0.5, max=4),
            reraise=True,
        ):
            with attempt:
                return fn()
    except ActionError:
        raise
    except Exception as exc:
        raise _action_error(exc, repo, revision, endpoint or _endpoint()) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _transient(exc: BaseException) -> bool:
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if isinstance(exc, HfHubHTTPError):
        return exc.response.status_code >= 500 or exc.response.status_code in (408, 429)
    if isinstance(exc, LocalEntryNotFoundError):  # hf's word for "could not reach the hub for this file"
        return True
    if isinstance(exc, OSError):
        return exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS)
    with contextlib.suppress(ImportError):
        import httpx2

        return isinstance(exc, httpx2.TransportError)
    return False


def _action_error(exc: Exception, repo: str, revision: str, endpoint: str | None) -> ActionError:
    from huggingface_hub import errors as e

    hub, first = endpoint or "https://huggingface.co", (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, e.GatedRepoError):
        return ActionError(f"{repo}: gated on {hub}; accept its licence on the hub page and set HF_TOKEN")
    if isinstance(exc, e.RepositoryNotFoundError):
        return ActionError(f"{repo}: no such repo on {hub} (check [model].repo; private repos need HF_TOKEN)")
    if isinstance(exc, e.RevisionNotFoundError):
        return ActionError(f"{repo}: no revision {revision!r} on {hub} (a branch, tag or full commit sha)")
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return ActionError(f"{repo}@{revision}: a listed file is gone from {hub} ({first}); apply again")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ActionError(f"no space left for the model's files ({first}); free disk space and apply again")
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EROFS):
        return ActionError(f"cannot write the model's files ({first}); fix the permissions of [model].dir")
    if isinstance(exc, e.HfHubHTTPError) and not _transient(exc):
        return ActionError(f"{repo}: the hub at {hub} refused ({first})")
    return ActionError(
        f"{repo}: the hub at {hub} failed {_ATTEMPTS} times ({type(exc).__name__}: {first}); check the "
        "network or HF_ENDPOINT, or set [model].offline = true with the files in place"
    )


def _quiet_tqdm() -> Any:
    from huggingface_hub.utils.tqdm import tqdm

    class Quiet(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})  # type: ignore[no-untyped-call]

    return Quiet


def _resume_partials(
    repo: str, commit: str, model_dir: str, wanted: Mapping[str, RemoteFile], endpoint: str | None, quiet: Any
) -> None:
    """Finish what a killed download left, with a Range request from where each partial file stops.

    huggingface_hub (2.x) downloads into a per-process `<hash>.<etag>.<uuid>.incomplete` and the next
    process starts from zero: a 20 GB shard killed at 90 % would be fetched whole again.
    """
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub._local_folder import get_local_download_paths, write_download_metadata
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils._headers import build_hf_headers
    except ImportError:  # another layout: snapshot_download does what it does
        return
    for name, remote in wanted.items():
        paths = get_local_download_paths(Path(model_dir), name)
        if remote.etag is None or paths.file_path.exists():
            continue
        stem = paths.incomplete_path(remote.etag).name[: -len("incomplete")]
        folder = paths.metadata_path.parent
        found = (folder / n for n in os.listdir(folder) if n.startswith(stem) and n.endswith(".incomplete"))
        parts = sorted(found, key=lambda p: p.stat().st_size, reverse=True)
        for extra in parts[1:]:
            extra.unlink(missing_ok=True)
        if not parts:
            continue
        part, have = parts[0], parts[0].stat().st_size
        url = hf_hub_url(repo, name, revision=commit, endpoint=endpoint)
        meta = get_hf_file_metadata(url, endpoint=endpoint)
        if have == 0 or meta.etag != remote.etag or meta.size is None or have >= meta.size:
            part.unlink(missing_ok=True)
            continue
        headers = build_hf_headers()
        if meta.location != url:
            headers.pop("authorization", None)  # a CDN gets no token
        with open(part, "ab") as f:
            http_get(meta.location, f, resume_size=have, headers=headers, expected_size=meta.size,
                     tqdm_class=quiet)
        if not _matches_etag(str(part), remote.etag):
            part.unlink(missing_ok=True)  # the bytes before the kill were bad: snapshot starts afresh
            continue
        os.chmod(part, 0o644)
        os.replace(part, paths.file_path)
        write_download_metadata(Path(model_dir), name, commit, remote.etag)


def _matches_etag(path: str, etag: str) -> bool:
    if len(etag) == 64:  # LFS: the sha256 of the content
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest() == etag
    return len(etag) != 40 or git_blob_sha1(path) == etag


def _size_problems(model_dir: str, sizes: Mapping[str, int]) -> list[str]:
    problems = []
    for name, size in sizes.items():
        try:
            have = os.stat(original_path(model_dir, name)).st_size
        except FileNotFoundError:
            problems.append(f"{name} missing")
            continue
        if have != size:
            problems.append(f"{name} is {have} bytes, the list says {size}")
    return problems


def _check_offline(model: Model) -> ActionResult:
    manifest, where = _read_manifest(model.dir), os.path.join(model.dir, MANIFEST)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        raise ActionError(
            f"offline: {where} is missing or unreadable, so nothing records which files belong in "
            f"{model.dir}; download once with offline = false, or copy the files in and use `source`"
        )
    if model.repo is not None and manifest.get("repo") != model.repo:
        raise ActionError(f"offline: {model.dir} holds {manifest.get('repo')!r}, the spec {model.repo!r}")
    if _COMMIT.match(model.revision) and manifest.get("commit") not in (None, model.revision):
        raise ActionError(f"offline: {model.dir} holds {manifest.get('commit')}, the spec {model.revision}")
    problems = _size_problems(model.dir, manifest["files"])
    if problems:
        raise ActionError(
            f"offline: {model.dir} is not what {MANIFEST} records: {'; '.join(problems)} "
            "(copy those files in, or set offline = false to download them)"
        )
    at = manifest.get("commit") or manifest.get("source")
    return ActionResult(False, f"offline: all {len(manifest['files'])} recorded files present ({at})")


def _copy_source(model: Model, source: str) -> ActionResult:
    """Copy `source` into `dir` (allow_patterns apply), skipping files whose size and mtime match."""
    if not os.path.isdir(source):
        raise ActionError(f"[model].source {source}: not a directory (point it at the model's files)")
    names = sorted(
        os.path.relpath(os.path.join(root, f), source).replace(os.sep, "/")
        for root, dirs, files in os.walk(source)
        if os.path.relpath(root, source).split(os.sep)[0] != ".cache"  # huggingface_hub's bookkeeping
        for f in files
    )
    names = [n for n in names if n not in (MANIFEST, BACKUP) and selected(n, model.allow_patterns)]
    if not names:
        raise ActionError(f"[model].source {source}: no file matches allow_patterns {model.allow_patterns}")
    copied = [n for n in names if _copy_one(os.path.join(source, n), model.dir, n)]
    if copied:
        fsync_dir(model.dir)
    sizes = {n: os.stat(os.path.join(source, n)).st_size for n in names}
    manifest = {"repo": model.repo, "revision": model.revision, "commit": None, "files": sizes}
    manifest["source"] = source
    if not copied and _read_manifest(model.dir) == manifest:
        return ActionResult(False, f"{model.dir}: all {len(names)} files match {source}")
    _write_manifest(model.dir, manifest)
    return ActionResult(True, f"{model.dir}: copied {len(copied)} of {len(names)} files from {source}")


def _copy_one(src: str, model_dir: str, name: str) -> bool:
    dst = os.path.join(model_dir, name)
    if name == "config.json" and (placed := place_source_config(src, model_dir)) is not None:
        return placed
    with contextlib.suppress(FileNotFoundError):
        s, d = os.stat(src), os.stat(dst)
        if s.st_size == d.st_size and int(s.st_mtime) == int(d.st_mtime):  # rsync's rule, 1 s granularity
            return False
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".tmp", dir=os.path.dirname(dst))
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        shutil.copystat(src, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def _read_manifest(model_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(model_dir, MANIFEST), "rb") as f:
            data = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_manifest(model_dir: str, manifest: Mapping[str, Any]) -> None:
    os.makedirs(model_dir, exist_ok=True)
    atomic_write(os.path.join(model_dir, MANIFEST), (json.dumps(manifest, indent=2) + "\n").encode())
