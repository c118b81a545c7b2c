"""actions.model.download against the loopback hub (real huggingface_hub, real files, real kill -9)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions.model import MANIFEST, download, resolve_revision
from actions.model_config import patch_config
from reconcile.errors import ActionError
from reconcile.spec.models import Model
from tests.fakes.hub_server import FakeHub

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
REPO = "org/toy"
WEIGHTS = os.urandom(2 * MiB)
CONFIG = b'{\n  "architectures": ["Toy"],\n  "max_position_embeddings": 4096\n}\n'
FILES = {"config.json": CONFIG, "model.safetensors": WEIGHTS, "tokenizer/vocab.txt": b"a\nb\n"}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def _files(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in d.rglob("*")
        if p.is_file() and ".cache" not in p.parts and p.name != MANIFEST
    }


def _manifest(d: Path) -> dict[str, object]:
    data = json.loads((d / MANIFEST).read_text())
    assert isinstance(data, dict)
    return data


def test_download_fetches_the_resolved_commit_and_records_it(hub: FakeHub, tmp_path: Path) -> None:
    sha = hub.add_commit(REPO, FILES)
    d = tmp_path / "model"

    result = download(Model(repo=REPO, dir=str(d)), progress=False)

    assert result.changed and sha[:12] in result.message
    assert _files(d) == FILES
    assert _manifest(d) == {
        "repo": REPO,
        "revision": "main",
        "commit": sha,
        "files": {"config.json": len(CONFIG), "model.safetensors": len(WEIGHTS), "tokenizer/vocab.txt": 4},
    }


def test_download_twice_fetches_nothing_the_second_time(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    model = Model(repo=REPO, dir=str(tmp_path / "model"))
    download(model, progress=False)
    hub.clear_log()

    again = download(model, progress=False)

    assert not again.changed and "all 3 files present" in again.message
    assert hub.downloads() == []
    assert [r.method for r in hub.requests() if "/resolve/" in r.path] == []


def test_allow_patterns_limit_what_is_fetched_and_recorded(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    d = tmp_path / "model"

    download(Model(repo=REPO, dir=str(d), allow_patterns=["*.json", "tokenizer/"]), progress=False)

    assert sorted(_files(d)) == ["config.json", "tokenizer/vocab.txt"]
    assert hub.downloads("model.safetensors") == []
    assert sorted(_manifest(d)["files"]) == ["config.json", "tokenizer/vocab.txt"]  # type: ignore[call-overload]


def test_a_pinned_commit_wins_over_a_branch_that_moved(hub: FakeHub, tmp_path: Path) -> None:
    pinned = hub.add_commit(REPO, FILES)
    newer = {"config.json": b'{"architectures": ["Toy2"]}\n', "model.safetensors": os.urandom(1000)}
    moved = hub.add_commit(REPO, newer)
    d = tmp_path / "model"

    download(Model(repo=REPO, revision=pinned, dir=str(d)), progress=False)

    assert resolve_revision(REPO, "main") == moved
    assert _files(d) == FILES
    assert _manifest(d)["commit"] == pinned
    assert all(f"/resolve/{pinned}/" in r.path for r in hub.requests() if "/resolve/" in r.path)


def test_resolve_revision_follows_branches_and_tags_at_a_given_endpoint() -> None:
    with FakeHub() as other:  # not the one HF_ENDPOINT names: the endpoint argument wins
        old = other.add_commit(REPO, FILES)
        new = other.add_commit(REPO, {"config.json": b"{}"})
        other.set_ref(REPO, "v1", old)

        assert resolve_revision(REPO, "main", endpoint=other.url) == new
        assert resolve_revision(REPO, "v1", endpoint=other.url) == old
        with pytest.raises(ActionError, match=r"no revision 'v2'"):
            resolve_revision(REPO, "v2", endpoint=other.url)


def test_a_branch_that_moved_brings_its_new_commit(hub: FakeHub, tmp_path: Path) -> None:
    first = hub.add_commit(REPO, FILES)
    d = tmp_path / "model"

    download(Model(repo=REPO, dir=str(d)), progress=False)
    second = hub.add_commit(REPO, {**FILES, "config.json": b'{"v": 2}\n'})
    result = download(Model(repo=REPO, dir=str(d)), progress=False)

    assert first != second and result.changed
    assert (d / "config.json").read_bytes() == b'{"v": 2}\n'
    assert _manifest(d)["commit"] == second
    resolves = [r.path for r in hub.requests() if "/resolve/" in r.path]
    assert resolves and all(f"/resolve/{first}/" in p or f"/resolve/{second}/" in p for p in resolves)


def test_a_damaged_file_is_fetched_again_and_only_it(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    d = tmp_path / "model"
    download(Model(repo=REPO, dir=str(d)), progress=False)
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    hub.clear_log()

    result = download(Model(repo=REPO, dir=str(d)), progress=False)

    assert result.changed
    assert (d / "model.safetensors").read_bytes() == WEIGHTS
    assert [r.filename for r in hub.downloads()] == ["model.safetensors"]


def test_pinning_the_commit_already_there_only_rewrites_the_record(hub: FakeHub, tmp_path: Path) -> None:
    sha = hub.add_commit(REPO, FILES)
    d = tmp_path / "model"
    download(Model(repo=REPO, dir=str(d)), progress=False)
    hub.clear_log()

    result = download(Model(repo=REPO, revision=sha, dir=str(d)), progress=False)

    assert result.changed and "files already there, recorded" in result.message
    assert hub.downloads() == []
    assert _manifest(d)["revision"] == sha and _manifest(d)["commit"] == sha


def test_progress_is_drawn_only_when_asked(
    hub: FakeHub, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    hub.add_commit(REPO, FILES)

    download(Model(repo=REPO, dir=str(tmp_path / "quiet")), progress=False)
    quiet = capfd.readouterr()
    download(Model(repo=REPO, dir=str(tmp_path / "loud")), progress=True)
    loud = capfd.readouterr()

    assert quiet.err == "" and quiet.out == ""
    assert "Fetching 3 files" in loud.err


def test_a_download_killed_half_way_resumes_from_where_it_stopped(hub: FakeHub, tmp_path: Path) -> None:
    big = os.urandom(20 * MiB)  # huggingface_hub writes 10 MiB chunks: the kill must land after the first
    hub.add_commit(REPO, {"config.json": CONFIG, "model.safetensors": big})
    hub.throttle_bps = 8 * MiB
    d = tmp_path / "model"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from reconcile.spec.models import Model; from actions.model import "
            "download; download(Model(repo=sys.argv[1], dir=sys.argv[2]), progress=False)",
            REPO,
            str(d),
        ],
        cwd=ROOT,
        env={**os.environ, "HF_ENDPOINT": hub.url},
    )
    partial = None
    deadline = time.monotonic() + 30
    while partial is None and time.monotonic() < deadline and child.poll() is None:
        for p in d.glob(".cache/huggingface/download/*.incomplete"):
            if p.stat().st_size >= 10 * MiB:
                partial = p
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    assert partial is not None and not (d / "model.safetensors").exists()
    have = partial.stat().st_size
    assert 0 < have < len(big)
    hub.throttle_bps = None
    hub.clear_log()

    result = download(Model(repo=REPO, dir=str(d)), progress=False)

    assert result.changed
    assert (d / "model.safetensors").read_bytes() == big
    [rest] = hub.downloads("model.safetensors")
    assert rest.range == f"bytes={have}-" and rest.body_bytes == len(big) - have
    assert list(d.rglob("*.incomplete")) == []


def test_a_file_whose_size_differs_from_the_hubs_list_is_named(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    hub.lie_about_size(REPO, "model.safetensors", len(WEIGHTS) + 1)
    d = tmp_path / "model"

    with pytest.raises(ActionError, match=r"model\.safetensors is 2097152 bytes, the list says 2097153"):
        download(Model(repo=REPO, dir=str(d)), progress=False)
    assert not (d / MANIFEST).exists()


def test_offline_never_contacts_the_hub_and_names_a_missing_file(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    d = tmp_path / "model"
    download(Model(repo=REPO, dir=str(d)), progress=False)
    hub.clear_log()
    offline = Model(repo=REPO, dir=str(d), offline=True)

    ok = download(offline, progress=False)
    (d / "tokenizer" / "vocab.txt").unlink()
    with pytest.raises(ActionError, match=r"tokenizer/vocab\.txt missing"):
        download(offline, progress=False)

    assert not ok.changed and "all 3 recorded files present" in ok.message
    assert hub.requests() == []


def test_offline_without_a_manifest_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ActionError, match=r"\.reconcile-model\.json is missing.*offline = false"):
        download(Model(repo=REPO, dir=str(tmp_path), offline=True), progress=False)


def test_a_missing_repo_or_revision_is_a_permanent_error_with_the_fix(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)

    with pytest.raises(ActionError, match=r"org/nope: no such repo"):
        download(Model(repo="org/nope", dir=str(tmp_path)), progress=False)
    with pytest.raises(ActionError, match=r"no revision 'v9'"):
        download(Model(repo=REPO, revision="v9", dir=str(tmp_path)), progress=False)
    assert len(hub.requests()) == 2  # permanent: asked once each, no retries


def test_an_unreachable_hub_is_retried_then_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeHub() as gone:
        url = gone.url
    monkeypatch.setenv("HF_ENDPOINT", url)

    with pytest.raises(ActionError, match=r"failed 3 times.*offline = true"):
        download(Model(repo=REPO, dir=str(tmp_path)), progress=False)


def test_a_patched_config_is_not_downloaded_again(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    d = tmp_path / "model"
    model = Model(repo=REPO, dir=str(d))
    download(model, progress=False)
    patch_config(str(d), {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    patched = (d / "config.json").read_bytes()
    hub.clear_log()

    again = download(model, progress=False)

    assert not again.changed
    assert (d / "config.json").read_bytes() == patched
    assert hub.downloads() == []


def test_a_new_upstream_config_replaces_the_stale_backup(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, FILES)
    d = tmp_path / "model"
    download(Model(repo=REPO, dir=str(d)), progress=False)
    patch = {"rope_parameters": {"rope_type": "yarn"}}
    patch_config(str(d), patch)
    upstream = b'{\n  "architectures": ["Toy"],\n  "max_position_embeddings": 8192\n}\n'
    hub.add_commit(REPO, {**FILES, "config.json": upstream})

    download(Model(repo=REPO, dir=str(d)), progress=False)
    assert (d / "config.json").read_bytes() == upstream and not (d / "config.json.bak").exists()
    patch_config(str(d), patch)

    assert (d / "config.json.bak").read_bytes() == upstream
    assert json.loads((d / "config.json").read_bytes()) == {
        "architectures": ["Toy"],
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "yarn"},
    }


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for name, data in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / ".cache" / "huggingface").mkdir(parents=True)
    (src / ".cache" / "huggingface" / "junk.metadata").write_text("x")
    return src


def test_a_local_source_is_copied_with_its_mtimes_and_recorded(tmp_path: Path) -> None:
    src, d = _source(tmp_path), tmp_path / "model"

    result = download(Model(source=str(src), dir=str(d)), progress=False)

    assert result.changed and "copied 3 of 3" in result.message
    assert _files(d) == FILES
    assert int(os.stat(d / "model.safetensors").st_mtime) == int(os.stat(src / "model.safetensors").st_mtime)
    manifest = _manifest(d)
    assert manifest["commit"] is None and manifest["source"] == str(src)
    assert manifest["files"] == {n: len(b) for n, b in FILES.items()}
    assert set(manifest) == {"repo", "revision", "commit", "files", "source", "source_files"}
    entry = manifest["source_files"]["model.safetensors"]  # what a later plan compares by content
    st = os.stat(src / "model.safetensors")
    assert entry == {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ino": st.st_ino,
        "ctime_ns": st.st_ctime_ns,
        "sha256": hashlib.sha256(FILES["model.safetensors"]).hexdigest(),
    }


def test_copying_a_local_source_twice_touches_nothing(tmp_path: Path) -> None:
    src, d = _source(tmp_path), tmp_path / "model"
    model = Model(source=str(src), dir=str(d), allow_patterns=["*.json", "*.safetensors"])
    download(model, progress=False)
    names = ("config.json", "model.safetensors")
    before = {p: (os.stat(d / p).st_mtime_ns, os.stat(d / p).st_ino) for p in names}

    again = download(model, progress=False)

    assert not again.changed and "all 2 files match" in again.message
    assert {p: (os.stat(d / p).st_mtime_ns, os.stat(d / p).st_ino) for p in before} == before
    assert not (d / "tokenizer").exists()


def test_a_changed_source_file_is_copied_again(tmp_path: Path) -> None:
    src, d = _source(tmp_path), tmp_path / "model"
    model = Model(source=str(src), dir=str(d))
    download(model, progress=False)
    (src / "tokenizer" / "vocab.txt").write_bytes(b"a\nb\nc\n")

    result = download(model, progress=False)

    assert result.changed and "copied 1 of 3" in result.message
    assert (d / "tokenizer" / "vocab.txt").read_bytes() == b"a\nb\nc\n"
    assert _manifest(d)["files"] == {**{n: len(b) for n, b in FILES.items()}, "tokenizer/vocab.txt": 6}


def test_a_source_of_symlinks_is_copied_as_files(tmp_path: Path) -> None:
    # A huggingface_hub cache snapshot: every file is a symlink into blobs/.
    blobs, snap, d = tmp_path / "blobs", tmp_path / "snapshots" / "abc", tmp_path / "model"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for i, (name, data) in enumerate(sorted(FILES.items())):
        (blobs / str(i)).write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(blobs / str(i))

    download(Model(source=str(snap), dir=str(d)), progress=False)

    assert _files(d) == FILES
    assert not any(p.is_symlink() for p in d.rglob("*"))


def test_a_hub_listing_bigger_than_the_free_space_is_refused_before_a_byte_is_fetched(
    hub: FakeHub, tmp_path: Path
) -> None:
    # Issue 24: the listing bounds the download; old code fetched (and, served for real, filled the disk)
    st = os.statvfs(tmp_path)
    hub.add_commit(REPO, FILES)
    hub.lie_about_size(REPO, "model.safetensors", st.f_bavail * st.f_frsize + (1 << 30))
    d = tmp_path / "model"

    refused = r"the files to write are .* \(model\.safetensors: .*\), more than the"
    with pytest.raises(ActionError, match=refused):
        download(Model(repo=REPO, dir=str(d)), progress=False)
    assert not d.exists() or not any(d.rglob("*.safetensors*"))
