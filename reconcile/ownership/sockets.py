"""Who listens on a TCP port: the socket inodes (sock_diag, else /proc/net/tcp and tcp6), the process
holding each (/proc/PID/fd), its user and command, and whether it is a member of a deployment.

Read only. probes.server reports the listener; probes.health sends the API key only after
key_guard() found the server's listener to be ours: on a TCP port, every listener a connection to the
server's host:port reaches (reaches(), not every listener on the port number); on a color's Unix socket,
the socket and its directories root's or the server user's. actions.server names a foreign holder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from reconcile.identity import endpoint, redact_argv
from reconcile.ownership.cgroups import cgroup_procs
from reconcile.ownership.membership import (
    Scope,
    is_member,
    read_bytes,
    read_stat,
    scope_of,
    uids,
    user_name,
)
from reconcile.record import Record
from reconcile.safety.display import shown_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def one_line(argv: tuple[str, ...], limit: int = 120) -> str:
    """A command line fit for one line of output: control characters (a newline in a `-c` script)
    become spaces, runs of spaces one."""
    text = " ".join(argv)
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:limit]


UNSEEN = "a process reconcile cannot see (another namespace?)"
# The descriptors of other users' processes read to name a socket's holder: another user holds as many
# as the hard limit allows (524,288 by systemd's default) in as many processes as they like, a few MB of
# their memory, and a scan that read them all took minutes a look. This bound is read in ~1 s (measured
# on the 2-core CI machine, busy).
OTHERS_FDS_MAX = 100_000
LOOKED = f"reconcile reads at most {OTHERS_FDS_MAX:,} descriptors of other users' processes to find one"
ARGV_MAX = 1 << 16  # of a holder's command line (it may be ~6 MB): shown_argv shows less


class Listener(Record):
    """One listening socket on the port and the process that holds it (pid None: not visible from
    here, e.g. another network or pid namespace)."""

    inode: str
    pid: int | None
    uid: int | None
    comm: str
    cmdline: tuple[str, ...]
    unseen: str = UNSEEN  # why no holder is named (pid None)

    def describe(self) -> str:
        if self.pid is None:
            return self.unseen
        cmd = one_line(self.cmdline) or self.comm
        return f"pid {self.pid} (user {user_name(self.uid)}: {cmd})"


class ForeignListener(Exception):
    """A request that would carry the key found a listener that is not the deployment's; `holder`
    says who it is (pid, user, command)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


# A listener's local address, 16 bytes: IPv6's, an IPv4 one v4-mapped (::ffff:a.b.c.d), as sock_diag and
# /proc/net/tcp6 give it; None: not read (counted as reaching every host).
Address = bytes | None
_MAPPED = bytes(10) + b"\xff\xff"
_ANY4, _ANY6 = _MAPPED + bytes(4), bytes(16)


def _literal(text: str) -> bytes | None:
    """An IP address written out, as listeners' addresses are kept; None: not one."""
    import _socket

    try:
        return _MAPPED + _socket.inet_pton(_socket.AF_INET, text)
    except OSError:
        pass
    try:
        return _socket.inet_pton(_socket.AF_INET6, text)
    except OSError:
        return None


def host_addresses(host: str | None) -> frozenset[bytes] | None:
    """The addresses a connection to (or a bind of) `host` uses, as listeners' addresses are kept; None
    when unknown (no host, a name that does not resolve): then every listener on the port counts."""
    import _socket

    if not host:
        return None
    literal = _literal(host)
    if literal is not None:
        return frozenset((literal,))
    try:  # a name (`localhost`): what the resolver answers the connect and the server's bind
        found = _socket.getaddrinfo(host, None, 0, _socket.SOCK_STREAM)
    except OSError:
        return None
    out = [_literal(str(where[0])) for *_rest, where in found]
    return None if not out or None in out else frozenset(a for a in out if a is not None)


def reaches(address: Address, v6only: bool, hosts: frozenset[bytes] | None) -> bool:
    """Whether a listener on `address` of the port is reached by a connection to one of `hosts` on it, or
    clashes with their bind: the same address, or a wildcard on either side (IPv6's [::] covers IPv4 too
    unless it is IPV6_V6ONLY). Unknown on either side: it counts."""
    if address is None or hosts is None:
        return True
    for host in hosts:
        v4 = host.startswith(_MAPPED)
        if address == host or host == _ANY6 or (host == _ANY4 and address.startswith(_MAPPED)):
            return True
        if (address == _ANY4 and v4) or (address == _ANY6 and not (v6only and v4)):
            return True
    return False


