"""Actions for the Python venv: create it (plus a .pth for extra site-packages), install packages.

Called by the executor for the `venv` Change: `create` first, then `install` with the packages
whose installed version does not satisfy the spec. Installs go through pip or uv (`installer_for`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from actions.venv_index import index_urls, netrc_env
from reconcile.errors import ActionError
from reconcile.host import (
    CommandTimeout,
    Completed,
    ToolMissing,
    atomic_write,
    checkpoint,
    run,
    run_lines,
)
from reconcile.plan.records import ActionResult
from reconcile.safety.filesafety import FIX, UnsafePath, resolve_exec
from reconcile.safety.sensitive import redact_url
from reconcile.safety.untrusted import load_json

if TYPE_CHECKING:
    from reconcile.spec.models import Venv

log = logging.getLogger(__name__)
output_log = logging.getLogger(__name__ + ".output")  # the installer's lines, as they come (live progress)

PTH_NAME = "reconcile-extra-site.pth"
CREATE_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 3600.0  # vLLM and its CUDA stack are ~11 GB
# benchmarks/uv_vs_pip.py on the 2-core CI machine (ninja, six, attrs into fresh venvs, median of 3;
# uv 0.13.9, pip 23.2.1): pip 0.91 s / uv 0.22 s with warm caches, pip 0.80 s / uv 0.30 s without.
# "auto" follows it: uv whenever it is on PATH.
UV_IS_FASTER = True

# Prints {normalised name: version} for the asked distributions, first on sys.path wins (as imports do).
_VERSIONS = """
import importlib.metadata as m, json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
want, found = {norm(n) for n in sys.argv[1:]}, {}
for dist in m.distributions():
    name = norm(dist.metadata["Name"] or "")
    if name in want and name not in found:
        found[name] = dist.version
print(json.dumps(found))
"""


def trusted_python(venv: Venv, *, missing_ok: bool = False) -> str | None:
    """The real path of [venv].python (a name is looked up on PATH), walked by the trust layer: root
    runs it, so it and every directory on its way must be root's or ours (filesafety.resolve_exec).
    The one way anything runs the spec's interpreter (a venv's creation, its release check, `reconcile
    lock`'s). None when it is not there and `missing_ok`."""
    found = venv.python if venv.python.startswith("/") else shutil.which(venv.python)
    if found is None or not os.path.lexists(found):
        if missing_ok:
            return None
        raise ActionError(
            f"[venv].python: interpreter {venv.python!r} not found: install it "
            f"(e.g. apt-get install {os.path.basename(venv.python)}-venv) or name one on PATH"
        )
    try:
        real = resolve_exec(found, what="[venv].python")
    except UnsafePath as exc:
        raise ActionError(f"[venv].python {found}: {exc}; {FIX}") from None
    if (problem := library_problem(real)) is not None:
        raise ActionError(
            f"[venv].python {found}: {problem} (the interpreter imports its standard library at every start, "
            "`-m venv` and ensurepip's bundled pip included); chown -R root: that install (a copy keeps its "
            "owners), or name an interpreter only root can change"
        )
    return real


# Where a python's own library lives, as getpath finds it without PYTHONHOME: a pyvenv.cfg beside the
# program or one up (the first found) whose `home` moves the search there; then, from the program's
# directory (or that home) up to "/", the first directory whose lib/python3.X holds os.py (its landmark)
# or lib/python3X.zip. Site directories are left to the rules that judge them (root runs the spec's
# interpreter with -S; system_site_packages walks the base's).
_SITE_DIRS = ("site-packages", "dist-packages")


def library_problem(python: str) -> str | None:
    """Why what `python` (a real path, checked by the exec role) reads at start is not root's or ours
    alone: its standard library, whole tree but the site directories, and a pyvenv.cfg that would
    redirect it (seventeenth round: a standalone install whose `venv/__init__.py` is nobody's ran as
    uid 0 at `python -I -S -m venv`; eighteenth: the same install named by a copied venv python's
    pyvenv.cfg `home`, whose own prefix has no library)."""
    from reconcile.safety.filesafety import pyvenv_cfg, pyvenv_home, read_problem

    bindir = os.path.dirname(python)
    for cfg in (os.path.join(bindir, "pyvenv.cfg"), os.path.join(os.path.dirname(bindir), "pyvenv.cfg")):
        if (problem := read_problem(cfg)) is not None:
            return problem
    read = pyvenv_cfg(bindir)
    start = (pyvenv_home(read) if read is not None else None) or bindir
    libs = list(dict.fromkeys(_prefix_libraries(start) + _build_libraries([bindir, start])))
    for found in _getpath_files(bindir, start, libs):
        if (problem := read_problem(found)) is not None:
            return problem
        for named in _pth_paths(found) if found.endswith("._pth") else []:
            if (problem := read_problem(named, entries=-1)) is not None:
                return f"{problem} (its {found} puts it on the path)"
    for lib in libs:
        parts = [lib] + [os.path.join(lib, e) for e in sorted(os.listdir(lib)) if e not in _SITE_DIRS]
        for part in parts if os.path.isdir(lib) else [lib]:
            if (problem := read_problem(part, entries=1 if part == lib else -1)) is not None:
                return problem
        if (problem := _extensions_problem(lib)) is not None:
            return problem
    return None


