"""Where a spec came from: the commit of its git repository and whether its files differ from it.

Called by the planner (the plan's header and notes) and the executor (each generation records it).
"""

from __future__ import annotations

import os

from reconcile.host import run
from reconcile.record import Record


class GitInfo(Record):
    commit: str | None
    dirty: bool | None  # None: not in a git work tree

    def describe(self) -> str:
        if self.commit is None:
            return "not in git"
        return f"git {self.commit[:12]}" + (" (uncommitted changes)" if self.dirty else "")


def git_info(paths: tuple[str, ...]) -> GitInfo:
    """The commit of the spec's repository and whether the spec files differ from it, asked of git
    each time: one `git status --porcelain=v2 --branch -- paths` (its `# branch.oid` line is the
    commit), bounded by a timeout. Not in a work tree, no commit yet, or no git: (None, None)."""
    if not paths:
        return GitInfo(None, None)
    return GitInfo(*ask_git(paths))


def ask_git(paths: tuple[str, ...]) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the spec files' repository, or (None, None). --no-optional-locks: a status
    run as root never rewrites the repository's index (it would leave it root's)."""
    directory = os.path.dirname(os.path.abspath(paths[0]))
    argv = ["git", "--no-optional-locks", "-C", directory, "status", "--porcelain=v2", "--branch"]
    argv += ["--no-ahead-behind", "--", *map(os.path.abspath, paths)]
    try:
        status = run(argv, timeout=5)
        if not status.ok:  # e.g. a base outside the repository: the commit alone, as rev-parse says
            head = run(["git", "-C", directory, "rev-parse", "HEAD"], timeout=5)
            return (head.stdout.strip(), False) if head.ok else (None, None)
    except Exception:
        return None, None
    commit = None
    dirty = False
    for line in status.stdout.splitlines():
        if line.startswith("# branch.oid "):
            commit = line[len("# branch.oid ") :].strip()
        elif line and not line.startswith("#"):
            dirty = True
    if commit is None or commit == "(initial)":
        return None, None  # no commit yet: as `git rev-parse HEAD` fails
    return commit, dirty