def listening_inodes(port: int, host: str | None = None) -> dict[str, int]:
    """Socket inodes listening on TCP `port` that a connection to `host` reaches (None: every one), each
    with the uid that made the socket: sock_diag over netlink (what `ss -ltn` does, ~0.1 ms), else
    /proc/net/tcp{,6} (which the kernel builds by walking every socket: ~10 ms each)."""
    try:
        found = _diag_listening(port)
    except OSError:
        found = _proc_listening(port)
    hosts = host_addresses(host)
    return {inode: uid for inode, (uid, address, v6only) in found.items() if reaches(address, v6only, hosts)}


def _proc_listening(port: int) -> dict[str, tuple[int, Address, bool]]:
    inodes: dict[str, tuple[int, Address, bool]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read_bytes(table) or b"").decode().splitlines()[1:]:
            cols = line.split()
            # local_address is ADDR:PORT in hex; st 0A is LISTEN
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                # V6ONLY is not shown here: an IPv6 wildcard counts as dual-stack
                inodes[cols[9]] = (int(cols[7]), _hex_address(cols[1].rsplit(":", 1)[0]), False)
    return inodes


def _hex_address(hexed: str) -> Address:
    """/proc/net/tcp{,6}'s address: 1 or 4 32-bit words in hex, each in the machine's byte order."""
    import struct

    try:
        raw = b"".join(struct.pack("=I", int(hexed[i : i + 8], 16)) for i in range(0, len(hexed), 8))
    except (ValueError, struct.error):
        return None
    return _MAPPED + raw if len(raw) == 4 else raw if len(raw) == 16 else None


def _diag_listening(port: int) -> dict[str, tuple[int, Address, bool]]:
    import _socket  # not socket.py: its selectors, array and enums cost ~3-4 ms to import
    import struct

    inodes: dict[str, tuple[int, Address, bool]] = {}
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
    try:
        sock.settimeout(2.0)
        for family in (_socket.AF_INET, _socket.AF_INET6):
            # inet_diag_req_v2: family, protocol, ext, pad, states (1 << TCP_LISTEN), a zeroed sockid
            req = struct.pack("=BBBBI", family, _socket.IPPROTO_TCP, 0, 0, 1 << 10) + bytes(48)
            # nlmsghdr: SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP
            sock.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req)
            done = False
            while not done:
                data = sock.recv(65536)
                offset = 0
                while offset + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, offset)
                    if kind == 2:  # NLMSG_ERROR
                        raise OSError(-struct.unpack_from("=i", data, offset + 16)[0], "sock_diag failed")
                    if kind == 3 or length < 16:  # NLMSG_DONE
                        done = True
                        break
                    # inet_diag_msg: family and 3 bytes, sockid (sport big-endian first, dport, src address
                    # in 16 bytes, ...: 48 bytes), expires, rqueue, wqueue, uid, inode (u32s); attributes
                    if struct.unpack_from("!H", data, offset + 20)[0] == port:
                        uid, inode = struct.unpack_from("=II", data, offset + 16 + 64)
                        src = data[offset + 24 : offset + 40]
                        address = _MAPPED + src[:4] if data[offset + 16] == _socket.AF_INET else src
                        inodes[str(inode)] = (uid, address, _v6only(data[offset + 16 + 72 : offset + length]))
                    offset += (length + 3) & ~3
    finally:
        sock.close()
    return inodes


def _v6only(attributes: bytes) -> bool:
    """INET_DIAG_SKV6ONLY among a listener's netlink attributes (the kernel sends it for IPv6 listeners)."""
    import struct

    at = 0
    while at + 4 < len(attributes):
        size, kind = struct.unpack_from("=HH", attributes, at)
        if size < 4:
            break
        if kind == 11:  # INET_DIAG_SKV6ONLY: a u8
            return bool(attributes[at + 4])
        at += (size + 3) & ~3
    return False


def socket_owners(inodes: Iterable[str], first: Iterable[int] = ()) -> tuple[dict[str, int], bool]:
    """(inode -> the first process found holding it, whether every process was looked at): `first`
    (the deployment's) are looked at before the rest; other users' descriptors are read up to
    OTHERS_FDS_MAX."""
    targets = {f"socket:[{i}]": i for i in inodes}
    found: dict[str, int] = {}
    early = list(dict.fromkeys(first))
    rest = (int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in early)
    budget, whole = OTHERS_FDS_MAX, True
    for n, pid in enumerate([*early, *rest]):
        if len(found) == len(targets):
            break
        # Root's processes and ours are read whole (no one else can make them many); other users' up to
        # the budget. Their uid from status: a process that turns itself non-dumpable has a root-owned
        # /proc/PID. Real and effective uid alike: another user's setuid program (su at its prompt, euid
        # 0) keeps every descriptor they held across the exec (thirteenth round); status unread: theirs.
        theirs = n >= len(early) and any(u not in (0, os.geteuid()) for u in uids(pid) or (-1,))
        if theirs and not whole:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        if theirs:
            budget -= len(fds)
            if budget < 0:
                whole = False
                continue
        for fd in fds:
            try:
                inode = targets.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if inode is not None and inode not in found:
                found[inode] = pid
    return found, whole


