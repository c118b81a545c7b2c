"""apt probe: the state of every named package (one dpkg-query for all of them), the configured
sources, their keyrings.

Called by reconcile.plan.prober. Reads /etc/apt/sources.list, sources.list.d/*.list (one-line format)
and sources.list.d/*.sources (deb822); never changes anything.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from probes.common import ParseError, ProbeFailure, Unavailable
from reconcile import host
from reconcile.record import Record
from reconcile.safety.untrusted import NotRegular, TooLarge, read_regular

SOURCES_LIMIT = 4 << 20  # a sources list or .sources file; apt's own are a few KiB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    PackageState = Literal[
        "installed",
        "absent",
        "config-files",
        "half-installed",
        "unpacked",
        "half-configured",
        "triggers-awaited",
        "triggers-pending",
    ]

    from reconcile.spec.models import Spec

# dpkg's package status -> ours ("not-installed" is dpkg remembering a package that is not there).
_DPKG_STATES: Mapping[str, PackageState] = {
    "installed": "installed",
    "not-installed": "absent",
    "config-files": "config-files",
    "half-installed": "half-installed",
    "unpacked": "unpacked",
    "half-configured": "half-configured",
    "triggers-awaited": "triggers-awaited",
    "triggers-pending": "triggers-pending",
}
DPKG_FORMAT = "${Package}\\t${Status}\\t${Version}\\n"
# Patterns as strings: re compiles (and caches) one on first use, not on every plan's import.
_NOT_FOUND = r"^dpkg-query: no packages found matching (\S+)\Z"


class PackageStatus(Record):
    name: str
    state: PackageState
    # Installed: its version. config-files and half-states: the version dpkg still records. Absent: None.
    version: str | None
    want: str = "unknown"  # dpkg's selection: install, hold, deinstall, purge, unknown
    error_flag: str = "ok"  # "reinstreq" when dpkg says the package must be reinstalled


class AptSource(Record):
    """One (type, uri, suite) entry of a sources file; deb822 stanzas expand to several."""

    file: str
    line: int
    format: Literal["one-line", "deb822"]
    type: str  # deb, deb-src
    uri: str
    suite: str
    components: tuple[str, ...]
    signed_by: tuple[str, ...]  # keyring paths or fingerprints; "(embedded key)" for an inline deb822 key
    trusted: bool
    enabled: bool
    options: Mapping[str, str] = MappingProxyType({})


class Unparsed(Record):
    """A sources line or stanza that apt's format does not allow; apt itself would reject it."""

    file: str
    line: int
    text: str
    reason: str


class AptObservation(Record):
    packages: Mapping[str, PackageStatus]  # by package name (the spec's "name=version" without the pin)
    sources: tuple[AptSource, ...]
    keyrings: Mapping[str, bool]  # keyring path -> exists, for sources' signed-by and the spec's keyrings
    unparsed: tuple[Unparsed, ...] = ()
    warnings: tuple[str, ...] = ()  # dpkg-query's warnings, kept verbatim
    # Of the packages not installed, those apt's lists cannot install now (no candidate). None: not
    # asked (everything installed, so a converged plan costs no apt-cache call) or apt-cache failed.
    unknown: tuple[str, ...] | None = None


def probe(spec: Spec) -> AptObservation | Unavailable | ProbeFailure | None:
    if spec.apt is None:
        return None
    names = [p.partition("=")[0] for p in spec.apt.packages]
    packages: Mapping[str, PackageStatus] = {}
    warnings: tuple[str, ...] = ()
    if names:
        answer = _dpkg_answer(names)
        if isinstance(answer, (Unavailable, ProbeFailure)):  # records are tuples too: test the type
            return answer
        try:
            packages, warnings = parse_dpkg_query(*answer, names)
        except ParseError as exc:
            return exc.as_failure("dpkg-query")
    apt_dir = os.path.dirname(spec.apt.sources_dir.rstrip("/"))
    sources, unparsed = read_sources(apt_dir, spec.apt.sources_dir)
    keyring_paths = [k for s in sources for k in s.signed_by if k.startswith("/")]
    keyring_paths += [r.keyring for r in spec.apt.repositories if r.keyring]
    keyrings = {k: os.path.isfile(k) for k in dict.fromkeys(keyring_paths)}
    missing = [n for n in names if n not in packages or packages[n].state != "installed"]
    return AptObservation(packages, sources, keyrings, unparsed, warnings, _unknown(missing))


# What apt-cache answers depends on the package lists and the sources: their stamps key the cache.
_APT_STATE = (
    "/var/lib/apt/lists",
    "/etc/apt/sources.list",
    "/etc/apt/sources.list.d",
    "/etc/apt/preferences.d",
)


