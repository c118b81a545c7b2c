"""apt probe: real dpkg on this machine (a tiny .deb installed, removed, purged), recorded dpkg-query
outputs, and sources files in temp dirs (plus this machine's own /etc/apt)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import apt
from probes.common import ParseError, ProbeFailure, Unavailable
from reconcile.spec.models import Spec

FIXTURES = Path(__file__).parent / "fixtures" / "dpkg-query"
TEST_PKG = "reconcile-probe-test"
needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg")


def spec(packages: list[str], sources_dir: str = "/etc/apt/sources.list.d", **extra: object) -> Spec:
    return Spec.model_validate({"apt": {"packages": packages, "sources_dir": sources_dir, **extra}})


def fixture(name: str) -> str:
    path = FIXTURES / name
    return path.read_text() if path.exists() else ""


# --- dpkg-query ---------------------------------------------------------------------------------


def test_no_apt_section_probes_nothing() -> None:
    assert apt.probe(Spec()) is None


@needs_dpkg
def test_installed_and_unknown_packages_in_one_call_on_this_machine() -> None:
    result = apt.probe(spec(["bash", "coreutils=0.0-pinned", "reconcile-no-such-package"]))
    assert isinstance(result, apt.AptObservation), result
    bash = result.packages["bash"]
    assert bash.state == "installed" and bash.version
    assert result.packages["coreutils"].state == "installed"
    assert result.packages["reconcile-no-such-package"] == apt.PackageStatus(
        "reconcile-no-such-package", "absent", None
    )


def test_recorded_output_of_this_machine() -> None:
    packages, warnings = apt.parse_dpkg_query(
        fixture("this-machine.stdout"),
        fixture("this-machine.stderr"),
        ["bash", "coreutils", "reconcile-no-such-package", "libc6"],
    )
    assert packages["bash"] == apt.PackageStatus("bash", "installed", "5.2.15-2+b8", "install", "ok")
    assert packages["libc6"].version == "2.36-9+deb12u14"
    assert packages["reconcile-no-such-package"].state == "absent"
    assert warnings == ()


def test_every_dpkg_state_of_a_half_done_cuda_install() -> None:
    names = [
        "cuda-nvcc-13-0",
        "cuda-cudart-dev-13-0",
        "cuda-cccl-13-0",
        "libcublas-dev-13-0",
        "cuda-nvrtc-dev-13-0",
        "libcusparse-dev-13-0",
        "libcurand-dev-13-0",
    ]
    packages, _ = apt.parse_dpkg_query(
        fixture("reference-partial.stdout"), fixture("reference-partial.stderr"), names
    )
    assert {n: (p.state, p.version) for n, p in packages.items()} == {
        "cuda-nvcc-13-0": ("installed", "13.0.88-1"),
        "cuda-cudart-dev-13-0": ("installed", "13.0.96-1"),
        "cuda-cccl-13-0": ("installed", "13.0.85-1"),
        "libcublas-dev-13-0": ("config-files", "13.0.0.19-1"),
        "cuda-nvrtc-dev-13-0": ("half-installed", "13.0.88-1"),
        "libcusparse-dev-13-0": ("absent", None),
        "libcurand-dev-13-0": ("absent", None),
    }
    assert packages["cuda-nvrtc-dev-13-0"].error_flag == "reinstreq"
    assert packages["libcublas-dev-13-0"].want == "deinstall"


def test_a_package_listed_per_architecture_counts_as_installed_when_one_is() -> None:
    packages, _ = apt.parse_dpkg_query(fixture("multiarch.stdout"), "", ["libc6:amd64"])
    assert packages["libc6:amd64"].state == "installed"
    assert packages["libc6:amd64"].version == "2.36-9+deb12u14"


def test_dpkg_warnings_are_kept_not_fatal() -> None:
    stderr = "dpkg-query: warning: parsing file '/var/lib/dpkg/available' near line 5: missing 'Maintainer'\n"
    packages, warnings = apt.parse_dpkg_query(fixture("this-machine.stdout"), stderr, ["bash"])
    assert packages["bash"].state == "installed"
    assert warnings == (stderr.strip(),)


@pytest.mark.parametrize(
    ("stdout", "stderr", "names"),
    [
        ("bash installed 5.2\n", "", ["bash"]),  # not the tab-separated format asked for
        ("bash\tinstall ok weird-state\t5.2\n", "", ["bash"]),
        ("", "dpkg-query: error: cannot access archive\n", ["bash"]),
        ("bash\tinstall ok installed\t5.2\n", "", ["bash", "zsh"]),  # zsh unaccounted for
    ],
)
def test_output_that_does_not_parse_is_an_error_with_the_text(
    stdout: str, stderr: str, names: list[str]
) -> None:
    with pytest.raises(ParseError) as err:
        apt.parse_dpkg_query(stdout, stderr, names)
    assert err.value.raw.startswith(stdout)


def test_without_dpkg_the_probe_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = apt.probe(spec(["bash"]))
    assert isinstance(result, Unavailable)
    assert "dpkg-query: not found" in result.reason


def test_dpkg_query_failing_otherwise_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "dpkg-query"
    fake.write_text("#!/bin/sh\necho 'dpkg-query: error: parsing file /var/lib/dpkg/status' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    result = apt.probe(spec(["bash"]))
    assert isinstance(result, ProbeFailure)
    assert "exited 2" in result.reason and "parsing file" in result.raw


def _dpkg(*args: str) -> None:
    # Other tests may hold the dpkg lock for a moment: wait for it rather than fail.
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(
            ["dpkg", *args], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
        )
        if done.returncode == 0:
            return
        if "lock" not in done.stderr or time.monotonic() > deadline:
            raise AssertionError(f"dpkg {' '.join(args)}: {done.stderr}")
        time.sleep(0.5)


@pytest.fixture
def test_deb(tmp_path: Path) -> Iterator[Path]:
    """A real .deb with a conffile (so `dpkg -r` leaves it in config-files); purged afterwards."""
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / f"{TEST_PKG}.conf").write_text("setting = 1\n")
    (root / "DEBIAN" / "conffiles").write_text(f"/etc/{TEST_PKG}.conf\n")
    (root / "DEBIAN" / "control").write_text(
        f"Package: {TEST_PKG}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: tests <t@reconcile.invalid>\n"
        "Description: reconcile probe test package\n"
    )
    for d, _, _ in os.walk(root):
        os.chmod(d, 0o755)
    deb = tmp_path / f"{TEST_PKG}_1.0-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True
    )
    try:
        yield deb
    finally:
        _dpkg("--purge", TEST_PKG)


@pytest.mark.root
@needs_dpkg
def test_real_package_through_install_remove_and_purge(test_deb: Path) -> None:
    def state() -> tuple[str, str | None]:
        result = apt.probe(spec([f"{TEST_PKG}=1.0-1"]))
        assert isinstance(result, apt.AptObservation), result
        status = result.packages[TEST_PKG]
        return status.state, status.version

    assert state() == ("absent", None)
    _dpkg("-i", str(test_deb))
    assert state() == ("installed", "1.0-1")
    _dpkg("-r", TEST_PKG)
    assert state() == ("config-files", "1.0-1")
    _dpkg("--purge", TEST_PKG)
    assert state() == ("absent", None)


# --- sources ------------------------------------------------------------------------------------


@pytest.fixture
def apt_dir(tmp_path: Path) -> Path:
    root = tmp_path / "etc-apt"
    (root / "sources.list.d").mkdir(parents=True)
    (root / "keyrings").mkdir()
    (root / "keyrings" / "cuda.gpg").write_bytes(b"\x99key")
    (root / "sources.list").write_text(
        "# main archive\n"
        "deb http://deb.debian.org/debian bookworm main contrib  # trailing comment\n"
        "deb-src http://deb.debian.org/debian bookworm main\n"
        "# deb http://disabled.example/debian bookworm main\n"
    )
    (root / "sources.list.d" / "cuda.list").write_text(
        f"deb [arch=amd64 signed-by={root}/keyrings/cuda.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/ /\n"
    )
    (root / "sources.list.d" / "reconcile-local.list").write_text("deb [ trusted=yes ] file:/srv/repo ./\n")
    (root / "sources.list.d" / "broken.list").write_text("deb http://only-a-uri.example\n")
    (root / "sources.list.d" / "ignored.list.disabled").write_text("deb http://never.example x main\n")
    (root / "sources.list.d" / "vendor.sources").write_text(
        "Types: deb deb-src\n"
        "URIs: https://vendor.example/apt\n"
        "Suites: jammy jammy-updates\n"
        "Components: main\n"
        f"Signed-By: {root}/keyrings/vendor.gpg\n"
        "\n"
        "# an inline key and a disabled stanza\n"
        "Types: deb\n"
        "URIs: https://inline.example/apt\n"
        "Suites: stable\n"
        "Components: main\n"
        "Enabled: no\n"
        "Signed-By:\n"
        " -----BEGIN PGP PUBLIC KEY BLOCK-----\n"
        " .\n"
        " mQINBF...\n"
        " -----END PGP PUBLIC KEY BLOCK-----\n"
        "\n"
        "Types: deb\n"
        "Suites: stable\n"
    )
    return root


def test_sources_in_both_formats_with_their_keyrings(apt_dir: Path) -> None:
    repos = [{"name": "cuda", "uri": "https://x.example", "suite": "/", "keyring": "/nonexistent/key.gpg"}]
    result = apt.probe(spec([], str(apt_dir / "sources.list.d"), repositories=repos))
    assert isinstance(result, apt.AptObservation)
    got = [(s.format, s.type, s.uri, s.suite, s.components, s.trusted, s.enabled) for s in result.sources]
    assert got == [
        ("one-line", "deb", "http://deb.debian.org/debian", "bookworm", ("main", "contrib"), False, True),
        ("one-line", "deb-src", "http://deb.debian.org/debian", "bookworm", ("main",), False, True),
        (
            "one-line",
            "deb",
            "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/",
            "/",
            (),
            False,
            True,
        ),
        ("one-line", "deb", "file:/srv/repo", "./", (), True, True),
        ("deb822", "deb", "https://vendor.example/apt", "jammy", ("main",), False, True),
        ("deb822", "deb", "https://vendor.example/apt", "jammy-updates", ("main",), False, True),
        ("deb822", "deb-src", "https://vendor.example/apt", "jammy", ("main",), False, True),
        ("deb822", "deb-src", "https://vendor.example/apt", "jammy-updates", ("main",), False, True),
        ("deb822", "deb", "https://inline.example/apt", "stable", ("main",), False, False),
    ]
    cuda_source = result.sources[2]
    assert cuda_source.options["arch"] == "amd64"
    assert cuda_source.signed_by == (f"{apt_dir}/keyrings/cuda.gpg",)
    assert result.sources[-1].signed_by == ("(embedded key)",)
    assert result.keyrings == {
        f"{apt_dir}/keyrings/cuda.gpg": True,
        f"{apt_dir}/keyrings/vendor.gpg": False,
        "/nonexistent/key.gpg": False,
    }
    assert [(Path(u.file).name, u.line) for u in result.unparsed] == [
        ("broken.list", 1),
        ("vendor.sources", 19),
    ]
    assert result.unparsed[1].reason == "stanza lacks uris"


@pytest.mark.skipif(
    not os.path.exists("/etc/apt/sources.list.d/debian.sources"), reason="needs Debian's deb822"
)
def test_this_machines_debian_sources() -> None:
    result = apt.probe(spec([]))
    assert isinstance(result, apt.AptObservation)
    debian = [s for s in result.sources if s.file == "/etc/apt/sources.list.d/debian.sources"]
    assert {s.suite for s in debian} >= {"bookworm", "bookworm-security"}
    assert result.keyrings["/usr/share/keyrings/debian-archive-keyring.gpg"] is True


def test_apt_cache_policy_answers_are_kept_until_the_lists_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real apt-cache, behind a wrapper on PATH that records each call.
    import shutil

    from probes import apt as apt_probe

    real = shutil.which("apt-cache")
    if real is None:
        pytest.skip("no apt-cache")
    calls = tmp_path / "calls"
    wrapper = tmp_path / "bin" / "apt-cache"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "x_Packages").write_text("one")
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(apt_probe, "_APT_STATE", (str(lists),))
    names = ["bash", "no-such-package-reconcile"]
    first = apt_probe._unknown(names)
    assert first == ("no-such-package-reconcile",)
    assert apt_probe._unknown(names) == first and len(calls.read_text().splitlines()) == 1
    cached = next((tmp_path / "cache" / "reconcile").glob("apt-policy-*.marshal"))
    assert stat.S_IMODE(cached.stat().st_mode) == 0o600
    (lists / "x_Packages").write_text("two, after apt-get update")
    assert apt_probe._unknown(names) == first and len(calls.read_text().splitlines()) == 2


def test_source_files_are_what_glob_lists(tmp_path: Path) -> None:
    """read_sources lists sources.list.d without glob (~2 ms of a plan's start-up): the same files as
    glob's *.list and *.sources, hidden names, other suffixes and a missing directory included."""
    import glob

    d = tmp_path / "sources.list.d"
    d.mkdir()
    for name in ("b.list", "a.list", ".hidden.list", ".list", "c.sources", "x.list.save", "z.sources~"):
        (d / name).write_text("")
    (d / "dir.list").mkdir()
    (d / "link.sources").symlink_to(d / "gone")
    for directory in (str(d), str(tmp_path / "missing"), str(d / "b.list")):
        want = sorted(glob.glob(os.path.join(glob.escape(directory), "*.list")))
        want += sorted(glob.glob(os.path.join(glob.escape(directory), "*.sources")))
        assert apt._ending(directory, ".list") + apt._ending(directory, ".sources") == want
    assert [os.path.basename(p) for p in apt._ending(str(d), ".list")] == ["a.list", "b.list", "dir.list"]
