"""The loopback hub answers huggingface_hub's real snapshot_download/hf_hub_download like the hub does."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from tests.fakes.hub_server import FakeHub, git_blob_sha1

MiB = 1024 * 1024
WEIGHTS = os.urandom(3 * MiB)
CONFIG = b'{\n  "architectures": ["Toy"],\n  "hidden_size": 64\n}\n'


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as h:
        yield h


def _get(
    hub: FakeHub, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    host, port = hub.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_snapshot_download_gets_every_file_and_lfs_comes_from_the_cdn(hub: FakeHub, tmp_path: Path) -> None:
    files = {"config.json": CONFIG, "model.safetensors": WEIGHTS, "tok/vocab.txt": b"a\nb\n"}
    sha = hub.add_commit("org/toy", files)

    out = snapshot_download("org/toy", local_dir=tmp_path / "m", cache_dir=tmp_path / "c", endpoint=hub.url)

    assert (Path(out) / "config.json").read_bytes() == CONFIG
    assert (Path(out) / "model.safetensors").read_bytes() == WEIGHTS
    assert (Path(out) / "tok" / "vocab.txt").read_bytes() == b"a\nb\n"
    [weights] = hub.downloads("model.safetensors")
    assert weights.server == "cdn" and weights.body_bytes == len(WEIGHTS)
    assert [r.server for r in hub.downloads("config.json")] == ["hub"]
    # Files are fetched at the commit the branch resolved to, never by branch name.
    assert all(f"/resolve/{sha}/" in r.path for r in hub.requests() if "/resolve/" in r.path)


def test_model_info_lists_sizes_blob_ids_and_lfs_sha256(hub: FakeHub) -> None:
    sha = hub.add_commit("org/toy", {"config.json": CONFIG, "model.safetensors": WEIGHTS})

    info = HfApi(endpoint=hub.url).model_info("org/toy", revision="main", files_metadata=True)

    assert info.sha == sha
    sib = {s.rfilename: s for s in info.siblings or []}
    assert sib["config.json"].size == len(CONFIG) and sib["config.json"].blob_id == git_blob_sha1(CONFIG)
    assert sib["config.json"].lfs is None
    lfs = sib["model.safetensors"].lfs
    assert lfs is not None and lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest() and lfs.size == len(WEIGHTS)


def test_a_moved_branch_resolves_to_the_new_commit_and_old_commits_stay(hub: FakeHub, tmp_path: Path) -> None:
    old = hub.add_commit("org/toy", {"config.json": b'{"v": 1}\n'})
    new = hub.add_commit("org/toy", {"config.json": b'{"v": 2}\n'}, ref=None)
    hub.set_ref("org/toy", "main", new)
    hub.set_ref("org/toy", "v1.0", old)
    api = HfApi(endpoint=hub.url)

    assert api.model_info("org/toy", revision="main").sha == new
    assert api.model_info("org/toy", revision="v1.0").sha == old
    path = hf_hub_download("org/toy", "config.json", revision=old, cache_dir=tmp_path, endpoint=hub.url)
    assert Path(path).read_bytes() == b'{"v": 1}\n'


def test_unknown_repo_revision_and_file_raise_the_hubs_errors(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit("org/toy", {"config.json": CONFIG})
    api = HfApi(endpoint=hub.url)

    with pytest.raises(RepositoryNotFoundError):
        api.model_info("org/nope", revision="main")
    with pytest.raises(RevisionNotFoundError):
        api.model_info("org/toy", revision="no-such-branch")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("org/toy", "missing.bin", cache_dir=tmp_path, endpoint=hub.url)


def test_resolve_answers_ranges_with_206_and_content_range(hub: FakeHub) -> None:
    sha = hub.add_commit("org/toy", {"config.json": CONFIG})

    status, headers, body = _get(hub, f"/org/toy/resolve/{sha}/config.json", {"Range": "bytes=2-9"})
    assert (status, body) == (206, CONFIG[2:10])
    assert headers["content-range"] == f"bytes 2-9/{len(CONFIG)}"
    status, headers, _ = _get(hub, f"/org/toy/resolve/{sha}/config.json", {"Range": "bytes=999-"})
    assert status == 416 and headers["content-range"] == f"bytes */{len(CONFIG)}"


def test_head_on_resolve_carries_the_headers_hf_reads(hub: FakeHub) -> None:
    sha = hub.add_commit("org/toy", {"config.json": CONFIG, "model.safetensors": WEIGHTS})

    status, headers, body = _get(hub, "/org/toy/resolve/main/config.json", method="HEAD")
    assert (status, body) == (200, b"")
    assert headers["x-repo-commit"] == sha and headers["etag"] == f'"{git_blob_sha1(CONFIG)}"'
    assert headers["content-length"] == str(len(CONFIG))
    status, headers, _ = _get(hub, "/org/toy/resolve/main/model.safetensors", method="HEAD")
    assert status == 302 and headers["location"].startswith(hub.cdn_url)
    assert headers["x-linked-etag"] == f'"{hashlib.sha256(WEIGHTS).hexdigest()}"'
    assert headers["x-linked-size"] == str(len(WEIGHTS))
    status, headers, _ = _get(hub, "/org/toy/resolve/main/nope.txt", method="HEAD")
    assert status == 404 and headers["x-error-code"] == "EntryNotFound"


def test_a_dropped_connection_is_resumed_by_hf_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    # hf writes in 10 MiB chunks, so only a cut after the first chunk leaves something to resume from.
    big = os.urandom(16 * MiB)
    hub.add_commit("org/toy", {"model.safetensors": big})
    hub.drop_connection("model.safetensors", after_bytes=12 * MiB)

    path = hf_hub_download("org/toy", "model.safetensors", local_dir=tmp_path, endpoint=hub.url)

    assert Path(path).read_bytes() == big
    first, second = hub.downloads("model.safetensors")
    assert first.range is None and first.body_bytes == 12 * MiB
    assert second.range == f"bytes={10 * MiB}-" and second.status == 206
    assert second.body_bytes == len(big) - 10 * MiB


def test_throttle_bounds_the_transfer_rate(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit("org/toy", {"model.safetensors": WEIGHTS})
    hub.throttle_bps = 6 * MiB

    began = time.monotonic()
    hf_hub_download("org/toy", "model.safetensors", local_dir=tmp_path, endpoint=hub.url)

    assert time.monotonic() - began >= 0.45  # 3 MiB at 6 MiB/s


def test_a_size_lie_shows_in_listings_but_not_in_downloads(hub: FakeHub, tmp_path: Path) -> None:
    sha = hub.add_commit("org/toy", {"model.safetensors": WEIGHTS})
    hub.lie_about_size("org/toy", "model.safetensors", 12)

    _, _, body = _get(hub, f"/api/models/org/toy/tree/{sha}?recursive=true")
    assert [e["size"] for e in json.loads(body)] == [12]
    path = hf_hub_download("org/toy", "model.safetensors", local_dir=tmp_path, endpoint=hub.url)
    assert os.path.getsize(path) == len(WEIGHTS)
