"""Resuming the partial files a killed hub download left, from where each one stops.

Called by `actions.model.download` before `snapshot_download`, which would start them from zero.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actions.model_config import git_blob_sha1


def resume_partials(
    repo: str, commit: str, model_dir: str, etags: Mapping[str, str | None], endpoint: str | None, quiet: Any
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
    from reconcile.host import bound_hub_session

    bound_hub_session()  # a least rate for the rest of each file
    for name, etag in etags.items():
        paths = get_local_download_paths(Path(model_dir), name)
        if etag is None or paths.file_path.exists():
            continue
        parts = sorted(partials(model_dir, name, etag), key=lambda p: p.stat().st_size, reverse=True)
        for extra in parts[1:]:
            extra.unlink(missing_ok=True)
        if not parts:
            continue
        part, have = parts[0], parts[0].stat().st_size
        url = hf_hub_url(repo, name, revision=commit, endpoint=endpoint)
        meta = get_hf_file_metadata(url, endpoint=endpoint)
        if have == 0 or meta.etag != etag or meta.size is None or have >= meta.size:
            part.unlink(missing_ok=True)
            continue
        headers = build_hf_headers()
        if meta.location != url:
            headers.pop("authorization", None)  # a CDN gets no token
        with open(part, "ab") as f:
            http_get(
                meta.location, f, resume_size=have, headers=headers, expected_size=meta.size, tqdm_class=quiet
            )
        if not _matches_etag(str(part), etag):
            part.unlink(missing_ok=True)  # the bytes before the kill were bad: snapshot starts afresh
            continue
        os.chmod(part, 0o644)
        os.replace(part, paths.file_path)
        write_download_metadata(Path(model_dir), name, commit, etag)


def partials(model_dir: str, name: str, etag: str) -> list[Path]:
    """huggingface_hub's partial files of `name` at `etag`: the exact names in the exact directory."""
    try:
        from huggingface_hub._local_folder import get_local_download_paths
    except ImportError:
        return []
    paths = get_local_download_paths(Path(model_dir), name)
    stem = paths.incomplete_path(etag).name[: -len("incomplete")]
    folder = paths.metadata_path.parent
    return [folder / n for n in os.listdir(folder) if n.startswith(stem) and n.endswith(".incomplete")]


def _matches_etag(path: str, etag: str) -> bool:
    if len(etag) == 64:  # LFS: the sha256 of the content
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest() == etag
    return len(etag) != 40 or git_blob_sha1(path) == etag
