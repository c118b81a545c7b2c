"""The path rule: every path reconcile writes (as root) or trusts must sit where no other user can
swap or plant it (reconcile.safety.filesafety's StrictModes check). Called by reconcile.preflight for
every spec, so `plan` names the path and `apply` refuses before it touches anything."""

from __future__ import annotations

import contextlib
import os

from reconcile.plan.records import Finding
from reconcile.safety.filesafety import (
    FIX,
    LISTENER_FIX,
    UnsafePath,
    data_problem,
    env_value_problem,
    index_problem,
    installer_cache_dirs,
    installer_config_files,
    listener_problem,
    owners,
    parent_problem,
    pyvenv_home,
    read_problem,
    resolve_exec,
    tool_dir_problem,
)
from reconcile.safety.names import read_as  # pure: not spec.values, which loads pydantic_core
from reconcile.safety.untrusted import not_regular
from reconcile.spec.roles import EXEC, spec_paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec
    from reconcile.spec.roles import Role


def watched_paths(spec: Spec) -> list[tuple[str, str, frozenset[int], Role]]:
    """(key, path, who may own it and its parents, role) for each path the spec names
    (reconcile.spec.roles), plus the default executable, <venv>/bin/vllm, when none is named."""
    out = []
    for p in spec_paths(spec):
        allowed = owners()
        if p.key == "[api_key].file" and spec.api_key is not None:
            import pwd

            with contextlib.suppress(KeyError):  # the api_key action says the user does not exist
                allowed = owners({pwd.getpwnam(spec.api_key.owner).pw_uid})
        elif p.role.kind == "value" and spec.server is not None and spec.server.supervisor == "systemd":
            import pwd  # a unit of another user's: its caches may be that user's

            user = spec.server.user
            with contextlib.suppress(KeyError):
                allowed = owners({pwd.getpwnam(user).pw_uid}) if user not in (None, "root") else allowed
        out.append((p.key, p.path, allowed, p.role))
    if spec.server is not None and spec.server.executable is None and spec.venv is not None:
        out.append(("[server].executable", f"{spec.venv.path.rstrip('/')}/bin/vllm", owners(), EXEC))
    return out


def _server_path(spec: Spec) -> str:
    from actions.launching import server_path

    return server_path(spec)


def _exec_problem(path: str, allowed: frozenset[int], search: str | None = None) -> str | None:
    """Why root must not run `path` (None when it may); a program not there yet (pip makes it) is
    held to the rule for what root writes. `search`: the PATH it runs with (default ours)."""
    if not path.startswith("/"):
        import shutil

        found = shutil.which(path)
        if found is None:
            return None  # the venv action says the interpreter is not there
        path = found
    if not os.path.lexists(path):
        return parent_problem(path, allowed)
    try:
        resolve_exec(path, allowed, search=search)
    except UnsafePath as exc:
        return str(exc)
    return None


def symlinked_model_dir(model_dir: str) -> str | None:
    """Why a symlinked [model].dir is refused (None when it is not one): writing through the link
    would patch and overwrite the files of whatever it points at, backups and all."""
    if not os.path.islink(model_dir):
        return None
    return (
        f"[model].dir {model_dir} is a symlink (to {os.readlink(model_dir)}): reconcile writes only into a "
        f'real directory, never through a link; set [model].dir = "{os.path.realpath(model_dir)}" '
        "or replace the link with a directory"
    )


# What root reads below a read-role directory: a wheelhouse's whole tree (pip lists its top level, and
# reads each HTML file there as a page whose links may lead below it: seventeenth round), python a whole
# site-packages tree (any module, and .pth files where it is a site dir).
# Keyed by the spec key without a list index ("[venv].extra_site_packages[0]").
READ_ENTRIES = {"[venv].wheelhouse": -1, "[venv].extra_site_packages": -1}


def _unindexed(key: str) -> str:
    """ "[venv].extra_site_packages[0]" -> "[venv].extra_site_packages"."""
    head, bracket, tail = key.rpartition("[")
    return head if bracket and head and tail[:-1].isdigit() else key