def _apt_stamp() -> str:
    parts = []
    for path in _APT_STATE:
        try:
            entries = [path, *(os.path.join(path, n) for n in sorted(os.listdir(path)))]
        except NotADirectoryError:
            entries = [path]
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                st = os.stat(entry)
                parts.append(f"{entry}:{st.st_mtime_ns}:{st.st_size}")
    return "\n".join(parts)


def _cache_file(names: list[str]) -> str:
    import zlib

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = zlib.crc32("\0".join(sorted(names)).encode())  # an index only: the entry names its inputs
    return os.path.join(base, "reconcile", f"apt-policy-{os.geteuid()}-{key:08x}.marshal")


def _unknown(names: list[str]) -> tuple[str, ...] | None:
    """Which of `names` apt has no install candidate for: one `apt-cache policy` for all of them, its
    answer kept (per user, 0600) until the package lists or sources change: without apt's own
    pkgcache.bin (container images drop it) one call costs most of a second on every plan."""
    if not names:
        return None
    stamp, path = _apt_stamp(), _cache_file(names)
    # The per-user cache's rules (reconcile.private_cache): a regular 0600 file of ours in a 0700
    # directory of ours, opened non-blocking; a FIFO, another user's file or directory is a miss.
    from reconcile import private_cache

    cached = private_cache.read(path)
    if isinstance(cached, dict) and cached.get("names") == sorted(names) and cached.get("stamp") == stamp:
        found = cached.get("unknown")
        if isinstance(found, list) and all(isinstance(n, str) for n in found):
            return tuple(found)
    unknown = _ask_apt_cache(names)
    if unknown is not None:
        private_cache.write(path, {"names": sorted(names), "stamp": stamp, "unknown": list(unknown)})
    return unknown


def _ask_apt_cache(names: list[str]) -> tuple[str, ...] | None:
    from reconcile.vllm.apt_policy import policy_table

    try:
        done = host.run(["apt-cache", "policy", *names], env={**os.environ, "LC_ALL": "C"}, timeout=30.0)
        table = policy_table(done.stdout) if done.ok else None
    except (host.ToolMissing, host.CommandTimeout, ValueError):
        return None
    if table is None:
        return None
    return tuple(n for n in names if table.get(n, (None, ()))[0] is None)


def _dpkg_answer(names: list[str]) -> tuple[str, str] | Unavailable | ProbeFailure:
    """dpkg-query's (stdout, stderr) for all of `names` at once: one process per probe."""
    argv = ["dpkg-query", "-W", f"-f={DPKG_FORMAT}", *names]
    try:
        # C locale: the "no packages found" message is parsed, and it is translated elsewhere.
        done = host.run(argv, env={**os.environ, "LC_ALL": "C"}, timeout=60.0)
    except host.ToolMissing as exc:
        return Unavailable(f"{exc}: not a Debian/Ubuntu system, so apt packages cannot be checked")
    except host.CommandTimeout as exc:
        return ProbeFailure(str(exc))
    if done.returncode not in (0, 1):  # 1 means "some names are unknown", which is an answer
        return ProbeFailure(f"dpkg-query exited {done.returncode}", raw=done.stdout + done.stderr)
    return done.stdout, done.stderr


def parse_dpkg_query(
    stdout: str, stderr: str, names: Iterable[str]
) -> tuple[dict[str, PackageStatus], tuple[str, ...]]:
    """Parse `dpkg-query -W -f=DPKG_FORMAT names...`: stdout lines, plus stderr's unknown names."""
    seen: dict[str, PackageStatus] = {}
    for line in stdout.splitlines():
        if not line:
            continue
        parts = line.split("\t")
        status = parts[1].split() if len(parts) == 3 else []
        if len(status) != 3 or status[2] not in _DPKG_STATES:
            raise ParseError(f"expected 'name<TAB>want flag status<TAB>version', got {line!r}", raw=stdout)
        name, want, flag = parts[0], status[0], status[1]
        state = _DPKG_STATES[status[2]]
        new = PackageStatus(name, state, None if state == "absent" else parts[2] or None, want, flag)
        # A multi-arch package prints a line per architecture: an installed one wins.
        if name not in seen or new.state == "installed":
            seen[name] = new
    warnings = []
    for line in stderr.splitlines():
        m = re.match(_NOT_FOUND, line.strip())
        if m:
            name = m.group(1).partition(":")[0]
            seen.setdefault(name, PackageStatus(name, "absent", None))
        elif "warning:" in line:
            warnings.append(line.strip())
        elif line.strip():
            raise ParseError(f"unexpected dpkg-query message: {line.strip()!r}", raw=stdout + stderr)
    result = {}
    for requested in names:
        base = requested.partition(":")[0]
        if base not in seen:
            raise ParseError(f"dpkg-query said nothing about {requested!r}", raw=stdout + stderr)
        result[requested] = seen[base]
    return result, tuple(warnings)


