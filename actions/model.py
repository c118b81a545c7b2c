"""The model's files: a pinned hub commit downloaded (or a local source copied) into `[model].dir`.

The executor calls `download` for the `model.files` Change and `reconcile lock` calls `resolve_revision`.
What was fetched is recorded in `<dir>/.reconcile-model.json`, which the model probe reads.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from actions.model_config import (
    BACKUP,
    desired_config,
    drop_stale_backup,
    original_path,
    patch_config,
)
from actions.model_copying import copy_files, inside_model_dir, source_files
from actions.model_resuming import partials, resume_partials
from reconcile.errors import ActionError
from reconcile.host import atomic_write, download_deadline_s, hub_deadline
from reconcile.plan.records import ActionResult
from reconcile.record import Record
from reconcile.safety import source_content
from reconcile.safety.filesafety import FIX, TREE_UMASK, UnsafePath, data_root, ensure_dir, open_dir, umask
from reconcile.safety.names import name_problem
from reconcile.safety.shapes import is_commit
from reconcile.safety.untrusted import JSON_LIMIT, load_json, past_free_space, read_regular

if TYPE_CHECKING:
    from reconcile.spec.models import Model

__all__ = ["MANIFEST", "desired_config", "download", "patch_config", "resolve_revision"]

MANIFEST = ".reconcile-model.json"
_REALIZATION = re.compile(r"^[0-9a-f]{32}-model\Z")  # reconcile.apply.store's name for a model realization
_ATTEMPTS = 3
T = TypeVar("T")


class RemoteFile(Record):
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
    if os.path.islink(model.dir):  # the preflight refuses it; an action never writes through a link
        raise ActionError(f"[model].dir {model.dir} is a symlink: set dir to a real directory")
    with umask(TREE_UMASK):  # the server may run as another user: readable by it, writable by none
        return _download(model, progress=progress)


def _download(model: Model, *, progress: bool) -> ActionResult:
    if model.offline:
        return _check_offline(model)
    if model.source is not None:
        return _copy_source(model, model.source)
    if model.repo is None:
        raise ActionError("[model] needs `repo` (a hub repo id) or `source` (a local directory)")
    repo, endpoint = model.repo, _endpoint()
    commit, listing = _listing(repo, model.revision, endpoint)
    _refuse_names(listing, f"{repo}@{commit[:12]}: the hub lists", _HUB_FIX)
    # A listed name that is one of reconcile's own records (the download record, the seal) is not
    # fetched: the hub would choose what the record says.
    wanted = {
        n: f
        for n, f in sorted(listing.items())
        if not source_content.reserved(n) and selected(n, model.allow_patterns)
    }
    if not wanted:
        raise ActionError(f"{repo}@{commit[:12]}: no file matches allow_patterns {model.allow_patterns}")
    sizes = {n: f.size for n, f in wanted.items()}
    manifest = {"repo": repo, "revision": model.revision, "commit": commit, "files": sizes}
    recorded = _read_manifest(model.dir) or {}
    # Same commit and sizes: nothing to fetch. Another commit: snapshot_download compares each file's etag.
    on_disk = recorded.get("commit") == commit and not _size_problems(model.dir, sizes)
    if on_disk and recorded == manifest:
        return ActionResult(False, f"{repo}@{commit[:12]}: all {len(sizes)} files present")
    etags = {n: f.etag for n, f in wanted.items()}
    hub_cache = store_hub_cache(model.dir)
    if not on_disk and hub_cache is not None:
        # A store realization: huggingface_hub's own cache keeps the files by content, the realization
        # links to its blobs (reconcile.apply.model_store seals it when it converged).
        _refuse_past_free_space(f"{repo}@{commit[:12]}", model.dir, sizes)
        ensure_dir(model.dir, 0o755)
        quiet = _bars() if progress else _quiet_tqdm()
        snap = _retrying(lambda: _snapshot(model, commit, endpoint, quiet, cache_dir=hub_cache), repo, commit)
        assert snap is not None
        link_snapshot(snap, model.dir, sizes)
    elif not on_disk:
        _refuse_past_free_space(f"{repo}@{commit[:12]}", model.dir, sizes)  # the hub's listing
        ensure_dir(model.dir, 0o755)
        paths = {name: inside_model_dir(model.dir, name) for name in sizes}
        for name, size in sizes.items():  # huggingface_hub trusts its own record over a damaged file
            path = paths[name]
            if name != "config.json" and os.path.isfile(path) and os.path.getsize(path) != size:
                os.unlink(path)
        quiet = _bars() if progress else _quiet_tqdm()
        # One deadline around all of it (retries too): a mirror that drips keeps no read past it.
        with hub_deadline(download_deadline_s(sizes.values()), "the download", sizes):
            _retrying(lambda: resume_partials(repo, commit, model.dir, etags, endpoint, quiet), repo, commit)
            _retrying(lambda: _snapshot(model, commit, endpoint, quiet), repo, commit)
    drop_stale_backup(model.dir, wanted["config.json"].blob_id if "config.json" in wanted else None)
    problems = _size_problems(model.dir, sizes)
    if problems:
        raise ActionError(
            f"{repo}@{commit[:12]}: not the size the hub lists: {'; '.join(problems)} (apply again; if it "
            "persists, the hub or a proxy serves other bytes than it lists)"
        )
    for name, etag in etags.items():  # partials of killed runs that could not be resumed
        for part in partials(model.dir, name, etag) if etag else ():
            part.unlink(missing_ok=True)
    _write_manifest(model.dir, manifest)
    what = f"downloaded {len(sizes)} files" if not on_disk else "files already there, recorded"
    return ActionResult(True, f"{repo}@{commit[:12]}: {what} ({_human(sum(sizes.values()))})")


SPACE_FIX = "free space there, or leave files out with allow_patterns"
_HUB_FIX = "a hub never lists such a name: check HF_ENDPOINT and what answers there"


def _refuse_names(names: Iterable[str], where: str, fix: str) -> None:
    """A name that would leave the model dir (or hold a control character) is refused before any join."""
    for name in names:
        if (problem := name_problem(name)) is not None:
            raise ActionError(f"{where} {name!r}, which {problem}: refused, nothing written ({fix})")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}"


selected = source_content.selected  # snapshot_download's allow_patterns rule


def _endpoint() -> str | None:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, when first imported.
    return os.environ.get("HF_ENDPOINT") or None


def _listing(repo: str, revision: str, endpoint: str | None) -> tuple[str, dict[str, RemoteFile]]:
    from huggingface_hub import HfApi

    from reconcile.host import hub_api_call
    from reconcile.safety.display import shown
    from reconcile.safety.shapes import listed_size

    def call() -> tuple[str, dict[str, RemoteFile]]:
        api = HfApi(endpoint=endpoint)
        info = hub_api_call(
            lambda: api.model_info(repo, revision=revision, files_metadata=True),
            str(api.endpoint),
        )
        if not is_commit(info.sha):
            raise ActionError(f"{repo}@{revision}: the hub answered without a commit sha ({info.sha!r})")
        files = {}
        for s in info.siblings or []:
            raw = s.lfs.size if s.lfs is not None else s.size
            size = listed_size(raw)
            if size is None:  # the hub's bad answer: said once, not retried, never int()'s crash
                raise ActionError(
                    f"{repo}@{revision}: the hub's listing gives {shown(str(s.rfilename), 200)} a size "
                    f"that is not a size ({shown(repr(raw), 100)}); check HF_ENDPOINT"
                )
            files[s.rfilename] = RemoteFile(
                size=size, blob_id=s.blob_id, sha256=s.lfs.sha256 if s.lfs is not None else None
            )
        return info.sha, files

    return _retrying(call, repo, revision, endpoint)


def store_hub_cache(model_dir: str) -> str | None:
    """`<store>/hub` when `model_dir` is a store realization (`<store>/<hash>-model`, as
    reconcile.apply.store names them), else None: the files go straight into the model dir."""
    if not _REALIZATION.match(os.path.basename(os.path.normpath(model_dir))):
        return None
    return os.path.join(os.path.dirname(os.path.normpath(model_dir)), "hub")


def link_snapshot(snapshot: str, model_dir: str, sizes: Mapping[str, int]) -> None:
    """Each file of a huggingface_hub snapshot (`snapshots/<commit>/<name>` -> `../../blobs/<etag>`)
    hard-linked into the realization: the blob's bytes, no copy. A config.json already patched there
    stays (its backup is the original, judged by drop_stale_backup)."""
    blobs = os.path.realpath(os.path.join(snapshot, "..", "..", "blobs"))
    for name in sorted(sizes):
        target = inside_model_dir(model_dir, name)
        if name == "config.json" and os.path.exists(os.path.join(model_dir, BACKUP)):
            continue
        blob = os.path.realpath(os.path.join(snapshot, name))
        if os.path.dirname(blob) != blobs:  # the library's own links: a blob of this repo, nothing else
            raise ActionError(
                f"{snapshot}/{name}: not a link into {blobs}; remove that snapshot and apply again"
            )
        ensure_dir(os.path.dirname(target), 0o755)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samefile(blob, target):
                continue
        dfd, base = open_dir(os.path.dirname(target)), os.path.basename(target)  # the walked directory
        try:
            tmp = f".{base}.reconcile-link.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            os.link(blob, tmp, dst_dir_fd=dfd, follow_symlinks=False)
            os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)


def _snapshot(
    model: Model, commit: str, endpoint: str | None, tqdm_class: Any, cache_dir: str | None = None
) -> str | None:
    from huggingface_hub import snapshot_download

    from reconcile.host import bound_hub_session

    bound_hub_session()  # a least rate for every file's transfer
    if cache_dir is not None:
        ensure_dir(cache_dir, 0o755)
        return str(
            snapshot_download(
                model.repo or "",
                revision=commit,
                cache_dir=cache_dir,
                allow_patterns=list(model.allow_patterns) or None,
                ignore_patterns=sorted(source_content.RESERVED),  # reconcile's own record names
                max_workers=model.max_workers,
                endpoint=endpoint,
                tqdm_class=tqdm_class,
            )
        )
    # The commit, never the branch: a branch that moves mid-download cannot mix two commits' files.
    snapshot_download(
        model.repo or "",
        revision=commit,
        local_dir=model.dir,
        allow_patterns=list(model.allow_patterns) or None,
        ignore_patterns=sorted(source_content.RESERVED),  # never a record a hub listing names
        max_workers=model.max_workers,
        endpoint=endpoint,
        tqdm_class=tqdm_class,
    )
    return None


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

    from reconcile.host import HttpUnreachable

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
    if isinstance(exc, HttpUnreachable):  # our own bounds: too slow (a drip) or too large
        return ActionError(f"{repo}: {first}; check the network or HF_ENDPOINT, then apply again")
    if isinstance(exc, e.HfHubHTTPError) and not _transient(exc):
        return ActionError(f"{repo}: the hub at {hub} refused ({first})")
    return ActionError(
        f"{repo}: the hub at {hub} failed {_ATTEMPTS} times ({type(exc).__name__}: {first}); check the "
        "network or HF_ENDPOINT, or set [model].offline = true with the files in place"
    )


def _bars() -> Any:
    """huggingface_hub's progress bars, drawn on the terminal itself (sys.__stderr__), not through the
    CLI's SafeStream, which would show their carriage returns and cursor moves as text. What they
    print is the library's own drawing, the file names in it checked first (_refuse_names)."""
    import sys

    from huggingface_hub.utils.tqdm import tqdm

    class Bars(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{"file": sys.__stderr__, **kwargs})  # type: ignore[no-untyped-call]

    return Bars


