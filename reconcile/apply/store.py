"""Realizations: each venv built once at a content-addressed path under `[venv] store`, never changed.

Called by the CLI's spec loading (`realize`: the spec's venv becomes its realization's path), by
reconcile.apply.switching (the profile link, the manifest, hard-link sharing) and by `reconcile gc`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Collection, Iterator

from reconcile.host import atomic_symlink, atomic_write
from reconcile.safety.filesafety import ensure_dir, open_dir, remove_tree_at
from reconcile.safety.untrusted import walk_tree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Venv

MANIFEST = ".reconcile-realization.json"  # inside each realization: what it holds, written once complete
_NAME = re.compile(r"^[0-9a-f]{32}-(venv|model)\Z")


def store_of(venv: Venv | None, state_dir: str | None = None) -> str | None:
    """The store's directory: `[venv] store` as written, else `<state_dir>/store` (the default, with
    or without a [venv]); None with `store = false` (or, without `state_dir`, when none is written)."""
    # getattr: a spec cache entry written before `store` existed has no such attribute.
    store = getattr(venv, "store", None) if venv is not None else None
    if store is False:
        return None
    if store is None and state_dir is not None:
        return os.path.join(state_dir, "store")
    return store if isinstance(store, str) else None


def spec_store(spec: Any) -> str | None:
    """The spec's store; no default one for a server that runs as another user (`[server] user`): it
    could not enter the state dir (0700), so it must name a store it can read."""
    if getattr(spec.venv, "store", None) is None and not_root(spec):
        return None
    return store_of(spec.venv, spec.machine.state_dir)


def not_root(spec: Any) -> str | None:
    user = getattr(spec.server, "user", None) if spec.server is not None else None
    return user if user not in (None, "root") else None


def _interpreter(python: str) -> str:
    """The interpreter a venv would be made from, as a real path (python3 -> /usr/bin/python3.11)."""
    found = python if os.path.isabs(python) else shutil.which(python)
    return os.path.realpath(found) if found else python


def _wheelhouse(path: str | None) -> list[str]:
    if path is None:
        return []
    try:
        return sorted(n for n in os.listdir(path) if n.endswith((".whl", ".tar.gz", ".zip")))
    except OSError:
        return []


def realization_inputs(venv: Venv) -> dict[str, Any]:
    """What a realization is addressed by: the interpreter, the package set (exact once `reconcile
    lock` pins it), where packages come from (indexes, or the wheelhouse's files) and how it is built.
    With the lock's closure (every distribution's version and file hashes) the content is fixed by it,
    so where the files come from is left out: one lock gives one realization path on every machine."""
    closure = list(getattr(venv, "closure", None) or [])
    if closure:
        return {
            "python": _interpreter(venv.python),
            "packages": sorted(venv.packages.items()),
            "closure": sorted(closure),
            "no_deps": venv.no_deps,
            "system_site_packages": venv.system_site_packages,
            "extra_site_packages": list(venv.extra_site_packages),
        }
    return {
        "python": _interpreter(venv.python),
        "packages": sorted(venv.packages.items()),
        "index_url": _no_credentials(venv.index_url),
        "extra_index_urls": [_no_credentials(u) for u in venv.extra_index_urls],
        "wheelhouse": [venv.wheelhouse, _wheelhouse(venv.wheelhouse)] if venv.wheelhouse else None,
        "no_deps": venv.no_deps,
        "system_site_packages": venv.system_site_packages,
        "extra_site_packages": list(venv.extra_site_packages),
    }


def _no_credentials(url: str | None) -> str | None:
    # A token in an index URL addresses nothing: the same index with another token is the same input.
    return None if url is None else re.sub(r"(://)[^/@\s]+@", r"\1", url)


def realization_path(venv: Venv, store: str) -> str:
    text = json.dumps(realization_inputs(venv), sort_keys=True, separators=(",", ":"))
    return os.path.join(store, hashlib.sha256(text.encode()).hexdigest()[:32] + "-venv")


def in_place(path: str, store: str | None = None) -> bool:
    """A real directory at the spec's `[venv] path` / `[model] dir` (made before the store was the
    default), or a link that is not ours (it leads elsewhere than a realization in `store`): left
    alone, never moved or linked over; that part is not realized (the preflight judges a link)."""
    if not os.path.lexists(path):
        return False
    if not os.path.islink(path):
        return True
    return store is not None and not is_realization(os.readlink(path), store)


def realize(loaded: LoadedSpec, venv_path: str | None = None, model_dir: str | None = None) -> LoadedSpec:
    """The spec with `[venv] path` and `[model] dir` replaced by their realizations' paths (`venv_path`,
    `model_dir`: recorded ones, for a rollback that must not depend on the wheelhouse or the model's
    source being as they were). No store (`store = false`): unchanged. A venv or model dir already
    there as a real directory stays where it is (store_notes says so)."""
    spec = loaded.spec
    store = spec_store(spec)
    if store is None:
        return loaded
    update: dict[str, Any] = {}
    venv = spec.venv
    if venv is not None and (venv_path or store_of(venv) is not None or not in_place(venv.path, store)):
        update["venv"] = venv.model_copy(update={"path": venv_path or realization_path(venv, store)})
    model = spec.model
    if model is not None and (model_dir or not in_place(model.dir, store)):
        from reconcile.apply.model_store import model_realization_path

        path = model_dir or model_realization_path(model, store)
        if path is not None:
            update["model"] = model.model_copy(update={"dir": path})
            if spec.server is not None:
                update["server"] = _server_in(spec.server, model.dir, path)
    if not update:
        return loaded
    return loaded._replace(spec=spec.model_copy(update=update))


def _server_in(server: Any, written: str, path: str) -> Any:
    """The server's args and env with paths inside `[model] dir` as written (`{model.dir}/plugin.py`)
    moved into the realization: the link is made only once the switch served, and vLLM must find
    the plugin at its first start."""
    prefix = written.rstrip("/") + "/"

    def moved(value: Any) -> Any:
        if isinstance(value, str) and (value.startswith(prefix) or value == written):
            return path + value[len(written.rstrip("/")) :]
        return value

    update: dict[str, Any] = {
        "args": {k: moved(v) for k, v in server.args.items()},
        "env": {k: moved(v) for k, v in server.env.items()},
    }
    if server.model is not None:
        update["model"] = moved(server.model)
    return server.model_copy(update=update)


def is_realization(path: str, store: str) -> bool:
    return os.path.dirname(path.rstrip("/")) == store.rstrip("/") and bool(
        _NAME.match(os.path.basename(path))
    )


def read_manifest(path: str) -> dict[str, Any] | None:
    """The realization's manifest; None when it has none (not sealed), or when what is there is not one
    (a FIFO, a directory, a link, not JSON, the wrong shape: moved aside by its one reader, the run goes
    on and the realization counts as not sealed)."""
    from reconcile.safety import statefiles

    try:
        data, _aside = statefiles.read_json(
            os.path.join(path, MANIFEST),
            statefiles.REALIZATION,
            max_bytes=statefiles.RECORD,
            then="the realization counts as not sealed",
        )
    except OSError:  # the realization itself is gone or not a directory: not sealed
        return None
    return data  # type: ignore[no-any-return]


def seal(path: str, packages: dict[str, str], inputs: dict[str, Any]) -> bool:
    """Write the manifest of a realization that converged (once: a sealed one is never rewritten)."""
    if read_manifest(path) is not None:
        return False
    body = {"format": "reconcile-realization/1", "packages": packages, "inputs": inputs}
    atomic_write(os.path.join(path, MANIFEST), (json.dumps(body, indent=2) + "\n").encode(), mode=0o644)
    return True


def link_profile(profile: str, target: str) -> str | None:
    """Point the spec's own `[venv] path` (or `[model] dir`) at the realization, as Nix points a profile
    at a store path. A real directory there is somebody's: left alone, and said so. Returns a note or None."""
    if os.path.islink(profile):
        if os.readlink(profile) == target:
            return None
    elif os.path.lexists(profile):
        return f"{profile} is not a link (made before the store): left as is; the server runs from {target}"
    ensure_dir(os.path.dirname(profile) or "/", 0o755)
    atomic_symlink(target, profile)
    return None


