"""Key-file probe: whether the API key file exists, its mode, owner, group and size. Never its content.

Called by reconcile.plan.prober; only `os.lstat` touches the file, so the secret is never read.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from probes.common import Absent
from reconcile.record import Record
from reconcile.safety.untrusted import kind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    FileKind = Literal["file", "symlink", "directory", "other"]

    from reconcile.spec.models import Spec


class FileFacts(Record):
    path: str
    kind: FileKind  # from lstat: a symlink is reported as one, never followed
    mode: str  # "0600"
    uid: int
    gid: int
    owner: str | None  # None: the uid has no passwd entry
    group: str | None  # None: the gid has no group entry
    size: int
    what: str = "a regular file"  # untrusted.kind: "a FIFO", "a character device", for a message

    @property
    def non_empty(self) -> bool:
        return self.size > 0


def probe(spec: Spec) -> FileFacts | Absent | None:
    if spec.api_key is None:
        return None
    return read_file_facts(spec.api_key.file)


def read_file_facts(path: str) -> FileFacts | Absent:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Absent(path)
    return FileFacts(
        path=path,
        kind=_kind(st.st_mode),
        mode=format_mode(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        owner=_user(st.st_uid),
        group=_group(st.st_gid),
        size=st.st_size,
        what=kind(st.st_mode),
    )


def format_mode(st_mode: int) -> str:
    """Permission bits as a 4-digit octal string: 0o100600 -> "0600", setuid included ("4755")."""
    return f"{stat.S_IMODE(st_mode):04o}"


def _kind(st_mode: int) -> FileKind:
    if stat.S_ISREG(st_mode):
        return "file"
    if stat.S_ISLNK(st_mode):
        return "symlink"
    if stat.S_ISDIR(st_mode):
        return "directory"
    return "other"


def _user(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _group(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None
