"""The server's HTTP answers: /health, /version, /v1/models (with the key), and `reconcile check`'s chat.

Read only. probe() is called by reconcile.plan.prober, chat_check() by the CLI's check command. The API key
is read from its file for the requests, never kept in a result, and sent only once every listener on
the port (or a color's Unix socket) is found to be the deployment's (reconcile.ownership.sockets.key_guard).
"""

from __future__ import annotations

import json
import time

from reconcile.host import HttpResponse, HttpUnreachable, http_request
from reconcile.identity import endpoint, endpoint_text, serving_spec
from reconcile.ownership.sockets import ForeignListener
from reconcile.record import Record
from reconcile.safety.display import shown
from reconcile.safety.untrusted import KEY_LIMIT, load_json, read_regular
from reconcile.vllm.versions import numbers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Literal

    from reconcile.spec.models import Spec


class ModelCard(Record):
    id: str
    root: str | None
    max_model_len: int | None


class HealthObservation(Record):
    """`not_listening`: the port refuses (stopped, or still loading the model)."""

    url: str
    state: Literal["healthy", "unhealthy", "not_listening"]
    health_status: int | None = None
    version: str | None = None
    models_status: int | None = None  # 401: the key was refused (or none was sent)
    models: tuple[ModelCard, ...] = ()
    error: str | None = None
    foreign_listener: str | None = None  # who holds the port when it is not ours: the key was not sent

    @property
    def served_names(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.models)

    @property
    def max_model_len(self) -> int | None:
        return self.models[0].max_model_len if self.models else None


class CheckStep(Record):
    name: str  # "chat", "reasoning", "tool_call"
    ok: bool
    message: str


class CheckResult(Record):
    ok: bool
    steps: tuple[CheckStep, ...]
    seconds: float


def _headers(spec: Spec) -> dict[str, str]:
    if spec.api_key is None:
        return {}
    try:  # as data: a FIFO at the key's path is never waited on (the api_key row names it)
        key = read_regular(spec.api_key.file, KEY_LIMIT).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return {}
    return {"Authorization": f"Bearer {key}"} if key else {}


def _guard(spec: Spec) -> Callable[[], None]:
    """Run after the connect, before the keyed request is sent: refuses unless the listener is the
    deployment's own (a local user listening there would otherwise get the key)."""
    from reconcile.ownership.sockets import key_guard

    return key_guard(spec)


def _json(resp: HttpResponse) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def probe(spec: Spec) -> HealthObservation:
    spec = serving_spec(spec)  # behind [front]: the active color's own socket
    host, port = endpoint(spec)
    url, timeout = f"http://{endpoint_text(spec)}", spec.health.timeout
    try:
        health = http_request("GET", host, port, "/health", timeout=timeout)
    except HttpUnreachable as exc:
        return HealthObservation(url, "not_listening", error=str(exc))
    state: Literal["healthy", "unhealthy"] = "healthy" if health.status == 200 else "unhealthy"
    version: str | None = None
    try:
        body = _json(http_request("GET", host, port, "/version", timeout=timeout))
        found = body.get("version") if isinstance(body, dict) else None
        version = shown(found) if isinstance(found, str) else None
        # keyed or not: the models a listener that is not the deployment's names are not the server's
        models = http_request(
            "GET", host, port, "/v1/models", headers=_headers(spec), timeout=timeout, before_send=_guard(spec)
        )
    except ForeignListener as exc:
        return HealthObservation(
            url, state, health.status, version, error=str(exc), foreign_listener=exc.holder
        )
    except HttpUnreachable as exc:
        return HealthObservation(url, state, health.status, version, error=str(exc))
    cards: list[ModelCard] = []
    error = None
    data = _json(models)
    if models.status == 200 and isinstance(data, dict) and isinstance(data.get("data"), list):
        for card in data["data"]:
            if isinstance(card, dict) and isinstance(card.get("id"), str):
                mml, root = card.get("max_model_len"), card.get("root")
                cards.append(
                    ModelCard(
                        shown(card["id"]),
                        shown(root) if isinstance(root, str) else None,
                        mml if isinstance(mml, int) else None,
                    )
                )
    elif models.status == 401:
        error = "/v1/models answered 401: the server refused the key" + (
            "" if spec.api_key else " (the spec has no [api_key])"
        )
    else:
        error = f"/v1/models answered {models.status}: {shown(models.body[:200].decode(errors='replace'))}"
    return HealthObservation(url, state, health.status, version, models.status, tuple(cards), error)


def reasoning_field(version: str | None) -> str:
    """Where vLLM puts the reasoning text: `reasoning_content` up to 0.11.0, `reasoning` from 0.11.1."""
    v = numbers(version)[:3]
    return "reasoning_content" if len(v) >= 2 and v <= (0, 11, 0) else "reasoning"


_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City name"}},
            "required": ["location"],
        },
    },
}


def answer(status: int, body: bytes, limit: int = 300) -> str:
    """The server's answer as `reconcile check` shows it when a step fails: HTTP status and the body,
    trimmed to one line (an empty error message is shown as such, not hidden)."""
    text = shown(body.decode("utf-8", errors="replace").strip().replace("\n", " "), limit)
    return f"HTTP {status}: {text or '(empty body)'}"


