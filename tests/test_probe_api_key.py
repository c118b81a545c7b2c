"""Key-file probe: real files with real modes and owners (we are root), and a FIFO that would hang
any probe that opened the file."""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest

from probes import api_key
from probes.common import Absent
from reconcile.spec.models import Spec
from tests.records_support import same

SECRET = "sk-reconcile-test-9f8e7d6c5b4a"


def spec_for(path: Path) -> Spec:
    return Spec.model_validate({"api_key": {"file": str(path)}})


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "vllm-api.key"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def test_no_api_key_section_probes_nothing() -> None:
    assert api_key.probe(Spec()) is None


def test_absent_key_file(tmp_path: Path) -> None:
    assert same(api_key.probe(spec_for(tmp_path / "vllm-api.key")), Absent(str(tmp_path / "vllm-api.key")))


def test_key_file_facts_and_never_its_content(key_file: Path) -> None:
    result = api_key.probe(spec_for(key_file))
    assert isinstance(result, api_key.FileFacts)
    me = pwd.getpwuid(os.getuid())
    assert (result.kind, result.mode, result.uid, result.owner) == ("file", "0600", me.pw_uid, me.pw_name)
    assert result.size == len(SECRET) + 1 and result.non_empty
    assert SECRET not in repr(result)


def test_mode_change_is_seen(key_file: Path) -> None:
    key_file.chmod(0o644)
    result = api_key.probe(spec_for(key_file))
    assert isinstance(result, api_key.FileFacts) and result.mode == "0644"


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_owner_and_group_names_after_chown(key_file: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    os.chown(key_file, nobody.pw_uid, nobody.pw_gid)
    result = api_key.probe(spec_for(key_file))
    assert isinstance(result, api_key.FileFacts)
    assert (result.uid, result.owner) == (nobody.pw_uid, "nobody")
    assert result.gid == nobody.pw_gid and result.group is not None


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_uid_without_a_passwd_entry_has_no_name(key_file: Path) -> None:
    os.chown(key_file, 54321, 54321)
    result = api_key.probe(spec_for(key_file))
    assert isinstance(result, api_key.FileFacts)
    assert (result.uid, result.owner, result.gid, result.group) == (54321, None, 54321, None)


def test_empty_key_file_is_not_non_empty(tmp_path: Path) -> None:
    (tmp_path / "empty.key").write_text("")
    result = api_key.probe(spec_for(tmp_path / "empty.key"))
    assert isinstance(result, api_key.FileFacts) and result.size == 0 and not result.non_empty


def test_symlink_is_reported_as_one_not_followed(key_file: Path, tmp_path: Path) -> None:
    os.symlink(key_file, tmp_path / "link.key")
    result = api_key.probe(spec_for(tmp_path / "link.key"))
    assert isinstance(result, api_key.FileFacts) and result.kind == "symlink"


def test_probe_never_opens_the_file(tmp_path: Path) -> None:
    # Opening a FIFO with no writer blocks: a probe that read the key would hang here.
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(api_key.probe(spec_for(fifo))), daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "the probe opened the key file"
    (result,) = results
    assert isinstance(result, api_key.FileFacts) and (result.kind, result.mode) == ("other", "0600")


def test_special_bits_are_in_the_mode_string() -> None:
    assert api_key.format_mode(0o104755) == "4755"
    assert api_key.format_mode(0o100600) == "0600"
