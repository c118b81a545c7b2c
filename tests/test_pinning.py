"""`reconcile lock`: a floating model branch pinned against the loopback hub, a `>=` range pinned
with real uv against a loopback package index, and apply holding to the lock until it is refreshed."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.cli import main
from reconcile.spec.loader import load_spec
from reconcile.spec.pins import apply_lock_pins, lock_notes
from tests.fakes.hub_server import FakeHub

REPO = "org/toy"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the spec says where packages and models come from: no pip.conf, no PIP_*, no HF cache."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in list(os.environ):
        if name.startswith("PIP_") and name not in ("PIP_CONFIG_FILE", "PIP_CERT"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def config(version: int) -> bytes:
    return json.dumps({"architectures": ["Toy"], "max_position_embeddings": 4096, "v": version}).encode()


def model_spec(root: Path, revision: str = "main") -> Path:
    spec = root / "specs" / "box.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        f'[machine]\nstate_dir = "{root / "state"}"\n\n'
        f'[model]\nrepo = "{REPO}"\nrevision = "{revision}"\ndir = "{root / "model"}"\n'
    )
    return spec


def lock_of(spec: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(spec.with_suffix(".lock").read_text())
    return data


def test_lock_pins_the_models_commit_and_apply_keeps_it_until_the_lock_is_refreshed(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = hub.add_commit(REPO, {"config.json": config(1), "weights.bin": b"\x01" * 4096})
    spec = model_spec(tmp_path)

    assert main(["lock", "--spec", str(spec)]) == 2
    assert lock_of(spec)["model"] == {"repo": REPO, "revision": "main", "commit": first}
    assert main(["lock", "--spec", str(spec)]) == 0  # the branch has not moved: the lock stays as it is
    assert main(["apply", "--spec", str(spec)]) == 2
    assert (tmp_path / "model" / "config.json").read_bytes() == config(1)

    second = hub.add_commit(REPO, {"config.json": config(2), "weights.bin": b"\x02" * 4096})  # main moves
    capsys.readouterr()

    assert main(["plan", "--spec", str(spec)]) == 0
    assert main(["apply", "--spec", str(spec)]) == 0
    assert (tmp_path / "model" / "config.json").read_bytes() == config(1)
    assert f"{first[:12]}" in capsys.readouterr().out

    assert main(["lock", "--spec", str(spec)]) == 2
    assert f"-> {second[:12]} (was {first[:12]})" in capsys.readouterr().out
    assert main(["apply", "--spec", str(spec)]) == 2
    assert (tmp_path / "model" / "config.json").read_bytes() == config(2)
    generations = tmp_path / "state" / "generations"
    recorded = [json.loads((generations / f"{n}.json").read_text())["resolved"] for n in (1, 2)]
    assert [r["lock"]["model_commit"] for r in recorded] == [first, second]
    assert [r["model_commit"] for r in recorded] == [first, second]


def test_without_a_lock_the_branch_floats(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_commit(REPO, {"config.json": config(1)})
    spec = model_spec(tmp_path)
    assert main(["apply", "--spec", str(spec)]) == 2

    hub.add_commit(REPO, {"config.json": config(2)})

    assert main(["apply", "--spec", str(spec)]) == 0  # the record says main; the planner does not ask the hub
    assert not spec.with_suffix(".lock").exists()


def test_plan_says_when_the_lock_is_older_than_the_spec(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit = hub.add_commit(REPO, {"config.json": config(1)})
    hub.set_ref(REPO, "v1.0", commit)
    spec = model_spec(tmp_path)
    assert main(["lock", "--spec", str(spec)]) == 2
    assert lock_notes(apply_lock_pins(load_spec(str(spec)))) == []

    model_spec(tmp_path, revision="v1.0")
    loaded = apply_lock_pins(load_spec(str(spec)))

    assert loaded.spec.model is not None and loaded.spec.model.revision == "v1.0"  # not pinned: made for main
    [note] = lock_notes(loaded)
    assert note.startswith(
        "box.lock is older than the spec: the model is org/toy@v1.0 (locked for org/toy@main)"
    )
    capsys.readouterr()
    assert main(["plan", "--spec", str(spec)]) == 2
    assert "box.lock is older than the spec" in capsys.readouterr().out


def test_a_damaged_lock_stops_plan_and_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = model_spec(tmp_path)
    spec.with_suffix(".lock").write_text('{"format": "something else"}')

    assert main(["plan", "--spec", str(spec)]) == 1

    assert "box.lock: not a reconcile-lock/2 lock file" in capsys.readouterr().err


def test_nothing_floating_writes_no_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = model_spec(tmp_path, revision="a" * 40)

    assert main(["lock", "--spec", str(spec)]) == 0

    assert "nothing floats" in capsys.readouterr().out and not spec.with_suffix(".lock").exists()


# --- packages: real pip against a loopback PEP 503 index --------------------------------------


def build_wheel(out: Path, name: str, version: str) -> Path:
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: reconcile-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = [f"{p},sha256={digest(t.encode())},{len(t.encode())}" for p, t in files.items()] + [
        f"{dist}/RECORD,,"
    ]
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


class Index:
    """A PEP 503 simple index over HTTP on loopback; publish() adds a version, like a nightly build."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "files").mkdir(parents=True)
        handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None  # type: ignore[method-assign]
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def publish(self, name: str, *versions: str) -> None:
        for v in versions:
            build_wheel(self.root / "files", name, v)
        page = self.root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        links = [
            f'<a href="../../files/{w.name}">{w.name}</a>'
            for w in sorted((self.root / "files").glob("*.whl"))
        ]
        (page / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    i = Index(tmp_path / "index")
    yield i
    i.server.shutdown()
    i.server.server_close()


def venv_spec(root: Path, index_url: str, specifier: str) -> Path:
    spec = root / "specs" / "gpu-box.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        f'[machine]\nstate_dir = "{root / "state"}"\n\n[venv]\npath = "{root / "venv"}"\n'
        f'python = "{sys.executable}"\ninstaller = "pip"\nindex_url = "{index_url}"\n'
        f'packages = {{ toywheel = "{specifier}" }}\n'
    )
    return spec