def _ending(directory: str, suffix: str) -> list[str]:
    """What glob's DIR/*SUFFIX lists (hidden names left out), sorted; without glob and fnmatch, whose
    import and patterns cost a plan ~2 ms."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names if n.endswith(suffix) and not n.startswith("."))


def read_sources(apt_dir: str, sources_dir: str) -> tuple[tuple[AptSource, ...], tuple[Unparsed, ...]]:
    files = [os.path.join(apt_dir, "sources.list"), *_ending(sources_dir, ".list")]
    files += _ending(sources_dir, ".sources")
    sources: list[AptSource] = []
    unparsed: list[Unparsed] = []
    for path in files:
        try:  # a FIFO or a device there is named, never waited on
            text = read_regular(path, SOURCES_LIMIT, follow=True).decode("utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except (NotRegular, TooLarge) as exc:
            unparsed.append(Unparsed(path, 0, "", str(exc)))
            continue
        parse = parse_deb822_sources if path.endswith(".sources") else parse_one_line_sources
        for item in parse(text, path):
            if isinstance(item, AptSource):
                sources.append(item)
            else:
                unparsed.append(item)
    return tuple(sources), tuple(unparsed)


_ONE_LINE = r"^(deb|deb-src)\s+(?:\[([^\]]*)\]\s*)?(\S+)\s+(\S+)(?:\s+(.*))?\Z"


def parse_one_line_sources(text: str, path: str) -> Iterator[AptSource | Unparsed]:
    """`deb [opt=val ...] uri suite [component ...]` lines; comments and blank lines skipped."""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(_ONE_LINE, line)
        if m is None:
            yield Unparsed(path, number, raw, "expected 'deb [options] uri suite [components]'")
            continue
        kind, opts, uri, suite, comps = m.groups()
        options: dict[str, str] = {}
        for opt in (opts or "").split():
            key, eq, value = opt.partition("=")
            if not eq:
                yield Unparsed(path, number, raw, f"option {opt!r} is not key=value")
                break
            options[key.lower()] = value
        else:
            yield AptSource(
                file=path,
                line=number,
                format="one-line",
                type=kind,
                uri=uri,
                suite=suite,
                components=tuple((comps or "").split()),
                signed_by=tuple(v for v in options.get("signed-by", "").split(",") if v),
                trusted=options.get("trusted", "no").lower() == "yes",
                enabled=True,
                options=options,
            )


def _stanzas(text: str, path: str) -> Iterator[tuple[int, dict[str, str]] | Unparsed]:
    """deb822 paragraphs as (first line, {lowercased field: value}); continuation lines are joined."""
    fields: dict[str, str] = {}
    start, last, bad = 0, "", False
    for number, raw in enumerate([*text.splitlines(), ""], 1):
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields and not bad:
                yield start, fields
            fields, last, bad = {}, "", False
            continue
        if not fields and not bad:
            start = number
        if raw[0] in " \t" and last:
            fields[last] += "\n" + raw.strip()
            continue
        key, colon, value = raw.partition(":")
        if not colon:
            if not bad:
                yield Unparsed(path, number, raw, "expected 'Field: value' (the stanza is skipped)")
            bad = True
            continue
        last = key.strip().lower()
        fields[last] = value.strip()


def parse_deb822_sources(text: str, path: str) -> Iterator[AptSource | Unparsed]:
    """deb822 `.sources` stanzas (Types/URIs/Suites/Components/Signed-By/Trusted/Enabled)."""
    for stanza in _stanzas(text, path):
        if isinstance(stanza, Unparsed):
            yield stanza
            continue
        number, fields = stanza
        missing = [k for k in ("types", "uris", "suites") if not fields.get(k)]
        if missing:
            yield Unparsed(path, number, _render(fields), f"stanza lacks {', '.join(missing)}")
            continue
        signed = fields.get("signed-by", "")
        signed_by = ("(embedded key)",) if "BEGIN PGP" in signed else tuple(signed.replace(",", " ").split())
        enabled = fields.get("enabled", "yes").lower() != "no"
        trusted = fields.get("trusted", "no").lower() == "yes"
        options = {k: v for k, v in fields.items() if k not in ("types", "uris", "suites", "components")}
        components = tuple(fields.get("components", "").split())
        for kind in fields["types"].split():
            for uri in fields["uris"].split():
                for suite in fields["suites"].split():
                    yield AptSource(
                        file=path,
                        line=number,
                        format="deb822",
                        type=kind,
                        uri=uri,
                        suite=suite,
                        components=components,
                        signed_by=signed_by,
                        trusted=trusted,
                        enabled=enabled,
                        options=options,
                    )


def _render(fields: Mapping[str, str]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in fields.items())
