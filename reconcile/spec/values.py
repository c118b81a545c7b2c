"""The checks each spec value passes, with the one-line reason a bad one gets.

Called by reconcile.spec.models's field types (the loader adds FILE:LINE); actions.apt's writer calls the apt
field checks again, and commands and the scheduler parse durations with `parse_duration`.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from typing import Any

from pydantic_core import PydanticCustomError

from reconcile.safety.names import LOCKED, name_problem

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*\Z")
DURATION_PATTERN = _DURATION.pattern
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
DURATIONS = '90 (seconds), "500ms", "90s", "15m" or "1h"'
_LONGEST = 86400.0  # a spec's timeouts and windows: a day is already far past any real boot or stop
# Directories that hold the system itself: reconcile writes (and removes its own files) in model.dir,
# state_dir and venv.path, so each must be a directory of its own, never one of these.
_SYSTEM_DIR_NAMES = (
    "/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /proc /root /run /sbin /srv "
    "/sys /tmp /usr /var /usr/bin /usr/include /usr/lib /usr/lib64 /usr/libexec /usr/local /usr/local/bin "
    "/usr/local/lib /usr/local/sbin /usr/local/share /usr/sbin /usr/share /usr/src /var/cache /var/lib "
    "/var/log /var/mail /var/opt /var/run /var/spool /var/tmp /etc/apt /etc/systemd /etc/systemd/system "
    "/dev/shm /run/user /run/systemd"
)
SYSTEM_DIRS = frozenset(_SYSTEM_DIR_NAMES.split())


def quoted(value: object) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def parse_duration(value: object) -> float:
    """`90`, `"90s"`, `"15m"`, `"1h"`, `"500ms"` -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a duration ({DURATIONS})")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"{quoted(value)} is not a duration ({DURATIONS})")
    if not math.isfinite(seconds):
        raise ValueError(f"{quoted(value)} is not a finite duration ({DURATIONS})")
    if seconds <= 0:
        raise ValueError(f"{quoted(value)} is not a positive duration ({DURATIONS})")
    return seconds


def spec_duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds > _LONGEST:
        raise ValueError(f"{quoted(value)} is longer than a day ({DURATIONS})")
    return seconds


def no_bool(value: object) -> object:
    """TOML's true is not 1: pydantic's lax int and float would take it as one."""
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "a boolean is not a number")
    return value


def absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{quoted(value)} is a relative path (an absolute path, starting with /)")
    if "\x00" in value:
        raise ValueError("a path cannot contain a NUL byte (an absolute path, starting with /)")
    return value


def own_dir(value: str) -> str:
    # Lexical, like the rest of validation (the spec cache keeps the result): "/usr/local/.." is /usr.
    normal = "/" + posixpath.normpath(value).lstrip("/")
    if normal in SYSTEM_DIRS:
        raise ValueError(
            f"{quoted(value)} is a system directory (a directory of its own below it, "
            "e.g. /var/lib/reconcile/models/NAME)"
        )
    return value


INSIDE = '(a relative path inside the model dir, e.g. "plugin/x.py")'


def relative_name(value: str) -> str:
    # An absolute path is allowed when it is under model.dir ("{model.dir}/x.py"): Model checks that.
    if (problem := name_problem(value[1:] if value.startswith("/") else value)) is not None:
        raise ValueError(f"{quoted(value)} {problem} {INSIDE}")
    return value


def env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError(
            f"{quoted(value)} is not an environment variable name "
            "(letters, digits and _, not starting with a digit)"
        )
    return value


# One field of a one-line apt source: whitespace would start another field, [ ] an option list, " a
# quoted word, # a comment, and a control character another line. (Also checked by actions.apt's writer.)
ONE_WORD = "one word without spaces, quotes, brackets or #"
_APT_WORD = r'[^\s\x00-\x1f\x7f-\x9f\u2028\u2029\[\]#"]+'


def apt_word(noun: str, value: str) -> str:
    """A suite or a component."""
    if not re.fullmatch(_APT_WORD, value):
        raise ValueError(
            f"{quoted(value)} is not {noun} "
            '(one word without spaces, quotes, brackets or #, e.g. "bookworm" or "/")'
        )
    return value


def apt_uri(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:" + _APT_WORD, value):
        raise ValueError(
            f"{quoted(value)} is not a repository URI (scheme:address without spaces, quotes, brackets or #, "
            'e.g. "https://example.com/debian" or "file:/srv/repo")'
        )
    return value


def apt_keyring(value: str) -> str:
    if not re.fullmatch(r"/" + _APT_WORD.replace("#", "#,"), value):
        raise ValueError(
            f"{quoted(value)} is not a keyring path for apt "
            "(an absolute path without spaces, quotes, brackets, commas or #)"
        )
    return value


# `[server] host`, as vLLM (--host) and HAProxy (`bind HOST:PORT`) read it: an address or a DNS name,
# nothing else. HAProxy reads more in that word: `unix@PATH` and `abns@NAME` (a socket, at a path no
# role judges), `fd@N`, a comma (a second address), a blank (an option).
HOST_RULE = 'an IP address or a DNS name, e.g. "127.0.0.1", "0.0.0.0", "::1" or "gpu1.example.com"'
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?!.{{254}}){_LABEL}(?:\.{_LABEL})*\.?")
_ZONE = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # an IPv6 address's %zone: an interface's name


