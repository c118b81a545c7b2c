"""Issue 24's hostile reader, third round: attacks found by reading docs/security.md and the code
after the second round (tests/test_hostile_reader2.py), each run for real (a `nobody` process
through setpriv, real files, links and listeners), each seen succeeding on main before its fix.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reconcile.errors import ActionError
from tests.apply_support import Demo
from tests.mirror_support import Mirror, one_answer, path_of
from tests.test_untrusted_trees import Tree, tree

__all__ = ["tree"]  # the fixture: a model source tree of nobody's

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

NOBODY = pwd.getpwnam("nobody").pw_uid
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def test_the_key_owner_cannot_point_the_key_directory_at_a_root_directory(yard: Path) -> None:
    """The path rule lets the key's `owner` own the directories above the key (their home, say).
    A link there was followed like one in root's directories: nobody makes the key's directory a
    link to a directory only root may write, and root writes nobody's key file (0600, chowned to
    nobody) into it. main: `victim/api.key`, owned by nobody, in root's 0700 directory."""
    from actions.api_key import ensure_key
    from reconcile.spec.models import ApiKey

    home = yard / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    victim = yard / "victim"
    victim.mkdir(mode=0o700)
    subprocess.run([*AS_NOBODY, "ln", "-s", str(victim), str(home / "keys")], check=True)
    with pytest.raises(ActionError, match="is not followed"):
        ensure_key(ApiKey(file=str(home / "keys" / "api.key"), owner="nobody"))
    assert list(victim.iterdir()) == []  # main: [victim/api.key], nobody's


IMPOSTOR = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
body = (
    b'{"version": "0.26.0", "data": [{"id": "demo", "max_model_len": 4096}], "choices": [{"message":'
    b' {"content": "Paris", "reasoning": "thought", "tool_calls": [{"function": {"name": "get_weather",'
    b' "arguments": "{\\"location\\": \\"Tokyo\\"}"}}]}}]}'
)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    data = b""
    try:
        while b"\r\n\r\n" not in data and (chunk := c.recv(65536)):
            data += chunk
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        c.sendall(head % len(body) + body)
    except OSError:
        pass
    c.close()
"""


def test_check_never_vouches_for_a_listener_of_nobodys_when_no_key_is_there(
    tmp_path: Path, strangers: list[int]
) -> None:
    """The key file is not there yet (no apply so far, or it was removed): `check` sent its chat
    unkeyed, so without the listener guard (which ran only for keyed requests), and nobody's
    listener on the port answered it. main: every step ✓, "passed", exit 0."""
    from tests.apply_support import demo_in
    from tests.ownership_support import as_nobody

    for demo in demo_in(tmp_path):
        assert not demo.key_file.exists()
        as_nobody(["/usr/bin/python3", "-c", IMPOSTOR, str(demo.port)], {}, strangers)
        run = demo.cli("check")
        assert run.returncode == 1, run.output
        assert "passed" not in run.output and "✓" not in run.output, run.output
        assert f"cannot verify the server: no key in {demo.key_file}" in run.output, run.output


def test_the_plan_never_reads_a_root_only_file_through_a_link_in_nobodys_source(tree: Tree) -> None:
    """nobody's `[model] source` has config.json as a link to a JSON file only root may read. The
    copy refuses links leading out of the tree, but the plan (preflight and the model.config row)
    read the source's JSON files following links: root's plan showed that file's values (the
    model.config row's diff), a file nobody could never read. main: `{"rope_type": "s3cr3t"}`."""
    vault = tree.root / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "config.json"
    secret.write_text('{"architectures": ["LlamaForCausalLM"], "rope_parameters": {"rope_type": "s3cr3t"}}')
    secret.chmod(0o600)
    (tree.source / "config.json").unlink()
    tree.as_nobody("ln", "-s", str(secret), str(tree.source / "config.json"))
    run = tree.cli("plan")
    assert "s3cr3t" not in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_gc_removes_a_realization_nested_past_the_recursion_limit(tmp_path: Path) -> None:
    """A realization is a venv: its tree is what the spec's packages install (wheels from an index,
    sdists' build steps), so its depth is not ours to choose. gc removed it with shutil.rmtree,
    which in Python 3.11 recurses once a level. main: RecursionError at 1,100 levels, the
    realization half-removed (renamed .gc-*) and every later gc failing on it."""
    from reconcile.apply.store import remove

    store = tmp_path / "store"
    doomed = store / ("0" * 32 + "-venv")
    doomed.mkdir(parents=True)
    fd = os.open(doomed, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):  # a/a/...: 2,200 characters, inside PATH_MAX (os.makedirs recurses too)
        os.mkdir("a", dir_fd=fd)
        fd, up = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(up)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    os.close(fd)
    (doomed / "bin").mkdir()
    (doomed / "bin" / "python").symlink_to("/usr/bin/python3")
    remove(str(store), str(doomed))
    assert list(store.iterdir()) == []
    assert Path("/usr/bin/python3").exists()