def _files(root: str) -> Iterator[tuple[str, os.stat_result]]:
    for directory, dirs, names in walk_tree(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                yield path, st


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same(path: str, st: os.stat_result, twin: str) -> bool:
    """`twin` may stand for `path`: same size, mode and bytes (a .pyc never is: it holds its path)."""
    try:
        tst = os.lstat(twin)
    except OSError:
        return False
    if not os.path.isfile(twin) or tst.st_size != st.st_size or tst.st_dev != st.st_dev:
        return False
    return (tst.st_mode & 0o777) == (st.st_mode & 0o777) and _digest(twin) == _digest(path)


def share_files(store: str, new: str) -> int:
    """Hard-link each file of the realization `new` that an older sealed one holds with the same
    relative path and bytes (Nix's `store --optimise`). Realizations are never written in place, so
    sharing is safe. Returns the bytes it saved."""
    saved = 0
    others = [p for p in realizations(store) if p != new and read_manifest(p) is not None]
    for path, st in _files(new):
        # A .pyc embeds its source's absolute path (co_filename): never the same bytes in two venvs.
        if st.st_nlink > 1 or path.endswith(".pyc") or os.path.basename(path) == MANIFEST:
            continue
        rel = os.path.relpath(path, new)
        for other in others:
            twin = os.path.join(other, rel)
            if not _same(path, st, twin):
                continue
            tmp = path + ".reconcile-link.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.link(twin, tmp)
            os.replace(tmp, path)
            saved += st.st_blocks * 512
            break
    return saved


def realizations(store: str) -> list[str]:
    """The `<hash>-venv` and `<hash>-model` realizations directly under `store`, listed through the trust
    walk (a store behind a link another user can re-point is an UnsafePath, never listed)."""
    try:
        fd = open_dir(store)
    except FileNotFoundError:
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    return sorted(os.path.join(store, n) for n in names if _NAME.match(n))


def disk_usage(paths: Collection[str]) -> int:
    """Bytes on disk under `paths`, each inode counted once (what `du` prints for them together)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in paths:
        for directory, dirs, names in walk_tree(root):
            for name in [*dirs, *names]:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(directory, name))
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
    return total


def in_use_by_processes(paths: Collection[str], pids: Collection[int]) -> set[str]:
    """Which of `paths` one of `pids` runs from: its executable, command line or cwd lies inside. `pids`
    are reconcile's own processes (membership.reconcile_processes): a stranger's command line naming a
    realization must never keep it (any user can put any path in their argv)."""
    used: set[str] = set()
    prefixes = {p.rstrip("/") + "/": p for p in paths}
    for pid in pids:
        seen: list[str] = []
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            seen += f.read().decode(errors="replace").split("\0")
        for link in ("exe", "cwd"):
            with contextlib.suppress(OSError):
                seen.append(os.readlink(f"/proc/{pid}/{link}") + "/")
        for text in seen:
            for prefix, path in prefixes.items():
                if text.startswith(prefix) or text == prefix[:-1]:
                    used.add(path)
    return used


def remove(store: str, path: str) -> None:
    """Delete one realization: only a `<hash>-venv` or `<hash>-model` directory directly under the store,
    that we sealed, acting on the store's descriptor from the trust walk (never on a name resolved again)."""
    name = os.path.basename(path.rstrip("/"))
    if not is_realization(path, store):
        raise ValueError(f"{path} is not a realization under {store}")
    fd = open_dir(store)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{path} is not a realization under {store}")
        # Renamed first, so a half-removed tree never looks like a realization again.
        os.rename(name, f".gc-{name}", src_dir_fd=fd, dst_dir_fd=fd)
        remove_tree_at(fd, f".gc-{name}")  # the store we walked, by its descriptor, no recursion
    finally:
        os.close(fd)
