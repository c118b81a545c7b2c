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

# A location is judged as each tool reads it, not as one parser does (thirteenth round: urlsplit read
# hosts that pip, uv or huggingface_hub did not, and skipped URLs they took). A URL: its scheme (any but
# file:, whose paths the path rule judges), then `//`, or for a scheme WHATWG calls special (uv's URL
# parser) any run of `/` and `\`, or none (`http:127.0.0.1:8080/`). Its authority runs to `/?#` or a
# space, and each piece of it between `@` (userinfo: last or first, by the tool), `\` (where WHATWG
# ends it) and `,;'"` (a list's or JSON's separators, userinfo to a tool reading the whole value) is
# judged as a host[:port]. Where the URL ends for the bare pattern below: at a space or `"',;`.
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.-])(?!file:)([A-Za-z][A-Za-z0-9+.-]*):([/\\]*)", re.IGNORECASE)
_SPECIAL = frozenset({"http", "https", "ws", "wss", "ftp"})
_AUTHORITY_END = re.compile(r"[/?#\s]")
_PIECE_SPLIT = re.compile(r"[@\\,;'\"]")
_URL_END = re.compile(r"[\s\"',;]")
# A port as the most lenient tool reads it: httpx (huggingface_hub's) with Python's int(), which takes
# blanks before it, a `+`, `_` between digits and any Unicode decimal digit (`: +1_2345` and `١٢٣٤٥` are
# 12345 to it: seventeenth round); WHATWG and urllib3 take ASCII digits, their leading zeros skipped.
_PORT = r"[ \t]*\+?\d[\d_]*"
# One piece of an authority (between `@\,;'"`, before `/?#` or a space): a bracketed host (to its `]`,
# else to the piece's end: an IPv6 address and its zone fit in 256) or one to its first `:`, then a
# port (_PORT) that runs to the piece's end (else junk: the scheme's default port).
_PIECE = re.compile(
    r"""(?:\[(?P<bracketed>[^\]@\\,;'"/?#\s]{0,256})\]?|(?P<host>[^:@\\,;'"/?#\s]*))"""
    rf"""(?::(?P<port>{_PORT})(?=[@\\,;'"/?#\s]|\Z))?"""
)
# A bare host:port, as proxies are written (`127.0.0.1:3128`, `user@localhost:3128`, `//0:3128/`): a
# host, not preceded by a host's character, and a port not followed by a digit or `.digit` (a
# terminal's `DISPLAY=localhost:10.0`). A host of digits alone is an address to inet_aton (`0` is
# 0.0.0.0, `2130706433` 127.0.0.1); a time (`12:30`) reads as 0.0.0.12, not this machine. A port's
# leading zeros are skipped, as urlsplit and urllib3 skip them (`127.0.0.1:000008000` is port 8000); the
# port read as _PORT (httpx reads a bare proxy as `http://` and it).
_HOST_PORT = re.compile(rf"(?<![\w.%\[\]-])(\[[0-9A-Fa-f:.]+(?:%\w+)?\]|[\w.%-]+):({_PORT})(?![\d_])(?!\.\d)")
# WHATWG's URL parser and Python's urlsplit drop an ASCII tab, CR or LF anywhere in a URL.
_DROPPED = re.compile(r"[\t\r\n]")
_DEFAULT_PORTS = {"http": 80, "https": 443, "socks4": 1080, "socks4a": 1080, "socks5": 1080, "socks5h": 1080}


def local_locations(value: str) -> list[tuple[str, int | None]]:
    """(host as written, port) for each location in `value` whose host is this machine, in every
    reading a tool makes of it (above); the port None where the URL names none and its scheme has no
    known default."""
    found: list[tuple[str, int | None]] = []
    for form in dict.fromkeys((value, _DROPPED.sub("", value))):
        bare = list(form)
        # A URL inside another's authority (`http:@http:@...`) shares its end, and the pieces after its
        # first were split there: judged again only for another scheme (its default port), so a value
        # of many URLs is read in one pass, not once per URL before them (fourteenth round).
        authority_end = url_end = -1
        judged: set[str] = set()
        for m in _SCHEME.finditer(form):
            scheme, slashes = m.group(1).lower().rsplit("+", 1)[-1], m.group(2)  # pip's git+https
            if scheme not in _SPECIAL and not slashes.startswith("//"):
                continue
            start = m.end()
            if authority_end < start:
                authority_end, judged = _end(_AUTHORITY_END, form, start), set()
            at = start
            while at <= authority_end:  # each piece; only the first where this scheme read the rest
                found += _host_port(form, at, scheme)
                at = (
                    authority_end + 1 if scheme in judged else _end(_PIECE_SPLIT, form, at, authority_end) + 1
                )
            judged.add(scheme)
            blank = max(m.start(), url_end)  # what an earlier URL left unblanked
            if url_end < start:
                url_end = _end(_URL_END, form, start)
            bare[blank:url_end] = " " * (url_end - blank)
        found += [
            (host.strip("[]"), number)
            for host, port in _HOST_PORT.findall("".join(bare))
            if (number := _port_number(port)) is not None
        ]
    machine = _Machine()
    return [(h, p) for h, p in dict.fromkeys(found) if _is_this_machine(h, machine)]


