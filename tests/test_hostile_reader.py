"""Issue 24's hostile second reader: attacks found by reading only the docs and the code, each run
for real (a `nobody` process through setpriv, real files, links and listeners), each seen
succeeding on main before its fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.apply_support import Demo
from tests.test_network_attacks import attacker, demo, watched
from tests.test_untrusted_trees import BOUND, Tree, tree

__all__ = ["demo", "tree"]  # the fixtures, from the network attacks and the source-tree attacks

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")


def nobody_runs(script: str) -> None:
    subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c", script],
        check=True,
        cwd="/",
        timeout=30,
    )


def tattler(directory: Path) -> Path:
    """nobody's program: run by anyone, it records the uid it ran as in `ran-as` beside it."""
    directory.mkdir()
    os.chown(directory, NOBODY, NOBODY)
    program = directory / "tattle"
    nobody_runs(f"printf '#!/bin/sh\\nid -u > {directory}/ran-as\\n' > {program} && chmod 755 {program}")
    return program


def cli(yard: Path, *args: str, spec: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "reconcile", *args, *(["--spec", str(spec)] if spec else [])]
    env = {**os.environ, "XDG_CACHE_HOME": str(yard / "cache")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, cwd=yard, env=env)


def spec_text(yard: Path) -> str:
    venv = f'[venv]\npath = "{yard}/venv"\npython = "/usr/bin/python3"\n'
    return f'[machine]\nstate_dir = "{yard}/state"\n\n{venv}'


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=30)


def committed_spec(yard: Path) -> tuple[Path, Path]:
    """A git repository under `yard`, root's, with the spec committed: (repository, spec)."""
    repo = yard / "fleet"
    repo.mkdir()
    git(repo, "init", "-q")
    spec = repo / "spec.toml"
    spec.write_text(spec_text(yard))
    git(repo, "add", "spec.toml")
    git(repo, "-c", "user.name=r", "-c", "user.email=r@x", "commit", "-qm", "spec")
    return repo, spec


@pytest.mark.parametrize("how", ["config 0666", "config nobody's"])
def test_a_spec_repository_config_others_can_write_never_makes_root_run_a_program(
    yard: Path, how: str
) -> None:
    """The spec and every directory above it are root's (provenance passes), but the repository's
    `.git/config` is writable by nobody. `plan` runs `git status` on the spec's repository as root:
    `core.fsmonitor` in that config is a program git runs."""
    repo, spec = committed_spec(yard)
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    assert f"git {commit[:12]}" in cli(yard, "plan", spec=spec).stdout  # a repository of root's: its commit
    config = repo / ".git" / "config"
    if how == "config 0666":
        config.chmod(0o666)
    else:
        os.chown(config, NOBODY, NOBODY)
    program = tattler(yard / "theirs")
    nobody_runs(f"printf '[core]\\n\\tfsmonitor = {program}\\n' >> {config}")
    run = cli(yard, "plan", spec=spec)
    assert run.returncode in (0, 2), run.stdout + run.stderr
    # main: "0": root ran nobody's program from the repository's config
    assert not (yard / "theirs" / "ran-as").exists()
    assert commit[:12] not in run.stdout  # the repository is not vouched for


# Text that reorders or hides what the terminal shows: a right-to-left override (U+202E) and its
# isolate (U+2067) turn "evil" around; a zero-width space, joiner and BOM hide a difference
# between two names; a pop (U+202C) and a left-to-right mark. None is a C0/C1 control.
INVISIBLE = "\u202e\u2067\u200b\u200d\ufeff\u202c\u200e\u2066\u2069\u061c\u2060"


def test_bidi_overrides_and_zero_width_characters_from_a_listener_never_reach_the_terminal(
    demo: Demo, strangers: list[int]
) -> None:
    """nobody holds the port and answers /version and /v1/models with text that reorders the
    line (Trojan Source's U+202E) or hides characters. main: `status` printed them raw."""
    attacker(demo, strangers, "escapes", "*", "x" + INVISIBLE + "live.")
    for command in ("status", "plan", "check"):
        run = watched(demo, command)
        assert run.returncode is not None, run
        raw = [f"U+{ord(c):04X}" for c in INVISIBLE if c in run.output]
        assert not raw, (command, raw, run.output)
    assert "0.26.0x\\u202e\\u2067\\u200b" in watched(demo, "status").output