def _getpath_files(bindir: str, start: str, libs: list[str]) -> list[str]:
    """The files besides pyvenv.cfg that getpath reads to move the search path, in the directories it
    looks in: a `._pth` beside the program, its base (`start`) and its libpython (`<prefix>/lib`), whose
    lines are sys.path whole, -I -S or not (twenty-first round: a standalone install's `python3._pth` of
    nobody's named their `venv` first at `-m venv`), and a build directory's `pybuilddir.txt`, which
    names lib-dynload."""
    dirs = dict.fromkeys([bindir, start, *(os.path.dirname(lib) for lib in libs)])
    return [
        os.path.join(d, f)
        for d in dirs
        if os.path.isdir(d)
        for f in sorted(os.listdir(d))
        if f.endswith("._pth") or f == "pybuilddir.txt"
    ]


def _pth_paths(pth: str) -> list[str]:
    """The directories (or zips) a `._pth` puts on sys.path, as getpath reads its lines: up to a `#`,
    stripped, from the file's directory; `import` lines and empty ones are not paths (twenty-first round:
    a `._pth` of root's naming nobody's directory imported their `venv` at `-m venv`)."""
    from reconcile.safety.filesafety import getpath_lines

    lines = (line.partition("#")[0].strip() for line in getpath_lines(pth) or [])
    paths = [line for line in lines if line and not line.startswith("import ")]
    return [os.path.join(os.path.dirname(pth), line) for line in paths]


def _prefix_libraries(start: str) -> list[str]:
    """The `lib/python3.X` (or `lib64/`) trees python takes from `start` up, as getpath finds its two
    prefixes, each on its own walk: the first with `os.py` (or a `python3X.zip`) for `prefix`, the first
    with a `lib-dynload` directory for `exec_prefix`, whose extension modules it imports (twentieth
    round: an `inner/lib/python3.X/lib-dynload` below the judged library loaded a module of nobody's)."""
    import glob

    found = []
    for landmark in ("os.py", "lib-dynload"):  # a python3X.zip stands for os.py (prefix only)
        for prefix in _ancestors(start):
            libs = sorted(glob.glob(os.path.join(glob.escape(prefix), "lib*", "python3*")))
            zipped = landmark == "os.py"
            libs = [
                lib
                for lib in libs
                if os.path.exists(os.path.join(lib, landmark)) or (zipped and lib.endswith(".zip"))
            ]
            if libs:
                found += libs
                break
    return list(dict.fromkeys(found))


def _build_libraries(dirs: list[str]) -> list[str]:
    """The directories getpath takes the library from when the program runs in its build tree, which it
    sees by a `pybuilddir.txt` or `Modules/Setup.local` beside the program: a `Lib` with `os.py` up from
    there (each such, a superset of the one it takes), and the directory `pybuilddir.txt`'s first line
    names from there (lib-dynload; the program's own directory when the line is empty) (twenty-second
    round: `Modules/Setup.local` beside a standalone install's program made its `../Lib`, never judged,
    the library: nobody's `venv` ran as uid 0 at `-m venv`)."""
    from reconcile.safety.filesafety import getpath_lines

    found = []
    for d in dirs:
        txt = os.path.join(d, "pybuilddir.txt")
        if not (os.path.lexists(txt) or os.path.lexists(os.path.join(d, "Modules", "Setup.local"))):
            continue
        found += [
            os.path.join(p, "Lib") for p in _ancestors(d) if os.path.exists(os.path.join(p, "Lib", "os.py"))
        ]
        found += [os.path.join(d, line) for line in (getpath_lines(txt) or [""])[:1]]
    return [path for path in found if os.path.isdir(path)]


