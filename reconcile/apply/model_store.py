"""Models in the store: each model's files kept once by content in huggingface_hub's cache layout
(`<store>/hub/models--org--name/blobs/<sha256>`, `snapshots/<id>/<file>` links to the blobs, `refs/`),
and each generation's model a realization `<store>/<hash>-model` of (hub commit or local source
content, `config.json` patch): hard links to those blobs plus its own patched `config.json`.

A local source's snapshot id is a hash of its content (its files' names and sha256), as a hub
commit names a hub snapshot. Called by reconcile.apply.store.realize (the realization's path, at
spec loading: no huggingface_hub import there), reconcile.apply.realization (sealing a converged
one) and reconcile.apply.gc (snapshots and blobs no kept realization holds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat

from reconcile.safety.filesafety import TREE_UMASK, UnsafePath, data_root, ensure_dir, open_dir, umask
from reconcile.safety.shapes import is_commit
from reconcile.safety.untrusted import (
    JSON_LIMIT,
    SOURCE_ENTRIES,
    load_json,
    open_regular,
    read_regular,
    sha256_fd,
    walk_tree,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from typing import Any, TypeVar

    T = TypeVar("T")

    from reconcile.spec.models import Model

HUB = "hub"  # <store>/hub: a huggingface_hub cache dir (HF_HUB_CACHE layout)
SEAL = ".reconcile-realization.json"  # as in a venv realization: written once, when it converged
RECORD = ".reconcile-model.json"  # the model action's download record (probes.model reads it)
BACKUP = "config.json.bak"
FORMAT = "reconcile-model-realization/1"


def content_id(files: Mapping[str, str]) -> str:
    """A snapshot id for content (name -> sha256): 40 hex digits, like the commit that names a hub one."""
    text = json.dumps(sorted(files.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _read_json(path: str) -> dict[str, Any]:
    try:  # data: a FIFO or a huge file there is no record
        data = load_json(read_regular(path, JSON_LIMIT))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Unsized(OSError):
    """The source does not fit where its realization would be copied: it is not hashed (a sparse
    file of a terabyte of holes would hash for hours); the planner names it, apply refuses it."""


def source_content(
    source: str, patterns: list[str], known: Mapping[str, Any], store: str | None = None
) -> dict[str, str]:
    """name -> sha256 of each file the copy takes from `source`. A file whose stamp (size, mtime,
    inode, ctime) is the one `known` (the current realization's copy record) or this user's hash cache
    recorded is not hashed again. NotRegular (an OSError) names a FIFO; Unsized when the files to
    hash do not fit the store's free space."""
    from reconcile import private_cache
    from reconcile.safety.source_content import reserved, same_stamp, selected, sha256_file
    from reconcile.safety.untrusted import past_free_space, tree_stat

    entries = []
    for root, dirs, names in walk_tree(source, SOURCE_ENTRIES):  # as probes.model_source walks it
        dirs[:] = sorted(d for d in dirs if d != ".cache")
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, source).replace(os.sep, "/")
            if reserved(rel) or (patterns and not selected(rel, patterns)):
                continue
            st = tree_stat(path, source, rel)  # NotRegular: a FIFO (never opened), a link out of it
            entries.append((rel, path, st))
    cache_file = os.path.join(
        private_cache.cache_root(), "source-hashes", hashlib.sha256(source.encode()).hexdigest()[:32]
    )
    cached = private_cache.read(cache_file)
    cached = cached if isinstance(cached, dict) else {}

    def stamped(rel: str, st: os.stat_result) -> str | None:
        for entry in (known.get(rel), cached.get(rel)):
            if isinstance(entry, dict) and same_stamp(entry, st) and isinstance(entry.get("sha256"), str):
                return str(entry["sha256"])
        return None

    todo = {rel: st.st_size for rel, _path, st in entries if stamped(rel, st) is None}
    if store is not None and (problem := past_free_space(store, todo)) is not None:
        raise Unsized(problem)
    out, fresh = {}, {}
    for rel, path, st in entries:
        digest = stamped(rel, st)
        if digest is None:
            digest = sha256_file(path, source)
            fresh[rel] = {
                "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                "ctime_ns": st.st_ctime_ns, "sha256": digest,
            }  # fmt: skip
        out[rel] = digest
    if fresh:
        private_cache.write(cache_file, {**cached, **fresh})
    return out


def model_inputs(model: Model, store: str | None = None) -> dict[str, Any]:
    """What a model realization is addressed by."""
    if model.source and not model.repo:
        # Stamps of the current realization's copy (`[model] dir` links to it): unchanged files unhashed.
        current = os.path.realpath(model.dir)
        known = _read_json(os.path.join(current, RECORD)).get("source_files")
        try:
            stamps = known if isinstance(known, dict) else {}
            source = data_root(model.source)  # no link on the way from another user's directory
            origin: dict[str, Any] = {
                "source": content_id(source_content(source, list(model.allow_patterns), stamps, store))
            }
        except (OSError, UnsafePath):
            # A FIFO in it, a source not there, one too big: no content to address. An address of its
            # own that is never made (apply refuses first), so the planner names what is wrong.
            origin = {"unusable source": model.source}
    else:
        origin = {"repo": model.repo, "revision": model.revision}
    return {"origin": origin, "config": model.config, "allow_patterns": sorted(model.allow_patterns)}


