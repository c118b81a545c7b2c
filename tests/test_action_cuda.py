"""The CUDA_HOME action on real symlinks in temp dirs, including a reader racing the repoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actions.cuda import point_home
from reconcile.errors import ActionError

# Reads the link in a tight loop in another process (another core, no GIL shared with the writer)
# until the stop file appears; prints how many reads found no link and what targets it saw.
READER = """
import os, sys
link, stop = sys.argv[1], sys.argv[2]
reads = missing = 0
seen = set()
print("ready", flush=True)
while not os.path.exists(stop):
    reads += 1
    try:
        seen.add(os.readlink(link))
    except FileNotFoundError:
        missing += 1
print(reads, missing, *sorted(seen))
"""


@pytest.fixture
def toolkits(tmp_path: Path) -> tuple[str, str]:
    old, new = tmp_path / "cuda-12.8", tmp_path / "cuda-13.0"
    for toolkit in (old, new):
        (toolkit / "bin").mkdir(parents=True)
    return str(old), str(new)


def test_absent_home_is_created(tmp_path: Path, toolkits: tuple[str, str]) -> None:
    home = str(tmp_path / "cuda")

    result = point_home(home, toolkits[1])

    assert result.changed and result.message == f"created {home} -> {toolkits[1]}"
    assert os.readlink(home) == toolkits[1]


def test_wrong_target_is_repointed_and_a_second_call_changes_nothing(
    tmp_path: Path, toolkits: tuple[str, str]
) -> None:
    old, new = toolkits
    home = str(tmp_path / "cuda")
    os.symlink(old, home)

    result = point_home(home, new)

    assert result.changed and result.message == f"{home} -> {old} => {new}"
    assert os.readlink(home) == new
    again = point_home(home, new)
    assert not again.changed and again.message == f"{home} already -> {new}"
    assert sorted(os.listdir(tmp_path)) == ["cuda", "cuda-12.8", "cuda-13.0"]  # no temp link left


def test_a_dangling_home_link_is_repointed(tmp_path: Path, toolkits: tuple[str, str]) -> None:
    home = str(tmp_path / "cuda")
    os.symlink(str(tmp_path / "cuda-11.8-removed"), home)

    assert point_home(home, toolkits[1]).changed
    assert os.readlink(home) == toolkits[1]


def test_a_link_that_already_resolves_to_the_target_is_left_alone(
    tmp_path: Path, toolkits: tuple[str, str]
) -> None:
    # The update-alternatives layout: /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-13.0
    alternative = str(tmp_path / "alternatives-cuda")
    os.symlink(toolkits[1], alternative)
    home = str(tmp_path / "cuda")
    os.symlink(alternative, home)

    result = point_home(home, toolkits[1])

    assert not result.changed and "already resolves to" in result.message
    assert os.readlink(home) == alternative


def test_a_real_directory_at_home_is_refused_and_untouched(tmp_path: Path, toolkits: tuple[str, str]) -> None:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("#!/bin/sh\n")

    with pytest.raises(ActionError) as refused:
        point_home(str(home), toolkits[1])

    assert f"mv {home} {home}-<version>" in str(refused.value)
    assert not home.is_symlink()
    assert (home / "bin" / "nvcc").read_text() == "#!/bin/sh\n"


def test_a_missing_target_is_refused_and_the_link_kept(tmp_path: Path, toolkits: tuple[str, str]) -> None:
    home = str(tmp_path / "cuda")
    os.symlink(toolkits[0], home)

    with pytest.raises(ActionError, match="does not exist"):
        point_home(home, str(tmp_path / "cuda-13.9"))

    assert os.readlink(home) == toolkits[0]


def test_readers_never_see_home_missing_while_it_is_repointed(
    tmp_path: Path, toolkits: tuple[str, str]
) -> None:
    home, stop = str(tmp_path / "cuda"), str(tmp_path / "stop")
    point_home(home, toolkits[0])
    reader = subprocess.Popen([sys.executable, "-c", READER, home, stop], stdout=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
    try:
        for i in range(400):
            assert point_home(home, toolkits[(i + 1) % 2]).changed
    finally:
        Path(stop).touch()
        out, _ = reader.communicate(timeout=30)

    reads, missing, *seen = out.split()
    assert int(reads) > 1000  # the reader really ran alongside the repoints
    assert int(missing) == 0
    assert seen == sorted(toolkits)
