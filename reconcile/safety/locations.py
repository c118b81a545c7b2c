"""Network locations in a value (an environment variable, a spec key): each URL, or a proxy's bare
host:port, whose host is this machine names a local listener, and who listens on its port. Called by
reconcile.safety.filesafety (listener_problem: the environment rule, the value and index roles).

A remote host is not judged here: whoever answers there is the network's to trust, not a local user's.
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ipaddress import IPv4Address, IPv6Address

# A URL (any scheme but file:, whose paths the path rule judges), and a bare host:port as proxies are
# often written (`https_proxy=127.0.0.1:3128`): a host with a letter, a dot or brackets, so that a time
# (`12:30`) or a terminal's `DISPLAY=localhost:10.0` is not one.
_URL = re.compile(r"(?<![A-Za-z0-9+.-])(?!file:)[A-Za-z][A-Za-z0-9+.-]*://[^\s\"',;]*", re.IGNORECASE)
_HOST_PORT = re.compile(
    r"(?<![\w.:/@%\[-])(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9-]*[A-Za-z.][A-Za-z0-9.-]*):(\d{1,5})(?![\w.:/\]])"
)
_DEFAULT_PORTS = {"http": 80, "https": 443, "socks4": 1080, "socks4a": 1080, "socks5": 1080, "socks5h": 1080}


def local_locations(value: str) -> list[tuple[str, int | None]]:
    """(host as written, port) for each location in `value` whose host is this machine; the port None
    where the URL names none and its scheme has no known default."""
    from urllib.parse import urlsplit  # here, not at start-up: most values hold no URL

    found = []
    for url in _URL.findall(value):
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port
        except ValueError:
            continue  # no tool reaches a port past 65535 either
        scheme = parts.scheme.lower().rsplit("+", 1)[-1]  # pip's VCS URLs: git+https, hg+http
        found.append((host, port if port is not None else _default_port(scheme)))
    for host, port in _HOST_PORT.findall(_URL.sub(" ", value)):
        found.append((host.strip("[]"), int(port)))
    return [(h, p) for h, p in dict.fromkeys(found) if _is_this_machine(h)]


def _default_port(scheme: str) -> int | None:
    if scheme in _DEFAULT_PORTS:
        return _DEFAULT_PORTS[scheme]
    import _socket  # not socket.py: its selectors, array and enums cost ~3-4 ms to import

    try:
        return _socket.getservbyname(scheme, "tcp")
    except OSError:
        return None


def _is_this_machine(host: str) -> bool:
    """A loopback or wildcard address (in any form inet_aton reads: `127.1`, `2130706433`), an address
    of one of this machine's interfaces, `localhost` or a `.localhost` name, this machine's hostname,
    or a name /etc/hosts gives one of those addresses (what the resolver answers without asking DNS).
    Judged as a resolver gets it: uv's URL parser (UTS 46) and Python's socket (the idna codec) map
    fullwidth letters and digits and the ideographic full stop to ASCII, `ｌｏｃａｌｈｏｓｔ` to localhost."""
    name = _ascii(host).lower().rstrip(".")
    address = _address(name)
    if address is not None:
        return _local_address(address)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    hostname = os.uname().nodename.lower()
    if name in (hostname, hostname.split(".")[0]):
        return True
    return any(_local_address(a) for a in _hosts_file().get(name, ()))


def _ascii(host: str) -> str:
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:  # a label the codec refuses: its compatibility form, as UTS 46 maps it first
        import unicodedata

        return unicodedata.normalize("NFKC", host)


def _address(text: str) -> IPv4Address | IPv6Address | None:
    import _socket
    import ipaddress

    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) picks a link
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(_socket.inet_aton(text))
    except OSError:
        return None


def _local_address(address: IPv4Address | IPv6Address) -> bool:
    address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1
    if address.is_loopback or address.is_unspecified:  # a connect to 0.0.0.0 or :: reaches this machine
        return True
    import psutil

    return any(
        _address(a.address) == address for nics in psutil.net_if_addrs().values() for a in nics if a.address
    )


def _hosts_file() -> dict[str, list[IPv4Address | IPv6Address]]:
    names: dict[str, list[IPv4Address | IPv6Address]] = {}
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return names
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        address = _address(fields[0]) if fields else None
        if address is not None:
            for name in fields[1:]:
                names.setdefault(name.lower().rstrip("."), []).append(address)
    return names


def listener_uids(port: int) -> list[int]:
    """The owner uid of each TCP socket listening on `port`, on any address of this machine (the
    kernel's tables, /proc/net/tcp and tcp6: their uid column is the socket's owner)."""
    uids = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # local_address is ADDR:PORT in hex; st 0A is LISTEN
            if len(cols) > 7 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                uids.append(int(cols[7]))
    return uids


def only_root_binds(port: int) -> bool:
    """Whether binding `port` needs privilege (below net.ipv4.ip_unprivileged_port_start, 1024 unless
    changed): a port nothing listens on is then taken by root or no one."""
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start", encoding="ascii") as f:
            start = int(f.read().strip())
    except (OSError, ValueError):
        start = 1024
    return port < start