def installed(root: Path) -> str:
    found = sorted((root / "venv").glob("lib/python3*/site-packages/toywheel-*.dist-info"))
    return found[-1].name.removesuffix(".dist-info").split("-")[1] if found else ""


def test_lock_pins_a_range_with_pip_and_apply_installs_the_pin_until_the_lock_moves(
    index: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index.publish("toywheel", "1.0", "1.1", "1.2rc1")
    spec = venv_spec(tmp_path, index.url, ">=1.0")

    assert main(["lock", "--spec", str(spec)]) == 2
    pinned = lock_of(spec)["packages"]["toywheel"]
    assert pinned == {"specifier": ">=1.0", "version": "1.1", "from": [index.url]}
    assert main(["apply", "--spec", str(spec)]) == 2
    assert installed(tmp_path) == "1.1"

    index.publish("toywheel", "1.3")  # a newer build on the index: the lock still says 1.1
    loaded = apply_lock_pins(load_spec(str(spec)))
    assert loaded.spec.venv is not None and loaded.spec.venv.packages == {"toywheel": "==1.1"}
    assert main(["apply", "--spec", str(spec)]) == 0
    assert installed(tmp_path) == "1.1"

    capsys.readouterr()
    assert main(["lock", "--spec", str(spec)]) == 2
    assert "toywheel >=1.0 -> 1.3 (was 1.1)" in capsys.readouterr().out
    assert main(["apply", "--spec", str(spec)]) == 2
    assert installed(tmp_path) == "1.3"


def test_a_range_nothing_on_the_index_satisfies_is_a_clear_error(
    index: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index.publish("toywheel", "1.0")
    spec = venv_spec(tmp_path, index.url, ">=2.0")

    assert main(["lock", "--spec", str(spec)]) == 1

    err = capsys.readouterr().err
    assert "uv pip compile" in err and index.url in err and "toywheel" in err and "2.0" in err
    assert not spec.with_suffix(".lock").exists()
