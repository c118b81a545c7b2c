"""venv probe: real venvs made with `python -m venv`, real wheels built from temp projects and
installed by a real installer (uv, else pip), and `ninja` from the package index."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probes import venv
from probes.common import Absent, Invalid
from reconcile.spec.models import Spec
from tests.records_support import same

BIN = Path(sys.executable).parent
UV = shutil.which("uv", path=str(BIN)) or shutil.which("uv")
PROJECTS = {"Tiny_Probe.Pkg": "1.2.3", "vllm": "0.26.0rc1"}


def make_venv(path: Path, *flags: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(path)], check=True)
    return path


def install(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    python = str(target / "bin" / "python")
    if UV:
        argv = [UV, "pip", "install", "-q", "--python", python, *args]
    else:
        argv = [sys.executable, "-m", "pip", "--python", python, "install", "-q", *args]
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wheels built from temp projects with the real build front-ends (both builds at once)."""
    root = tmp_path_factory.mktemp("wheels")
    builds = []
    for name, version in PROJECTS.items():
        project = root / name
        project.mkdir()
        (project / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\n'
        )
        if UV:
            argv = [UV, "build", "-q", "--wheel", "--out-dir", str(root / "dist"), str(project)]
        else:
            argv = [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "-w",
                str(root / "dist"),
                str(project),
            ]
        builds.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for build in builds:
        out, _ = build.communicate(timeout=300)
        if build.returncode != 0:
            pytest.skip(f"cannot build wheels here (needs setuptools from the index): {out[-500:]}")
    return root / "dist"


@pytest.fixture(scope="module")
def full_venv(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    path = make_venv(tmp_path_factory.mktemp("venvs") / "vllm-venv")
    done = install(path, "--no-index", "--find-links", str(wheels), *PROJECTS)
    assert done.returncode == 0, done.stderr
    return path


def spec_for(path: Path) -> Spec:
    return Spec.model_validate({"venv": {"path": str(path)}})


def test_no_venv_section_probes_nothing() -> None:
    assert venv.probe(Spec()) is None


def test_absent_venv(tmp_path: Path) -> None:
    assert same(venv.probe(spec_for(tmp_path / "nothing")), Absent(str(tmp_path / "nothing")))


def test_directory_without_pyvenv_cfg_is_not_a_venv(tmp_path: Path) -> None:
    (tmp_path / "plain" / "bin").mkdir(parents=True)
    result = venv.probe(spec_for(tmp_path / "plain"))
    assert isinstance(result, Invalid)
    assert "pyvenv.cfg is missing" in result.message


def test_fresh_venv_reads_its_config_and_interpreter_without_running_it(tmp_path: Path) -> None:
    path = make_venv(tmp_path / "fresh")
    result = venv.probe(spec_for(path))
    assert isinstance(result, venv.VenvObservation)
    assert result.version == platform.python_version()
    assert result.include_system_site_packages is False
    assert isinstance(result.interpreter, venv.Interpreter)
    assert result.interpreter.resolved == os.path.realpath(path / "bin" / "python")
    assert result.interpreter.link_target is not None
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert result.site_packages == (str(path / "lib" / minor / "site-packages"),)
    assert result.distributions == {}
    assert (result.has_ninja, result.vllm_version) == (False, None)


def test_system_site_packages_flag(tmp_path: Path) -> None:
    result = venv.probe(spec_for(make_venv(tmp_path / "sys", "--system-site-packages")))
    assert isinstance(result, venv.VenvObservation)
    assert result.include_system_site_packages is True


def test_installed_distributions_by_normalised_name(full_venv: Path) -> None:
    result = venv.probe(spec_for(full_venv))
    assert isinstance(result, venv.VenvObservation)
    tiny = result.distributions["tiny-probe-pkg"]
    assert (tiny.name, tiny.version) == ("Tiny_Probe.Pkg", "1.2.3")
    assert result.version_of("TINY_probe.pkg") == "1.2.3"
    assert result.vllm_version == "0.26.0rc1"
    assert result.unreadable == ()


def test_ninja_from_the_index_is_seen(tmp_path: Path) -> None:
    path = make_venv(tmp_path / "with-ninja")
    done = install(path, "ninja")
    if done.returncode != 0:
        pytest.skip(f"the package index is not reachable: {done.stderr[-300:]}")
    result = venv.probe(spec_for(path))
    assert isinstance(result, venv.VenvObservation)
    assert result.has_ninja is True
    assert result.version_of("ninja") is not None
    assert (path / "bin" / "ninja").exists()


def test_pth_files_that_add_other_site_packages(tmp_path: Path) -> None:
    path = make_venv(tmp_path / "pth")
    other = tmp_path / "torch-env" / "lib" / "python3.12" / "site-packages"
    other.mkdir(parents=True)
    result = venv.probe(spec_for(path))
    assert isinstance(result, venv.VenvObservation)
    site = Path(result.site_packages[0])
    (site / "reconcile-extra.pth").write_text(
        f"# made by reconcile\n{other}\nimport sys; sys.flags\n{tmp_path}/gone/site-packages\nrelative-dir\n"
    )
    result = venv.probe(spec_for(path))
    assert isinstance(result, venv.VenvObservation)
    assert [(Path(e.file).name, e.path, e.exists) for e in result.pth_paths] == [
        ("reconcile-extra.pth", str(other), True),
        ("reconcile-extra.pth", f"{tmp_path}/gone/site-packages", False),
        ("reconcile-extra.pth", str(site / "relative-dir"), False),
    ]


def test_metadata_without_a_version_is_reported_not_skipped(tmp_path: Path) -> None:
    path = make_venv(tmp_path / "bad")
    site = next((path / "lib").glob("python3.*/site-packages"))
    (site / "broken-1.0.dist-info").mkdir()
    (site / "broken-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\n\nbody\n")
    result = venv.probe(spec_for(path))
    assert isinstance(result, venv.VenvObservation)
    assert "broken" not in result.distributions
    (bad,) = result.unreadable
    assert bad.path.endswith("broken-1.0.dist-info/METADATA")
    assert "Name: broken" in bad.raw


def test_this_projects_own_venv_matches_importlib_metadata() -> None:
    # The one scan must agree with what the interpreter itself sees for the same environment.
    from importlib import metadata

    result = venv.read_venv(sys.prefix)
    assert isinstance(result, venv.VenvObservation)
    for name in ("pydantic", "pytest", "nvidia-ml-py"):
        assert result.version_of(name) == metadata.version(name)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("home = /usr/bin\nversion = 3.10.12\n", "3.10.12"),  # python -m venv
        ("home = /usr/bin\nversion_info = 3.12.3\nuv = 0.4.0\n", "3.12.3"),  # uv
        ("home = /usr/bin\nversion_info = 3.11.7.final.0\n", "3.11.7"),  # virtualenv
        ("home = /usr/bin\n", None),
    ],
)
def test_pyvenv_cfg_version_from_each_tool(text: str, version: str | None) -> None:
    assert venv.pyvenv_version(venv.parse_pyvenv_cfg(text)) == version


def _site(tmp_path: Path, dists: dict[str, str]) -> Path:
    site = tmp_path / "site-packages"
    for name, body in dists.items():
        (site / f"{name}.dist-info").mkdir(parents=True)
        (site / f"{name}.dist-info" / "METADATA").write_text(body)
    return site


def test_remembered_headers_give_what_a_fresh_read_gives_until_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = _site(
        tmp_path,
        {
            "alpha-1.0": "Metadata-Version: 2.1\nName: alpha\nVersion: 1.0\n\nbody\n",
            "beta-2.0": "Metadata-Version: 2.1\nName: Beta_Pkg\nVersion: 2.0\n",
            "broken-0": "Metadata-Version: 2.1\nName: broken\n\n",
        },
    )

    def fresh() -> object:
        with monkeypatch.context() as m:
            m.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))  # nothing remembered there
            return venv.scan_site_packages(str(site))

    first = venv.scan_site_packages(str(site))
    assert first == fresh() and "alpha" in first[0] and len(first[2]) == 1
    (entry,) = (tmp_path / "cache" / "reconcile" / "venv").iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600
    with monkeypatch.context() as m:  # remembered: no file is read again
        m.setattr(venv, "read_metadata_header", lambda path: pytest.fail(f"{path} was read"))
        assert venv.scan_site_packages(str(site)) == first
    # An in-place edit that keeps the size and the mtime: the ctime tells.
    meta = site / "alpha-1.0.dist-info" / "METADATA"
    st = meta.stat()
    meta.write_text(meta.read_text().replace("1.0", "1.1"))
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = venv.scan_site_packages(str(site))
    assert again == fresh() and again[0]["alpha"].version == "1.1"
    shutil.rmtree(site / "beta-2.0.dist-info")
    assert venv.scan_site_packages(str(site)) == fresh()
    entry.write_bytes(b"\x00damaged")
    assert venv.scan_site_packages(str(site)) == fresh()


def test_site_dirs_are_what_glob_lists(tmp_path: Path) -> None:
    """read_venv finds lib/python3.*/site-packages without glob (~2 ms of a plan's start-up): the same
    directories as glob, in the same order, past files, links and versions without site-packages."""
    import glob

    lib = tmp_path / "lib"
    for version in ("python3.12", "python3.9", "python3.10", "python3.", ".python3.11", "python2.7"):
        (lib / version / "site-packages").mkdir(parents=True)
    (lib / "python3.8").mkdir()  # no site-packages
    (lib / "python3.7").write_text("")  # a file, not a directory
    (lib / "python3.13").symlink_to(lib / "python3.12")
    (lib / "python3.6").mkdir()
    (lib / "python3.6" / "site-packages").symlink_to(tmp_path / "gone")  # dangling: glob keeps it
    for path in (tmp_path, tmp_path / "missing", lib / "python3.7"):
        want = sorted(glob.glob(os.path.join(glob.escape(str(path)), "lib", "python3.*", "site-packages")))
        assert list(venv._site_dirs(str(path))) == want
    assert len(venv._site_dirs(str(tmp_path))) == 6


def test_normalize_is_pep_503_on_any_name() -> None:
    """normalize's shortcut (a name with nothing to collapse) gives what the PEP 503 rule gives."""
    import re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from probes.venv import normalize

    @settings(max_examples=2000, deadline=None)
    @given(st.text(alphabet="aZ9-_.İ", max_size=12) | st.text(max_size=8))
    def same(name: str) -> None:
        assert normalize(name) == re.sub(r"[-_.]+", "-", name).lower()

    same()
    assert normalize("Flash_Attn.X") == "flash-attn-x" and normalize("a--b") == "a-b"
