"""Action for the server's API key file: generate it once, then only keep its mode and owner right.

Called by the executor for the `api_key` Change. The key itself never leaves the file: it is not
returned, logged, nor put in any message.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from reconcile.errors import ActionError
from reconcile.host import checkpoint, temp_prefix
from reconcile.plan.records import ActionResult
from reconcile.safety.untrusted import NotRegular, open_regular

if TYPE_CHECKING:
    from reconcile.spec.models import ApiKey


def _resolve_owner(api_key: ApiKey) -> tuple[int, int]:
    import grp
    import pwd

    try:
        user = pwd.getpwnam(api_key.owner)
    except KeyError:
        raise ActionError(
            f"[api_key].owner: user {api_key.owner!r} does not exist on this machine: "
            f"create it (useradd --system {api_key.owner}) or set owner to an existing user"
        ) from None
    if api_key.group is None:
        return user.pw_uid, user.pw_gid
    try:
        return user.pw_uid, grp.getgrnam(api_key.group).gr_gid
    except KeyError:
        raise ActionError(
            f"[api_key].group: group {api_key.group!r} does not exist on this machine: "
            f"create it (groupadd --system {api_key.group}) or leave group unset (the owner's group)"
        ) from None


def _names(uid: int, gid: int) -> str:
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return f"{user}:{group}"


def _key_dir(directory: str, uid: int, gid: int) -> tuple[int, bool]:
    """An O_RDONLY descriptor of the key's directory, and whether it was made now (0700, owned like
    the key, else its owner could not reach it).

    By descriptor (the path-trust layer's walk, then mkdirat and fchmod/fchown on the new directory
    opened O_NOFOLLOW), never by name: the directories above may be the key owner's (the path rule
    allows them, but follows no link in them), and between a mkdir and a chown by name they could put
    a link to any of root's directories in its place, which root would then chown to them. The key is
    then written through the same descriptor (write_new_at)."""
    from reconcile.safety.filesafety import UnsafePath, owners, walk

    try:
        w = walk(directory, owners({uid}), follow_last=True, is_dir=True)
    except UnsafePath as exc:
        raise ActionError(f"[api_key].file {directory}: {exc}") from None
    try:
        make = w.st is None
        names = [w.name, *w.missing] if w.name else []
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=w.dir_fd)
    finally:
        w.close()
    try:
        for name in names:
            try:
                if make:
                    os.mkdir(name, 0o700, dir_fd=fd)
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if not make:
                    raise ActionError(
                        f"{w.real}: not a directory ({exc.strerror}): move it aside or fix [api_key].file"
                    ) from None
                raise ActionError(
                    f"{directory}: cannot make {name} ({exc.strerror}; another user may have put "
                    "something there): nothing was chowned, check that directory"
                ) from None
            os.close(fd)
            fd = nxt
            if make:
                os.fchmod(fd, 0o700)  # mkdir's mode is filtered by the umask
                os.fchown(fd, uid, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd, make


def _generate(api_key: ApiKey, mode: int, uid: int, gid: int, why: str) -> ActionResult:
    import secrets

    from reconcile.safety.filesafety import write_new_at

    fd, made_dir = _key_dir(os.path.dirname(api_key.file), uid, gid)
    try:  # A trailing newline, like `print(token) > file`: readers strip() it.
        data = (secrets.token_urlsafe(32) + "\n").encode()
        name = os.path.basename(api_key.file)
        prefix = temp_prefix(api_key.file)
        write_new_at(fd, name, data, mode=mode, uid=uid, gid=gid, prefix=prefix, checkpoint=checkpoint)
    except OSError as exc:
        if exc.filename is None:  # ENOSPC on write names no file: name the key's
            raise OSError(exc.errno, exc.strerror, api_key.file) from exc
        raise
    finally:
        os.close(fd)
    where = f" (created {os.path.dirname(api_key.file)} 0700)" if made_dir else ""
    return ActionResult(
        True, f"{why}: generated a new key in {api_key.file}, mode {mode:04o}, {_names(uid, gid)}{where}"
    )


def ensure_key(api_key: ApiKey) -> ActionResult:
    """Make the key file exist with the spec's mode and owner; an existing key is never replaced."""
    uid, gid = _resolve_owner(api_key)
    mode = int(api_key.mode, 8)
    try:
        # As data: a symlink planted at the key's path must not make us chmod/chown its target, and a
        # FIFO or device there is refused by name, never opened.
        fd, st = open_regular(api_key.file)
    except FileNotFoundError:
        return _generate(api_key, mode, uid, gid, "no key file")
    except NotRegular as exc:
        if os.path.islink(api_key.file):
            raise ActionError(
                f"{api_key.file} is a symlink: the key must be a regular file; remove the link "
                f"(rm {api_key.file}) and re-run to generate a key there"
            ) from None
        raise ActionError(
            f"{api_key.file} is {exc.strerror}: move it aside and re-run to generate a key there"
        ) from None
    except OSError as exc:
        raise ActionError(f"{api_key.file}: cannot open ({exc.strerror})") from None
    try:
        if st.st_nlink > 1:
            # A hard link put in the key's place by whoever owns its directory (the key's owner may):
            # root's fchmod and fchown would change the file behind every other name (seventeenth round).
            raise ActionError(
                f"{api_key.file} has {st.st_nlink} names (a hard link): changing its mode or owner would "
                f"change the file behind the others; remove it (rm {api_key.file}) and re-run to generate "
                "a key there"
            )
        if st.st_size == 0:
            # An empty file holds no key to preserve; serving with an empty key would be open to all.
            return _generate(api_key, mode, uid, gid, "key file was empty")
        fixed: list[str] = []
        old_mode = stat.S_IMODE(st.st_mode)
        if old_mode != mode:  # tighten the mode before handing the file to another owner
            os.fchmod(fd, mode)
            fixed.append(f"mode {old_mode:04o} -> {mode:04o}")
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:  # chown may clear set-id bits
                os.fchmod(fd, mode)
            fixed.append(f"owner {_names(st.st_uid, st.st_gid)} -> {_names(uid, gid)}")
    finally:
        os.close(fd)
    if fixed:
        return ActionResult(True, f"{api_key.file}: " + ", ".join(fixed) + " (key kept)")
    return ActionResult(
        False, f"{api_key.file} already holds a key, mode {mode:04o}, owner {_names(uid, gid)}"
    )