def _extensions_problem(lib: str) -> str | None:
    """What the loader loads for each extension module (`*.so`) of the standard library `lib`, which
    python dlopens as it imports it (twentieth round: `_posixsubprocess`'s RUNPATH, nobody's directory,
    loaded nobody's library as uid 0 at `-m venv`)."""
    from reconcile.safety.filesafety import dlopen_problem

    walked = set()
    for root, dirs, files in os.walk(lib, followlinks=True):  # python imports through links too
        walked.add(os.path.realpath(root))
        skip = walked.union(_SITE_DIRS if root == lib else ())
        dirs[:] = [d for d in dirs if d not in skip and os.path.realpath(os.path.join(root, d)) not in skip]
        for module in (os.path.join(root, f) for f in sorted(files) if f.endswith(".so")):
            if (problem := dlopen_problem(module)) is not None:
                return f"its extension module {module}: {problem}"
    return None


def _ancestors(path: str) -> list[str]:
    """`path` and each directory above it, up to "/"."""
    out = [path]
    while out[-1] != os.path.dirname(out[-1]):
        out.append(os.path.dirname(out[-1]))
    return out


# How root runs the spec's interpreter (the venv's creation, its release check, `reconcile lock`'s
# probe): -S, so no `.pth` of its site-packages runs and no `sitecustomize` is imported (the exec role
# judged the program, not what it loads at start from a tree that may keep another user's files: a
# standalone install unpacked with its archive's owners); -I, so no PYTHON* variable and no user site.
# `-m venv` needs neither: the new venv's own python (ensurepip's) reads only the new venv.
ISOLATED = ("-I", "-S")


def _python(venv: Venv) -> str:
    return os.path.join(venv.path, "bin", "python")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _redact(text: str) -> str:
    """Index URLs may carry credentials (https://user:token@host/): never repeat them."""
    return redact_url(text)


def _tail(out: Completed, lines: int = 10) -> str:
    text = [ln for ln in (out.stdout + "\n" + out.stderr).splitlines() if ln.strip()]
    errors = [ln for ln in text if re.match(r"^\s*(ERROR|error|×|╰─▶|\S*Error\b)", ln)]
    return _redact("\n".join((errors or text)[-lines:]) or f"exit code {out.returncode}")


def _run(
    argv: Sequence[str],
    timeout: float,
    what: str,
    extra: Mapping[str, str] | None = None,
    *,
    stream: bool = False,
) -> Completed:
    """`extra`: more environment (a netrc for index credentials); `stream`: each output line goes to the
    log as it comes (apply shows it as live progress)."""
    try:
        # Our own PYTHONPATH/PYTHONHOME must not leak in: pip would count what it finds there as
        # installed in the venv and skip it (reconcile itself may run from a --target dir).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(extra or {})
        env = {**env, "PIP_NO_INPUT": "1", "NO_COLOR": "1"}
        if stream:
            return run_lines(
                argv, on_line=lambda line: output_log.info("%s", _redact(line)), env=env, timeout=timeout
            )
        return run(argv, env=env, timeout=timeout)
    except ToolMissing as exc:
        raise ActionError(f"{what}: {exc}") from None
    except CommandTimeout as exc:
        raise ActionError(_redact(f"{what}: {exc}")) from None


# A venv with pip takes about 20 MiB; less than this free after a failed creation is the reason.
_VENV_NEEDS = 32 * 1024 * 1024


def _no_space(path: str, out: Completed) -> str | None:
    """Say so when a creation failed for want of space: venv hides ensurepip's own error ("returned
    non-zero exit status 1"), so the filesystem holding `path` is asked too."""
    where = path
    while not os.path.exists(where) and where != os.path.dirname(where):
        where = os.path.dirname(where)
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if "No space left on device" not in out.stdout + out.stderr and free >= _VENV_NEEDS:
        return None
    return (
        f"No space left on device: the filesystem holding {path} has {free // 1024} KiB free and a venv "
        "with pip needs about 30 MiB: free some space, then apply again"
    )


