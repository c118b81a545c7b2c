"""Generated files from hostile specs: the server's unit and EnvironmentFile, the timer's service, the cron
line and the apt source. Each is parsed back the way its consumer reads it (tests/generated_parsers.py,
`systemd-analyze verify`, apt's own parser) and must hold exactly the intended keys, or be refused."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from actions import apt, systemd_unit
from actions.launching import LaunchInputs, launch_command
from reconcile.errors import ReconcileError
from reconcile.spec.models import AptRepository, Spec
from reconcile.unattended import timer as scheduling
from tests import generated_parsers as parse
from tests.test_server_support import FAKE_VLLM

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
needs_apt = pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get")

# Legal but hostile: everything each format treats specially, short of a control character.
NASTY = "a \"q\" 'r' \\b %h %% $HOME $$ ${X} ` ; [x] # é"
SERVICE_KEYS = [
    "Type",
    "EnvironmentFile",
    "ExecStart",
    "WorkingDirectory",
    "StandardInput",
    "StandardOutput",
    "StandardError",
    "KillMode",
    "KillSignal",
    "TimeoutStopSec",
    "SendSIGKILL",
    "Restart",
    "RestartSec",
]


def service_keys(spec: Any, env: Mapping[str, str]) -> list[str]:
    """The [Service] keys the writer means to write: the fixed ones, then one per hardening line
    (issue 16; their values hold the spec's paths, so hostile values must not add or drop one)."""
    return SERVICE_KEYS + [line.split("=", 1)[0] for line in systemd_unit.hardening(spec, env)]


def refused_or(render: Callable[[], str]) -> str | None:
    """The writer's text, or None when it refused the value with a clear error."""
    try:
        return render()
    except ReconcileError as exc:
        assert "\n" not in str(exc)
        return None


def server_spec(
    tmp_path: Path, *, log: str | None = None, state: str | None = None, **server: object
) -> Spec:
    return Spec.model_validate(
        {
            "machine": {"state_dir": state or str(tmp_path / "state")},
            "model": {"dir": "/models/nemotron"},
            "server": {
                "name": "nemotron",
                "supervisor": "systemd",
                "executable": FAKE_VLLM,
                "log": log or str(tmp_path / "nemotron.log"),
                **server,
            },
        }
    )


def unit_text(spec: Spec) -> str:
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    return systemd_unit.render_unit(spec, command, systemd_unit.env_file_path(spec))


def keys(settings: list[tuple[str, str, str]], section: str) -> list[str]:
    return [k for s, k, _ in settings if s == section]


# -- the attacks of issue 13 ------------------------------------------------------------------------


def test_a_newline_in_server_log_gives_no_exec_start_pre_line(tmp_path: Path) -> None:
    spec = server_spec(tmp_path, log=f"{tmp_path}/n.log\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'")
    text = refused_or(lambda: unit_text(spec))
    if text is not None:
        assert keys(parse.unit_settings(text), "Service") == SERVICE_KEYS


def test_an_env_key_with_a_newline_gives_no_ld_preload_line() -> None:
    env = {"HF_HUB_OFFLINE=1\nLD_PRELOAD": "/tmp/evil.so", "A": "1"}
    text = refused_or(lambda: systemd_unit.render_environment_file(env))
    if text is not None:
        assert [k for k, _ in parse.environment_file(text)] == sorted(env)


def test_an_env_value_with_a_newline_gives_no_second_variable() -> None:
    env = {"A": "1\nLD_PRELOAD=/tmp/evil.so"}
    text = refused_or(lambda: systemd_unit.render_environment_file(env))
    if text is not None:
        assert parse.environment_file(text) == list(env.items())


def schedule(
    state_dir: str, spec_path: str = "/srv/specs/box.toml", textfile: str | None = None
) -> scheduling.Schedule:
    every = scheduling.parse_every("5m")
    return scheduling.Schedule(spec_path, state_dir, every, 60, textfile=textfile)


def test_a_newline_in_state_dir_gives_the_cron_file_no_second_job() -> None:
    s = schedule("/var/lib/reconcile\n* * * * * root touch /tmp/pwned\n")
    text = refused_or(lambda: scheduling.render_cron(s))
    if text is not None:
        cron = parse.cron_file(text)
        assert len(cron.jobs) == 1 and [k for k, _ in cron.env] == ["SHELL", "PATH"]


def test_a_newline_in_the_spec_path_gives_the_timer_service_no_extra_key() -> None:
    s = schedule("/var/lib/reconcile", spec_path="/srv/specs/box.toml\nExecStartPre=/tmp/evil")
    text = refused_or(lambda: scheduling.render_service(s))
    if text is not None:
        assert "ExecStartPre" not in keys(parse.unit_settings(text), "Service")


def hostile_repo(**fields: Any) -> AptRepository:
    # model_construct: what a spec that got past validation (or a caller in Python) hands the writer.
    base: dict[str, Any] = {
        "name": "cuda",
        "uri": "https://example.com/debian",
        "suite": "bookworm",
        "components": ["main"],
        "keyring": "/etc/apt/keyrings/example.gpg",
        "key_source": None,
        "trusted": False,
    }
    return AptRepository.model_construct(**{**base, **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {"keyring": "/etc/apt/keyrings/x.gpg trusted=yes"},
        {"keyring": "/etc/apt/keyrings/x.gpg] [trusted=yes"},
        {"suite": "bookworm\ndeb [trusted=yes] https://evil.example/debian bookworm"},
        {"uri": "https://example.com/debian [trusted=yes]"},
        {"components": ["main", "#", "contrib"]},
    ],
    ids=["keyring-option", "keyring-bracket", "suite-newline", "uri-space", "component-comment"],
)
def test_hostile_apt_fields_give_no_trusted_source(fields: dict[str, object]) -> None:
    repo = hostile_repo(**fields)
    line = refused_or(lambda: apt.sources_line(repo))
    if line is not None:
        entries = parse.apt_sources(line)
        assert [(e.options, e.uri, e.suite, e.components) for e in entries] == [
            ({"signed-by": repo.keyring}, repo.uri, repo.suite, repo.components)
        ]


# -- hostile but legal values come back exactly -------------------------------------------------------


def test_nasty_server_values_come_back_exactly_from_the_unit_and_the_environment_file(tmp_path: Path) -> None:
    log = f"{tmp_path}/{NASTY}.log"
    state = f"{tmp_path}/st {NASTY}"
    args = {"chat-template": NASTY, "tokenizer-mode": ";", "tokenizer": "x -y", "seed": "-1"}
    spec = server_spec(tmp_path, log=log, state=state, args=args, env={"ODD": NASTY, "EMPTY": ""})
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    text = systemd_unit.render_unit(spec, command, systemd_unit.env_file_path(spec))
    settings = parse.unit_settings(text)
    assert keys(settings, "Service") == service_keys(spec, command.env)
    service = {k: v for s, k, v in settings if s == "Service"}
    assert parse.exec_argv(service["ExecStart"]) == list(command.argv)
    assert parse.setting_value(service["StandardOutput"]) == f"append:{log}"
    assert parse.setting_value(service["EnvironmentFile"]) == systemd_unit.env_file_path(spec)
    env = parse.environment_file(systemd_unit.render_environment_file(command.env))
    assert env == sorted(command.env.items())


@needs_analyze
def test_systemd_analyze_reads_the_nasty_unit_without_a_warning(tmp_path: Path) -> None:
    spec = server_spec(tmp_path, log=f"{tmp_path}/{NASTY}.log", args={"chat-template": NASTY})
    command = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin"})
    systemd_unit.install_unit(spec, command, unit_dir=str(tmp_path / "units"))
    unit = tmp_path / "units" / systemd_unit.unit_name(spec)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "reconcile-nemotron" not in done.stderr, done.stderr
    # The check can fail: an injected line is reported.
    unit.write_text(unit.read_text().replace("SendSIGKILL=yes", "SendSIGKILL=yes\nInjected=yes"))
    bad = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "Injected" in bad.stderr


def test_nasty_schedule_values_come_back_exactly_from_the_service_and_the_cron_line() -> None:
    s = schedule(f"/var/lib/{NASTY}", spec_path=f"/srv/{NASTY}/box.toml", textfile=f"/tmp/{NASTY}.prom")
    service = parse.unit_settings(scheduling.render_service(s))
    values = {k: v for sec, k, v in service if sec == "Service"}
    assert parse.exec_argv(values["ExecStart"]) == s.apply_argv()
    assert parse.setting_value(values["WorkingDirectory"]) == f"/srv/{NASTY}"
    cron = parse.cron_file(scheduling.render_cron(s))
    assert [k for k, _ in cron.env] == ["SHELL", "PATH"] and len(cron.jobs) == 1
    assert cron_words(cron.jobs[0][2]) == cron_intended(s)


def cron_words(command: str) -> list[str]:
    import shlex

    words = shlex.split(command.split("; rc=$?", 1)[0])
    inner = words[words.index("-c") + 1]
    return [*words[:3], words[8], *shlex.split(inner.split("exec ", 1)[1]), words[-2]]


def cron_intended(s: scheduling.Schedule) -> list[str]:
    state = s.state_dir.rstrip("/")
    return ["mkdir", "-p", state, f"{state}/timer.lock", *s.apply_argv(), f">>{state}/timer.log"]


@needs_analyze
def test_systemd_analyze_reads_the_nasty_timer_units_without_a_warning(tmp_path: Path) -> None:
    s = schedule(f"{tmp_path}/{NASTY}", spec_path=f"{tmp_path}/{NASTY}/box.toml")
    outcome = scheduling.install(s, unit_dir=str(tmp_path / "units"))
    done = subprocess.run(
        ["systemd-analyze", "verify", *outcome.paths], capture_output=True, text=True, timeout=60
    )
    assert "reconcile-apply" not in done.stderr, done.stderr


@needs_apt
def test_apt_reads_the_written_source_as_exactly_the_intended_entry(tmp_path: Path) -> None:
    keyring = tmp_path / "k.gpg"
    keyring.write_bytes(b"")
    repo = AptRepository(
        name="ex",
        uri="https://example.com/debian",
        suite="bookworm",
        components=["main", "non-free"],
        keyring=str(keyring),
    )
    apt.add_repository(repo, str(tmp_path / "sources"))
    listed = tmp_path / "sources" / "reconcile-ex.list"
    lists = tmp_path / "lists"
    lists.mkdir()
    done = subprocess.run(
        [
            "apt-get",
            "-o",
            f"Dir::Etc::sourcelist={listed}",
            "-o",
            "Dir::Etc::sourceparts=-",
            "-o",
            f"Dir::State::Lists={lists}",
            "-o",
            "APT::Architectures=amd64",
            "indextargets",
            "--no-release-info",
            "--format",
            "$(SOURCESENTRY) $(REPO_URI) $(RELEASE) $(COMPONENT)",
            "Created-By: Packages",
            "Architecture: amd64",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:-1]) == [
        f"{listed}:2 https://example.com/debian/ bookworm main",
        f"{listed}:2 https://example.com/debian/ bookworm non-free",
    ]


# apt's own C++ parser, through python-apt (Debian's python3-apt, for the system interpreter).
_APT_PKG = """
import apt_pkg, json, sys
apt_pkg.init_config()
apt_pkg.config.set("Dir::Etc::sourcelist", sys.argv[1])
apt_pkg.config.set("Dir::Etc::sourceparts", "-")
apt_pkg.init_system()
sources = apt_pkg.SourceList()
sources.read_main_list()
print(json.dumps([[m.uri, m.dist, m.is_trusted, len(m.index_files)] for m in sources.list]))
"""
needs_python_apt = pytest.mark.skipif(
    subprocess.run(["/usr/bin/python3", "-c", "import apt_pkg"], capture_output=True).returncode != 0
    if shutil.which("/usr/bin/python3")
    else True,
    reason="no python3-apt",
)


def apt_pkg_entries(listed: Path) -> list[list[object]]:
    import json

    done = subprocess.run(
        ["/usr/bin/python3", "-c", _APT_PKG, str(listed)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    entries: list[list[object]] = json.loads(done.stdout)
    return entries


@needs_python_apt
@pytest.mark.parametrize(
    ("uri", "suite", "components"),
    [
        ("https://example.com/de%20bian", "bookworm", ["main", "non-free"]),
        ("file:/srv/repo", "./", []),
        ("https://example.com/x;y=z", "stable/updates", ["a+b"]),
    ],
)
def test_apts_own_parser_reads_one_signed_entry_for_each_written_source(
    tmp_path: Path, uri: str, suite: str, components: list[str]
) -> None:
    keyring = tmp_path / "k.gpg"
    keyring.write_bytes(b"")
    repo = AptRepository(name="ex", uri=uri, suite=suite, components=components, keyring=str(keyring))
    apt.add_repository(repo, str(tmp_path))
    entries = apt_pkg_entries(tmp_path / "reconcile-ex.list")
    assert len(entries) == 1
    assert entries[0][1:3] == [suite, False]  # the suite intended, signed (not trusted=yes)
    # The check can fail: the old writer's line for keyring = ".../k.gpg trusted=yes" is a trusted source.
    old = tmp_path / "old.list"
    old.write_text(f"deb [signed-by={keyring} trusted=yes] {uri} {suite} {' '.join(components)}\n")
    assert apt_pkg_entries(old)[0][2] is True