@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer_config.json", "hf_quant_config.json", "model.safetensors.index.json"]
)
@pytest.mark.parametrize("kind", ["a FIFO", "a link to /dev/zero"])
def test_a_source_json_file_nobody_swaps_never_hangs_or_fills_the_first_plan(
    tree: Tree, name: str, kind: str
) -> None:
    """Before the first copy the preflight and the model.config change read the source's own JSON
    files (the copy is not there yet). nobody owns the source: main opened them by name, blocking,
    and read them whole (a FIFO hung `plan`; /dev/zero grew it without end)."""
    path = tree.source / name
    path.unlink(missing_ok=True)
    if kind == "a FIFO":
        tree.as_nobody("mkfifo", str(path))
    else:
        tree.as_nobody("ln", "-s", "/dev/zero", str(path))
    started = time.monotonic()
    try:
        plan = tree.cli("plan", timeout=BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"plan hung on {kind} at the source's {name}")  # main
    assert time.monotonic() - started < BOUND
    assert "Traceback" not in plan.output, plan.output
    assert plan.returncode in (1, 2), plan.output


def key_spec(yard: Path, name: str) -> Path:
    spec = yard / f"{name}.toml"
    spec.write_text(f'[machine]\nstate_dir = "{yard}/state"\n\n[api_key]\nfile = "{yard}/{name}.key"\n')
    return spec


def test_a_saved_plan_file_nobody_can_swap_never_chooses_the_spec_root_applies(yard: Path) -> None:
    """`reconcile plan --out` writes plan files 0644, so any user can read one; the plan file names
    the spec `apply FILE` applies. The operator saves plan A where nobody can write (a drop
    directory of theirs); nobody puts root's own saved plan of spec B (copied, readable) in its
    place. main: `apply FILE` applied spec B."""
    a, b = key_spec(yard, "a"), key_spec(yard, "b")
    private = yard / "private"
    private.mkdir(mode=0o755)
    assert cli(yard, "plan", "--out", str(private / "b.json"), spec=b).returncode == 2  # 0644
    drop = yard / "drop"
    drop.mkdir()
    os.chown(drop, NOBODY, NOBODY)
    plan = drop / "plan.json"
    assert cli(yard, "plan", "--out", str(plan), spec=a).returncode == 2
    nobody_runs(f"mv {plan} {drop}/old && cp {private}/b.json {plan}")
    run = cli(yard, "apply", str(plan))
    assert not (yard / "b.key").exists(), run.stdout + run.stderr  # main: spec B applied, exit 2
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert f"{drop} is owned by nobody" in run.stderr, run.stderr


def test_a_saved_plan_file_that_is_a_fifo_is_refused_not_waited_on(yard: Path) -> None:
    drop = yard / "drop"
    drop.mkdir(mode=0o755)
    os.mkfifo(drop / "plan.json")
    try:
        run = cli(yard, "apply", str(drop / "plan.json"))
    except subprocess.TimeoutExpired:
        pytest.fail("apply FILE waited on a FIFO")  # main
    assert run.returncode == 1 and "FIFO" in run.stderr and len(run.stderr.splitlines()) == 1, run.stderr


