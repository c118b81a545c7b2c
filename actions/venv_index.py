"""Index credentials for pip and uv: URLs without their user:password (a command line is world-readable
in /proc) and a private netrc that gives the installer the credentials instead (pip and uv both read
the file NETRC names). Called by actions.venv.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from reconcile.errors import ActionError
from reconcile.host import atomic_write
from reconcile.safety.sensitive import netrc_text, split_credentials

if TYPE_CHECKING:
    from reconcile.spec.models import Venv


def index_urls(venv: Venv) -> tuple[str | None, list[str], list[tuple[str, str, str]]]:
    """The index URLs without their credentials (fit for a command line: /proc/PID/cmdline is
    world-readable), and the (host, login, password) entries pip and uv get from a netrc instead."""
    creds = []
    index = None
    if venv.index_url is not None:
        index, cred = split_credentials(venv.index_url)
        creds += [cred] if cred else []
    extra = []
    for url in venv.extra_index_urls:
        bare, cred = split_credentials(url)
        extra.append(bare)
        creds += [cred] if cred else []
    return index, extra, creds


@contextlib.contextmanager
def netrc_env(entries: Sequence[tuple[str, str, str]]) -> Iterator[dict[str, str]]:
    """NETRC= a 0600 file in a fresh 0700 temp dir holding `entries` (both removed after), or {}."""
    if not entries:
        yield {}
        return
    try:
        text = netrc_text(entries)
    except ValueError as exc:
        raise ActionError(f"[venv]: {exc}; put them in /root/.netrc yourself") from None
    directory = tempfile.mkdtemp(prefix="reconcile-netrc-")
    path = os.path.join(directory, "netrc")
    try:
        atomic_write(path, text.encode(), mode=0o600)
        yield {"NETRC": path}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
