"""Every path a spec can name, with what root does with it: its role. The path preflight rule
(reconcile.preflight.paths) checks each through reconcile.safety.filesafety's walk, and the actions
open them through it. The models' path types carry the same roles (reconcile.spec.models: `ExecPath`,
`WritePath`, ...); tests/test_path_trust.py holds this table to them, so no path field can be added
to the spec without a role here, and so without a check.

Plain data, no pydantic: a warm plan reads it from the spec cache's views.
"""

from __future__ import annotations

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Role(Record):
    kind: str  # read | write | write-dir | exec | delete | link | data | value | index | location
    rule: str  # the rule that applies, in words (docs/security.md's table)


READ = Role(
    "read",
    "root reads it and trusts what it says: every directory on the way, links' own included, root's or ours",
)
WRITE = Role(
    "write",
    "root writes it: every directory on the way and an existing file root's or ours, never a link",
)
WRITE_DIR = Role(
    "write-dir", "root makes and writes under it: as write, and the directory itself not writable by others"
)
EXEC = Role(
    "exec",
    "root runs it: as read, and the file (and a script's interpreter) root's or ours, not writable by others",
)
DELETE = Role(
    "delete", "root removes entries under it: as write-dir, walked by descriptor, never through a link"
)
LINK = Role("link", "root points this symlink: its directory root's or ours")
DATA = Role("data", "a tree from outside, copied as data (regular files only, modes reduced, sizes bounded)")
VALUE = Role(
    "value",
    "a value handed to the server (an env var, a flag) that may name a path: each absolute path (or "
    "file:// URL, or ':'-list of them) in it held as the environment's are, a directory to write-dir, a "
    "file to read (the serving user may own them too); a URL on this machine: its listener root's or ours",
)

INDEX = Role(
    "index",
    "a package index pip and uv install from: a local one (a path or file:// URL in it) held to the read "
    "role, its whole tree (what it holds is what root installs); a URL on this machine: its listener root's "
    "or ours; a remote one is the spec's choice",
)

LOCATION = Role(
    "location",
    "a URL root fetches from (apt's repository): on this machine, its port listened on by root or us "
    "(or one only root may bind); a remote host is the network's to trust, not judged",
)

# (section, field, role). A section named "a.b" is a list of tables (apt.repositories).
PATHS: tuple[tuple[str, str, Role], ...] = (
    ("machine", "state_dir", WRITE_DIR),
    ("cuda", "home", LINK),
    ("cuda", "target", READ),
    ("apt", "sources_dir", WRITE_DIR),
    ("apt.repositories", "keyring", WRITE),
    ("apt.repositories", "key_source", READ),
    ("apt.repositories", "uri", LOCATION),
    ("venv", "path", WRITE_DIR),
    ("venv", "python", EXEC),
    ("venv", "index_url", INDEX),
    ("venv", "extra_index_urls", INDEX),
    ("venv", "wheelhouse", READ),
    ("venv", "extra_site_packages", READ),
    ("venv", "store", DELETE),
    ("model", "source", DATA),
    ("model", "dir", WRITE_DIR),
    ("api_key", "file", WRITE),
    ("server", "executable", EXEC),
    ("server", "log", WRITE),
    ("server", "pidfile", WRITE),
    ("server", "secret_files", READ),
    ("server", "env", VALUE),
    ("server", "args", VALUE),
    ("front", "haproxy", EXEC),
)


class SpecPath(Record):
    key: str  # "[server].executable", "[apt].repositories.cuda.key_source", "[server].secret_files.HF_TOKEN"
    path: str
    role: Role


def spec_paths(spec: Any) -> list[SpecPath]:
    """Every path `spec` names (a pydantic Spec or its cached view), with its key and role."""
    out: list[SpecPath] = []
    for section, field, role in PATHS:
        top, _, sub = section.partition(".")
        holder = getattr(spec, top, None)
        if holder is None:
            continue
        tables = [(f"[{top}]", holder)]
        if sub:
            tables = [
                (f"[{top}].{sub}.{getattr(t, 'name', i)}", t) for i, t in enumerate(getattr(holder, sub, ()))
            ]
        for where, table in tables:
            value = getattr(table, field, None)
            if isinstance(value, str):
                out.append(SpecPath(f"{where}.{field}", value, role))
            elif isinstance(value, dict):
                for k, v in sorted(value.items()):  # a flag's list or JSON table: each string in it
                    out += [SpecPath(f"{where}.{field}.{k}", w, role) for w in _strings(v)]
            elif isinstance(value, (list, tuple)):
                out += [SpecPath(f"{where}.{field}[{i}]", v, role) for i, v in enumerate(value)]
    return out


def _strings(value: object) -> list[str]:
    """Every string in a value, however deep in its lists and tables (a JSON flag's table:
    `compilation-config = { cache_dir = ... }`)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [w for k in sorted(value) for w in _strings(value[k])]
    if isinstance(value, (list, tuple)):
        return [w for v in value for w in _strings(v)]
    return []