def evil_wheel(path: Path, marker: Path) -> None:
    """A wheel whose only file is a .pth: every start of the venv's python runs its import line."""
    import zipfile

    pth = f"import os; open({str(marker)!r}, 'w').write(str(os.getuid()))\n"
    info = "evilpkg-1.0.dist-info"
    files = {
        "evilpkg.pth": pth,
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def test_a_wheel_nobody_owns_in_roots_wheelhouse_never_runs_as_root(yard: Path) -> None:
    """The wheelhouse directory and every directory above it are root's (the read role passes),
    but one wheel in it is nobody's: nobody can rewrite it whenever it likes, and pip installs
    what it holds. main: apply installed nobody's .pth and root's venv python ran it."""
    wheelhouse = yard / "wheelhouse"
    wheelhouse.mkdir(mode=0o755)
    wheel = wheelhouse / "evilpkg-1.0-py3-none-any.whl"
    marker = yard / "theirs" / "ran-as"
    (yard / "theirs").mkdir()
    os.chown(yard / "theirs", NOBODY, NOBODY)
    evil_wheel(yard / "theirs" / "w.whl", marker)
    wheel.touch()
    os.chown(wheel, NOBODY, NOBODY)
    nobody_runs(f"cat {yard}/theirs/w.whl > {wheel}")
    spec = yard / "spec.toml"
    spec.write_text(spec_text(yard) + f'wheelhouse = "{wheelhouse}"\npackages = {{ evilpkg = "*" }}\n')
    run = cli(yard, "apply", spec=spec)
    assert not marker.exists(), run.stdout + run.stderr  # main: "0"
    assert str(wheel) in run.stdout + run.stderr and "nobody" in run.stdout + run.stderr, run.stdout


@pytest.mark.parametrize(
    "where",
    [
        "a 0777 wheelhouse of root's",
        "a 0666 wheel of root's",
        "a 0777 extra site-packages of root's",
        "nobody's module deep in an extra site-packages",
        "nobody's directory in an extra site-packages",
        "a 0666 apt key_source of root's",
    ],
)
def test_what_a_read_path_holds_is_held_to_the_read_role_not_only_the_way_to_it(
    yard: Path, where: str
) -> None:
    """The read role promised "root reads it and trusts what it says", but main checked only the
    directories on the way and the owner of the last component: a root-owned path anyone may
    write, or nobody's file inside a tree root reads (pip's wheelhouse, python's extra
    site-packages), planned clean, and apply then installed or imported what nobody put there."""
    tree = yard / "tree"
    tree.mkdir(mode=0o755)
    extra = ""
    if "wheel" in where:
        extra = f'wheelhouse = "{tree}"\n'
        (tree / "x-1.0-py3-none-any.whl").write_bytes(b"")
    elif "site-packages" in where:
        extra = f'extra_site_packages = ["{tree}"]\n'
        (tree / "pkg" / "sub").mkdir(parents=True, mode=0o755)
        (tree / "pkg" / "sub" / "mod.py").write_text("")
    spec = yard / "spec.toml"
    text = spec_text(yard) + extra
    if "key_source" in where:
        (tree / "key.asc").write_text("")
        text += (
            f'\n[apt]\nsources_dir = "{yard}/sources"\n\n[[apt.repositories]]\nname = "x"\n'
            f'uri = "https://example.invalid/x"\nsuite = "stable"\ncomponents = ["main"]\n'
            f'keyring = "{yard}/x.gpg"\nkey_source = "{tree}/key.asc"\n'
        )
    spec.write_text(text)
    target = {
        "a 0777 wheelhouse of root's": tree,
        "a 0666 wheel of root's": tree / "x-1.0-py3-none-any.whl",
        "a 0777 extra site-packages of root's": tree,
        "nobody's module deep in an extra site-packages": tree / "pkg" / "sub" / "mod.py",
        "nobody's directory in an extra site-packages": tree / "pkg",
        "a 0666 apt key_source of root's": tree / "key.asc",
    }[where]
    if where.startswith("nobody's"):
        os.chown(target, NOBODY, NOBODY)
    else:
        target.chmod(0o777 if target.is_dir() else 0o666)
    run = cli(yard, "plan", spec=spec)
    out = run.stdout + run.stderr
    assert "paths.owner" in out or f"{target} is" in out, out  # main: planned without a word
    assert f"{target} is" in out, out


def test_init_never_drafts_root_s_spec_from_another_users_server(yard: Path) -> None:
    """`reconcile init` as root reads every `vllm serve` on the machine. nobody starts one (any
    program with that command line) with its own model, flags and HF_ENDPOINT (a mirror of theirs):
    main drafted them into root's spec (--manage-server: live sections apply then runs)."""
    marker = "nobodys-mirror-5e1f"
    script = "import time; print('ready', flush=True); time.sleep(120)"
    argv = ["python3", "-c", script, "vllm.entrypoints.openai.api_server", "--model", f"{marker}/m"]
    proc = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
        env={"PATH": "/usr/bin:/bin", "HF_ENDPOINT": f"http://127.0.0.1:9/{marker}"},
        stdout=subprocess.PIPE,
        cwd="/",
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        out = yard / "drafted.toml"
        run = cli(yard, "init", "--out", str(out), "--manage-server", "--state-dir", str(yard / "state"))
        text = out.read_text() if out.exists() else ""
        assert marker not in text and marker not in run.stdout, text  # main: model and HF_ENDPOINT drafted
    finally:
        proc.kill()
        proc.wait()


def test_init_never_drafts_a_venv_another_user_owns(yard: Path) -> None:
    """`reconcile init` looks for venvs in users' homes (/home/*/*/bin/vllm). nobody's venv there is
    nobody's to fill (here with a FIFO among its packages' METADATA): main drafted it as root's
    [venv] (the path rule refuses it at plan, but root's draft should not name it)."""
    plant = "a FIFO at a METADATA"
    home = yard / "home"
    home.mkdir(mode=0o755)
    venv = home / "nobody" / "venv"
    (home / "nobody").mkdir()
    os.chown(home / "nobody", NOBODY, NOBODY)
    site = venv / "lib" / "python3.12" / "site-packages"
    nobody_runs(
        f"mkdir -p {venv}/bin {site}/vllm-0.26.0.dist-info && printf '#!/bin/sh\\n' > {venv}/bin/vllm"
        f" && chmod 755 {venv}/bin/vllm && printf 'home = /usr/bin\\nversion = 3.12.3\\n' > {venv}/pyvenv.cfg"
        f" && printf 'Name: vllm\\nVersion: 0.26.0\\n' > {site}/vllm-0.26.0.dist-info/METADATA"
    )
    target = venv / "pyvenv.cfg" if "pyvenv" in plant else site / "vllm-0.26.0.dist-info" / "METADATA"
    nobody_runs(f"rm {target} && mkfifo {target}")
    code = (
        "from reconcile.authoring.init_survey import probe_machine\n"
        f"facts = probe_machine(venv_globs=({str(home)!r} + '/*/*/bin/vllm',))\n"
        "print('venv', facts.venv and facts.venv.path, facts.other_venvs)\n"
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=BOUND, cwd=yard
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"init hung on {plant} in nobody's venv")  # main
    assert run.returncode == 0, run.stderr
    assert str(venv) not in run.stdout, run.stdout


DRIP = """
import sys
from actions.model import download
from reconcile.spec.models import Model
download(Model(repo="org/toy", dir=sys.argv[1]), progress=False)
"""


def test_a_mirror_that_drips_a_download_cannot_hold_apply(tmp_path: Path) -> None:
    from tests.fakes.hub_server import FakeHub

    with FakeHub(throttle_bps=1024) as hub:
        hub.add_commit("org/toy", {"config.json": b"{}", "model.safetensors": os.urandom(4 << 20)})
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}
        try:
            run = subprocess.run(
                [sys.executable, "-c", DRIP, str(tmp_path / "m")],
                env=env,
                timeout=30,
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("a 4 MiB download at 1 KiB/s held the download past 30 s")  # main: ~70 min
        # given up in one window (no retry: a drip is not a transient failure), and said so
        assert "under the least rate" in run.stderr, run.stderr
        assert not (tmp_path / "m" / "model.safetensors").exists()


RACER = r"""
import os, sys, time
parent, victim = sys.argv[1], sys.argv[2]
keys, aside = os.path.join(parent, "keys"), os.path.join(parent, "aside")
print("ready", flush=True)
end = time.monotonic() + 60
n = 0
while time.monotonic() < end:
    try:
        os.rename(keys, aside + str(n))  # the moment root's makedirs made it
    except OSError:
        continue
    try:
        os.symlink(victim, keys)
    except OSError:
        pass
    n += 1
"""


def test_the_key_owner_cannot_turn_the_new_key_directory_into_a_link_to_roots(yard: Path) -> None:
    """The path rule lets the key's `owner` own the directories above the key. When the key's own
    directory is missing, main made it (makedirs) and then chmod/chown'ed it by name: the owner
    (nobody here) renames the new directory and puts a link to a root directory in its place, and
    root chowns that directory to nobody. Driven through the real action, many times, against a
    real racing `nobody` process."""
    from actions.api_key import ensure_key
    from reconcile.spec.models import ApiKey

    parent = yard / "nobody"
    parent.mkdir()
    os.chown(parent, NOBODY, NOBODY)
    victim = yard / "victim"
    victim.mkdir(mode=0o755)
    racer = subprocess.Popen(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            sys.executable,
            "-c",
            RACER,
            str(parent),
            str(victim),
        ],
        stdout=subprocess.PIPE,
        cwd="/",
    )
    try:
        assert racer.stdout is not None and racer.stdout.readline().strip() == b"ready"
        key = ApiKey(file=str(parent / "keys" / "api.key"), owner="nobody")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and victim.stat().st_uid == 0:
            with contextlib.suppress(Exception):
                ensure_key(key)
            for entry in parent.iterdir():  # nobody's leftovers: root may clean its own test yard
                with contextlib.suppress(OSError):  # the racer moves them meanwhile
                    if entry.is_symlink() or entry.is_file():
                        entry.unlink()
                    else:
                        shutil.rmtree(entry, ignore_errors=True)
    finally:
        racer.kill()
        racer.wait()
    st = victim.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)  # main: nobody's, 0700, within seconds


