"""Which values are secret, and how they are shown and kept: `(sensitive)` on screen, a hash at rest.

Pure and cheap to import. Used by the identity (launch records), the launcher (server env), the venv
installer (index credentials), the generation writer and the commands that show generations.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SENSITIVE = "(sensitive)"
# A word of the name (split at anything not a letter or digit): HF_TOKEN, AWS_SECRET_ACCESS_KEY,
# VLLM_API_KEY, DB_PASSWORD; not TOKENIZERS_PARALLELISM nor MONKEY (whole words only).
_SECRET_WORDS = frozenset(
    {"TOKEN", "TOKENS", "KEY", "KEYS", "APIKEY", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD"}
    | {"CREDENTIAL", "CREDENTIALS"}
)
_WORD = re.compile(r"[^A-Za-z0-9]+")
# Where a camelCase or PascalCase name starts a word: accessToken, APIKey, hfToken (thirteenth round).
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# scheme://userinfo@ — the userinfo of a URL is a credential (pip's and uv's index URLs).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@")
# Where a spec document holds values that are secret by position (see secret_paths).
PLACEHOLDER_PREFIX = "(sensitive sha256:"


def is_secret_name(name: str, marked: Collection[str] = ()) -> bool:
    """True when the env name says it holds a secret (a word TOKEN, KEY, SECRET, PASSWORD,
    CREDENTIAL, any case) or the spec marks it (`[server] secret_env`, `secret_files`)."""
    return name in marked or any(word.upper() in _SECRET_WORDS for word in _words(name))


def _words(name: str) -> list[str]:
    """The words of a name as it is written: snake_case, kebab-case, dotted, camelCase alike."""
    return [w for part in _WORD.split(name) for w in _CAMEL.split(part) if w]


# A flag, or a key inside a flag's JSON value, named for one secret: its last word is a secret word in
# the singular (--api-key, --hf-token, {"api_key": ...}). --max-num-batched-tokens counts tokens and
# --allow-credentials is a switch: neither holds one.
_ONE_SECRET = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"})


# vLLM's flags that take a secret: every flag of reconcile/data/vllm_flags.json that is_secret_flag
# names (tests/test_hostile_reader13.py keeps the two in step). vLLM's argparse reads `_` as `-` and any
# prefix of a long flag as the flag (`--hf-tok` is --hf-token; one that two flags share is refused, after
# the process has shown it): a prefix of one of these names it too.
VLLM_SECRET_FLAGS = ("api-key", "hf-token")


def is_secret_flag(name: str) -> bool:
    words = _words(name)
    return bool(words) and words[-1].upper() in _ONE_SECRET


def is_secret_option(flag: str) -> bool:
    """Whether vLLM's command-line flag `flag` (without its dashes) takes a secret: named for one
    (is_secret_flag), or as vLLM's argparse reads it, a prefix of one that does (VLLM_SECRET_FLAGS)."""
    canonical = flag.replace("_", "-")
    return is_secret_flag(flag) or (
        bool(canonical) and any(f.startswith(canonical) for f in VLLM_SECRET_FLAGS)
    )


def secret_args(args: Mapping[str, object]) -> list[tuple[str, ...]]:
    """Where a server's `args` hold a secret, which on vLLM's command line every local user would read
    (/proc/PID/cmdline): any value but true/false of a flag that takes one (is_secret_option) or of a
    key named for one inside a value (is_secret_flag: `api_key`, `accessToken`), a table written as
    JSON text included (vLLM parses it the same), a URL's user:password anywhere. Each as its path of
    keys, outermost first."""
    return [p for flag, value in args.items() for p in _secrets_in(value, (flag,), is_secret_option(flag))]


def json_holds_secret(text: str) -> bool:
    """Whether `text`, a JSON flag's value on a command line, holds a key named for a secret."""
    inner = _json_text(text)
    return inner is not None and bool(_secrets_in(inner, (), secret=False))


# How deep a value is searched for a secret: the bound untrusted.JSON_DEPTH_MAX puts on JSON from outside
# (this layer may not import it). A value nested deeper (a foreign command line's `[[[[...`, a fleet
# repository's spec under review) counts as holding one: refused, or hidden, never a RecursionError.
_DEPTH_MAX = 64


