"""Pure parsers for the files reconcile generates, read the way their consumers read them.

Used by tests/test_generated_files.py (hostile specs) and tests/test_generated_fuzz.py (hypothesis) to
find which keys, words and entries a generated file really holds. Each follows its consumer's source:
systemd 252 (src/shared/conf-parser.c, extract-word.c, env-file.c), cronie (entry.c, do_command.c),
apt 2.6 (apt-pkg/sourcelist.cc, deb/debmetaindex.cc).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WHITESPACE = " \t\n\r"
_EOL = re.compile(r"\r\n|\r|\n|\x00")  # systemd's read_line() ends a line at any of these


class Malformed(Exception):
    """The consumer would reject the file (or this line of it)."""


# -- systemd unit files ---------------------------------------------------------------------------


def unit_settings(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, as systemd's config parser sees them."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in _EOL.split(text):
        line = raw.strip(WHITESPACE)
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):  # continuation: the backslash becomes a space, the next line joins
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("["):
            if not line.endswith("]"):
                raise Malformed(f"bad section header {line!r}")
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise Malformed(f"not an assignment: {line!r}")
        out.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE)))
    if pending:
        out.append((section, "(continuation)", pending))
    return out


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}
_C_ESCAPES.update({"\\": "\\", '"': '"', "'": "'"})


def _cunescape(s: str, i: int) -> tuple[str, int]:
    """One C escape at s[i] (just after the backslash) -> (character, next index)."""
    if i >= len(s):
        raise Malformed("a backslash at the end")
    c = s[i]
    if c in _C_ESCAPES:
        return _C_ESCAPES[c], i + 1
    if c == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", s[i + 1 : i + 3]):
        code = int(s[i + 1 : i + 3], 16)
        if code == 0:
            raise Malformed("\\x00")
        return chr(code), i + 3
    if c in "uU":
        n = 4 if c == "u" else 8
        if re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", s[i + 1 : i + 1 + n]):
            return chr(int(s[i + 1 : i + 1 + n], 16)), i + 1 + n
    if re.fullmatch(r"[0-7]{3}", s[i : i + 3]):
        return chr(int(s[i : i + 3], 8)), i + 3
    raise Malformed(f"bad escape \\{c}")


def exec_argv(value: str) -> list[str]:
    """An ExecStart= value -> the argv systemd runs: words unquoted and C-unescaped, then % specifiers
    resolved per word, then $ variables at exec time. A specifier or variable that would expand is kept
    as the marker <%x> / <$NAME>, so that a comparison with the intended argv fails."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            break
        if value[i] == ";" and (i + 1 == n or value[i + 1] in WHITESPACE):
            raise Malformed("a ; separates a second command")
        word, quote = "", None
        while i < n:
            c = value[i]
            if quote is None and c in WHITESPACE:
                break
            if quote is None and c in "\"'":
                quote, i = c, i + 1
                continue
            if quote is not None and c == quote:
                quote, i = None, i + 1
                continue
            if c == "\\":
                ch, i = _cunescape(value, i + 1)
                word += ch
                continue
            word += c
            i += 1
        if quote is not None:
            raise Malformed("unterminated quote")
        words.append(word)
    if words and words[0][:1] in ("-", "@", ":", "+", "!"):
        raise Malformed(f"{words[0]!r}: a prefix, not a program")
    return [_dollars(_percents(w)) for w in words]


def _percents(word: str) -> str:
    return re.sub(r"%(.?)", lambda m: "%" if m.group(1) == "%" else f"<%{m.group(1)}>", word)


def _dollars(word: str) -> str:
    return re.sub(
        r"\$(\$|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)",
        lambda m: "$" if m.group(1) == "$" else f"<${m.group(1)}>",
        word,
    )


def setting_value(value: str) -> str:
    """A plain setting's value after specifier expansion (unknown ones kept as markers)."""
    return _percents(value)


# -- EnvironmentFile ------------------------------------------------------------------------------


