"""venv probe: pyvenv.cfg, the interpreter link, and every installed distribution, without running Python.

Called by reconcile.plan.prober. Distributions come from one scan of site-packages reading each
`*.dist-info/METADATA` header (no `pip list`: starting the venv's interpreter costs seconds).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping

from probes.common import Absent, Invalid
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeGuard

    from reconcile.spec.models import Spec


def normalize(name: str) -> str:
    """PEP 503 name normalisation: "Flash_Attn.X" -> "flash-attn-x"."""
    low = name.lower()
    if "_" not in low and "." not in low and "--" not in low:
        return low  # nothing for the rule to collapse: most names (a 500-package venv reads 500)
    return re.sub(r"[-_.]+", "-", low)


class Distribution(Record):
    name: str  # as METADATA spells it
    version: str
    path: str  # the .dist-info (or .egg-info) directory


class PthEntry(Record):
    """A path line of a .pth file in site-packages: Python adds it to sys.path at start-up."""

    file: str
    path: str  # absolute (relative lines are resolved against site-packages)
    exists: bool


class Interpreter(Record):
    path: str  # <venv>/bin/python
    link_target: str | None  # readlink when a symlink
    resolved: str | None  # realpath when it exists; None: the base interpreter is gone


class VenvObservation(Record):
    path: str
    config: Mapping[str, str]  # pyvenv.cfg as key -> value
    version: str | None  # "3.10.12" from pyvenv.cfg's version / version_info; None when it has neither
    interpreter: Interpreter | Absent
    include_system_site_packages: bool
    site_packages: tuple[str, ...]  # lib/python3.*/site-packages directories
    distributions: Mapping[str, Distribution]  # by PEP 503 normalised name
    pth_paths: tuple[PthEntry, ...]
    unreadable: tuple[Invalid, ...]  # .dist-info directories whose METADATA lacks Name/Version
    has_ninja: bool  # bin/ninja exists, or the ninja distribution is installed

    def version_of(self, name: str) -> str | None:
        dist = self.distributions.get(normalize(name))
        return dist.version if dist else None

    @property
    def vllm_version(self) -> str | None:
        return self.version_of("vllm")


def probe(spec: Spec) -> VenvObservation | Absent | Invalid | None:
    if spec.venv is None:
        return None
    return read_venv(spec.venv.path)


CFG_LIMIT = 1 << 16  # a pyvenv.cfg is a few lines


def read_venv(path: str) -> VenvObservation | Absent | Invalid:
    """The venv at `path`; Absent when nothing is there, Invalid when it is a directory without pyvenv.cfg."""
    cfg_path = os.path.join(path, "pyvenv.cfg")
    from reconcile.safety.untrusted import read_regular

    try:  # non-blocking, a regular file only, bounded: a venv of another user's may hold a FIFO here
        config = parse_pyvenv_cfg(read_regular(cfg_path, CFG_LIMIT).decode("utf-8", errors="replace"))
    except FileNotFoundError:
        if os.path.lexists(path):
            return Invalid(path, f"{cfg_path} is missing: {path} is not a virtual environment")
        return Absent(path)
    except NotADirectoryError:
        return Invalid(path, f"{path} is not a directory")
    except OSError as exc:  # NotRegular (a FIFO, a link), TooLarge: said, never read
        return Invalid(path, f"{cfg_path}: {exc.strerror or exc}: not read")
    site_dirs = _site_dirs(path)
    distributions: dict[str, Distribution] = {}
    pth: list[PthEntry] = []
    unreadable: list[Invalid] = []
    for site in site_dirs:
        dists, entries, bad = scan_site_packages(site)
        distributions.update(dists)
        pth += entries
        unreadable += bad
    ninja = os.path.join(path, "bin", "ninja")
    return VenvObservation(
        path=path,
        config=config,
        version=pyvenv_version(config),
        interpreter=_interpreter(os.path.join(path, "bin", "python")),
        include_system_site_packages=config.get("include-system-site-packages", "false").lower() == "true",
        site_packages=site_dirs,
        distributions=distributions,
        pth_paths=tuple(pth),
        unreadable=tuple(unreadable),
        has_ninja=(os.path.isfile(ninja) and os.access(ninja, os.X_OK)) or "ninja" in distributions,
    )


def _site_dirs(path: str) -> tuple[str, ...]:
    """What glob's PATH/lib/python3.*/site-packages lists, sorted; without glob and fnmatch, whose import
    and patterns cost a plan ~2 ms."""
    lib = os.path.join(path, "lib")
    try:
        with os.scandir(lib) as entries:
            versions = [e.name for e in entries if e.name.startswith("python3.") and e.is_dir()]
    except OSError:
        return ()
    return tuple(sorted(s for v in versions if os.path.lexists(s := os.path.join(lib, v, "site-packages"))))


def parse_pyvenv_cfg(text: str) -> dict[str, str]:
    """`key = value` lines (what venv, virtualenv and uv write); other lines are ignored like site.py does."""
    config = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            config[key.strip().lower()] = value.strip()
    return config


def pyvenv_version(config: Mapping[str, str]) -> str | None:
    # venv writes `version = 3.10.12`; uv and virtualenv write `version_info = 3.12.3[.final.0]`.
    raw = config.get("version") or config.get("version_info")
    if not raw:
        return None
    return ".".join(raw.split(".")[:3])


def _interpreter(path: str) -> Interpreter | Absent:
    if not os.path.lexists(path):
        return Absent(path)
    target = os.readlink(path) if os.path.islink(path) else None
    resolved = os.path.realpath(path)
    return Interpreter(path, target, resolved if os.path.exists(resolved) else None)


def scan_site_packages(
    site: str,
) -> tuple[dict[str, Distribution], list[PthEntry], list[Invalid]]:
    """One directory scan: distributions from *.dist-info/METADATA (and *.egg-info/PKG-INFO), .pth paths."""
    dists: dict[str, Distribution] = {}
    pth: list[PthEntry] = []
    bad: list[Invalid] = []
    try:
        entries = list(os.scandir(site))
    except OSError:
        return dists, pth, bad
    headers = _Headers(site)
    for entry in entries:
        if entry.name.endswith((".dist-info", ".egg-info")):
            meta = entry.path + ("/METADATA" if entry.name.endswith(".dist-info") else "/PKG-INFO")
            found = headers.read(meta)
            if found is None:
                continue  # a flat .egg-info file or an unfinished install: nothing to read yet
            if isinstance(found, Invalid):
                bad.append(found)
            else:
                dists[normalize(found[0])] = Distribution(found[0], found[1], entry.path)
        elif entry.name.endswith(".pth") and entry.is_file():
            found_pth = _pth_paths(entry.path, site)
            if isinstance(found_pth, Invalid):
                bad.append(found_pth)
            else:
                pth += found_pth
    headers.keep()
    return dists, pth, bad


class _Headers:
    """Each metadata file's (Name, Version) header, remembered per site-packages directory in the
    user's cache while the file's (inode, size, mtime, ctime) are the same (any write changes its
    ctime): a 500-package venv is then 500 stats, not 500 reads (~10 ms a plan). A private marshal
    file (reconcile.private_cache); damaged or foreign is a miss."""

    def __init__(self, site: str) -> None:
        import zlib

        from reconcile import private_cache

        self._site = os.path.abspath(site)
        key = self._site.encode("utf-8", "surrogateescape")
        self._entry = os.path.join(
            private_cache.cache_root(), "venv", f"{zlib.crc32(key):08x}-{len(key)}.marshal"
        )
        data = private_cache.read(self._entry)
        valid = isinstance(data, tuple) and len(data) == 3 and data[:2] == (1, self._site)
        self._seen: dict[str, tuple[object, ...]] = data[2] if valid and isinstance(data[2], dict) else {}
        self._now: dict[str, tuple[object, ...]] = {}

    def read(self, meta: str) -> tuple[str, str] | Invalid | None:
        """As read_metadata_header, or None when `meta` is not a regular file (os.path.isfile)."""
        try:
            st = os.stat(meta)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        kept = self._seen.get(meta)
        if type(kept) is tuple and len(kept) == 3 and kept[0] == stamp:
            kind, answer = kept[1], kept[2]
            if (
                kind == "ok"
                and type(answer) is tuple
                and len(answer) == 2
                and type(answer[0]) is str
                and type(answer[1]) is str
            ):
                self._now[meta] = kept
                return answer[0], answer[1]
            if kind == "invalid" and _strings(answer, 3):
                self._now[meta] = kept
                return Invalid(*answer)
        found = read_metadata_header(meta)
        if isinstance(found, Invalid):
            self._now[meta] = (stamp, "invalid", tuple(found))
        else:
            self._now[meta] = (stamp, "ok", found)
        return found

    def keep(self) -> None:
        if self._now != self._seen:  # only what this scan saw: removed packages drop out
            from reconcile import private_cache

            private_cache.write(self._entry, (1, self._site, self._now))


def _strings(value: object, n: int) -> TypeGuard[tuple[str, ...]]:
    """`value` is a tuple of `n` str (what the cache kept for an invalid header): else a miss."""
    return type(value) is tuple and len(value) == n and all(type(v) is str for v in value)


def read_metadata_header(path: str) -> tuple[str, str] | Invalid:
    """Name and Version from a core-metadata file's header (read up to the first blank line)."""
    name = version = None
    lines = []
    try:
        head = _head(path)
    except OSError as exc:  # NotRegular (a FIFO, a link put there since the stat): said, never read
        return Invalid(path, f"{path}: {exc.strerror or exc}: not read")
    for line in head:
        if not line.strip():
            break
        lines.append(line)
        key, _, value = line.partition(":")
        if key == "Name":
            name = value.strip()
        elif key == "Version":
            version = value.strip()
        if name and version:
            return name, version
    return Invalid(path, "METADATA has no Name or no Version header", "".join(lines))