def listeners(port: int, first: Iterable[int] = (), host: str | None = None) -> list[Listener]:
    """Every socket listening on `port` that a connection to `host` reaches (None: on any address), with
    who holds it."""
    inodes = listening_inodes(port, host)
    owners, whole = socket_owners(inodes, first) if inodes else ({}, True)
    out = []
    for inode, made_by in sorted(inodes.items()):
        pid = owners.get(inode)
        if pid is None:
            why = UNSEEN if whole else f"a process of user {user_name(made_by)} (not looked up: {LOOKED})"
            out.append(Listener(inode, None, made_by, "?", (), why))
            continue
        stat = read_stat(pid)
        raw = read_bytes(f"/proc/{pid}/cmdline", ARGV_MAX) or b""
        cmd = shown_argv(redact_argv([c for c in raw.decode(errors="replace").split("\0") if c]))
        ids = uids(pid)  # named by its real uid: another user's setuid program (su, euid 0) is theirs
        out.append(Listener(inode, pid, ids[0] if ids else None, stat.comm if stat else "?", cmd))
    return out


def key_holder_check(host: str, port: int, scope: Scope, what: str) -> None:
    """Raise ForeignListener unless something listens on `port` and every listener a connection to `host`
    reaches (or that clashes with its bind: reaches()) is a member; a listener on another address of the
    port (127.0.0.2 beside the server's 127.0.0.1) is not the connection's and is not judged.

    Called after the TCP connect and before the request is sent: our connection then waits in the
    queue of a listener that existed at connect time, and a listener cannot be replaced without
    resetting the connections it queued."""
    # Our own processes are looked at first: the fd scan then stops at once when the holder is ours.
    ours = [*(cgroup_procs(scope.cgroup) if scope.cgroup else []), *(r.pid for r in scope.launches)]
    found = listeners(port, first=ours, host=host)
    if not found:
        raise ForeignListener(
            f"the key was not sent: nothing that reconcile can see listens on port {port} at {host}",
            "nobody visible",
        )
    bad = [x for x in found if x.pid is None or not is_member(x.pid, scope)]
    if bad:
        holder = bad[0].describe()
        raise ForeignListener(
            f"the key was not sent: port {port} is held by {holder}, which is not {what}", holder
        )


def key_guard(spec: Spec) -> Callable[[], None]:
    """The check a keyed (or vouching) request to the deployment's server runs after its connect and
    before a byte is sent (raises ForeignListener): on a TCP port, key_holder_check; on a color's Unix
    socket, socket_holder_check."""
    assert spec.server is not None
    where, port = endpoint(spec)
    what = f"deployment {spec.server.name}"
    if port == 0:
        uid = serving_uid(spec)
        return lambda: socket_holder_check(where, uid, what)
    scope = scope_of(spec)
    return lambda: key_holder_check(where, port, scope, what)


def serving_uid(spec: Spec) -> int:
    """The uid the server runs as: its systemd unit's User=, else root (0); an unknown user: root's."""
    import pwd

    server = spec.server
    assert server is not None
    if server.supervisor != "systemd" or server.user in (None, "root"):
        return 0
    try:
        return pwd.getpwnam(str(server.user)).pw_uid
    except KeyError:  # the unit's rendering names the missing user; only root may then own the socket
        return 0


def socket_holder_check(path: str, uid: int, what: str) -> None:
    """Raise ForeignListener unless the Unix socket at `path` is one only root or the server's user
    (`uid`) can have made. No holder lookup is needed, unlike a TCP port, which any user may bind once
    it is free: the socket's directory (actions.launching makes it 0700, the server's user's, under
    root's /run/reconcile) is walked from / without following a link, each directory on the way root's
    or that user's and writable by no one else (filesafety.walk), and the socket itself is not a link
    and is theirs. Nobody else can enter that directory, so nobody else can bind or swap a socket in it:
    whatever answered our connect there is root's or the deployment's."""
    import stat

    from reconcile.safety.filesafety import UnsafePath, owners, walk

    try:
        w = walk(path, owners((uid,)))
    except (OSError, UnsafePath) as exc:
        raise ForeignListener(f"the key was not sent: {exc}", "a socket reconcile does not trust") from None
    w.close()
    if w.st is None or not stat.S_ISSOCK(w.st.st_mode) or w.st.st_uid not in owners((uid,)):
        whose = "nothing" if w.st is None else f"a file of {user_name(w.st.st_uid)}'s, not a socket of ours"
        raise ForeignListener(f"the key was not sent: {path} is {whose}", whose)
