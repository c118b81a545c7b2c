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
    """The commit of the spec's repository and whether the spec files differ from it (git's answer,
    remembered by reconcile.spec.git_cache until a file it depends on changes)."""
    if not paths:
        return GitInfo(None, None)
    from reconcile.spec.git_cache import remembered

    return GitInfo(*remembered(paths, lambda: ask_git(paths)))


def ask_git(paths: tuple[str, ...]) -> tuple[str | None, bool | None]:
    """`git rev-parse HEAD` and `git status --porcelain -- paths`: (commit, dirty), or (None, None)."""
    directory = os.path.dirname(os.path.abspath(paths[0]))
    try:
        head = run(["git", "-C", directory, "rev-parse", "HEAD"], timeout=5)
        if not head.ok:
            return None, None
        status = run(
            ["git", "-C", directory, "status", "--porcelain", "--", *map(os.path.abspath, paths)], timeout=5
        )
    except Exception:
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip())
