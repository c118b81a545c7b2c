"""Issue 24's hostile reader, sixteenth round: apply's actions no round had re-read since the tenth
(apt repositories and keyrings, the CUDA toolkit, the model copy and its config patch, the API key, the
venv build), read as `nobody` (or the owner of a directory a spec path leads through, or of a model
source tree) with only docs/security.md and the code. Each attack runs for real on real files owned by
nobody, judged by the plan's path findings as `reconcile plan` judges them, and was seen succeeding on
main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.test_path_trust import NOBODY, _full_spec, nobodys_dir


def _errors(tmp_path: Path, spec_text: str) -> list[str]:
    from reconcile.preflight.paths import path_findings
    from reconcile.spec.loader import load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text)
    return [
        f"{f.evidence['key']}: {f.message}"
        for f in path_findings(load_spec(str(spec)).spec)
        if f.severity == "error"
    ]


def _nobodys_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x\n")
    os.chown(path, NOBODY, NOBODY)


def _unsigned_repo_spec(tmp_path: Path, uri: str) -> str:
    """The full spec of test_path_trust, its repository marked trusted (no keyring vouches for it)."""
    ok = tmp_path / "ok"
    text = _full_spec(tmp_path, ("apt.repositories", "uri"), uri)
    signed = f'keyring = "{ok}/keyrings/r.gpg"\nkey_source = "{ok}/r.gpg"'
    assert signed in text
    return text.replace(signed, "trusted = true")


@pytest.mark.parametrize("where", ["the repository", "a file in it"])
def test_an_unsigned_local_apt_repository_of_nobodys_is_refused(tmp_path: Path, where: str) -> None:
    """`[[apt.repositories]] trusted = true` (`[trusted=yes]`: no signature checked) with `uri =
    "file:<dir>"`: apt installs what the directory's Packages index lists, and dpkg runs each package's
    maintainer scripts as root. The uri had the location role only (who listens on a URL on this
    machine; a `file:` one was "the keyring's to vouch for"), but a trusted repository has no keyring:
    seen on main, a repository directory of nobody's, or root's with a Packages file of nobody's, gave
    no error (the plan would write the source and apt-get install their packages). Now a repository no
    keyring vouches for is a local package index like `[venv] index_url`'s: each local path its uri
    names is held to the read role, its whole tree."""
    if where == "the repository":
        repo = nobodys_dir(tmp_path / "theirs") / "repo"
        repo.mkdir()
        os.chown(repo, NOBODY, NOBODY)
    else:
        repo = tmp_path / "repo"
        _nobodys_file(repo / "pool" / "Packages")
    found = _errors(tmp_path, _unsigned_repo_spec(tmp_path, f"file:{repo}"))
    assert any(e.startswith("[apt].repositories") and "uri" in e and "owned by nobody" in e for e in found), (
        found
    )


def test_a_signed_local_apt_repository_of_roots_is_not_refused(tmp_path: Path) -> None:
    """The fix's other side: a trusted repository whose tree is root's alone plans clean (no finding
    names its uri)."""
    repo = tmp_path / "repo"
    (repo / "pool").mkdir(parents=True)
    (repo / "Packages").write_text("")
    found = _errors(tmp_path, _unsigned_repo_spec(tmp_path, f"file:{repo}"))
    assert not any("uri" in e.split(":")[0] for e in found), found


@pytest.mark.parametrize(
    "part", ["bin/crt/link.stub", "lib64/stubs/libcuda.so", "targets/x86_64-linux/lib/stubs/libcuda.so"]
)
def test_a_toolkit_file_of_nobodys_two_levels_down_is_refused(tmp_path: Path, part: str) -> None:
    """`[cuda] target` (what `/usr/local/cuda` is pointed at, the toolkit FlashInfer's JIT compiles and
    links with as root) is judged on the parts nvcc reads (paths.TOOLKIT_PARTS), but `bin`, `lib64` and
    `targets/*/lib` only one level down: nvcc compiles `bin/crt/link.stub` into a relocatable device
    link, and a link against `-lcuda` finds `lib64/stubs/libcuda.so`. Seen on main: a toolkit root's in
    every directory with one of those files nobody's gave no finding. Now every part is judged whole."""
    toolkit = tmp_path / "cuda-13.0"
    for d in ("bin", "include", "nvvm", "lib64", "targets/x86_64-linux/include", "targets/x86_64-linux/lib"):
        (toolkit / d).mkdir(parents=True, exist_ok=True)
    _nobodys_file(toolkit / part)
    found = _errors(tmp_path, _full_spec(tmp_path, ("cuda", "target"), str(toolkit)))
    assert any(e.startswith("[cuda].target") and "owned by nobody" in e for e in found), found


def test_a_model_file_with_file_capabilities_is_copied_without_them(tmp_path: Path) -> None:
    """Already refused on main, kept as a new member (xattrs): a source tree unpacked with `tar
    --xattrs` by root keeps `security.capability`; were the copy to keep it, a model file marked
    executable would run with the capabilities its publisher chose. The copy writes the bytes into a
    new file of root's (copy_fd), so no extended attribute comes along; nor does the set-id bit."""
    from actions.model_copying import copy_files

    source, model_dir = tmp_path / "src", tmp_path / "model"
    source.mkdir()
    model_dir.mkdir()
    tool = source / "tool.py"
    tool.write_text("print('hi')\n")
    tool.chmod(0o4755)
    subprocess.run(["setcap", "cap_setuid,cap_net_admin+ep", str(tool)], check=True)
    os.setxattr(tool, "user.origin", b"publisher")
    assert os.getxattr(tool, "security.capability")
    copy_files(str(source), str(model_dir), ["tool.py"], {})
    copied = model_dir / "tool.py"
    assert copied.read_text() == "print('hi')\n"
    assert os.listxattr(copied) == []
    assert os.stat(copied).st_mode & 0o7777 == 0o755