def test_a_program_of_nobodys_in_a_root_directory_on_path_never_runs(
    yard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PATH entries are held to the read role (round 1), but only as directories: a program file
    of nobody's in root's 0755 directory (a tarball unpacked with its archive's owners, as the CUDA
    toolkit's nvcc was) ran whenever reconcile ran that name. Here `git`, which every plan asks.
    main: ran as uid 0."""
    from tests.test_hostile_reader import committed_spec

    _, spec = committed_spec(yard)
    bin_dir = yard / "bin"
    bin_dir.mkdir(mode=0o755)
    git = bin_dir / "git"
    git.write_text(f'#!/bin/sh\nid -u > {yard}/ran-as\nexec /usr/bin/git "$@"\n')
    git.chmod(0o755)
    os.chown(git, NOBODY, NOBODY)  # nobody's file: they may rewrite it at will
    argv = [sys.executable, "-m", "reconcile", "plan", "--spec", str(spec)]
    env = {**os.environ, "XDG_CACHE_HOME": str(yard / "cache"), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=yard, env=env)
    assert not (yard / "ran-as").exists()  # main: "0"
    assert run.returncode in (0, 1, 2), run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    # What a caller of host.run is told (the plan's git row says only "not in git")
    from reconcile import host
    from reconcile.safety.filesafety import resolve_exec

    monkeypatch.setattr(host, "_PROGRAM_CHECK", [])
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    host.check_programs(resolve_exec)
    with pytest.raises(host.ToolMissing, match="is owned by nobody") as refused:
        host.run(["git", "--version"])
    assert str(refused.value).startswith(f"git: {git} not run: "), refused.value
    assert not (yard / "ran-as").exists()
    git.chmod(0o755)
    os.chown(git, 0, 0)  # root's, as /usr/bin's: runs
    assert host.run(["git", "--version"]).ok and (yard / "ran-as").read_text() == "0\n"


@pytest.mark.parametrize("where", ["include/cuda_fp8.h", "include/cuda/std/atomic", "lib64/libcudart.so"])
def test_a_toolkit_file_of_nobodys_fails_the_plan(yard: Path, where: str) -> None:
    """A toolkit unpacked from a tarball keeps the archive's owners. Round 1 held bin/nvcc to the
    exec role; the headers FlashInfer's JIT compiles into the server's kernels (as the server's
    user, root by default) and the libraries they link were not looked at: a header of nobody's,
    deep in include/, planned clean. main: no finding."""
    from tests.test_hostile_reader import cli, spec_text

    target = yard / "cuda-13.0"
    for d in ("bin", "include/cuda/std", "lib64"):
        (target / d).mkdir(parents=True)
    planted = target / where
    planted.write_text("/* nobody's */\n")
    os.chown(planted, NOBODY, NOBODY)
    (target / "include" / "cuda_runtime.h").write_text("/* root's */\n")
    (yard / "cuda").symlink_to(target)
    spec = yard / "spec.toml"
    spec.write_text(spec_text(yard) + f'\n[cuda]\nhome = "{yard}/cuda"\ntarget = "{target}"\n')
    run = cli(yard, "plan", spec=spec)
    assert "Traceback" not in run.stderr, run.stderr
    assert f"{planted} is owned by nobody" in run.stdout, run.stdout
    assert run.returncode == 1, run.stdout


class Overfeeder(Mirror):
    """A mirror in front of a FakeHub: everything passed through, except the body of a `/resolve/`
    GET for `name`, which is `extra` bytes longer than the hub lists (declared in Content-Length,
    or gzip-compressed zeros with `gzip`). Counts what the client took."""

    def __init__(self, upstream: str, name: str, extra: int, *, gzip: bool) -> None:
        super().__init__(upstream)
        self.name, self.extra, self.gzip = name, extra, gzip
        self.sent = 0
        self.start()

    def answer(self, conn: socket.socket, lines: list[bytes]) -> None:
        import zlib

        method, path = lines[0].split(b" ")[0], path_of(lines)
        if not (method == b"GET" and "/resolve/" in path and path.endswith("/" + self.name)):
            conn.sendall(one_answer(self.forward(lines)))
            return
        if self.gzip:
            packer = zlib.compressobj(9, zlib.DEFLATED, 31)
            body = packer.compress(b"\0" * self.extra) + packer.flush()
            top = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
            chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]
        else:
            top = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.extra
            chunks = [b"\0" * 65536] * (self.extra // 65536)
        try:
            conn.sendall(top.replace(b"\r\n", b"\r\nConnection: close\r\n", 1))
            for chunk in chunks:
                conn.sendall(chunk)
                self.sent += len(chunk)
        except OSError:
            pass


@pytest.mark.parametrize("gzip", [False, True], ids=["longer", "gzip-bomb"])
def test_a_mirror_cannot_write_more_than_the_hub_lists_into_the_model_dir(tmp_path: Path, gzip: bool) -> None:
    """The free-space check takes the hub's listing; huggingface_hub then writes whatever the GET's
    body holds and compares sizes only at the end. A mirror answers a 64 KiB file with 64 MiB
    (or a gzip body that inflates to it: httpx decodes what it was offered): main wrote all of it
    to the model dir's disk before failing."""
    from tests.fakes.hub_server import FakeHub

    big = 64 << 20
    with FakeHub() as hub:
        files = {
            "config.json": b"{}",
            "tokenizer.json": b"{}" * (32 << 10),
            "model.safetensors": b"\0" * 1024,
        }
        hub.add_commit("org/toy", files)
        mirror = Overfeeder(hub.url, "tokenizer.json", big, gzip=gzip)  # not LFS: served from /resolve/
        env = {**os.environ, "HF_ENDPOINT": mirror.url, "HF_HUB_DISABLE_XET": "1"}
        code = "import sys\nfrom actions.model import download\nfrom reconcile.spec.models import Model\n"
        code += "download(Model(repo='org/toy', dir=sys.argv[1]), progress=False)\n"
        try:
            run = subprocess.run(
                [sys.executable, "-c", code, str(tmp_path / "m")],
                env=env,
                timeout=120,
                capture_output=True,
                text=True,
            )
        finally:
            mirror.close()
        assert run.returncode == 1, run.stderr
        last = run.stderr.strip().splitlines()[-1]
        said = "encoded file (asked for identity): refused" if gzip else "more than the 64 KiB the hub lists"
        assert "ActionError" in last and said in last, run.stderr
        if not gzip:
            assert mirror.sent < 16 << 20, mirror.sent  # main: all 64 MiB taken, three times


class XetMirror(Mirror):
    """A mirror in front of a FakeHub that says a file is stored in Xet (the HEAD's X-Xet-Hash and
    X-Xet-Refresh-Route headers, as the real hub sends them), and whose token route names as the
    CAS server a `tarpit` that accepts connections and never answers."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.tarpit = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        threading.Thread(target=self._pit, daemon=True).start()
        self.start()

    def _pit(self) -> None:
        while True:
            try:
                self.held.append(self.tarpit.accept()[0])
            except OSError:
                return

    def answer(self, conn: socket.socket, lines: list[bytes]) -> None:
        path = path_of(lines)
        if path.startswith("/xet-token"):
            cas = f"http://127.0.0.1:{self.tarpit.getsockname()[1]}"
            expires = int(time.time()) + 3600
            token = f"X-Xet-Cas-Url: {cas}\r\nX-Xet-Access-Token: t\r\nX-Xet-Token-Expiration: {expires}"
            answer = f"HTTP/1.1 200 OK\r\nConnection: close\r\n{token}\r\nContent-Length: 2\r\n\r\n{{}}"
            conn.sendall(answer.encode())
            return
        extra: tuple[bytes, ...] = ()
        if "/resolve/" in path and path.endswith("/tokenizer.json"):
            extra = (b"X-Xet-Hash: " + b"a" * 64, f"X-Xet-Refresh-Route: {self.url}/xet-token".encode())
        conn.sendall(one_answer(self.forward(lines), extra))

    def close(self) -> None:
        super().close()
        self.tarpit.close()
        for conn in self.held:
            conn.close()


def test_a_mirror_cannot_send_a_download_to_a_xet_server_of_its_choosing(tmp_path: Path) -> None:
    """huggingface_hub downloads a file whose HEAD names a Xet hash through hf_xet (Rust, its own
    sockets), from the CAS server the mirror's token route names: no deadline, least rate or size
    cap of ours reaches it. The other tests set HF_HUB_DISABLE_XET; a real machine does not. A CAS
    server that accepts and never answers: main held the download past 60 s."""
    from tests.fakes.hub_server import FakeHub

    with FakeHub() as hub:
        hub.add_commit("org/toy", {"config.json": b"{}", "tokenizer.json": b"{}" * 1000})
        mirror = XetMirror(hub.url)
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_XET"}
        env["HF_ENDPOINT"] = mirror.url
        code = "import sys\nfrom actions.model import download\nfrom reconcile.spec.models import Model\n"
        code += "print(download(Model(repo='org/toy', dir=sys.argv[1]), progress=False).message)\n"
        try:
            run = subprocess.run(
                [sys.executable, "-c", code, str(tmp_path / "m")],
                env=env,
                timeout=60,
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"held past 60 s, {len(mirror.held)} connection(s) in the tarpit")  # main
        finally:
            mirror.close()
        assert run.returncode == 0, run.stderr
        assert "downloaded 2 files" in run.stdout, run.stdout  # over /resolve/, bounded
        assert mirror.held == []
        assert (tmp_path / "m" / "tokenizer.json").read_bytes() == b"{}" * 1000


def test_a_listener_that_takes_the_port_while_the_server_loads_is_not_reported_as_the_server(
    seeded: Demo, strangers: list[int]
) -> None:
    """The preflight finds the port free; the server starts loading; nobody binds the port before
    vLLM does and answers `/health` 200. The readiness loop asked `/health` unkeyed and without the
    listener guard: main reported the server started and healthy (only the acceptance check after
    it failed; the real server died on the bound port). Now the start fails, naming the holder."""
    from tests.ownership_support import as_nobody

    def slow_start(doc: Any) -> None:
        doc["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = "5"  # the port bound after it

    seeded.write_spec(slow_start)
    apply = seeded.start("apply")
    deadline = time.monotonic() + 120
    while "Loading model from scratch" not in (seeded.log.read_text() if seeded.log.exists() else ""):
        assert time.monotonic() < deadline and apply.poll() is None, "the server never started loading"
        time.sleep(0.1)
    as_nobody(["/usr/bin/python3", "-c", IMPOSTOR, str(seeded.port)], {}, strangers)
    run = seeded.finish(apply)
    assert run.returncode == 4, run.output
    (row,) = [line for line in run.output.splitlines() if line.lstrip().startswith(("✓ server", "✗ server"))]
    assert "healthy after" not in row, run.output  # main: "✓ server changed: started ...; healthy after 0.6s"
    assert "✗ server" in row and "/health was answered by pid" in run.output and "user nobody" in run.output