def _secrets_in(value: object, path: tuple[str, ...], secret: bool, depth: int = 0) -> list[tuple[str, ...]]:
    if depth > _DEPTH_MAX:
        return [path]
    if isinstance(value, str) and (inner := _json_text(value)) is not None:
        return _secrets_in(inner, path, secret, depth)
    if secret and value is not None and not isinstance(value, bool):
        return [path]
    if isinstance(value, str) and has_credentials(value):
        return [path]
    if isinstance(value, Mapping):
        return [
            p
            for k, v in value.items()
            for p in _secrets_in(v, (*path, str(k)), is_secret_flag(str(k)), depth + 1)
        ]
    if isinstance(value, list):
        return [p for v in value for p in _secrets_in(v, path, secret, depth + 1)]
    return []


def _json_text(value: str) -> object | None:
    """A JSON object or array written as text (vLLM's JSON flags parse it), else None."""
    if not value.lstrip().startswith(("{", "[")):
        return None
    try:
        parsed: object = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, (dict, list)) else None


def digest(value: str) -> str:
    """The hash a secret is kept as: enough to tell a rotation, useless to recover a random token."""
    return hashlib.sha256(b"reconcile-sensitive\0" + value.encode()).hexdigest()[:16]


def has_credentials(url: str) -> bool:
    return _USERINFO.search(url) is not None


def redact_url(url: str) -> str:
    """`https://user:token@host/simple` -> `https://(sensitive)@host/simple`; others unchanged."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{SENSITIVE}@", url)


def redact_text(text: str, values: Iterable[str] = ()) -> str:
    """`text` with every given secret value and every URL's credentials replaced by (sensitive)."""
    for value in sorted((v for v in values if v), key=len, reverse=True):
        text = text.replace(value, SENSITIVE)
    return redact_url(text)


# --- secrets inside a spec document (the resolved TOML as a dict) ---------------------------


def secret_paths(doc: Mapping[str, Any]) -> dict[tuple[str | int, ...], str]:
    """Every secret value a spec document holds inline, by its path: `[server] env` values whose
    name is secret (or listed in `secret_env`), and any value holding a URL's user:password (an index,
    a proxy or a hub endpoint in `[server] env`, an apt repository: fourteenth round)."""
    found: dict[tuple[str | int, ...], str] = {}
    server = doc.get("server")
    if isinstance(server, Mapping):
        env, marked = server.get("env"), server.get("secret_env") or ()
        if isinstance(env, Mapping):
            for name, value in env.items():
                if isinstance(value, str) and is_secret_name(str(name), marked):
                    found[("server", "env", str(name))] = value
    for path, value in _leaves(doc):
        if isinstance(value, str) and has_credentials(value):
            found[path] = value
    return found


def placeholder(value: str) -> str:
    """What a generation keeps instead of a secret: its hash, marked, and for a URL its public part."""
    shown = redact_url(value) if has_credentials(value) else ""
    return f"{PLACEHOLDER_PREFIX}{digest(value)})" + (f" {shown}" if shown else "")


def redact_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `doc` with every value of secret_paths() replaced by its placeholder()."""
    out: dict[str, Any] = json.loads(json.dumps(doc, default=str))
    for path, value in secret_paths(doc).items():
        _set(out, path, placeholder(value))
    return out


def redact_spec_text(text: str, doc: Mapping[str, Any]) -> str:
    """The spec file's text with the secrets of `doc` (its resolved document) replaced, as TOML
    strings, by their placeholders. If a secret is still there (written with escapes), the text is
    withheld rather than kept."""
    secrets = secret_paths(doc)
    for value in sorted(secrets.values(), key=len, reverse=True):
        for quoted in (json.dumps(value), f"'{value}'", f"'''{value}'''", f'"""{value}"""'):
            text = text.replace(quoted, json.dumps(placeholder(value)))
    if any(v in text or json.dumps(v)[1:-1] in text for v in secrets.values()):
        return "# (spec text withheld: it holds a sensitive value written with escapes)\n"
    return text


def is_placeholder(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX)


def restore_document(
    redacted: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Put secrets back into a generation's document for a rollback, from the current spec.

    A generation keeps only hashes, so each secret comes from the same place in `current` (the
    spec as it is now). Returns the document and one note per secret that is not the value the
    generation had (rotated since); raises ValueError naming a secret the current spec lacks."""
    out: dict[str, Any] = json.loads(json.dumps(redacted))
    notes: list[str] = []
    for path, value in _placeholders(out):
        now = _get(current, path)
        where = _dotted(path)
        if not isinstance(now, str):
            raise ValueError(
                f"{where} is sensitive: the generation keeps only its hash and the current spec has "
                "no value there to use (add it back to the spec, then roll back)"
            )
        if placeholder(now) != value:
            notes.append(
                f"{where} {SENSITIVE}: the generation's value is kept only as a hash; using the current one"
            )
        _set(out, path, now)
    return out, notes