def test_remote_code_from_a_source_another_user_writes_is_refused(tree: Tree) -> None:
    """A `[model] source` is data whoever writes it, as long as the server reads it as data. With
    `trust-remote-code` vLLM imports the model's own .py files (copied from the source) in the
    server, root's by default: nobody's source becomes nobody's code in root's server. main: the plan
    went ahead without a word."""
    nobody_runs(f"printf 'import os\\nos.system(\"id > /tmp/x\")\\n' > {tree.source}/modeling_x.py")
    tree.spec.write_text(
        tree.spec.read_text()
        + '\n[server]\nname = "m"\nexecutable = "/bin/true"\nlog = "'
        + str(tree.root / "m.log")
        + '"\nargs = { trust-remote-code = true }\n'
    )
    plan = tree.cli("plan")
    assert "Traceback" not in plan.output, plan.output
    assert "trust-remote-code" in plan.output and str(tree.source) in plan.output, plan.output
    assert plan.returncode == 1 or "✗" in plan.output, plan.output


def test_a_path_entry_another_user_writes_never_supplies_a_program_root_runs(yard: Path) -> None:
    """reconcile runs git, pip's helpers, apt-get, systemctl, nvidia-smi... by name, through PATH.
    A PATH entry nobody can write (a directory of theirs in an operator's or a unit's PATH) put
    nobody's `git` in root's plan: main ran it as root."""
    _, spec = committed_spec(yard)
    theirs = tattler(yard / "theirs")
    nobody_runs(f"mv {theirs} {theirs.parent}/git")
    argv = [sys.executable, "-m", "reconcile", "plan", "--spec", str(spec)]
    env = {**os.environ, "XDG_CACHE_HOME": str(yard / "cache"), "PATH": f"{theirs.parent}:/usr/bin:/bin"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, cwd=yard, env=env)
    assert run.returncode in (0, 2), run.stdout + run.stderr
    assert not (yard / "theirs" / "ran-as").exists()  # main: "0"
    assert "git " in run.stdout.splitlines()[0], run.stdout  # root's own git, from /usr/bin, still asked