def _chat(spec: Spec, body: dict[str, Any], timeout: float) -> tuple[int, Any, str]:
    host, port = endpoint(spec)
    keyed = _headers(spec)
    resp = http_request(
        "POST",
        host,
        port,
        "/v1/chat/completions",
        headers={**keyed, "Content-Type": "application/json"},
        body=json.dumps(body).encode(),
        timeout=timeout,
        # keyed or not: an answer from a listener that is not the deployment's vouches for nothing
        before_send=_guard(spec),
    )
    return resp.status, _json(resp), answer(resp.status, resp.body)


def _message(data: Any) -> dict[str, Any]:
    try:
        message = data["choices"][0]["message"]
        return message if isinstance(message, dict) else {}
    except (KeyError, IndexError, TypeError):
        return {}


# New tokens a chat is given. Without a reasoning parser the first tokens are the answer: 16 show that
# the template renders and the model generates, and a model that never stops early (the lab's random
# weights) is not made to write 512, which took most of a rollback's own time on the H200 (issue 26).
# With one, the answer comes after the reasoning: room for both.
# A forced tool call's JSON takes more than 16 (about 30 tokens for get_weather(location) in Hermes'
# format); cut by max_tokens it is no tool call at all, and the acceptance check rolled every tool
# deployment back (seen on the H200 lab after issue 26 gave the tool step the chat's 16).
ANSWER_TOKENS, REASONING_TOKENS, TOOL_TOKENS = 16, 512, 256


def _room(wanted: int, limit: int | None) -> int:
    """New tokens to ask for: `wanted`, leaving half of the smallest served context to the prompt (a
    512-token context cannot take 512 new tokens: seen on vLLM 0.26, "This model's maximum context
    length is 512 tokens")."""
    return wanted if limit is None else max(16, min(wanted, limit // 2))


def chat_check(spec: Spec, *, timeout: float | None = None) -> CheckResult:
    """One chat completion; its reasoning text when a reasoning parser is set; a forced tool call when
    the server enables auto tool choice."""
    spec = serving_spec(spec)
    server = spec.server
    if server is None:
        raise ValueError("the spec has no [server]")
    started = time.monotonic()
    timeout = timeout or max(spec.health.timeout, 120.0)
    model = server.served_model_name or server.model or (spec.model.dir if spec.model else "")
    steps: list[CheckStep] = []
    if spec.api_key is not None and not _headers(spec):  # a server that takes any key is not this one
        why = f"cannot verify the server: no key in {spec.api_key.file} (apply makes it); nothing was sent"
        return CheckResult(False, (CheckStep("key", False, why),), time.monotonic() - started)
    try:
        seen = probe(spec)
        version = seen.version
        limit = min((c.max_model_len for c in seen.models if c.max_model_len), default=None)
        budget = _room(REASONING_TOKENS if server.args.get("reasoning-parser") else ANSWER_TOKENS, limit)
        status, data, raw = _chat(
            spec,
            {
                "model": model,
                "messages": [{"role": "user", "content": spec.health.smoke_prompt}],
                "max_tokens": budget,
                "temperature": 0,
            },
            timeout,
        )
        message = _message(data)
        content = message.get("content")
        answer = content.strip() if isinstance(content, str) else ""
        if status == 200 and answer:
            steps.append(CheckStep("chat", True, f"answered: {shown(answer, 120)}"))
        else:
            steps.append(CheckStep("chat", False, raw if status != 200 else f"no answer text; {raw}"))
        if server.args.get("reasoning-parser"):
            field = reasoning_field(version)
            text = message.get(field)
            good = isinstance(text, str) and bool(text.strip())
            steps.append(
                CheckStep(
                    "reasoning",
                    good,
                    f"message.{field} "
                    + (
                        f"holds {len(text)} characters"
                        if good and isinstance(text, str)
                        else "is empty: is the reasoning parser (and its plugin) loaded?"
                    ),
                )
            )
        if server.args.get("enable-auto-tool-choice") is True:
            steps.append(_tool_step(spec, model, timeout, _room(TOOL_TOKENS, limit)))
    except ForeignListener as exc:
        steps.append(CheckStep("chat", False, f"cannot verify the server: {exc}"))
    except HttpUnreachable as exc:
        steps.append(CheckStep("chat", False, str(exc)))
    return CheckResult(all(s.ok for s in steps), tuple(steps), time.monotonic() - started)


def _tool_step(spec: Spec, model: str, timeout: float, max_tokens: int = 256) -> CheckStep:
    status, data, raw = _chat(
        spec,
        {
            "model": model,
            "messages": [{"role": "user", "content": "What is the weather in Tokyo?"}],
            "tools": [_WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout,
    )
    calls = _message(data).get("tool_calls") or []
    try:
        fn = calls[0]["function"]
        arguments = load_json(fn["arguments"])
    except (IndexError, KeyError, TypeError, ValueError):
        if status != 200:  # the server's own answer says more than "no tool call" would
            return CheckStep("tool_call", False, raw)
        return CheckStep("tool_call", False, f"no tool call with JSON arguments in the answer; {raw}")
    if fn.get("name") != "get_weather" or not isinstance(arguments, dict):
        called = shown(f"{fn.get('name')}({fn.get('arguments')})", 300)
        return CheckStep("tool_call", False, f"unexpected tool call {called}")
    return CheckStep("tool_call", True, f"get_weather({shown(json.dumps(arguments), 300)})")