def _remote_code_problem(spec: Spec) -> Finding | None:
    """A local `[model] source` is data whoever writes it, until `trust-remote-code` makes vLLM
    import the model's own .py files in the server (root's by default): then the source tree is
    code root runs, and is held to the read role, its whole tree (as an extra site-packages is). So is
    a local directory `[server] model` names, which the server reads in place (seventeenth round)."""
    server, model = spec.server, spec.model
    if server is None:
        return None
    # As vLLM reads the flag (fourteenth round): any spelling its argparse takes, or a --config file,
    # whose YAML vLLM reads as flags of its own.
    values = [v for k, v in server.args.items() if read_as(k, "trust-remote-code") or read_as(k, "config")]
    if all(v in (False, "false") for v in values):
        return None
    # vLLM (transformers) takes `[server] model` as a local directory where one is there, from the
    # server's working directory "/", else as a hub id.
    trees = [("[model].source", model.source)] if model is not None and model.source else []
    if server.model and os.path.isdir(os.path.join("/", server.model)):
        trees.append(("[server].model", os.path.join("/", server.model)))
    for key, tree in trees:
        if (problem := read_problem(tree, entries=-1)) is not None:
            return Finding(
                "paths.remote-code",
                "error",
                f"{key} {tree}: {problem}; with trust-remote-code (set in [server] args, in any spelling "
                "vLLM reads, or maybe by its --config file) the server runs the model's own Python code "
                "from it",
                "copy the model into a directory only root can write and name that, or drop "
                "trust-remote-code",
                {"path": tree, "key": key},
            )
    return None


# What of a CUDA toolkit root uses beyond bin/nvcc (checked by the exec role when it runs): the headers
# FlashInfer's JIT compiles into the server's kernels (whole trees), nvcc's own helpers (cicc, ptxas,
# nvvm), the libraries the kernels link (the top level). (relative glob, entries as in read_problem)
# Each walked whole: nvcc reads below bin (bin/crt/link.stub) and links below lib (lib64/stubs/libcuda.so).
TOOLKIT_PARTS = ("include", "targets/*/include", "nvvm", "bin", "lib64", "targets/*/lib")


def _toolkit_problem(spec: Spec) -> Finding | None:
    """A toolkit unpacked from a tarball keeps the archive's owners: a header or library of another
    user's, under root's directories, is theirs to change. The read role on the parts root's
    compilers read (TOOLKIT_PARTS), below `[cuda] target` (else what `home` points to)."""
    if spec.cuda is None:
        return None
    import glob

    key = "[cuda].target" if spec.cuda.target else "[cuda].home"
    top = spec.cuda.target or spec.cuda.home
    real = os.path.realpath(top)
    for part in TOOLKIT_PARTS:
        for path in sorted(glob.glob(os.path.join(glob.escape(real), part))):
            if (problem := read_problem(path, entries=-1)) is not None:
                return Finding(
                    "paths.owner",
                    "error",
                    f"{key} {top}: {problem} (the toolkit's {part})",
                    "chown -R root: the toolkit (a tarball keeps its archive's owners), or point "
                    f"{key} at a toolkit only root can write",
                    {"path": path, "key": key},
                )
    return None


def _unsigned_repo_problem(spec: Spec) -> Finding | None:
    """A repository no keyring vouches for (`trusted = true`: `[trusted=yes]`) is a local package index:
    dpkg runs its packages' maintainer scripts as root. Each local path its uri names (`file:`, `copy:`)
    is held to the index role (the read role, its whole tree), as `[venv] index_url`'s is."""
    import re

    for repo in spec.apt.repositories if spec.apt is not None else ():
        # apt's `copy:` method reads a local directory as `file:` does (seventeenth round: `copy:///<dir>`
        # read as a remote URL named no path).
        uri = re.sub(r"^(mirror\+)?copy:", r"\1file:", repo.uri, flags=re.IGNORECASE)
        if repo.trusted and (problem := index_problem(uri)) is not None:
            key = f"[apt].repositories.{repo.name}.uri"
            fix = f"make {repo.uri} root's alone, or give {key[:-4]} a keyring instead of trusted = true"
            return Finding(
                "paths.owner", "error", f"{key} {repo.uri}: {problem}", fix, {"path": repo.uri, "key": key}
            )
    return None