SHADOW = "import os; open({mark!r}, 'w').write(str(os.getuid())); raise SystemExit('shadowed')\n"


def shadowing_repo(yard: Path) -> Path:
    """A fleet repository whose specs directory also holds a json.py (merged with a spec change;
    reviewers read the TOML): data, never code root runs."""
    repo = yard / "fleet"
    repo.mkdir()
    (repo / "gpu-1.toml").write_text(spec_text(yard))
    (repo / "json.py").write_text(SHADOW.format(mark=str(yard / "ran-as")))
    return repo


def test_python_m_reconcile_in_a_fleet_repository_never_imports_its_python_files(yard: Path) -> None:
    """`python -m reconcile` puts the current directory first on sys.path. CI runs `validate` in the
    repository under review; main imported its json.py (validate, then plan, as root)."""
    repo = shadowing_repo(yard)
    for args in (("validate", str(repo)), ("plan", "--spec", str(repo / "gpu-1.toml"))):
        run = subprocess.run(
            [sys.executable, "-m", "reconcile", *args],
            capture_output=True,
            text=True,
            timeout=BOUND,
            cwd=repo,
        )
        assert not (yard / "ran-as").exists(), (args, run.stderr)  # main: "0", "shadowed"
        assert "shadowed" not in run.stderr and run.returncode in (0, 2), run.stderr


