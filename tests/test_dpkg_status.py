"""probes.dpkg_status: dpkg's status file read directly gives what the real dpkg-query answers.

Every comparison runs the real dpkg-query (on this machine's database, or with --admindir on a status
file written here) and parses both answers with the apt probe's own parser.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probes import dpkg_status
from probes.apt import DPKG_FORMAT, parse_dpkg_query

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg")
REPO = Path(__file__).resolve().parent.parent


def _real(names: list[str], admindir: str = dpkg_status.ADMINDIR) -> tuple[object, ...]:
    argv = ["dpkg-query", f"--admindir={admindir}", "-W", f"-f={DPKG_FORMAT}", *names]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    assert done.returncode in (0, 1), done.stderr
    return parse_dpkg_query(done.stdout, done.stderr, names)


def _direct(names: list[str], admindir: str = dpkg_status.ADMINDIR) -> tuple[object, ...]:
    answer = dpkg_status.query(names, admindir)
    assert answer is not None, "the status file was not read"
    return parse_dpkg_query(*answer, names)


def _this_machine() -> tuple[list[str], dict[str, str]]:
    text = Path(dpkg_status.ADMINDIR, "status").read_text(errors="replace")
    archs = dict(re.findall(r"^Package: (\S+)\n(?:.*\n)*?Architecture: (\S+)", text, re.MULTILINE))
    return sorted(set(re.findall(r"^Package: (\S+)$", text, re.MULTILINE))), archs


def test_this_machines_whole_package_set_reads_as_dpkg_query_answers() -> None:
    names, archs = _this_machine()
    assert dpkg_status.usable()
    text = Path(dpkg_status.ADMINDIR, "status").read_text(errors="replace")
    depended = {d for d in re.findall(r"^(?:Depends|Recommends|Suggests): (.*)$", text, re.MULTILINE)}
    only_named = sorted(
        {w.split()[0].split(":")[0] for line in depended for w in re.split(r"[,|]", line) if w.strip()}
        - set(names)
    )[:50]  # dpkg-query lists these as "unknown ok not-installed": the same answer as unknown
    qualified = [f"{n}:{archs[n]}" for n in names[:100] if n in archs]
    qualified += [f"{n}:{'i386' if archs.get(n) != 'i386' else 'amd64'}" for n in names[:20]]
    asked = [*names, *only_named, *qualified, "no-such-package-here", "Bash"]
    assert _direct(asked) == _real(asked)


def test_the_scale_benchmarks_300_packages_read_as_dpkg_query_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # benchmarks/scale.py's own choice for its 100x spec: the first 300 names dpkg says are installed.
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    scale = importlib.import_module("scale")
    installed, wanted = scale.installed_packages(), scale.SIZES[100][0]
    if len(installed) < wanted:
        pytest.skip(f"only {len(installed)} packages installed here")
    names = installed[:wanted]
    direct = _direct(names)
    assert direct == _real(names)
    assert all(p.state == "installed" for p in direct[0].values())  # type: ignore[attr-defined]


def _stanza(name: str, status: str, arch: str = "amd64", version: str | None = "1.0", extra: str = "") -> str:
    fields = [f"Package: {name}", *([extra] if extra else []), f"Status: {status}"]
    if not status.endswith("not-installed"):
        fields += ["Priority: optional", "Maintainer: Someone <someone@example.org>"]
    fields.append(f"Architecture: {arch}")
    if version is not None:
        fields.append(f"Version: {version}")
    if not status.endswith("not-installed"):
        fields += ["Description: a package", " that is not here."]
    return "\n".join(fields) + "\n"


STATES = [
    _stanza("essential", "install ok installed", extra="Essential: yes"),
    _stanza("removed", "deinstall ok config-files", version="2.0"),
    _stanza("broken", "install reinstreq half-installed"),
    _stanza("unpacked", "install ok unpacked"),
    _stanza("halfconf", "install ok half-configured"),
    _stanza("held", "hold ok installed"),
    _stanza("leaving", "deinstall ok installed"),
    _stanza("purged", "purge ok not-installed", version=None),
    _stanza("forgotten", "deinstall ok not-installed", version="3.0"),
    _stanza("held-gone", "hold ok not-installed", version="4.0"),
    _stanza("multi", "install ok installed", arch="amd64", version="5.0", extra="Multi-Arch: same"),
    _stanza("multi", "install ok installed", arch="i386", version="5.0", extra="Multi-Arch: same"),
    _stanza("noarch", "install ok installed", arch="all"),
]
ASKED = [
    "essential", "removed", "broken", "unpacked", "halfconf", "held", "leaving",
    "purged", "forgotten", "held-gone", "multi", "multi:amd64", "multi:i386", "multi:arm64",
    "noarch", "noarch:all", "noarch:amd64", "unknown",
]  # fmt: skip


def _admindir(tmp_path: Path, stanzas: list[str]) -> str:
    (tmp_path / "updates").mkdir()
    (tmp_path / "status").write_text("\n".join(stanzas))
    return str(tmp_path)


def test_every_dpkg_state_and_architecture_reads_as_dpkg_query_answers(tmp_path: Path) -> None:
    admindir = _admindir(tmp_path, STATES)
    direct = _direct(ASKED, admindir)
    assert direct == _real(ASKED, admindir)
    states = {n: p.state for n, p in direct[0].items()}  # type: ignore[attr-defined]
    assert states["removed"] == "config-files" and states["broken"] == "half-installed"
    assert states["multi"] == "installed" and states["purged"] == "absent" and states["unknown"] == "absent"


@pytest.mark.parametrize(
    "stanzas",
    [
        [
            _stanza("a", "install ok installed", arch="amd64"),
            _stanza("a", "deinstall ok config-files", arch="i386"),
        ],
        [_stanza("a", "install ok installed").replace("Maintainer: Someone <someone@example.org>\n", "")],
        [_stanza("a", "install ok installed", version=None)],
        [_stanza("a", "install ok installed").replace("Status: ", "Status:  ")],
        [_stanza("a", "install ok installed").replace("Package: ", "package: ")],
        [_stanza("a", "install ok installed"), _stanza("a", "install ok installed")],
        [_stanza("a", "install ok installed"), _stanza("b", "install ok triggers-pending", extra="")],
        [_stanza("a", "install ok installed") + "Triggers-Pending: ldconfig\n"],
        [
            _stanza("a", "install ok installed", arch="amd64"),
            _stanza("a", "install ok installed", arch="i386"),
        ],
    ],
    ids=[
        "architectures-disagree",
        "no-maintainer",
        "no-version",
        "odd-status",
        "odd-field",
        "twice",
        "trigger-state",
        "trigger-field",
        "two-not-multi-arch",
    ],
)
def test_a_status_file_that_is_not_as_dpkg_writes_it_is_left_to_dpkg_query(
    tmp_path: Path, stanzas: list[str]
) -> None:
    assert dpkg_status.query(["a"], _admindir(tmp_path, stanzas)) is None


def test_an_unmerged_journal_a_pattern_or_another_dpkg_query_is_left_to_dpkg_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admindir = _admindir(tmp_path, STATES)
    assert dpkg_status.usable(admindir)
    (tmp_path / "updates" / "0001").write_text(_stanza("held", "install ok installed"))
    assert not dpkg_status.usable(admindir)
    assert dpkg_status.query(["ess*"], admindir) is None
    wrapper = tmp_path / "bin" / "dpkg-query"
    wrapper.parent.mkdir()
    wrapper.write_text('#!/bin/sh\nexec /usr/bin/dpkg-query "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    assert not dpkg_status.usable()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_the_apt_probe_of_installed_packages_starts_no_process(tmp_path: Path) -> None:
    code = (
        "from reconcile.spec.loader import load_spec; from probes import apt; "
        f"obs = apt.probe(load_spec({str(REPO / 'specs' / 'cpu-demo.toml')!r}).spec); "
        "print(sorted((n, p.state) for n, p in obs.packages.items()))"
    )
    trace = tmp_path / "trace"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[('bash', 'installed'), ('coreutils', 'installed')]"
    execs = [ln for ln in trace.read_text().splitlines() if "execve(" in ln]
    assert len(execs) == 1, execs  # the interpreter itself, and nothing it started


def test_the_remembered_answer_is_dpkg_query_s_until_the_status_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    admindir = _admindir(tmp_path, STATES)
    first = dpkg_status.remembered(ASKED, admindir)
    assert first == dpkg_status.query(ASKED, admindir)
    (entry,) = (tmp_path / "cache" / "reconcile" / "dpkg").iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600
    assert dpkg_status.remembered(ASKED, admindir) == first
    # dpkg installs a package: a new status file by rename, as dpkg writes it.
    status = Path(admindir, "status")
    new = Path(admindir, "status-new")
    new.write_text(status.read_text() + "\n" + _stanza("late", "install ok installed"))
    new.replace(status)
    later = dpkg_status.remembered([*ASKED, "late"], admindir)
    assert later is not None and parse_dpkg_query(*later, [*ASKED, "late"]) == _real(
        [*ASKED, "late"], admindir
    )
    # The same names again, after an in-place edit that keeps size and mtime: ctime tells.
    st = status.stat()
    text = status.read_text()
    status.write_text(text.replace("install ok installed", "deinstall ok installed", 1))
    os.utime(status, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dpkg_status.remembered(ASKED, admindir) == dpkg_status.query(ASKED, admindir) != first
    entry.write_bytes(b"\x00damaged")
    assert dpkg_status.remembered(ASKED, admindir) == dpkg_status.query(ASKED, admindir)
