"""A vLLM server's launch identity: one digest over every input whose change needs a restart.

Pure. actions.server stamps the digest into the server's environment (with the deployment marker)
and records the components; the planner compares them and explain_change() words the reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Collection, Mapping, Sequence

from reconcile.record import Record
from reconcile.safety.sensitive import (
    SENSITIVE,
    env_hashes,
    is_secret_option,
    json_holds_secret,
    redact_url,
    shown_env,
)
from reconcile.safety.shapes import within_last
from reconcile.safety.untrusted import load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.models import Spec

MARKER = "RECONCILE_DEPLOYMENT"  # inherited by every child: how a deployment's processes are found
IDENTITY = "RECONCILE_IDENTITY"
SECRET = SENSITIVE  # how a secret is shown everywhere
INPUTS = ("argv", "env", "packages", "model_revision", "config_json")
_WHAT = {
    "argv": "args",
    "env": "env",
    "packages": "packages",
    "model_revision": "model revision",
    "config_json": "config.json",
}
_SHOWN_MAX = 5


class Identity(Record):
    """`digest` is stamped as RECONCILE_IDENTITY; `components` holds a short hash per input plus a
    non-secret rendering (`<input>.shown`) so a plan can say exactly what changed."""

    digest: str
    components: Mapping[str, str]


def _hash(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _canonical_package(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to show: the value of a flag that takes a secret (`--api-key`, `--hf-token`,
    `--hf-tok`: sensitive.is_secret_option) replaced by (sensitive), so is a JSON value holding a key
    named for one (`{"api_key": ...}`), and a URL's user:password wherever it is."""
    out: list[str] = []
    hide = False
    for token in argv:
        option = token.startswith("--")
        if hide and not option:
            out.append(SECRET)
            continue
        flag, eq, value = token.partition("=")
        secret = option and is_secret_option(flag[2:])
        hide = secret and not eq
        if option and eq and (secret or json_holds_secret(value)):
            out.append(f"{flag}={SECRET}")
        elif not option and json_holds_secret(token):
            out.append(SECRET)
        else:
            out.append(redact_url(token))
    return out


def launch_identity(
    argv: Sequence[str],
    env: Mapping[str, str],
    secret_env_keys: Collection[str],
    packages: Mapping[str, str],
    model_revision: str | None,
    config_json: bytes | None,
) -> Identity:
    """The identity of a launch. Secret env values count in the hash but are kept only as hashes:
    `env.secrets` names them, `env.secret_hashes` holds one digest each (to tell which one rotated)."""
    try:
        config_key: bytes | None = (
            json.dumps(load_json(config_json), sort_keys=True).encode() if config_json is not None else None
        )
    except ValueError:
        config_key = config_json  # unparseable: its bytes are the identity
    pkgs = {_canonical_package(k): v for k, v in packages.items()}
    hashes = {
        "argv": _hash(json.dumps(list(argv))),
        "env": _hash(json.dumps(sorted(env.items()))),
        "packages": _hash(json.dumps(sorted(pkgs.items()))),
        "model_revision": _hash(json.dumps(model_revision)),
        "config_json": _hash(b"absent" if config_key is None else b"json:" + config_key),
    }
    secrets = sorted(k for k in env if k in secret_env_keys)
    shown = {
        "argv.shown": json.dumps(redact_argv(argv)),
        "env.shown": json.dumps(shown_env(dict(sorted(env.items())), secret_env_keys)),
        "env.secrets": json.dumps(secrets),
        "env.secret_hashes": json.dumps(env_hashes(env, secret_env_keys)),
        "packages.shown": json.dumps(dict(sorted(pkgs.items()))),
        "model_revision.shown": model_revision or "",
    }
    digest = hashlib.sha256(json.dumps([hashes[k] for k in INPUTS]).encode()).hexdigest()[:32]
    return Identity(digest=digest, components={**hashes, **shown})


def changed_inputs(old: Mapping[str, str], new: Mapping[str, str]) -> tuple[str, ...]:
    """Which of INPUTS differ (all of them when `old` holds no record)."""
    return tuple(k for k in INPUTS if old.get(k) != new.get(k))


