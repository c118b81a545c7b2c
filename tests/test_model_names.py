"""Names from outside the spec, as a hostile mirror or local user would write them: a hub listing, a
download record, a local source tree. Each is checked as a relative path inside its directory before
any join; a bad one is refused naming the file, and nothing outside the model dir is touched."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions.model import MANIFEST, download
from probes.common import Absent, Invalid
from probes.model import read_model_dir
from reconcile.errors import ActionError
from reconcile.spec.models import Model
from tests.fakes.hub_server import FakeHub

REPO = "org/toy"
CONFIG = b'{"architectures": ["Toy"]}\n'


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def victims(tmp_path: Path) -> dict[Path, bytes]:
    found = {tmp_path / "victim": b"another program's file", tmp_path / "outside" / "abs-victim": b"root's"}
    for path, data in found.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return found


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "control"])
def test_a_hub_listing_with_a_name_outside_the_model_dir_is_refused_and_deletes_nothing(
    hub: FakeHub, tmp_path: Path, kind: str
) -> None:
    kept = victims(tmp_path)
    d = tmp_path / "models" / "toy"
    d.mkdir(parents=True)
    name = {
        "dotdot": "../../victim",
        "absolute": str(tmp_path / "outside" / "abs-victim"),
        "control": "tokenizer\nconfig.json",
    }[kind]
    hub.add_commit(REPO, {"config.json": CONFIG, name: b"a different size from the victim"})

    with pytest.raises(ActionError) as caught:
        download(Model(repo=REPO, dir=str(d)), progress=False)

    message = str(caught.value)
    assert json.dumps(name)[1:-1] in message or repr(name)[1:-1] in message  # names the file
    assert "network" not in message and "\n" not in message
    assert {p: p.read_bytes() for p in kept} == kept
    assert not (d / MANIFEST).exists()


def test_a_download_record_naming_a_file_outside_is_invalid_to_probe_and_offline(tmp_path: Path) -> None:
    kept = victims(tmp_path)
    d = tmp_path / "models" / "toy"
    d.mkdir(parents=True)
    (d / "config.json").write_bytes(CONFIG)
    record = {"repo": REPO, "revision": "main", "commit": "a" * 40, "files": {"../../victim": 22}}
    (d / MANIFEST).write_text(json.dumps(record))

    observed = read_model_dir(str(d), [])

    assert not isinstance(observed, (Invalid, Absent))
    assert isinstance(observed.record, Invalid) and "../../victim" in observed.record.message
    with pytest.raises(ActionError, match=r"\.\./\.\./victim"):
        download(Model(repo=REPO, dir=str(d), offline=True), progress=False)
    assert {p: p.read_bytes() for p in kept} == kept


def source_tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_bytes(CONFIG)
    (src / "tokenizer" / "vocab.txt").write_bytes(b"a\nb\n")
    return src


def test_a_source_symlink_that_leaves_the_source_is_refused_and_nothing_is_copied(tmp_path: Path) -> None:
    secret = tmp_path / "root-only" / "id_rsa"
    secret.parent.mkdir()
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    src = source_tree(tmp_path)
    (src / "tokenizer" / "merges.txt").symlink_to(secret)
    d = tmp_path / "models" / "toy"

    with pytest.raises(ActionError) as caught:
        download(Model(source=str(src), dir=str(d)), progress=False)

    assert "tokenizer/merges.txt" in str(caught.value) and str(secret) in str(caught.value)
    assert not d.exists() or not any(p.is_file() for p in d.rglob("*"))


def test_a_source_directory_symlink_that_leaves_the_source_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "shadow").write_bytes(b"root:x:")
    src = source_tree(tmp_path)
    (src / "extra").symlink_to(outside)

    with pytest.raises(ActionError, match="extra"):
        download(Model(source=str(src), dir=str(tmp_path / "models" / "toy")), progress=False)


def test_a_source_file_named_with_a_newline_is_refused(tmp_path: Path) -> None:
    src = source_tree(tmp_path)
    (src / "evil\nname.json").write_bytes(b"{}")

    with pytest.raises(ActionError, match=r"evil\\nname\.json"):
        download(Model(source=str(src), dir=str(tmp_path / "models" / "toy")), progress=False)


def test_a_symlinked_subdirectory_of_the_model_dir_is_not_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    src = source_tree(tmp_path)
    d = tmp_path / "models" / "toy"
    d.mkdir(parents=True)
    (d / "tokenizer").symlink_to(elsewhere)

    with pytest.raises(ActionError, match="tokenizer"):
        download(Model(source=str(src), dir=str(d)), progress=False)

    assert list(elsewhere.iterdir()) == []


def test_required_files_outside_the_model_dir_are_refused_by_the_spec() -> None:
    from pydantic import ValidationError

    for name in ("../../etc/shadow", "/etc/shadow", "/srv/models/toy/../x", "a/./b"):
        with pytest.raises(ValidationError, match="relative path inside"):
            Model(dir="/srv/models/toy", required_files=[name])
    names = ["plugin/x.py", "/srv/models/toy/y.py"]  # absolute: under the model dir
    assert Model(dir="/srv/models/toy", required_files=names).required_files == names


def test_a_hugging_face_cache_snapshot_still_copies(tmp_path: Path) -> None:
    # Its files are symlinks into ../../blobs: outside the snapshot, inside the repo's cache folder.
    repo = tmp_path / "models--org--toy"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "1").write_bytes(CONFIG)
    (snap / "config.json").symlink_to(os.path.relpath(blobs / "1", snap))

    download(Model(source=str(snap), dir=str(tmp_path / "models" / "toy")), progress=False)

    assert (tmp_path / "models" / "toy" / "config.json").read_bytes() == CONFIG