def _placeholders(doc: Any) -> list[tuple[tuple[str | int, ...], str]]:
    return [(path, value) for path, value in _leaves(doc) if is_placeholder(value)]


def _leaves(doc: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], Any]]:
    """Each value of a document that is not a table or a list, by its path (the spec loader bounds the
    nesting: reconcile.spec.loader)."""
    if isinstance(doc, Mapping):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))]
    return [(path, doc)]


def _get(doc: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        if isinstance(doc, Mapping) and isinstance(part, str):
            doc = doc.get(part)
        elif isinstance(doc, list) and isinstance(part, int) and part < len(doc):
            doc = doc[part]
        else:
            return None
    return doc


def _set(doc: Any, path: tuple[str | int, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")


def shown_env(env: Mapping[str, str], marked: Collection[str] = ()) -> dict[str, str]:
    """The env fit to show: secret values replaced by (sensitive), URL credentials too."""
    return {k: SENSITIVE if is_secret_name(k, marked) else redact_url(v) for k, v in env.items()}


def env_hashes(env: Mapping[str, str], marked: Collection[str] = ()) -> dict[str, str]:
    """name -> digest of each secret value (a secret name's, or a URL's with a password in it): how a
    record tells which secret was rotated."""
    return {k: digest(v) for k, v in sorted(env.items()) if is_secret_name(k, marked) or has_credentials(v)}


def redact_generation(record: Mapping[str, Any]) -> dict[str, Any]:
    """A generation record fit to keep: the spec's secrets (by secret_paths of its `spec_resolved`)
    kept as placeholders with their hash, in the document, the spec text and every other string."""
    doc = record.get("spec_resolved")
    doc = doc if isinstance(doc, Mapping) else {}
    values = list(secret_paths(doc).values())
    out = {
        k: _redact_strings(v, values) for k, v in record.items() if k not in ("spec_resolved", "spec_text")
    }
    if "spec_resolved" in record:
        out["spec_resolved"] = redact_document(doc)
    if isinstance(record.get("spec_text"), str):
        out["spec_text"] = redact_spec_text(record["spec_text"], doc)
    return {k: out[k] for k in record}  # the record's own key order


def _redact_strings(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, Mapping):
        return {k: _redact_strings(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_strings(v, secrets) for v in value]
    return value


def split_credentials(url: str) -> tuple[str, tuple[str, str, str] | None]:
    """`https://user:tok@host:8443/simple` -> (`https://host:8443/simple`, (host, user, tok)): the URL
    fit for a command line, and the netrc entry that gives pip or uv the credentials instead."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None or parts.hostname is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    user, password = unquote(parts.username), unquote(parts.password or "")
    return urlunsplit(parts._replace(netloc=netloc)), (parts.hostname, user, password)


def netrc_text(entries: Iterable[tuple[str, str, str]]) -> str:
    """A netrc file for (host, login, password) entries (values must hold no whitespace or quote)."""
    lines: list[str] = []
    seen: dict[str, tuple[str, str]] = {}
    for host, login, password in entries:
        if seen.setdefault(host, (login, password)) != (login, password):
            raise ValueError(f"two index URLs give {host} different credentials: a netrc holds one per host")
        if len(seen) == len(lines):  # the same credentials again
            continue
        if any(c.isspace() or c in "\"'#" for c in host + login + password):
            raise ValueError(
                f"index credentials for {host} hold a space, quote or '#': netrc cannot carry them"
            )
        lines.append(f"machine {host} login {login} password {password}")
    return "\n".join(lines) + "\n"