def model_realization_path(model: Model, store: str) -> str | None:
    if model.offline:
        return None  # the files are put in place by hand: used where they are
    inputs = model_inputs(model, store)
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return os.path.join(store, hashlib.sha256(text.encode()).hexdigest()[:32] + "-model")


def read_seal(path: str) -> dict[str, Any] | None:
    data = _read_json(os.path.join(path, SEAL))
    return data if data.get("format") == FORMAT else None


def repo_folder(model: Model) -> str:
    """huggingface_hub's folder name: models--org--name (a local source: models--local--<its dir's name>)."""
    from huggingface_hub.file_download import repo_folder_name

    repo = model.repo or "local/" + re.sub(
        r"[^\w.-]", "-", os.path.basename(os.path.normpath(model.source or "x"))
    )
    return repo_folder_name(repo_id=repo, repo_type="model")


def _sha256(path: str) -> str:
    fd, st = open_regular(path)
    try:
        return sha256_fd(fd, st.st_size)
    finally:
        os.close(fd)


def _link_over(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Make dst (in dst_dir) a hard link to src (in src_dir): a new link beside it, renamed over it."""
    tmp = f".{dst}.reconcile-link.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dst_dir)
    os.link(src, tmp, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    os.replace(tmp, dst, src_dir_fd=dst_dir, dst_dir_fd=dst_dir)


def seal_model(store: str, path: str, model: Model) -> int:
    """Keep a converged model realization's files by content: each becomes a hard link to its blob
    (the blob made from it when new), the snapshot links to the blobs, and the seal is written. Its own
    `config.json` (patched) stays its own. Returns the bytes now shared with blobs older ones held."""
    if read_seal(path) is not None:
        return 0
    record = _read_json(os.path.join(path, RECORD))
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return 0
    known = record.get("source_files") if isinstance(record.get("source_files"), dict) else {}
    patched = os.path.isfile(os.path.join(path, BACKUP))
    folder = repo_folder(model)
    repo_root = os.path.join(store, HUB, folder)
    blobs = os.path.join(repo_root, "blobs")
    digests: dict[str, str] = {}
    shared = 0
    commit = record.get("commit")
    fetched = os.path.join(repo_root, "snapshots", str(commit))
    if model.repo and is_commit(commit) and os.path.isdir(fetched):
        # snapshot_download(cache_dir=<store>/hub) made the snapshot and its blobs (named by the hub's
        # etag) and actions.model linked the realization to them: only the seal is left to write.
        for rel in sorted(files):
            with contextlib.suppress(OSError):
                digests[rel] = os.path.basename(os.readlink(os.path.join(fetched, rel)))
        _write_ref(repo_root, model, commit)
        _write_seal(path, folder, commit, digests)
        return 0
    with umask(TREE_UMASK):
        ensure_dir(blobs, 0o755)
        blobs_fd = open_dir(blobs)
        try:
            for rel in sorted(files):
                # The original bytes: a patched config.json's are in its backup.
                name = BACKUP if rel == "config.json" and patched else rel
                full = os.path.join(path, name)
                entry = known.get(rel) if isinstance(known, dict) else None
                sha = (
                    str(entry["sha256"]) if isinstance(entry, dict) and entry.get("sha256") else _sha256(full)
                )
                digests[rel] = sha
                directory, base = os.path.split(full)
                dfd = open_dir(directory)
                try:
                    st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    try:
                        bst = os.stat(sha, dir_fd=blobs_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        _link_over(dfd, base, blobs_fd, sha)  # a new blob: this file's inode
                        continue
                    same_mode = stat.S_IMODE(bst.st_mode) == stat.S_IMODE(st.st_mode)  # one inode, one mode
                    if (
                        (bst.st_dev, bst.st_ino) != (st.st_dev, st.st_ino)
                        and bst.st_size == st.st_size
                        and same_mode
                    ):
                        _link_over(blobs_fd, sha, dfd, base)
                        shared += st.st_blocks * 512
                finally:
                    os.close(dfd)
        finally:
            os.close(blobs_fd)
        snapshot = commit if is_commit(commit) else content_id(digests)
        _snapshot_links(repo_root, snapshot, digests)
        _write_ref(repo_root, model, snapshot)
        _write_seal(path, folder, snapshot, digests)
    return shared


def _write_ref(repo_root: str, model: Model, commit: str) -> None:
    """refs/<branch or tag> = the commit it resolved to, as huggingface_hub records it."""
    from reconcile.safety.names import name_problem

    if model.repo and not is_commit(model.revision) and name_problem(model.revision) is None:
        from reconcile.host import atomic_write

        with umask(TREE_UMASK):
            ref = os.path.join(repo_root, "refs", model.revision)
            ensure_dir(os.path.dirname(ref), 0o755)
            atomic_write(ref, commit.encode(), mode=0o644)


def _write_seal(path: str, folder: str, snapshot: str, digests: Mapping[str, str]) -> None:
    from reconcile.host import atomic_write

    config = os.path.join(path, "config.json")
    body = {
        "format": FORMAT,
        "repo_folder": folder,
        "snapshot": snapshot,
        "files": dict(digests),  # name -> its blob's name
        "config_json": _sha256(config) if os.path.isfile(config) else None,  # its own, patched
    }
    atomic_write(os.path.join(path, SEAL), (json.dumps(body, indent=2) + "\n").encode(), mode=0o644)


def _snapshot_links(repo_root: str, snapshot: str, digests: Mapping[str, str]) -> None:
    """snapshots/<id>/<name> -> ../../blobs/<sha256>, relative, as huggingface_hub makes them."""
    snap = os.path.join(repo_root, "snapshots", snapshot)
    for rel, sha in sorted(digests.items()):
        link = os.path.join(snap, rel)
        directory = os.path.dirname(link)
        ensure_dir(directory, 0o755)
        target = os.path.relpath(os.path.join(repo_root, "blobs", sha), directory)
        fd = open_dir(directory)
        try:
            base = os.path.basename(link)
            with contextlib.suppress(FileExistsError):
                os.symlink(target, base, dir_fd=fd)
        finally:
            os.close(fd)


def referenced_snapshots(realizations: Collection[str]) -> set[tuple[str, str]]:
    """(repo folder, snapshot id) of each sealed model realization in `realizations`."""
    out = set()
    for path in realizations:
        seal = read_seal(path)
        if seal is not None:
            out.add((str(seal.get("repo_folder")), str(seal.get("snapshot"))))
    return out


def collect_snapshots(store: str, keep: set[tuple[str, str]]) -> list[str]:
    """Remove the snapshots no kept realization holds, and the blobs only they held, as
    huggingface_hub's own cache cleaning decides (scan_cache_dir + delete_revisions); the removal is
    ours, by descriptor, inside `<store>/hub` only. Returns what was removed."""
    hub = os.path.join(store, HUB)
    try:
        fd = open_dir(hub)  # the trust walk first: a hub dir behind another user's link is never scanned
    except FileNotFoundError:
        return []
    os.close(fd)
    from huggingface_hub import scan_cache_dir

    info = _deep(lambda: scan_cache_dir(hub))
    doomed = [
        rev.commit_hash
        for repo in info.repos
        for rev in repo.revisions
        if (repo.repo_path.name, rev.commit_hash) not in keep
    ]
    if not doomed:
        return []
    strategy = info.delete_revisions(*doomed)
    removed = []
    for p in sorted(
        {*strategy.snapshots, *strategy.blobs, *strategy.refs, *strategy.repos}, key=str, reverse=True
    ):
        if _remove_inside(hub, str(p)):
            removed.append(str(p))
    return removed


DEEP_RECURSION = 20_000  # frames: a snapshot nested to PATH_MAX (~2,000 levels), a few frames a level
DEEP_STACK = 512 << 20  # bytes of the thread's C stack for that recursion


def _deep(call: Callable[[], T]) -> T:
    """`call()` where a tree nested to PATH_MAX fits its recursion: huggingface_hub's scan globs `**/*`,
    which Python 3.11's pathlib walks a frame or two a level, and a snapshot is as deep as the source
    it was copied from (another user's tree: round 2 copies 1,100 levels). In a thread of its own
    with a large stack, the recursion limit raised for the call (gc runs nothing else meanwhile)."""
    import sys
    import threading

    from reconcile.host import in_thread

    limit, stack = sys.getrecursionlimit(), threading.stack_size(DEEP_STACK)
    sys.setrecursionlimit(max(limit, DEEP_RECURSION))
    try:
        _done, value = in_thread(call, "hub-scan")  # no timeout: it ends
    finally:
        threading.stack_size(stack)
        sys.setrecursionlimit(limit)
    return value  # type: ignore[return-value]


def _remove_inside(hub: str, path: str) -> bool:
    rel = os.path.relpath(path, hub)
    if rel.startswith("..") or os.path.isabs(rel) or rel == ".":
        return False
    directory, name = os.path.split(path)
    try:
        fd = open_dir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            from reconcile.safety.filesafety import remove_tree_at

            os.rename(name, f".gc-{name}", src_dir_fd=fd, dst_dir_fd=fd)
            remove_tree_at(fd, f".gc-{name}")  # by the walked directory's descriptor, no recursion
        else:
            os.unlink(name, dir_fd=fd)
        return True
    finally:
        os.close(fd)


def blob_paths(store: str) -> list[str]:
    """Every blob under `<store>/hub`, listed through the trust walk (for tests and `du`)."""
    out = []
    hub = os.path.join(store, HUB)
    for directory, dirs, names in walk_tree(hub):
        dirs.sort()
        if os.path.basename(directory) == "blobs":
            out += [os.path.join(directory, n) for n in sorted(names)]
    return out