def _venv_tree_problem(spec: Spec) -> Finding | None:
    """What the venv holds, python runs as root: a venv copied in with its owners kept (`cp -a`, a
    tarball of a build user's) is held to the read role, whole tree, as a toolkit is. The whole venv,
    not its site-packages only: every start of its python reads `pyvenv.cfg`, whose `home` chooses
    where the standard library is found (ninth round), and pip reads the venv's `pip.conf`. A
    realization reconcile made and sealed in the spec's store (a directory of the delete role, walked
    above) is root's by construction: not walked again on every plan."""
    if spec.venv is None:
        return None
    from reconcile.apply.store import is_realization, read_manifest, spec_store

    real = os.path.realpath(spec.venv.path)
    store = spec_store(spec)
    if store is not None and is_realization(real, os.path.realpath(store)) and read_manifest(real):
        return None
    if os.path.isdir(real) and (problem := read_problem(real, entries=-1)) is not None:
        return Finding(
            "paths.owner",
            "error",
            f"[venv].path {spec.venv.path}: {problem} (root's python runs from this venv: its pyvenv.cfg, "
            "bin and site-packages)",
            "chown -R root: the venv (a copy keeps its owners), or let reconcile make it",
            {"path": real, "key": "[venv].path"},
        )
    if not spec.venv.system_site_packages:
        return None
    for site in _base_site_dirs(spec.venv.python, real):
        if (problem := read_problem(site, entries=-1)) is not None:
            return Finding(
                "paths.owner",
                "error",
                f"[venv].system_site_packages: {problem} (the venv's python imports from {site}, its base "
                "interpreter's, and runs each .pth there)",
                "chown -R root: that interpreter's install (a copy keeps its owners), or set "
                "system_site_packages = false",
                {"path": site, "key": "[venv].system_site_packages"},
            )
    return None


def _base_site_dirs(python: str, venv: str) -> list[str]:
    """The site directories a venv made with --system-site-packages shares with its base interpreter,
    found without running it: below the prefix of `[venv] python` (its real path's bin/..) and of the
    venv's pyvenv.cfg `home`, CPython's lib/python3.X/site-packages and Debian's dist-packages (as its
    site.py lists them)."""
    import glob
    import shutil

    bins = []
    found = python if python.startswith("/") else shutil.which(python)
    if found is not None:
        bins.append(os.path.dirname(os.path.realpath(found)))
    if (home := pyvenv_home(os.path.join(venv, "pyvenv.cfg"))) is not None:
        bins.append(home)
    out: list[str] = []
    for prefix in dict.fromkeys(os.path.dirname(b) for b in bins):
        for pattern in (
            "lib/python3*/site-packages",
            "lib/python3*/dist-packages",
            "lib/python3/dist-packages",
            "local/lib/python3*/dist-packages",
        ):
            out += sorted(glob.glob(os.path.join(glob.escape(prefix), pattern)))
    return list(dict.fromkeys(out))


def _installer_config_problem(spec: Spec) -> Finding | None:
    """pip and uv read config files no variable names (filesafety.installer_config_files: /etc/pip.conf,
    ~/.config/pip/pip.conf, ~/.config/uv/uv.toml, ...), each choosing the index root installs from, and
    keep caches root installs from (installer_cache_dirs: ~/.cache/uv, ...): held to the read role, and
    a cache to the rule for a directory the environment names (seventeenth round: HOME was judged as a
    directory only, and the defaults not at all)."""
    if spec.venv is None:
        return None
    config = "reads it for its own config: where it installs from, or how it builds what it installs"
    cache = "keeps its cache there: wheels it installs again without reading them anew"
    files = [(tool, p, read_problem, config) for tool, p in installer_config_files(os.environ)]
    caches = [(tool, p, tool_dir_problem, cache) for tool, p in installer_cache_dirs(os.environ)]
    for tool, path, rule, why in [*files, *caches]:
        if (problem := rule(path)) is not None:
            return Finding(
                "paths.owner",
                "error",
                f"[venv] {path}: {problem} (root's {tool} {why})",
                f"chown -R root: {path} and make it writable by root alone, or remove it",
                {"path": path, "key": "[venv].installer"},
            )
    return None


