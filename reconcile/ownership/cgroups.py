"""Where a deployment's cgroup (v2) is, and whether this machine can have one. Read only.

Used by reconcile.ownership.membership (members = the cgroup's processes), actions.cgroups (which makes and
removes it) and `reconcile status` (which ownership path is in use, and why).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat

from reconcile.identity import deployment_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec

SUBTREE = "reconcile"  # <cgroup2 mount>/reconcile/<deployment>/: made and owned by reconcile
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def cgroup_root() -> tuple[str | None, str]:
    """The cgroup2 mount point where reconcile can make its subtree (None where it cannot) and why."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        return None, f"cannot read /proc/self/mountinfo ({exc.strerror})"
    for line in lines:
        left, sep, right = line.partition(" - ")
        cols, fs = left.split(), right.split()
        if not sep or len(cols) < 6 or not fs or fs[0] != "cgroup2":
            continue
        mount = _unescape(cols[4])
        if "ro" in cols[5].split(","):
            return None, f"the cgroup2 hierarchy at {mount} is mounted read-only"
        if os.geteuid() != 0 and not os.access(mount, os.W_OK):
            return None, f"the cgroup2 hierarchy at {mount} is not writable by uid {os.geteuid()}"
        return mount, f"cgroup v2 at {mount}"
    return None, "no cgroup2 hierarchy is mounted (cgroup v1 only)"


def cgroup_name(spec: Spec) -> str:
    """The deployment's directory name: its server name and a hash of its marker (name@state_dir),
    so two specs with one server name never share a cgroup."""
    assert spec.server is not None
    digest = hashlib.sha256(deployment_id(spec).encode()).hexdigest()[:12]
    return f"{spec.server.name}-{digest}"


def cgroup_path(spec: Spec) -> str | None:
    """Where the deployment's cgroup is or would be (None without a usable cgroup2 hierarchy). Under
    supervisor = "systemd" it is the unit's own cgroup, which systemd makes and removes."""
    assert spec.server is not None
    root, _ = cgroup_root()
    if root is None:
        return None
    if spec.server.supervisor == "systemd":
        return os.path.join(root, "system.slice", f"reconcile-{spec.server.name}.service")
    return os.path.join(root, SUBTREE, cgroup_name(spec))


def trusted(path: str) -> bool:
    """A cgroup dir whose members prove something: a real directory, owned by root (or us), that no
    one else can write, nor its cgroup.procs (moving a process into it needs write access there)."""
    try:
        for p in (path, os.path.join(path, "cgroup.procs")):
            st = os.lstat(p)
            if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
                return False
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def deployment_cgroup(spec: Spec) -> str | None:
    """The deployment's cgroup when it exists and can be trusted, else None."""
    path = cgroup_path(spec)
    return path if path is not None and trusted(path) else None


def subtree_procs() -> set[int]:
    """The processes in every trusted cgroup of reconcile's own subtree (`<cgroup2>/reconcile/*`, and
    below): only root can move a process there, so each is one reconcile runs, whatever its uid."""
    root, _ = cgroup_root()
    top = os.path.join(root, SUBTREE) if root is not None else None
    if top is None or not trusted(top):
        return set()
    out: set[int] = set()
    todo = [top]
    while todo:
        here = todo.pop()
        out.update(cgroup_procs(here))
        try:
            names = os.listdir(here)
        except OSError:
            continue
        for name in names:
            path = os.path.join(here, name)
            if os.path.isdir(path) and not os.path.islink(path) and trusted(path):
                todo.append(path)
    return out


def cgroup_procs(path: str) -> list[int]:
    """The processes in cgroup `path` (empty when it is gone)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []
