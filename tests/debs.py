"""Test helper: build tiny real .deb packages with dpkg-deb and serve them as a flat local apt repository.

Used by the apt action tests (and any probe test that wants real installed packages). Each package
ships one file, /usr/share/reconcile-test/<name>, whose content is its version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

TOOLS = ("apt-get", "apt-cache", "dpkg-deb", "dpkg-scanpackages", "dpkg-query")
FILES_DIR = "/usr/share/reconcile-test"


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def repo_dir() -> str:
    """A temp dir apt can read: apt fetches file: URIs as the unprivileged `_apt` user."""
    path = tempfile.mkdtemp(prefix="reconcile-apt-repo-")
    os.chmod(path, 0o755)
    return path


def build_deb(out_dir: str, name: str, version: str, *, depends: tuple[str, ...] = ()) -> str:
    """Build `<out_dir>/<name>_<version>_all.deb` and return its path."""
    with tempfile.TemporaryDirectory(prefix="reconcile-deb-") as root:
        os.makedirs(os.path.join(root, "DEBIAN"))
        control = [
            f"Package: {name}",
            f"Version: {version}",
            "Architecture: all",
            "Maintainer: reconcile tests <tests@reconcile.invalid>",
            "Section: misc",
            "Priority: optional",
        ]
        if depends:
            control.append(f"Depends: {', '.join(depends)}")
        control.append(f"Description: reconcile test package {name} {version}")
        with open(os.path.join(root, "DEBIAN", "control"), "w") as f:
            f.write("\n".join(control) + "\n")
        payload = os.path.join(root, FILES_DIR.lstrip("/"))
        os.makedirs(payload)
        with open(os.path.join(payload, name), "w") as f:
            f.write(version + "\n")
        for dirpath, _, _ in os.walk(root):
            os.chmod(dirpath, 0o755)  # dpkg-deb refuses a DEBIAN dir with odd permissions
        deb = os.path.join(out_dir, f"{name}_{version}_all.deb")
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, deb],
            check=True,
            capture_output=True,
            text=True,
        )
    os.chmod(deb, 0o644)
    return deb


def scan(repo: str) -> None:
    """(Re)write the flat repository's Packages index (what `deb [trusted=yes] file:<repo> ./` reads)."""
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    with open(os.path.join(repo, "Packages"), "w") as f:
        f.write(index)
    os.chmod(os.path.join(repo, "Packages"), 0o644)


def installed_version(name: str) -> str | None:
    """The version dpkg has installed, or None (not installed, or only its config files left)."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", name], capture_output=True, text=True
    )
    status, _, version = out.stdout.partition(" ")
    return version if out.returncode == 0 and status == "installed" else None


def purge(names: list[str]) -> None:
    subprocess.run(
        ["dpkg", "--purge", *names], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
    )