def _pth_problem(spec: Spec) -> Finding | None:
    """Each path line of a .pth file in the venv's site-packages is a directory every Python start
    puts on sys.path, and then imports `sitecustomize` from: root's server (and every python root
    runs from the venv) runs what is there. A directory an editable install (`pip install -e`) or a
    package's own .pth names is held to the read role, its whole tree, as `extra_site_packages` is; and
    so is each path that a module a .pth import line imports names (an editable finder's MAPPING:
    probes.venv.pth_imports)."""
    if spec.venv is None:
        return None
    import glob

    from probes.venv import pth_imports, scan_site_packages

    venv = spec.venv.path.rstrip("/")
    named = {os.path.normpath(p) for p in spec.venv.extra_site_packages}  # checked as the spec's paths
    for site in sorted(glob.glob(os.path.join(glob.escape(venv), "lib", "python3*", "site-packages"))):
        for entry in [*scan_site_packages(site)[1], *pth_imports(site)]:
            if entry.path in named:
                continue
            if (problem := read_problem(entry.path, entries=-1)) is not None:
                what = (
                    f"puts {entry.path} on the server's sys.path"
                    if entry.file.endswith(".pth")
                    else f"names {entry.path}, run or imported at every start of the venv's python"
                )
                return Finding(
                    "paths.owner",
                    "error",
                    f"[venv].path {venv}: {entry.file} {what} (root imports from it): {problem}",
                    "remove that line (or the .pth file), or move what it names under a directory only "
                    "root can write",
                    {"path": entry.path, "key": "[venv].path"},
                )
    return None


def path_findings(spec: Spec) -> tuple[Finding, ...]:
    """An error per path another user could swap, plant or make us follow (a symlinked log, a
    planted key, an executable in a directory they can write), for a symlinked model dir, and for a
    URL on this machine (an index, a value handed to the server) that another user's listener holds."""
    out = []
    if spec.model is not None and (why := symlinked_model_dir(spec.model.dir)) is not None:
        out.append(Finding("paths.symlink", "error", why, "", {"path": spec.model.dir, "key": "[model].dir"}))
    for what, path, allowed, role in watched_paths(spec):
        if role.kind == "exec":
            # The server runs with the launcher's PATH (a `#!/usr/bin/env NAME` script's NAME is found
            # there, [server] env PATH's directories included), every other program with ours.
            problem = _exec_problem(
                path, allowed, _server_path(spec) if what == "[server].executable" else None
            )
        elif role.kind == "read":  # root trusts what it reads: the file or tree, not only the way to it
            problem = read_problem(path, allowed, entries=READ_ENTRIES.get(_unindexed(what), 0))
        elif role.kind == "value":  # a path in a value handed to the server: a directory's whole tree
            problem = env_value_problem(path, allowed, depth=-1)
        elif role.kind == "index":  # a local index is a wheelhouse: what it holds is what root installs
            problem = index_problem(path, allowed)
        elif role.kind == "data":  # anyone's tree, but no link on the way from a directory of another's
            problem = data_problem(path)
        elif role.kind == "location":  # not a path: only its listener, below
            problem = None
        else:
            problem = parent_problem(path, allowed)
        rule, fix = "paths.owner", FIX
        if problem is None and role.kind in ("value", "index", "location"):  # a URL on this machine
            problem, rule, fix = listener_problem(path, allowed), "paths.listener", LISTENER_FIX
        if problem is not None:
            out.append(Finding(rule, "error", f"{what} {path}: {problem}", fix, {"path": path, "key": what}))
    if (remote := _remote_code_problem(spec)) is not None:
        out.append(remote)
    if (toolkit := _toolkit_problem(spec)) is not None:
        out.append(toolkit)
    if (unsigned := _unsigned_repo_problem(spec)) is not None:
        out.append(unsigned)
    if (pth := _pth_problem(spec)) is not None:
        out.append(pth)
    if (config := _installer_config_problem(spec)) is not None:
        out.append(config)
    if (site := _venv_tree_problem(spec)) is not None:
        out.append(site)
    for name, path in sorted(spec.server.secret_files.items()) if spec.server is not None else ():
        try:
            st = os.lstat(path)
        except OSError:
            continue  # the server Change says it cannot be read
        if (kind := not_regular(st.st_mode)) is not None:  # a FIFO would hang the read, a link lead elsewhere
            out.append(
                Finding(
                    "paths.secret-kind",
                    "error",
                    f"[server].secret_files.{name} {path} is {kind}",
                    "put the secret in a regular file there (mode 0600): reconcile reads it as data",
                    {"path": path, "key": f"[server].secret_files.{name}"},
                )
            )
            continue
        loose = st.st_mode & 0o077
        if loose:
            out.append(
                Finding(
                    "paths.secret-mode",
                    "warning",
                    f"[server].secret_files.{name} {path} is readable or writable by others "
                    f"(mode {os.stat(path).st_mode & 0o777:04o})",
                    f"chmod 600 {path}",
                    {"path": path, "key": f"[server].secret_files.{name}"},
                )
            )
    return tuple(out)