def environment_file(text: str) -> list[tuple[str, str]]:
    """(key, value) pairs in order, as systemd's parse_env_file() reads them (a state machine)."""
    out: list[tuple[str, str]] = []
    state, key, value = "PRE_KEY", "", ""
    key_ws = value_ws = -1  # where trailing whitespace starts (-1: none)

    def push() -> None:
        k = key[:key_ws] if key_ws >= 0 else key
        v = value[:value_ws] if value_ws >= 0 and state == "VALUE" else value
        out.append((k, v))

    for c in text:
        if state == "PRE_KEY":
            if c in "#;":
                state = "COMMENT"
            elif c not in WHITESPACE:
                state, key, key_ws = "KEY", c, -1
        elif state == "KEY":
            if c in "\n\r":
                state = "PRE_KEY"  # a key without = is dropped
            elif c == "=":
                state, value, value_ws = "PRE_VALUE", "", -1
            else:
                if c not in WHITESPACE:
                    key_ws = -1
                elif key_ws < 0:
                    key_ws = len(key)
                key += c
        elif state == "PRE_VALUE":
            if c in "\n\r":
                push()
                state = "PRE_KEY"
            elif c == "'":
                state = "SINGLE"
            elif c == '"':
                state = "DOUBLE"
            elif c == "\\":
                state = "VALUE_ESCAPE"
            elif c not in WHITESPACE:
                state, value = "VALUE", value + c
        elif state == "VALUE":
            if c in "\n\r":
                push()
                state = "PRE_KEY"
            elif c == "\\":
                state, value_ws = "VALUE_ESCAPE", -1
            else:
                if c not in WHITESPACE:
                    value_ws = -1
                elif value_ws < 0:
                    value_ws = len(value)
                value += c
        elif state == "VALUE_ESCAPE":
            state = "VALUE"
            if c not in "\n\r":
                value += c
        elif state == "SINGLE":
            if c == "'":
                state = "PRE_VALUE"
            else:
                value += c
        elif state == "DOUBLE":
            if c == '"':
                state = "PRE_VALUE"
            elif c == "\\":
                state = "DOUBLE_ESCAPE"
            else:
                value += c
        elif state == "DOUBLE_ESCAPE":
            state = "DOUBLE"
            if c in '"\\`$':
                value += c
            elif c != "\n":
                value += "\\" + c
        elif state == "COMMENT":
            if c == "\\":
                state = "COMMENT_ESCAPE"
            elif c in "\n\r":
                state = "PRE_KEY"
        elif state == "COMMENT_ESCAPE":
            state = "COMMENT"
    if state in ("PRE_VALUE", "VALUE", "VALUE_ESCAPE", "SINGLE", "DOUBLE", "DOUBLE_ESCAPE"):
        push()
    return out


# -- cron ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CronFile:
    env: list[tuple[str, str]]
    jobs: list[tuple[str, str, str]]  # (schedule, user, command as the shell gets it)


_CRON_ENV = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")


def cron_file(text: str) -> CronFile:
    """An /etc/cron.d file: environment lines and jobs (five fields, a user, the command)."""
    env: list[tuple[str, str]] = []
    jobs: list[tuple[str, str, str]] = []
    for line in re.split(r"\r\n|\r|\n", text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _CRON_ENV.match(line)
        if m and not line.lstrip()[:1].isdigit() and not line.lstrip().startswith(("*", "@")):
            env.append((m.group(1), m.group(2)))
            continue
        fields = line.split(None, 6)
        if len(fields) < 7:
            raise Malformed(f"not a job line: {line!r}")
        jobs.append((" ".join(fields[:5]), fields[5], cron_command(fields[6])))
    return CronFile(env, jobs)


def cron_command(text: str) -> str:
    """What cron hands the shell: `\\%` is a %, the first unescaped % ends the command (the rest is stdin)."""
    out, escaped = "", False
    for ch in text:
        if escaped:
            out = out[:-1] + "%" if ch == "%" else out + ch
            escaped = False
            continue
        if ch == "\\":
            escaped = True
            out += ch
            continue
        if ch == "%":
            return out + "<stdin follows>"
        out += ch
    return out


# -- apt one-line sources ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AptEntry:
    kind: str
    options: dict[str, str]
    uri: str
    suite: str
    components: list[str]


def apt_sources(text: str) -> list[AptEntry]:
    """A one-line .list file as apt reads it: `#` starts a comment anywhere, [options] after the type."""
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        rest = rest.strip()
        options: dict[str, str] = {}
        if rest.startswith("["):
            inside, close, rest = rest[1:].partition("]")
            if not close:
                raise Malformed(f"unterminated [options] in {line!r}")
            for opt in inside.split():
                name, eq, val = opt.partition("=")
                if not eq:
                    raise Malformed(f"option without a value: {opt!r}")
                options[name] = val
        words = rest.split()
        if len(words) < 2 or any(c in w for w in words for c in '"[]'):
            raise Malformed(f"bad entry {line!r}")
        if words[1].endswith("/") and len(words) > 2:
            raise Malformed(f"a flat suite with components: {line!r}")
        entries.append(AptEntry(kind, options, words[0], words[1], words[2:]))
    return entries