def host(value: str) -> str:
    """`value`, an address or a DNS name; "" (every address, as vLLM reads it) too."""
    from ipaddress import ip_address

    if value == "":
        return value
    address, percent, zone = value.partition("%")
    try:
        ip_address(address)
        is_address = not percent or _ZONE.fullmatch(zone) is not None
    except ValueError:
        is_address = False
    if not is_address and not _DNS_NAME.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a host ({HOST_RULE})")
    return value


# One word of HAProxy's config (a path written in it): a blank starts the next word (another option),
# # a comment, quotes and \ are its quoting, $ its variables, a control character another line.
HAPROXY_WORD = "a path without blanks, quotes, #, \\, $ or control characters"
_HAPROXY_WORD = re.compile(r'[^\s\x00-\x1f\x7f-\x9f\u2028\u2029#\'"\\$]+')


def haproxy_word_problem(what: str, value: str) -> str | None:
    """Why `value` cannot be written as one word of HAProxy's config; None when it can."""
    if _HAPROXY_WORD.fullmatch(value):
        return None
    return f"{quoted(value)} cannot be written in HAProxy's config as {what} ({HAPROXY_WORD})"


# What a specifier may hold besides its operators: a version's own characters (PEP 440's, and `*`).
# PEP 440's arbitrary equality (`===`) takes any string without blanks, `;` or `)`, and pip reads a
# requirement holding `/` as a path from its working directory: `ninja===1/../var/tmp/x/y.whl` installed
# that file, which no path role judged (seventeenth round).
_SPECIFIER_CHARS = re.compile(r"[A-Za-z0-9.*+!_\-<>=~, ]*\Z")


def specifier(value: str) -> str:
    if value.strip() in ("*", ""):
        return "*"
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        if not _SPECIFIER_CHARS.match(value):
            raise InvalidSpecifier(value)
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(
            f'{quoted(value)} is not a version specifier ("*", "==0.26.0", ">=0.26.0rc1", "~=1.11")'
        ) from None
    return value


def package_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        raise ValueError(f"{quoted(value)} is not a package name (letters, digits, '.', '_', '-')")
    return value


def locked_line(value: str) -> str:
    if not re.fullmatch(LOCKED, value):
        raise ValueError(
            f"{quoted(value)} is not a locked distribution (name==version --hash=sha256:<64 hex>): "
            "run `reconcile lock` to write the lock again"
        )
    return value


def apt_name(value: str) -> str:
    name, _, version = value.partition("=")
    if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", name):
        raise ValueError(
            f'{quoted(value)} is not an apt package (a lowercase name, optionally "name=version")'
        )
    if "=" in value and not re.fullmatch(r"[A-Za-z0-9.+~:-]+", version):
        raise ValueError(f'{quoted(value)} has a bad version after "=" (digits, letters, ".+~:-")')
    return value


def flag_names(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if key.startswith("-"):
            message = "write the flag without its leading dashes ({name} = ...)"
            raise PydanticCustomError("spec", message, {"at": (key,), "name": key.lstrip("-")})
        if not re.fullmatch(FLAG_NAME, key):
            # `"download-dir=/x" = true` renders as `--download-dir=/x`: a value in the name, where the
            # value role (reconcile.spec.roles) never looks, and argparse takes it as the flag's value.
            message = (
                "a flag's name is letters, digits, '.', '_' and '-'; its value goes on the right "
                "({name} = ...)"
            )
            raise PydanticCustomError("spec", message, {"at": (key,), "name": re.split(r"[=\s]", key)[0]})
    return value


FLAG_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


def flag_values(value: dict[str, Any]) -> dict[str, Any]:
    """Each text a flag's value renders as one argv token (a list: one per element), which vLLM's argparse
    reads as a flag of its own when it starts with '-' and is not a number: `lora-modules = ["a=/x",
    "--hf-token", "S"]` ends the list there and sets --hf-token, past every rule that judges a flag by its
    key (the secret rule, trust-remote-code's; fourteenth round)."""
    for key, v in value.items():
        for text in v if isinstance(v, list) else [v]:
            if isinstance(text, str) and text.startswith("-") and not _is_number(text):
                message = (
                    "{text} starts with '-': vLLM reads it as a flag of its own, not as this flag's value; "
                    "write each flag as its own key ({name} = ...)"
                )
                name = re.split(r"[=\s]", text.lstrip("-"))[0] or "flag"
                raise PydanticCustomError("spec", message, {"at": (key,), "text": quoted(text), "name": name})
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