def _end(pattern: re.Pattern[str], text: str, start: int, end: int | None = None) -> int:
    """Where `pattern` first matches in `text[:end]` at or after `start`, else `end` (the text's end)."""
    end = len(text) if end is None else end
    m = pattern.search(text, start, end)
    return end if m is None else m.start()


def _host_port(text: str, at: int, scheme: str) -> list[tuple[str, int | None]]:
    """The piece of an authority at `at` in `text`, `host[:port]` (a bracketed IPv6 host too), as (host,
    port): the scheme's default port where the piece names none (or junk WHATWG would refuse); none past
    65535 (no tool reaches it), however many leading zeros it has. Read by a pattern from `at`, never
    by copying the rest of the text: a value of many URLs is read in one pass (fourteenth round)."""
    m = _PIECE.match(text, at)
    assert m is not None  # every part of the pattern is optional
    host = m.group("bracketed") if m.group("bracketed") is not None else m.group("host")
    if not host:
        return []
    port = m.group("port")
    if port is None:
        return [(host, _default_port(scheme))]
    number = _port_number(port)
    return [] if number is None else [(host, number)]


def _port_number(port: str) -> int | None:
    """A port that _PORT matched, as int() reads it, its leading zeros skipped however many (WHATWG and
    urllib3 read any number of them: fifteenth round); None past 65535 (no tool reaches it)."""
    digits = port.strip(" \t+").replace("_", "")
    if not digits.isascii():
        digits = "".join(str(int(c)) for c in digits)  # each a Unicode decimal digit (\d)
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 5 and int(digits) <= 65535 else None


def _default_port(scheme: str) -> int | None:
    if scheme in _DEFAULT_PORTS:
        return _DEFAULT_PORTS[scheme]
    import _socket  # not socket.py: its selectors, array and enums cost ~3-4 ms to import

    try:
        return _socket.getservbyname(scheme, "tcp")
    except OSError:
        return None


class _Machine:
    """What makes a host this machine, each read once for a value however many hosts it names (a value
    of thousands: fourteenth round): the interfaces' addresses (psutil, loaded only when an address is
    not a loopback or wildcard one), and /etc/hosts."""

    def __init__(self) -> None:
        self._addresses: set[IPv4Address | IPv6Address] | None = None
        self._names: dict[str, list[IPv4Address | IPv6Address]] | None = None

    def addresses(self) -> set[IPv4Address | IPv6Address]:
        if self._addresses is None:
            import psutil

            nics = psutil.net_if_addrs().values()
            self._addresses = {a for a in (_address(n.address) for ns in nics for n in ns if n.address) if a}
        return self._addresses

    def names(self) -> dict[str, list[IPv4Address | IPv6Address]]:
        if self._names is None:
            self._names = _hosts_file()
        return self._names


def _is_this_machine(host: str, machine: _Machine) -> bool:
    """A loopback or wildcard address (in any form inet_aton reads: `127.1`, `2130706433`), an address
    of one of this machine's interfaces, `localhost` or a `.localhost` name, this machine's hostname,
    or a name /etc/hosts gives one of those addresses (what the resolver answers without asking DNS).
    Judged as a resolver gets it: uv's URL parser (UTS 46) and Python's socket (the idna codec) map
    fullwidth letters and digits and the ideographic full stop to ASCII, `ｌｏｃａｌｈｏｓｔ` to localhost."""
    name = _ascii(host).lower().rstrip(".")
    address = _address(name)
    if address is not None:
        return _local_address(address, machine)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    hostname = os.uname().nodename.lower()
    if name in (hostname, hostname.split(".")[0]):
        return True
    return any(_local_address(a, machine) for a in machine.names().get(name, ()))


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
        pass
    number = _whatwg_ipv4(text)
    return None if number is None else ipaddress.IPv4Address(number)


_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


def _whatwg_ipv4(text: str) -> int | None:
    """An IPv4 host as WHATWG's URL standard reads it (uv's parser), where it differs from inet_aton: a
    part `0x` with no digits is 0 (`0x7f.0x.0x.0x1` is 127.0.0.1 to uv; inet_aton refuses it)."""
    parts = text.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if not 1 <= len(parts) <= 4:
        return None
    numbers = []
    for part in parts:
        if part[:2] in ("0x", "0X"):
            base, digits = 16, part[2:]
        elif len(part) > 1 and part[0] == "0":
            base, digits = 8, part[1:]
        else:
            base, digits = 10, part
        if (base == 10 and not digits) or any(c not in _DIGITS[base] for c in digits):
            return None
        numbers.append(int(digits, base) if digits else 0)
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    return sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last


def _local_address(address: IPv4Address | IPv6Address, machine: _Machine) -> bool:
    address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1
    if address.is_loopback or address.is_unspecified:  # a connect to 0.0.0.0 or :: reaches this machine
        return True
    return address in machine.addresses()


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


def listeners() -> dict[int, list[int]]:
    """Each port some TCP socket listens on, on any address of this machine, and the owner uid of each
    such socket (the kernel's tables, /proc/net/tcp and tcp6: their uid column is the socket's owner)."""
    uids: dict[int, list[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # local_address is ADDR:PORT in hex; st 0A is LISTEN
            if len(cols) > 7 and cols[3] == "0A":
                uids.setdefault(int(cols[1].rsplit(":", 1)[1], 16), []).append(int(cols[7]))
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