def _quiet_tqdm() -> Any:
    from huggingface_hub.utils.tqdm import tqdm

    class Quiet(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})  # type: ignore[no-untyped-call]

    return Quiet


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
    _refuse_names(
        manifest["files"], f"offline: {where} lists", f"reconcile never writes that: remove {where}"
    )
    if model.repo is not None and manifest.get("repo") != model.repo:
        raise ActionError(f"offline: {model.dir} holds {manifest.get('repo')!r}, the spec {model.repo!r}")
    if is_commit(model.revision) and manifest.get("commit") not in (None, model.revision):
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
    try:  # read by its real path, every link on the way one only root or we could have made
        source = data_root(source)
    except UnsafePath as exc:
        raise ActionError(f"[model].source {source}: {exc}; {FIX}") from None
    names = source_files(source)
    names = [n for n in names if not source_content.reserved(n) and selected(n, model.allow_patterns)]
    if not names:
        raise ActionError(f"[model].source {source}: no file matches allow_patterns {model.allow_patterns}")
    _refuse_past_free_space(f"[model].source {source}", model.dir, _source_sizes(source, names))
    recorded = (_read_manifest(model.dir) or {}).get("source_files")
    copied, entries = copy_files(source, model.dir, names, recorded if isinstance(recorded, dict) else {})
    sizes = {n: e["size"] for n, e in entries.items()}
    manifest = {"repo": model.repo, "revision": model.revision, "commit": None, "files": sizes}
    manifest["source"] = source
    manifest["source_files"] = entries  # stamps and hashes: a same-size edit is seen next time
    if not copied and _read_manifest(model.dir) == manifest:
        return ActionResult(False, f"{model.dir}: all {len(names)} files match {source}")
    _write_manifest(model.dir, manifest)
    return ActionResult(True, f"{model.dir}: copied {len(copied)} of {len(names)} files from {source}")