HEADER_LIMIT = 1 << 20  # a core-metadata header is a few KiB; the description after it is not read


def _head(path: str) -> list[str]:
    """The lines of the first HEADER_LIMIT bytes of the regular file at `path` (opened non-blocking,
    no link followed): a distribution's file in a venv of another user's may be a sparse 4 GiB line."""
    from reconcile.safety.untrusted import open_regular

    fd, _st = open_regular(path)
    try:
        parts, have = [], 0
        while have < HEADER_LIMIT and (chunk := os.read(fd, HEADER_LIMIT - have)):
            parts.append(chunk)
            have += len(chunk)
    finally:
        os.close(fd)
    return b"".join(parts).decode("utf-8", errors="replace").splitlines(keepends=True)


# A .pth is a few lines (an editable install's is one); one larger is not read into the plan (a file
# of another user's in a copied venv could be grown to gigabytes of one line: the preflight names it).
PTH_LIMIT = 1 << 20


def _pth_paths(pth_file: str, site: str) -> list[PthEntry] | Invalid:
    from reconcile.safety.untrusted import read_regular

    try:  # non-blocking, a regular file only, bounded: never read whole by name
        raw = read_regular(pth_file, PTH_LIMIT, follow=True)
    except OSError as exc:
        return Invalid(pth_file, f"{pth_file}: {exc.strerror or exc}: not read")
    entries = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        # site.py executes lines starting with "import", skips comments and blanks, and strips the
        # trailing blanks of a path line (as here: "/dir " is /dir to it).
        if not line.strip() or line.startswith("#") or line.startswith(("import ", "import\t")):
            continue
        path = os.path.normpath(os.path.join(site, line.rstrip()))
        entries.append(PthEntry(pth_file, path, os.path.isdir(path)))
    return entries