def test_the_timer_never_imports_python_files_beside_the_spec(yard: Path) -> None:
    """The timer's unit runs `python -m reconcile` with WorkingDirectory= the spec's directory: on
    main every scheduled apply, as root, imported a json.py that lay beside the spec."""
    from reconcile.unattended.timer import Schedule, parse_every, render_service

    repo = shadowing_repo(yard)
    spec = str(repo / "gpu-1.toml")
    schedule = Schedule(spec, str(yard / "state"), parse_every("15m"), 0)
    unit = render_service(schedule)
    (line,) = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    argv = [w.strip('"') for w in line[len("ExecStart=") :].split()]
    (cwd,) = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("WorkingDirectory=")]
    assert cwd == str(repo)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, cwd=cwd)  # as systemd would
    assert not (yard / "ran-as").exists(), run.stderr  # main: "0"
    assert "shadowed" not in run.stderr, run.stderr


def test_the_pythons_reconcile_runs_never_import_python_files_beside_the_spec(yard: Path) -> None:
    """The timer's apply runs in the spec's directory; apply runs the venv's `python -m pip` and
    `python -c` there, each of which puts the current directory first on sys.path. main: a json.py
    beside the spec was imported by root's pip."""
    repo = shadowing_repo(yard)
    wheelhouse = yard / "wheelhouse"
    wheelhouse.mkdir(mode=0o755)
    evil_wheel(wheelhouse / "evilpkg-1.0-py3-none-any.whl", yard / "unused")  # root's own wheel
    (repo / "gpu-1.toml").write_text(
        spec_text(yard) + f'wheelhouse = "{wheelhouse}"\npackages = {{ evilpkg = "*" }}\n'
    )
    argv = [sys.executable, "-P", "-m", "reconcile", "apply", "--spec", str(repo / "gpu-1.toml")]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND * 2, cwd=repo)
    assert not (yard / "ran-as").exists(), run.stdout + run.stderr  # main: "0", from pip
    assert run.returncode == 2, run.stdout + run.stderr


def test_an_nvcc_another_user_owns_in_the_toolkit_never_runs_as_root(yard: Path) -> None:
    """A toolkit unpacked from a tarball keeps the archive's owners: its bin/nvcc can be another
    user's while every directory is root's. Every plan runs `nvcc --version` as root: main ran
    nobody's nvcc (it could then rewrite it whenever it liked)."""
    target = yard / "cuda-13.0"
    (target / "bin").mkdir(parents=True, mode=0o755)
    (target / "bin").chmod(0o755)
    target.chmod(0o755)
    nvcc = target / "bin" / "nvcc"
    nvcc.touch()
    os.chown(nvcc, NOBODY, NOBODY)
    mark = yard / "theirs" / "ran-as"
    (yard / "theirs").mkdir()
    os.chown(yard / "theirs", NOBODY, NOBODY)
    nobody_runs(
        f"printf '#!/bin/sh\\nid -u > {mark}\\necho release 13.0, V13.0.88\\n' > {nvcc} && chmod 755 {nvcc}"
    )
    (yard / "cuda").symlink_to(target)
    spec = yard / "spec.toml"
    spec.write_text(spec_text(yard) + f'\n[cuda]\nhome = "{yard}/cuda"\ntarget = "{target}"\n')
    run = cli(yard, "plan", spec=spec)
    assert not mark.exists(), run.stdout + run.stderr  # main: "0"
    assert "Traceback" not in run.stderr, run.stderr
    assert "bin/nvcc is owned by nobody" in run.stdout, run.stdout