def _pyvenv_cfg(venv: Venv) -> dict[str, str]:
    cfg: dict[str, str] = {}
    with open(os.path.join(venv.path, "pyvenv.cfg"), encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.partition("=")
            if sep:
                cfg[key.strip()] = value.strip()
    return cfg


def _check_interpreter(venv: Venv) -> None:
    """A venv made from another Python release cannot be fixed in place (and holds gigabytes)."""
    cfg = _pyvenv_cfg(venv)
    have = ".".join((cfg.get("version_info") or cfg.get("version") or "").split(".")[:2])
    python = trusted_python(venv, missing_ok=True)
    if python is None:
        return  # the venv still works; only re-creating it would need that interpreter
    try:
        out = run([python, *ISOLATED, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=30)
    except ToolMissing:
        return  # the venv still works; only re-creating it would need that interpreter
    want = out.stdout.strip()
    if out.ok and have and want != have:
        raise ActionError(
            f"{venv.path} was made with Python {have}, the spec's {venv.python} is Python {want}: "
            f"move it aside (mv {venv.path} {venv.path}.py{have}) and re-run to create it anew"
        )


def _sync_system_site(venv: Venv) -> str | None:
    path = os.path.join(venv.path, "pyvenv.cfg")
    want = "true" if venv.system_site_packages else "false"
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, old = [], None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "include-system-site-packages":
            old = value.strip()
            line = f"include-system-site-packages = {want}"
        out.append(line)
    if old is None:
        out.append(f"include-system-site-packages = {want}")
    if old == want:
        return None
    atomic_write(path, ("\n".join(out) + "\n").encode())
    return f"include-system-site-packages {old} -> {want}"


def _sync_pth(venv: Venv) -> str | None:
    for extra in venv.extra_site_packages:
        if not os.path.isdir(extra):
            raise ActionError(
                f"[venv].extra_site_packages: {extra} is not a directory: fix the path "
                "(it must be another environment's site-packages)"
            )
    out = _run([_python(venv), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], 30, "venv")
    if not out.ok:
        raise ActionError(f"{_python(venv)} does not run: {_tail(out)}")
    pth = os.path.join(out.stdout.strip(), PTH_NAME)
    try:
        with open(pth, encoding="utf-8") as f:
            current: str | None = f.read()
    except FileNotFoundError:
        current = None
    if not venv.extra_site_packages:
        if current is None:
            return None
        os.unlink(pth)
        return f"removed {pth}"
    content = "# Written by reconcile from [venv].extra_site_packages\n" + "".join(
        f"{extra}\n" for extra in venv.extra_site_packages
    )
    if current == content:
        return None
    atomic_write(pth, content.encode(), mode=0o644)
    return f"{pth} lists {', '.join(venv.extra_site_packages)}"


def create(venv: Venv) -> ActionResult:
    """Make `venv.path` a venv of the spec's interpreter, with the spec's site-packages visibility."""
    done: list[str] = []
    if os.path.exists(_python(venv)) and os.path.exists(os.path.join(venv.path, "pyvenv.cfg")):
        _check_interpreter(venv)
        if (changed := _sync_system_site(venv)) is not None:
            done.append(changed)
        if (repaired := _ensure_pip(venv)) is not None:
            done.append(repaired)
    else:
        if (
            os.path.isdir(venv.path)
            and os.listdir(venv.path)
            and not os.path.exists(os.path.join(venv.path, "pyvenv.cfg"))
        ):
            raise ActionError(
                f"{venv.path} exists and is not a venv: move it aside (mv {venv.path} {venv.path}.old) "
                "or set [venv].path elsewhere"
            )
        python = trusted_python(venv)
        assert python is not None
        argv = [
            python,
            *ISOLATED,
            "-m",
            "venv",
            *(["--system-site-packages"] if venv.system_site_packages else []),
        ]
        if installer_for(venv) == "uv":
            # uv installs into a venv without pip: ensurepip was 63-70% of a from-scratch demo apply.
            argv.append("--without-pip")
        try:
            out = run([*argv, venv.path], timeout=CREATE_TIMEOUT_S)
        except ToolMissing:
            raise ActionError(
                f"[venv].python: interpreter {venv.python!r} not found: install it "
                f"(e.g. apt-get install {os.path.basename(venv.python)}-venv) or name one on PATH"
            ) from None
        except CommandTimeout as exc:
            raise ActionError(str(exc)) from None
        if not out.ok:
            if (full := _no_space(venv.path, out)) is not None:
                raise ActionError(f"{' '.join(argv)} {venv.path} failed: {full}")
            raise ActionError(f"{' '.join(argv)} {venv.path} failed:\n{_tail(out)}")
        checkpoint("venv.created")
        done.append(f"created {venv.path} with {venv.python}")
    if (pth := _sync_pth(venv)) is not None:
        done.append(pth)
    if not done:
        return ActionResult(False, f"{venv.path} is already a venv as the spec says")
    return ActionResult(True, "; ".join(done))


def _ensure_pip(venv: Venv) -> str | None:
    """A venv whose creation was killed during ensurepip has no pip: bring it back (pip installs only)."""
    import glob

    if installer_for(venv) != "pip" or glob.glob(
        os.path.join(venv.path, "lib", "python3*", "site-packages", "pip")
    ):
        return None
    out = _run([_python(venv), "-m", "ensurepip", "--default-pip"], CREATE_TIMEOUT_S, "ensurepip")
    if not out.ok:
        raise ActionError(f"{venv.path} has no pip and ensurepip failed:\n{_tail(out)}")
    return f"restored pip in {venv.path} (its creation had been interrupted)"


def installer_for(venv: Venv) -> Literal["pip", "uv"]:
    """uv when the spec asks for it, or on "auto" when it is on PATH (it measured faster)."""
    if venv.installer == "auto":
        return "uv" if UV_IS_FASTER and shutil.which("uv") else "pip"
    return venv.installer


def installed_versions(python: str, names: Sequence[str]) -> dict[str, str]:
    """{normalised name: version} of the asked distributions, as the venv's interpreter sees them."""
    out = _run([python, "-c", _VERSIONS, *names], 60, "reading installed versions")
    if not out.ok:
        raise ActionError(f"{python} cannot read its installed packages: {_tail(out)}")
    try:
        found = load_json(out.stdout)
    except ValueError:
        raise ActionError(f"cannot parse installed versions from {python}: {out.stdout[:500]!r}") from None
    return {str(k): str(v) for k, v in found.items()}


def _satisfies(version: str | None, spec: str) -> bool:
    if version is None:
        return False
    if spec == "*":
        return True
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _install_argv(venv: Venv, installer: str, requirements: Sequence[str]) -> list[str]:
    if installer == "uv":
        uv = shutil.which("uv")
        if uv is None:
            raise ActionError('[venv].installer = "uv" but uv is not on PATH: install uv or set installer')
        argv = [uv, "pip", "install", "--python", _python(venv), "--no-progress"]
    else:
        argv = [_python(venv), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    if venv.wheelhouse is not None:
        argv += ["--no-index", "--find-links", venv.wheelhouse]
    else:
        index, extra, _ = index_urls(venv)
        if index is not None:
            argv += ["--index-url", index]
        for url in extra:
            argv += ["--extra-index-url", url]
        if installer == "uv" and venv.extra_index_urls:
            argv += ["--index-strategy", "unsafe-best-match"]  # pip's meaning: best version of all indexes
    if venv.no_deps:
        argv.append("--no-deps")
    return argv + list(requirements)


def _summary(out: Completed) -> str:
    lines = (out.stdout + "\n" + out.stderr).splitlines()
    picked = [ln.strip() for ln in lines if ln.startswith(("Successfully installed", " + ", " - "))]
    return _redact("; ".join(picked) or "done")


def install(venv: Venv, wanted: Mapping[str, str]) -> ActionResult:
    """Install or upgrade the `wanted` packages (name -> specifier, "*" = any) that are not satisfied."""
    python = _python(venv)
    if not os.path.exists(python):
        raise ActionError(f"{venv.path} is not a venv (no bin/python): it must be created before installing")
    before = installed_versions(python, list(wanted))
    todo = {name: spec for name, spec in wanted.items() if not _satisfies(before.get(_norm(name)), spec)}
    if not todo:
        seen = ", ".join(f"{n} {before[_norm(n)]}" for n in wanted)
        return ActionResult(False, f"already satisfied: {seen or '(nothing asked)'}")

    installer = installer_for(venv)
    if getattr(venv, "closure", None):
        return _install_closure(venv, installer, todo, before)
    requirements = [name if spec == "*" else f"{name}{spec}" for name, spec in todo.items()]
    if installer == "pip" and run([python, "-c", "import pip"], timeout=60).returncode != 0:
        raise ActionError(f'{venv.path} has no pip: set [venv].installer = "uv" or re-create the venv')
    checkpoint("venv.pip.before")
    with netrc_env(index_urls(venv)[2] if venv.wheelhouse is None else []) as netrc:
        out = _run(
            _install_argv(venv, installer, requirements),
            INSTALL_TIMEOUT_S,
            f"{installer} install",
            netrc,
            stream=True,
        )
    checkpoint("venv.pip.after")
    if not out.ok:
        raise ActionError(f"{installer} install {' '.join(requirements)} failed:\n{_tail(out)}")
    log.info("%s install %s: %s", installer, " ".join(requirements), _summary(out))

    after = installed_versions(python, list(todo))
    wrong = [
        f"{name} is {after.get(_norm(name), 'absent')}"
        for name, spec in todo.items()
        if not _satisfies(after.get(_norm(name)), spec)
    ]
    if wrong:
        raise ActionError(
            f"{installer} finished but {'; '.join(wrong)} (spec: {', '.join(requirements)}); "
            "a constraint file or an index without that version may be in the way"
        )
    changes = [
        f"{n} {before[_norm(n)]} -> {after[_norm(n)]}" if _norm(n) in before else f"{n} {after[_norm(n)]}"
        for n in todo
    ]
    return ActionResult(True, f"installed with {installer}: {', '.join(changes)}")


_HASH_MISMATCH = re.compile(r"DO NOT MATCH THE HASHES|[Hh]ash mismatch|hash.*does not match", re.S)


def _install_closure(
    venv: Venv, installer: str, todo: Mapping[str, str], before: Mapping[str, str]
) -> ActionResult:
    """Install the lock's whole closure in hash-checking mode (`--require-hashes -r`): every file must
    have a sha256 the lock recorded, and nothing outside the lock is installed."""
    import tempfile

    from reconcile.safety.names import LOCKED

    python = _python(venv)
    if installer == "pip" and run([python, "-c", "import pip"], timeout=60).returncode != 0:
        raise ActionError(f'{venv.path} has no pip: set [venv].installer = "uv" or re-create the venv')
    locked = {m.group(1): m.group(2) for m in (re.fullmatch(LOCKED, ln) for ln in venv.closure) if m}
    # A private 0700 directory: the file there names what root installs.
    with tempfile.TemporaryDirectory(prefix="reconcile-closure-") as directory:
        path = os.path.join(directory, "requirements.txt")
        atomic_write(path, ("\n".join(venv.closure) + "\n").encode(), mode=0o600)
        checkpoint("venv.pip.before")
        with netrc_env(index_urls(venv)[2] if venv.wheelhouse is None else []) as netrc:
            out = _run(
                _install_argv(venv, installer, ["--require-hashes", "-r", path]),
                INSTALL_TIMEOUT_S,
                f"{installer} install",
                netrc,
                stream=True,
            )
        checkpoint("venv.pip.after")
    if not out.ok and _HASH_MISMATCH.search(text := out.stdout + "\n" + out.stderr):
        # uv: "Hash mismatch for `toydep==1.1`"; pip: "    toydep==1.1 from file:///...:" under its banner
        named = re.findall(r"[Hh]ash mismatch for `([^`]+)`", text) or re.findall(
            r"^\s+(\S+==\S+) from ", text, re.M
        )
        raise ActionError(
            f"{installer} refused {', '.join(dict.fromkeys(named)) or 'a file'}: a file whose sha256 is not "
            "the lock's (the source serves other bytes than when `reconcile lock` ran); if that change "
            "is expected, run `reconcile lock` again"
        )
    if not out.ok:
        raise ActionError(f"{installer} install of the locked closure failed:\n{_tail(out)}")
    log.info("%s install of the locked closure: %s", installer, _summary(out))
    after = installed_versions(python, list(locked))
    wrong = [
        f"{n} is {after.get(_norm(n), 'absent')}"
        for n, v in locked.items()
        if not _satisfies(after.get(_norm(n)), f"=={v}")
    ]
    if wrong:
        raise ActionError(f"{installer} finished but {'; '.join(wrong)} (the lock's closure says otherwise)")
    own = {_norm(n) for n in venv.packages}
    moved = sorted((n for n in todo if _norm(n) in after), key=lambda n: _norm(n) not in own)
    changes = [
        f"{n} {before[_norm(n)]} -> {after[_norm(n)]}" if _norm(n) in before else f"{n} {after[_norm(n)]}"
        for n in moved
    ]
    others = len([n for n in moved if _norm(n) not in own])
    if others > 3:  # a vLLM closure is ~150: the spec's own packages, and a count of the rest
        changes = [*changes[: len(changes) - others], f"{others} more from the lock"]
    shown = ", ".join(changes) or "(nothing new)"
    what = f"the lock's closure ({len(locked)}, hashes checked)"
    return ActionResult(True, f"installed {what} with {installer}: {shown}")