def pth_imports(site: str) -> list[PthEntry]:
    """The paths that the modules a `.pth` import line imports from `site` name: an editable install
    of setuptools' finder kind (`import __editable___x_finder; __editable___x_finder.install()`) maps
    the package to its source directory in the finder's `MAPPING` (`editables`' redirector alike, in a
    `map_module` call), so each absolute path written in such a module (a string literal; the module
    is parsed, never run) is one root's python imports from; and so is one written in the import
    line itself, which is code (`import os; exec(open("/x").read())`). Bounded reads, as _pth_paths'."""
    from reconcile.safety.untrusted import read_regular, walk_tree

    out: list[PthEntry] = []
    names: list[str] = []
    for _top, dirs, files in walk_tree(site):
        dirs[:] = []  # site-packages' own .pth files only, as site.py reads them
        names = sorted(f for f in files if f.endswith(".pth"))
    for pth in names:
        try:
            raw = read_regular(os.path.join(site, pth), PTH_LIMIT, follow=True)
        except OSError:
            continue  # named by scan_site_packages as unreadable
        for line in raw.decode("utf-8", errors="replace").splitlines():
            if line.startswith(("import ", "import\t")):
                tree = _parsed(line.encode())
                line_of = f"{os.path.join(site, pth)} (its import line)"
                out += [PthEntry(line_of, p, os.path.exists(p)) for p in _literal_paths(tree)]
                for module in _imported(tree):
                    out += _module_paths(site, module)
    return out


def _parsed(source: bytes) -> Any:
    """The AST of a .pth line or a module (None when it does not parse: Python would fail it too)."""
    import ast

    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _literal_paths(tree: Any) -> list[str]:
    """Every absolute path written as a string literal in `tree` (parsed, never run)."""
    import ast

    if tree is None:
        return []
    found = {
        os.path.normpath(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/")
    }
    return sorted(found)


def _imported(tree: Any) -> list[str]:
    """The top-level modules an `import` line of a .pth imports (`import a, b.c; ...`: a, b)."""
    import ast

    if tree is None:
        return []
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import)]
    return [a.name.split(".")[0] for node in imports for a in node.names]


def _module_paths(site: str, module: str) -> list[PthEntry]:
    from reconcile.safety.untrusted import read_regular

    for candidate in (os.path.join(site, module + ".py"), os.path.join(site, module, "__init__.py")):
        try:
            source = read_regular(candidate, PTH_LIMIT, follow=True)
        except OSError:
            continue
        return [PthEntry(candidate, path, os.path.exists(path)) for path in _literal_paths(_parsed(source))]
    return []


def requires(dist: Distribution) -> tuple[str, ...]:
    """The Requires-Dist lines of a distribution's core metadata, as written (markers included).

    Read on demand (the preflight asks for vLLM's only), from the header up to its first blank line."""
    meta = os.path.join(dist.path, "METADATA" if dist.path.endswith(".dist-info") else "PKG-INFO")
    out = []
    try:
        head = _head(meta)
    except OSError:
        return ()
    for line in head:
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key == "Requires-Dist":
            out.append(value.strip())
    return tuple(out)
