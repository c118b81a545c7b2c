"""The generated-file writers fuzzed with hostile strings (hypothesis, 10,000 cases per format): each case
is refused with a clear error or parsed back (tests/generated_parsers.py) to exactly the intended keys,
words and entries. A case that gives the consumer one key, word or entry more than intended fails."""

from __future__ import annotations

import os
import shlex
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actions import apt, systemd_unit
from actions.launching import LaunchCommand
from reconcile.errors import ReconcileError
from reconcile.identity import Identity
from reconcile.spec.models import Spec
from reconcile.unattended import timer as scheduling
from tests import generated_parsers as parse
from tests.test_generated_files import hostile_repo, service_keys

CASES = int(os.environ.get("RECONCILE_FUZZ_CASES", "10000"))
BATCH = 10
# What the formats treat specially (a plain letter and a non-ASCII one among them); half the strings also
# draw control characters and line separators.
PRINTABLE = list(" \"'\\%$`;#[]=,{}*/-~@:+!aZ0_.é")
CONTROLS = list("\t\n\r\x00\x0b\x1b\x7f\x85\u2028")
HOSTILE = st.one_of(
    st.text(alphabet=st.sampled_from(PRINTABLE), max_size=16),
    st.text(alphabet=st.sampled_from(PRINTABLE + CONTROLS), max_size=16),
)


def one_hostile(benign: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    """`benign` with one field, picked at random, replaced by a hostile string (two draws per case:
    hypothesis's own cost is most of the time, and one bad field is what injects)."""
    return st.tuples(st.integers(0, len(benign) - 1), HOSTILE).map(
        lambda c: [c[1] if n == c[0] else v for n, v in enumerate(benign)]
    )


def fuzz(strategy: st.SearchStrategy[Any], check: Callable[[Any], None]) -> Counter[str]:
    """Run `check` on CASES drawn values, BATCH per hypothesis example (hypothesis's own cost per example
    is most of the time); counts the rendered and the refused ones."""
    seen: Counter[str] = Counter()

    @settings(
        max_examples=CASES // BATCH,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(strategy, min_size=BATCH, max_size=BATCH))
    def prop(values: list[Any]) -> None:
        for value in values:
            try:
                check(value)
            except ReconcileError as exc:
                assert "\n" not in str(exc)
                seen["refused"] += 1
                continue
            seen["rendered"] += 1

    prop()
    assert sum(seen.values()) >= CASES, seen
    assert seen["rendered"] > CASES // 20 and seen["refused"] > 0, seen  # both sides were exercised
    return seen


_SPEC = Spec.model_validate(
    {
        "machine": {"state_dir": "/var/lib/reconcile"},
        "model": {"dir": "/models/m"},
        "server": {
            "name": "m",
            "supervisor": "systemd",
            "executable": "/opt/v/bin/vllm",
            "log": "/var/log/m.log",
        },
    }
)


def test_the_unit_writer_injects_no_key_and_no_word() -> None:
    def check(case: list[str]) -> None:
        first, second, log, env_file = case[0], case[1], "/" + case[2], "/" + case[3]
        assert _SPEC.server is not None
        spec = _SPEC.model_copy(update={"server": _SPEC.server.model_copy(update={"log": log})})
        argv = ("/opt/v/bin/vllm", "serve", first, second)
        command = LaunchCommand(argv, {}, Identity("0" * 16, {}))
        settings_ = parse.unit_settings(systemd_unit.render_unit(spec, command, env_file))
        assert [k for s, k, _ in settings_ if s == "Service"] == service_keys(spec, command.env)
        service = {k: v for s, k, v in settings_ if s == "Service"}
        assert parse.exec_argv(service["ExecStart"]) == list(argv)
        assert parse.setting_value(service["StandardOutput"]) == f"append:{log}"
        assert parse.setting_value(service["EnvironmentFile"]) == env_file

    fuzz(one_hostile(("--chat-template", "x.jinja", "var/log/m.log", "var/lib/r/server-m.env")), check)


def test_the_environment_file_writer_injects_no_variable() -> None:
    def check(case: list[str]) -> None:
        env = {case[0]: case[1], case[2]: case[3]}
        text = systemd_unit.render_environment_file(env)
        assert parse.environment_file(text) == sorted(env.items())

    fuzz(one_hostile(("HF_HUB_OFFLINE", "1", "VLLM_API_KEY", "sk-x")), check)


def test_the_cron_and_timer_writers_inject_no_job_and_no_key() -> None:
    every = scheduling.parse_every("5m")

    def check(case: list[str]) -> None:
        state, spec_path, textfile = "/" + case[0], "/" + case[1], "/" + case[2]
        s = scheduling.Schedule(spec_path, state, every, 60, textfile=textfile)
        cron = parse.cron_file(scheduling.render_cron(s))
        assert [k for k, _ in cron.env] == ["SHELL", "PATH"] and len(cron.jobs) == 1
        words = shlex.split(cron.jobs[0][2].split("; rc=$?", 1)[0])
        inner = shlex.split(words[words.index("-c") + 1].split("exec ", 1)[1])
        root = state.rstrip("/") or "/"
        assert words[:3] == ["mkdir", "-p", root] and inner == s.apply_argv()
        assert words[-2:] == [f">>{os.path.join(root, 'timer.log')}", "2>&1"]
        service = parse.unit_settings(scheduling.render_service(s))
        assert [k for sec, k, _ in service if sec == "Service"] == [
            "Type",
            "ExecStart",
            "WorkingDirectory",
            "SuccessExitStatus",
            "TimeoutStartSec",
            "TimeoutStopSec",  # issue 30: the server's drain and stop, plus a minute
            "Environment",
        ]
        values = {k: v for sec, k, v in service if sec == "Service"}
        assert parse.exec_argv(values["ExecStart"]) == s.apply_argv()

    fuzz(one_hostile(("var/lib/reconcile", "srv/specs/box.toml", "var/lib/node/reconcile.prom")), check)


def test_the_apt_source_writer_injects_no_option_and_no_entry() -> None:
    def check(case: list[str]) -> None:
        name, uri, suite, keyring, components = case[0], case[1], case[2], "/" + case[3], case[4:]
        repo = hostile_repo(name=name, uri=uri, suite=suite, components=components, keyring=keyring)
        entries = parse.apt_sources(apt.sources_line(repo))
        assert [(e.kind, e.options, e.uri, e.suite, e.components) for e in entries] == [
            ("deb", {"signed-by": keyring}, uri, suite, components)
        ]

    fuzz(
        one_hostile(
            ("cuda", "https://example.com/debian", "bookworm", "etc/apt/keyrings/k.gpg", "main", "contrib")
        ),
        check,
    )
