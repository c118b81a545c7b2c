"""`reconcile lock` pins the venv's whole dependency closure with sha256 hashes (uv's resolver), apply
installs from it in hash-checking mode, and the realization's path follows the lock, not the machine.

Real uv and real venvs against a wheelhouse of tiny wheels built here; offline (a proxy that refuses
everything is set, so any network use fails).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from actions import venv as venv_action
from reconcile.apply.store import realize
from reconcile.cli import main
from reconcile.errors import ActionError, ReconcileError
from reconcile.spec.loader import load_spec
from reconcile.spec.models import Venv
from reconcile.spec.pins import apply_lock_pins

CLOSED = "http://127.0.0.1:9"  # nothing listens: a request through it fails at once


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the spec says where packages come from; the network is a proxy that refuses; uv (from
    reconcile's own dependencies) is on PATH for the uv installer."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")) and name not in ("PIP_CONFIG_FILE", "PIP_CERT"):
            monkeypatch.delenv(name)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, CLOSED)
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bindir = os.path.dirname(sys.executable)
    assert os.access(os.path.join(bindir, "uv"), os.X_OK), "uv is a dependency of reconcile"
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))


def build_wheel(out: Path, name: str, version: str, requires: tuple[str, ...] = (), body: str = "") -> Path:
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n{body}",
        f"{dist}/METADATA": meta,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: reconcile-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = [f"{p},sha256={digest(t.encode())},{len(t.encode())}" for p, t in files.items()]
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return wheel


def wheelhouse(root: Path) -> Path:
    """toyserve 1.0 needs toydep>=1; toydep 1.0 and 1.1 are there (1.1 is what a resolver picks)."""
    wheels = root / "wheels"
    wheels.mkdir(parents=True)
    build_wheel(wheels, "toyserve", "1.0", ("toydep>=1",))
    build_wheel(wheels, "toydep", "1.0")
    build_wheel(wheels, "toydep", "1.1")
    return wheels


def write_spec(root: Path, wheels: Path, installer: str = "uv", packages: str = 'toyserve = "==1.0"') -> Path:
    spec = root / "specs" / "box.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        f'[machine]\nstate_dir = "{root / "state"}"\n\n[venv]\npath = "{root / "venv"}"\n'
        f'python = "{sys.executable}"\ninstaller = "{installer}"\nwheelhouse = "{wheels}"\n'
        f'store = "{root / "store"}"\npackages = {{ {packages} }}\n'
    )
    return spec


def lock_of(spec: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(spec.with_suffix(".lock").read_text())
    return data


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed(root: Path) -> dict[str, str]:
    """{name: version} of what the venv holds, from its dist-info directories."""
    found = (root / "venv").glob("lib/python3*/site-packages/*.dist-info")
    return dict(p.name.removesuffix(".dist-info").split("-", 1) for p in found)  # type: ignore[misc]


def test_lock_pins_the_whole_closure_with_the_sha256_of_each_wheel_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = wheelhouse(tmp_path)
    spec = write_spec(tmp_path, wheels)  # toyserve is ==pinned: only the closure floats

    assert main(["lock", "--spec", str(spec)]) == 2

    closure = lock_of(spec)["closure"]
    assert closure["requirements"] == [
        f"toydep==1.1 --hash=sha256:{sha256(wheels / 'toydep-1.1-py3-none-any.whl')}",
        f"toyserve==1.0 --hash=sha256:{sha256(wheels / 'toyserve-1.0-py3-none-any.whl')}",
    ]
    assert closure["for"] == {"packages": {"toyserve": "==1.0"}, "no_deps": False}
    assert closure["python"] == "{}.{}".format(*sys.version_info[:2])
    assert closure["from"] == [str(wheels)]
    assert "closure: 2 distributions with sha256 hashes" in capsys.readouterr().out
    assert (spec.with_suffix(".lock").stat().st_mode & 0o777) == 0o644
    assert main(["lock", "--spec", str(spec)]) == 0  # nothing moved: the file is left as it is


def test_apply_installs_the_locked_closure_and_a_newer_wheel_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = wheelhouse(tmp_path)
    spec = write_spec(tmp_path, wheels)
    assert main(["lock", "--spec", str(spec)]) == 2
    build_wheel(wheels, "toydep", "1.2")  # a newer dependency lands: without the lock it would be taken

    assert main(["apply", "--spec", str(spec)]) == 2
    assert installed(tmp_path) == {"toyserve": "1.0", "toydep": "1.1"}
    capsys.readouterr()
    assert main(["plan", "--spec", str(spec)]) == 0
    assert "2 locked with hashes" in capsys.readouterr().out

    spec.with_suffix(".lock").unlink()  # what the same spec gives without a lock: the newest
    assert main(["apply", "--spec", str(spec)]) == 2
    assert installed(tmp_path) == {"toyserve": "1.0", "toydep": "1.2"}


def test_the_realization_path_follows_the_lock_on_two_machines(tmp_path: Path) -> None:
    """Two checkouts with their own wheelhouse copies (one with an extra wheel): one lock, one path."""
    first, second = tmp_path / "one", tmp_path / "two"
    spec = write_spec(first, wheelhouse(first))
    assert main(["lock", "--spec", str(spec)]) == 2
    other = write_spec(second, wheelhouse(second))
    build_wheel(second / "wheels", "unrelated", "3.0")

    def path(s: Path) -> str:
        venv = realize(apply_lock_pins(load_spec(str(s)))).spec.venv
        assert venv is not None
        return os.path.basename(venv.path)

    assert path(other) != path(spec)  # unlocked, the sources are the inputs: they differ here
    shutil.copy(spec.with_suffix(".lock"), other.with_suffix(".lock"))

    assert path(other) == path(spec)

    lock = lock_of(spec)
    lock["closure"]["requirements"][0] = lock["closure"]["requirements"][0].replace(
        "toydep==1.1", "toydep==1.0"
    )
    lock["closure"]["requirements"][0] = (
        f"toydep==1.0 --hash=sha256:{sha256(first / 'wheels' / 'toydep-1.0-py3-none-any.whl')}"
    )
    other.with_suffix(".lock").write_text(json.dumps(lock))
    assert path(other) != path(spec)  # another closure, another realization


def tamper(wheels: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """toydep 1.1 rebuilt with other bytes under the same name, later, on a machine with no uv cache
    (uv would serve the locked bytes from a cache it made when locking)."""
    changed = build_wheel(wheels, "toydep", "1.1", body="print('not what was locked')\n")
    os.utime(changed, (changed.stat().st_atime, changed.stat().st_mtime + 60))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-machine-cache"))


def test_a_wheel_whose_bytes_changed_since_the_lock_is_refused_by_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = wheelhouse(tmp_path)
    spec = write_spec(tmp_path, wheels)
    assert main(["lock", "--spec", str(spec)]) == 2
    tamper(wheels, monkeypatch, tmp_path)
    capsys.readouterr()

    assert main(["apply", "--spec", str(spec)]) not in (0, 2)

    out = capsys.readouterr().out
    assert "uv refused toydep==1.1: a file whose sha256 is not the lock's" in out
    assert "run `reconcile lock` again" in out
    assert "toydep" not in installed(tmp_path)


def test_pip_refuses_a_changed_wheel_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """installer = "pip": pip's own hash-checking mode (a venv that sees the base interpreter's pip,
    not one made with ensurepip: seconds less)."""
    wheels = wheelhouse(tmp_path)
    spec = write_spec(tmp_path, wheels, installer="pip")
    assert main(["lock", "--spec", str(spec)]) == 2
    tamper(wheels, monkeypatch, tmp_path)
    made = tmp_path / "pip-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", made], check=True
    )
    venv = Venv(
        path=str(made),
        python=sys.executable,
        installer="pip",
        wheelhouse=str(wheels),
        system_site_packages=True,
        packages={"toyserve": "==1.0"},
        closure=lock_of(spec)["closure"]["requirements"],
    )

    with pytest.raises(ActionError) as refused:
        venv_action.install(venv, {"toyserve": "==1.0"})

    assert str(refused.value).startswith("pip refused toydep==1.1: a file whose sha256 is not the lock's")
    assert not list(made.glob("lib/python3*/site-packages/toydep*"))


def test_plan_says_the_closure_is_stale_when_the_specs_packages_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = wheelhouse(tmp_path)
    spec = write_spec(tmp_path, wheels)
    assert main(["lock", "--spec", str(spec)]) == 2
    write_spec(tmp_path, wheels, packages='toyserve = "==1.0", toydep = "==1.0"')
    capsys.readouterr()

    assert main(["plan", "--spec", str(spec)]) == 2

    out = capsys.readouterr().out
    assert "box.lock is older than the spec: toydep is ==1.0 (not in the closure)" in out
    assert "the dependency closure is not locked" in out and "`reconcile lock`" in out
    venv = apply_lock_pins(load_spec(str(spec))).spec.venv
    assert venv is not None and venv.closure == []  # a stale closure is not installed


def test_a_closure_for_another_python_is_not_used_and_plan_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, wheelhouse(tmp_path))
    assert main(["lock", "--spec", str(spec)]) == 2
    lock = lock_of(spec)
    lock["closure"]["python"] = "3.9"
    spec.with_suffix(".lock").write_text(json.dumps(lock, indent=2))
    capsys.readouterr()

    assert main(["plan", "--spec", str(spec)]) == 2

    here = "{}.{}".format(*sys.version_info[:2])
    assert f"its closure is for Python 3.9, [venv].python here is Python {here}" in capsys.readouterr().out


def test_a_damaged_closure_entry_is_one_line_naming_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, wheelhouse(tmp_path))
    assert main(["lock", "--spec", str(spec)]) == 2
    path = spec.with_suffix(".lock")
    text = path.read_text()
    bad = text.replace("toyserve==1.0 --hash=sha256:", "toyserve==1.0 --hash=md5:")
    path.write_text(bad)
    line = next(n for n, ln in enumerate(bad.splitlines(), 1) if "--hash=md5:" in ln)
    capsys.readouterr()

    assert main(["plan", "--spec", str(spec)]) == 1

    [err] = capsys.readouterr().err.splitlines()
    assert err.startswith(f"reconcile: {path}:{line}: ") and "is not a locked distribution" in err
    assert err.endswith("run `reconcile lock` to write it again")

    path.write_text(text[:-40])  # cut short: not JSON any more
    assert main(["apply", "--spec", str(spec)]) == 1
    [err] = capsys.readouterr().err.splitlines()
    assert f"{path}:{len(text[:-40].splitlines())}: not a lock file" in err

    assert main(["lock", "--spec", str(spec)]) == 2  # the fix it names works
    assert main(["plan", "--spec", str(spec)]) == 2


def test_a_closure_written_in_the_spec_itself_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, wheelhouse(tmp_path))
    spec.write_text(spec.read_text() + f'closure = ["toydep==1.1 --hash=sha256:{"0" * 64}"]\n')

    assert main(["plan", "--spec", str(spec)]) == 1

    assert "[venv].closure is written by `reconcile lock` into box.lock, not in a spec: remove it" in (
        capsys.readouterr().err
    )


def test_a_lock_line_that_smuggles_an_installer_option_is_refused(tmp_path: Path) -> None:
    """The closure becomes a requirements file root installs from: a line carrying a second line
    (`--index-url`, `-e`) would steer pip or uv elsewhere, so only `name==version --hash=...` passes."""
    spec = write_spec(tmp_path, wheelhouse(tmp_path))
    assert main(["lock", "--spec", str(spec)]) == 2
    lock = lock_of(spec)
    first = lock["closure"]["requirements"][0]
    for smuggled in (f"{first}\n--index-url {CLOSED}/simple", f"{first} --index-url {CLOSED}/simple"):
        lock["closure"]["requirements"][0] = smuggled
        spec.with_suffix(".lock").write_text(json.dumps(lock, indent=2))

        with pytest.raises(ReconcileError, match="is not a locked distribution"):
            apply_lock_pins(load_spec(str(spec)))


def test_a_closure_of_the_wrong_shape_names_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, wheelhouse(tmp_path))
    assert main(["lock", "--spec", str(spec)]) == 2
    lock = lock_of(spec)
    lock["closure"]["for"] = {"packages": ["toyserve"]}  # a list where a table of specifiers belongs
    text = json.dumps(lock, indent=2, sort_keys=True)
    spec.with_suffix(".lock").write_text(text)
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if '"closure"' in ln)
    capsys.readouterr()

    assert main(["plan", "--spec", str(spec)]) == 1

    assert capsys.readouterr().err == (
        f"reconcile: {spec.with_suffix('.lock')}:{line}: a damaged closure; "
        "run `reconcile lock` to write it again\n"
    )


def test_a_no_deps_spec_locks_exactly_its_list_with_hashes_and_installs_it(tmp_path: Path) -> None:
    """The lab's shape: `no_deps = true` and an explicit, complete list (uv's requirements output has
    no hashes under --no-deps; its pylock.toml answer does)."""
    wheels = wheelhouse(tmp_path)
    spec = write_spec(tmp_path, wheels, packages='toyserve = "==1.0", toydep = "==1.0"')
    spec.write_text(spec.read_text() + "no_deps = true\n")

    assert main(["lock", "--spec", str(spec)]) == 2

    assert lock_of(spec)["closure"]["requirements"] == [
        f"toydep==1.0 --hash=sha256:{sha256(wheels / 'toydep-1.0-py3-none-any.whl')}",
        f"toyserve==1.0 --hash=sha256:{sha256(wheels / 'toyserve-1.0-py3-none-any.whl')}",
    ]
    assert main(["apply", "--spec", str(spec)]) == 2
    assert installed(tmp_path) == {"toyserve": "1.0", "toydep": "1.0"}
    assert main(["plan", "--spec", str(spec)]) == 0