def explain_change(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """One line for the plan: "config.json changed; args changed: --max-model-len 1024 -> 2048"."""
    if not any(k in old for k in INPUTS):
        return "no recorded launch identity"
    parts = []
    for key in changed_inputs(old, new):
        detail = _DETAIL[key](old, new) if key in _DETAIL else ""
        parts.append(f"{_WHAT[key]} changed" + (f": {detail}" if detail else ""))
    return "; ".join(parts) or "launch identity unchanged"


def _loads(components: Mapping[str, str], key: str) -> object:
    """A component's JSON: a list of strings or a map of strings to strings, as launch_identity writes
    each; anything else (a record damaged inside a string its reader's shape check passed) reads as none,
    and its detail as unknown (eighteenth round: `argv.shown` as `[1]` ended every plan and apply in an
    internal error)."""
    try:
        value = load_json(components[key])  # a state file's string: the nesting bound too
    except (KeyError, ValueError):
        return None
    items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [None]
    return value if all(isinstance(item, str) for item in items) else None


def _limit(items: list[str]) -> str:
    more = len(items) - _SHOWN_MAX
    return ", ".join(items[:_SHOWN_MAX]) + (f", and {more} more" if more > 0 else "")


def _split_argv(argv: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """([executable, "serve", model], {"--flag": [values]}); `--no-x` is filed under `--x`."""
    head: list[str] = []
    flags: dict[str, list[str]] = {}
    current: list[str] | None = None
    for token in argv:
        if token.startswith("--") or token == "-tp":
            name, eq, value = token.partition("=")
            key = "--" + name[5:] if name.startswith("--no-") else name
            current = flags.setdefault(key, [])
            current.append(name)
            if eq:
                current.append(value)
        elif current is None:
            head.append(token)
        else:
            current.append(token)
    return head, flags


def _argv_detail(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    a, b = _loads(old, "argv.shown"), _loads(new, "argv.shown")
    if not isinstance(a, list) or not isinstance(b, list):
        return ""
    (head_a, flags_a), (head_b, flags_b) = _split_argv(a), _split_argv(b)
    items = []
    for label, i in (("executable", 0), ("model", 2)):
        was, now = (head_a[i : i + 1] or [""])[0], (head_b[i : i + 1] or [""])[0]
        if was != now:
            items.append(f"{label} {was} -> {now}")
    for flag in [*flags_b, *(f for f in flags_a if f not in flags_b)]:
        x, y = flags_a.get(flag), flags_b.get(flag)
        if x == y:
            continue
        if x is None:
            items.append(" ".join(y or []) + " added")
        elif y is None:
            items.append(" ".join(x) + " removed")
        elif x[0] == y[0]:
            items.append(f"{x[0]} {' '.join(x[1:])} -> {' '.join(y[1:])}")
        else:
            items.append(f"{' '.join(x)} -> {' '.join(y)}")
    return _limit(items)


def _mapping_detail(old: Mapping[str, str], new: Mapping[str, str], key: str, sep: str) -> list[str]:
    a, b = _loads(old, key), _loads(new, key)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    items = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x == y:
            continue
        if x is None:
            items.append(f"{name}{sep}{y} added" if y != SECRET else f"{name} added")
        elif y is None:
            items.append(f"{name} removed")
        else:
            items.append(f"{name} {x} -> {y}")
    return items


def _env_detail(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    items = _mapping_detail(old, new, "env.shown", "=")
    a, b = _loads(old, "env.secret_hashes"), _loads(new, "env.secret_hashes")
    if isinstance(a, dict) and isinstance(b, dict):
        shown_a, shown_b = _loads(old, "env.shown"), _loads(new, "env.shown")
        both = (
            {k for k in set(shown_a) & set(shown_b) if shown_a[k] == shown_b[k]}
            if isinstance(shown_a, dict) and isinstance(shown_b, dict)
            else set()
        )
        # Shown alike, hashed in either record and not the same: a record from before a value was hashed
        # (787187d: a URL's password) has no hash for it (seventeenth round).
        items += [
            f"{k} {SECRET} changed" for k in sorted(both) if (k in a or k in b) and a.get(k) != b.get(k)
        ]
    if not items:  # an older record without per-secret hashes: which secret is unknown
        secrets = _loads(new, "env.secrets")
        names = ", ".join(secrets) if isinstance(secrets, list) and secrets else "a secret"
        items = [f"one of {names} {SECRET} changed"]
    return _limit(items)


def _packages_detail(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    return _limit(_mapping_detail(old, new, "packages.shown", " "))


def _revision_detail(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    a, b = old.get("model_revision.shown"), new.get("model_revision.shown")
    return f"{a or '(none)'} -> {b or '(none)'}" if a is not None and b is not None else ""


_DETAIL = {
    "argv": _argv_detail,
    "env": _env_detail,
    "packages": _packages_detail,
    "model_revision": _revision_detail,
}


def deployment_id(spec: Spec) -> str:
    """The marker's value: the server's name and the state dir, so two specs on one machine that
    use the same server name never take each other's processes for their own."""
    if spec.server is None:
        raise ValueError("the spec has no [server]")
    return marker_value(spec.server.name, spec.machine.state_dir)


def marker_value(name: str, state_dir: str) -> str:
    return f"{name}@{state_dir.rstrip('/') or '/'}"


def pidfile_path(spec: Spec) -> str:
    """Where the server's pid is kept: [server] pidfile, else <state_dir>/<name>.pid."""
    if spec.server is None:
        raise ValueError("the spec has no [server]")
    return spec.server.pidfile or f"{spec.machine.state_dir.rstrip('/')}/{spec.server.name}.pid"


def state_file_path(spec: Spec) -> str:
    """The server's record (identity components, start history): <state_dir>/server-<name>.json."""
    if spec.server is None:
        raise ValueError("the spec has no [server]")
    return f"{spec.machine.state_dir.rstrip('/')}/server-{spec.server.name}.json"


def read_record(spec: Spec) -> dict[str, Any]:
    """The server's record: identity components, log offset of the last start, start history."""
    from reconcile.safety import statefiles

    try:  # the one reader: a damaged record is moved aside, said, and reads as none
        return statefiles.read_server_record(state_file_path(spec)) or {}
    except OSError:
        return {}


def crash_loop_hold(spec: Spec, record: Mapping[str, Any], now: float | None = None) -> str | None:
    """The crash-loop guard's verdict in words when it refuses starts now (None: it allows them)."""
    if spec.server is None:
        return None
    guard = spec.server.crash_loop
    now = time.time() if now is None else now
    recent: list[Mapping[str, Any]] = []
    hangs: list[Mapping[str, Any]] = []  # engines restarted for making no progress: a good start between
    for entry in record.get("history", []):  # two hangs does not clear them (each restart starts fine)
        if entry.get("outcome") == "ok":
            recent = []
        elif entry.get("outcome") == "failed" and within_last(guard.window, entry.get("at", 0), now):
            recent.append(entry)
        elif entry.get("outcome") == "hung" and within_last(guard.window, entry.get("at", 0), now):
            hangs.append(entry)
    for seen, what in ((recent, "failed to start"), (hangs, "was restarted with its engine hung")):
        if len(seen) >= guard.max_starts:
            until = time.strftime("%H:%M:%S", time.localtime(seen[-guard.max_starts]["at"] + guard.window))
            return (
                f"server {spec.server.name} {what} {len(seen)} times within {guard.window:g}s "
                f"(last: {seen[-1].get('reason', '?')}); not starting it again before {until}"
            )
    return None


# --- A server behind [front] (HAProxy): two colors of the deployment, each a deployment of its own
# (its own name, marker, pidfile, record, cgroup) on its own Unix socket; the front routes to the
# active one, recorded in <state_dir>/front-<name>.json by the switch that made it active.
COLORS = ("blue", "green")
# Where the colors' sockets live. Not a loopback port: any local user may bind one while the color's
# server is down, and would get the clients (their keys) through root's HAProxy (round 17c). A socket
# in a directory that only root and the server's user may enter cannot be taken. Under /run, not in
# the state dir: root's 0700 state dir is closed to a systemd unit's User=, and /run's short paths
# fit sun_path (108 bytes) and HAProxy's bound whatever the state dir.
SOCKETS_DIR = "/run/reconcile"
SOCKET_NAME = "vllm.sock"


def color_socket(state_dir: str, server: str, color: str) -> str:
    """The Unix socket a color serves on (`vllm serve --uds`): <SOCKETS_DIR>/<hash>-<color>/vllm.sock,
    the hash of the deployment's marker (name@state_dir): two specs with one server name never share
    one. actions.launching makes its directory (0700, the server's user's)."""
    digest = hashlib.sha256(marker_value(server, state_dir).encode()).hexdigest()[:16]
    return f"{SOCKETS_DIR}/{digest}-{color}/{SOCKET_NAME}"


def server_socket(spec: Spec) -> str | None:
    """The Unix socket the server serves on: a color's (color_spec sets it); None: its TCP host:port."""
    found = getattr(spec.server, "uds", None)
    return found if isinstance(found, str) else None


def endpoint(spec: Spec) -> tuple[str, int]:
    """Where this machine reaches the server, as reconcile.host.http_request takes it: (its socket's
    path, 0) for a color, else (host, port) with a wildcard bind reached on loopback."""
    server = spec.server
    if server is None:
        raise ValueError("the spec has no [server]")
    uds = server_socket(spec)
    if uds is not None:
        return uds, 0
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(server.host, server.host), server.port


def endpoint_text(spec: Spec) -> str:
    """The server's address in words: `unix:<path>` or `host:port`, for output and errors."""
    where, port = endpoint(spec)
    return f"unix:{where}" if port == 0 else f"{where}:{port}"


def front_state_path(spec: Spec) -> str:
    if spec.server is None:
        raise ValueError("the spec has no [server]")
    return f"{spec.machine.state_dir.rstrip('/')}/front-{spec.server.name}.json"


def active_color(spec: Spec) -> str:
    """The color the front routes to ("blue" until a switch made "green" active)."""
    if spec.server is None:
        raise ValueError("the spec has no [server]")
    return active_color_at(spec.machine.state_dir, spec.server.name)


def other_color(color: str) -> str:
    return COLORS[1] if color == COLORS[0] else COLORS[0]


def color_spec(spec: Spec, color: str) -> Spec:
    """The spec of one color of a fronted deployment: name <name>-<color>, its own Unix socket (`uds`,
    an attribute beside the [server] fields: a spec never sets it; server_socket reads it)."""
    server = spec.server
    assert server is not None
    uds = color_socket(spec.machine.state_dir, server.name, color)
    update = {"name": f"{server.name}-{color}", "host": "127.0.0.1", "uds": uds, "pidfile": None}
    # Without [front]: a color is a plain deployment (its probes and actions need no more of it).
    return spec.model_copy(update={"server": server.model_copy(update=update), "front": None})


def serving_spec(spec: Spec) -> Spec:
    """The spec the server's probes and actions work on: itself, or with [front] its active color's."""
    if getattr(spec, "front", None) is None or spec.server is None:
        return spec
    return color_spec(spec, active_color(spec))


def front_paths(spec: Spec) -> tuple[str, str, str]:
    """(config, pidfile, runtime socket) of the deployment's HAProxy, in the 0700 state dir; behind the
    machine's one HAProxy (several deployments), <machine state_dir>/front.*."""
    from reconcile.spec.fronting import shared_front

    shared = shared_front(spec)
    if shared is not None:
        base = f"{shared.state_dir.rstrip('/')}/front"
    else:
        base = front_state_path(spec)[: -len(".json")]
    return f"{base}.cfg", f"{base}.pid", f"{base}.sock"


def machine_dir(spec: Spec) -> str | None:
    """The machine's state dir of a deployment view (<machine>/deployments/<name>, see
    reconcile.spec.deployments.state_dir_of); None for a state dir not laid out so."""
    import os.path

    here = spec.machine.state_dir.rstrip("/")
    parent = os.path.dirname(here)
    return os.path.dirname(parent) if os.path.basename(parent) == "deployments" else None


def as_fronted(spec: Spec, machine: str | None = None) -> Spec:
    """The front-less spec with apt's haproxy as its [front] (only what finding and stopping it read);
    `machine`: behind the machine's one HAProxy in that state dir."""
    from reconcile.spec.fronting import DEFAULT_HAPROXY, FrontView, SharedFront
    from reconcile.spec.view import SpecView

    if machine is not None:
        assert spec.server is not None
        shared = SharedFront(machine, (), ())
        view = FrontView(
            DEFAULT_HAPROXY, [], "never", spec.machine.state_dir.rstrip("/").rsplit("/", 1)[-1], shared
        )
        return spec.model_copy(update={"front": view})
    front = SpecView({"haproxy": DEFAULT_HAPROXY, "ports": [], "blue_green": "never"})
    return spec.model_copy(update={"front": front})


def serves_in(was: Spec) -> bool:
    """Whether the machine's HAProxy config still has the deployment's frontend."""
    from reconcile.safety import statefiles

    assert was.server is not None
    config, _pidfile, _sock = front_paths(was)
    try:
        raw = statefiles.read_state(config, max_bytes=65536) or b""
    except OSError:
        return False
    return f"\nfrontend {was.server.name}\n".encode() in raw


def front_joined(state_dir: str, server: str) -> bool:
    """Whether a deployment's own front step ran (its front-<server>.json is there): before, another
    deployment's step leaves it out of the shared config (its server from before [front] may still
    hold its public port until its own apply moves it)."""
    from reconcile.errors import ReconcileError
    from reconcile.safety import statefiles

    try:
        path = f"{state_dir.rstrip('/')}/front-{server}.json"
        return statefiles.read_state(path, max_bytes=4096) is not None
    except (OSError, ReconcileError):  # not a regular file: not one our front step wrote
        return False


def active_color_at(state_dir: str, server: str) -> str:
    """Another fronted deployment's active color, from its own state dir."""
    from reconcile.safety import statefiles
    from reconcile.safety.shapes import Obj, Scalar

    path = f"{state_dir.rstrip('/')}/front-{server}.json"
    try:
        data, _aside = statefiles.read_json(
            path, Obj({"active": Scalar("string")}, required=("active",)), max_bytes=4096
        )
    except OSError:
        return COLORS[0]
    active = data.get("active") if isinstance(data, dict) else None
    return active if active in COLORS else COLORS[0]
