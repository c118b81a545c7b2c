"""The hub's file sizes of a model revision: one metadata call, cached on disk, pinned to the commit.

Called by the preflight inputs only while the model is not on disk yet, so that the memory check can
count the weights before they are downloaded. Read only: it never downloads a file. A converged plan
never gets here (the files are on disk), and an offline one answers from the cache or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Mapping

from probes.common import Unavailable
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.display import shown

_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
BRANCH_TTL_S = 24 * 3600  # a branch's listing is asked again after a day; a commit's never
FAILED_TTL_S = 15 * 60  # after a failed call, plans from a timer do not wait on the hub again for this
TIMEOUT_S = 10.0  # huggingface_hub's, for each read
DEADLINE_S = 30.0  # for the whole listing (reconcile.host.hub_api_call): a plan does not wait longer


class HubListing(Record):
    repo: str
    revision: str
    commit: str
    sizes: Mapping[str, int]  # file name -> bytes (LFS files: the object's size, not the pointer's)
    cached: bool  # answered from the cache, no request made


_ASKED_AGAIN = "the hub is asked again"


def cache_path(cache_dir: str, repo: str, revision: str) -> str:
    """`<cache_dir>/<owner>__<name>/<revision>.json`; names that could escape the dir are refused."""
    for part in (*repo.split("/"), revision):
        if not part or part in (".", "..") or not re.fullmatch(r"[A-Za-z0-9._-]+", part):
            raise ValueError(f"not a plain repo id or revision: {repo}@{revision}")
    return os.path.join(cache_dir, repo.replace("/", "__"), f"{revision}.json")


def _read_cache(path: str, revision: str) -> HubListing | None:
    """The cached listing, by the state files' one reader (a FIFO, a link, a huge or damaged file there
    is moved aside with one line, never waited on)."""
    got = statefiles.read_hub_listing(path)
    if got is None:
        return None
    data, mtime = got
    if not (_COMMIT.match(revision) or time.time() - mtime < BRANCH_TTL_S):
        return None
    return HubListing(str(data.get("repo")), revision, data["commit"], dict(data["sizes"]), cached=True)


def _recent_failure(path: str) -> str | None:
    got = statefiles.read_hub_note(path + ".failed")
    if got is None or time.time() - got[1] >= FAILED_TTL_S:
        return None
    return shown(got[0].strip(), 300) + " (asked less than 15 minutes ago)"


def _write_private(path: str, text: str) -> None:
    """Best effort, 0600 in 0700 dirs, atomically: a plan run by a user who cannot write the state
    dir still works."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


def _write_cache(path: str, found: HubListing) -> None:
    """Cached only when its reader (statefiles.read_hub_listing) takes it back as written."""
    data = {"repo": found.repo, "revision": found.revision, "commit": found.commit, "sizes": found.sizes}
    raw = json.dumps(data)
    if statefiles.unreadable(
        raw.encode(), max_bytes=statefiles.HUB_LISTING_MAX, shape=statefiles.HUB_LISTING
    ):
        return  # not cached: asked again next time, never written to be moved aside
    _write_private(path, raw)
    with contextlib.suppress(OSError):
        os.unlink(path + ".failed")


def listing(
    repo: str, revision: str, cache_dir: str, *, offline: bool, endpoint: str | None = None
) -> HubListing | Unavailable:
    """The sizes of every file of repo@revision: from the cache, else one `model_info` call (not when
    offline). Unavailable (with the reason) when neither answers."""
    try:
        path = cache_path(cache_dir, repo, revision)
    except ValueError as exc:
        return Unavailable(str(exc))
    for directory in (cache_dir, os.path.dirname(path)):  # a FIFO, file, link there: aside, not followed
        with contextlib.suppress(OSError):  # a plan by a user who cannot read the state dir: no cache
            statefiles.clear_non_dir(directory, then=_ASKED_AGAIN)
    cached = _read_cache(path, revision)
    if cached is not None:
        return cached
    if offline:
        return Unavailable(f"offline, and no cached listing of {repo}@{revision}")
    failed = _recent_failure(path)
    if failed is not None:
        return Unavailable(failed)
    from huggingface_hub import HfApi

    from reconcile.host import hub_api_call

    api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None)
    try:
        info = hub_api_call(
            lambda: api.model_info(repo, revision=revision, files_metadata=True, timeout=TIMEOUT_S),
            str(api.endpoint),
            DEADLINE_S,
        )
    except Exception as exc:  # huggingface_hub's errors (network, 401, 404) carry the hub's answer
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        reason = f"the hub did not list {repo}@{revision}: {shown(first, 200)}"
        _write_private(path + ".failed", reason)
        return Unavailable(reason)
    if not info.sha or not _COMMIT.match(info.sha):
        return Unavailable(f"the hub answered without a commit for {repo}@{revision}")
    from reconcile.safety.shapes import listed_size

    sizes: dict[str, int] = {}
    for s in info.siblings or []:
        raw = s.lfs.size if s.lfs is not None else s.size
        size = listed_size(raw)
        if size is None:
            return Unavailable(
                f"the hub's listing of {repo}@{revision} gives {shown(str(s.rfilename), 200)} "
                f"a size that is not a size ({shown(repr(raw), 100)}): not used"
            )
        sizes[s.rfilename] = size
    found = HubListing(repo, revision, info.sha, sizes, cached=False)
    _write_cache(path, found)
    if revision != info.sha:
        _write_cache(cache_path(cache_dir, repo, info.sha), found)
    return found