def _source_sizes(source: str, names: Iterable[str]) -> dict[str, int]:
    sizes = {}
    for name in names:
        with contextlib.suppress(OSError):  # gone since the walk: the copy names it
            sizes[name] = os.stat(os.path.join(source, name)).st_size
    return sizes


def _refuse_past_free_space(origin: str, model_dir: str, sizes: Mapping[str, int]) -> None:
    """The files (name -> size, from the source or the hub's listing) that the model dir does not hold
    at their size must fit the free space of its filesystem, checked before a byte is written. By
    apparent size: a sparse source file (1 TiB of holes in a few blocks) counts whole, so neither its
    copy (which keeps holes) nor its hashing can run for the length of a full disk."""
    need: dict[str, int] = {}
    for name, size in sizes.items():
        try:
            have: int | None = os.stat(original_path(model_dir, name)).st_size
        except OSError:
            have = None
        if have != size:
            need[name] = size
    if (problem := past_free_space(model_dir, need)) is not None:
        raise ActionError(f"{origin}: {problem}: refused, nothing written ({SPACE_FIX})")


def _read_manifest(model_dir: str) -> dict[str, Any] | None:
    try:  # as data: a FIFO or a huge file in its place is no record (and never a hang)
        data = load_json(read_regular(os.path.join(model_dir, MANIFEST), JSON_LIMIT))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_manifest(model_dir: str, manifest: Mapping[str, Any]) -> None:
    ensure_dir(model_dir, 0o755)
    atomic_write(os.path.join(model_dir, MANIFEST), (json.dumps(manifest, indent=2) + "\n").encode())
