"""The spec loader: every malformed spec gets one exact line; extends, references, find_spec."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from reconcile.errors import ReconcileError, SpecError
from reconcile.spec.loader import find_spec, load_spec, schema_text, spec_from_resolved
from reconcile.spec.models import Spec

BAD = Path(__file__).parent / "bad_specs"
DURATIONS = '(90 (seconds), "500ms", "90s", "15m" or "1h")'
OWN_DIR = "(a directory of its own below it, e.g. /var/lib/reconcile/models/NAME)"
CTRL = "(text without control characters: no newline, tab or escape code)"

# file -> the one line the user sees ({dir} is tests/bad_specs, absolute)
EXPECTED = {
    # TOML syntax
    "syntax_unterminated_string.toml": "syntax_unterminated_string.toml:2: invalid TOML: unterminated "
    "string, or a control character in one (close the quote; write \\n for a newline)",
    "syntax_missing_value.toml": "syntax_missing_value.toml:3: invalid TOML: unexpected end of line "
    '(a value: "string", number, true/false, [array] or { table })',
    "syntax_bare_word_value.toml": "syntax_bare_word_value.toml:3: invalid TOML: unexpected character 'l' "
    '(a value: "string", number, true/false, [array] or { table })',
    "syntax_duplicate_key.toml": "syntax_duplicate_key.toml:4: venv.path: defined twice "
    "(a key or [table] appears once; merge them)",
    "syntax_duplicate_table.toml": "syntax_duplicate_table.toml:7: gpu: defined twice "
    "(a key or [table] appears once; merge them)",
    "syntax_unclosed_array.toml": "syntax_unclosed_array.toml:5: invalid TOML: unexpected character '[' "
    "(an [array] or { table } left open above?)",
    "syntax_bad_escape.toml": "syntax_bad_escape.toml:2: invalid TOML: bad escape in a string "
    "(\\n \\t \\\" \\\\ \\uXXXX; or a 'literal string' without escapes)",
    "syntax_unclosed_header.toml": "syntax_unclosed_header.toml:1: invalid TOML: unexpected end of line "
    "(a [table] header ends with ])",
    # unknown keys
    "unknown_top_level_section.toml": "unknown_top_level_section.toml:4: sever: unknown key, did you mean "
    "server? (allowed: machine, gpu, cuda, apt, bench, venv, model, api_key, server, front, health, "
    "deployments, extends)",
    "unknown_venv_key.toml": "unknown_venv_key.toml:3: venv.pakages: unknown key, did you mean packages? "
    "(allowed: path, python, index_url, extra_index_urls, packages, closure, wheelhouse, no_deps, "
    "system_site_packages, extra_site_packages, installer, store)",
    "unknown_apt_repository_key.toml": "unknown_apt_repository_key.toml:8: apt.repositories[0].keyrings: "
    "unknown key, did you mean keyring? "
    "(allowed: name, uri, suite, components, keyring, key_source, trusted)",
    "unknown_crash_loop_key.toml": "unknown_crash_loop_key.toml:6: server.crash_loop.windw: unknown key, "
    "did you mean window? (allowed: max_starts, window)",
    "unknown_key_no_suggestion.toml": "unknown_key_no_suggestion.toml:3: gpu.colour: unknown key "
    "(allowed: count, name, compute_capability, memory_gib, min_driver)",
    "extends_inside_table.toml": "extends_inside_table.toml:3: machine.extends: unknown key: extends goes "
    "at the top of the file, before any [table] (allowed: hostname, state_dir, description)",
    # wrong types
    "port_as_string.toml": 'port_as_string.toml:6: server.port: "eighty" is not a port (an integer 1-65535)',
    "gpu_count_float.toml": "gpu_count_float.toml:2: gpu.count: 2.5 is not an integer (a whole number >= 0)",
    "venv_packages_as_list.toml": 'venv_packages_as_list.toml:3: venv.packages: ["vllm", "ninja", '
    '"huggingface_hub"] is not a table (name = "version specifier" pairs, e.g. '
    '{ vllm = ">=0.26", ninja = "*" })',
    "args_nested_array_of_tables.toml": "args_nested_array_of_tables.toml:9: server.args.speculative: "
    '[{ method = "ngram" }, { tokens = 4 }] is not a flag value (a string, number, true/false, '
    "a list of those, or a table for a JSON flag)",
    "headers_as_string.toml": 'headers_as_string.toml:3: cuda.headers: "cublasLt.h" is not a list '
    "([...], each a string)",
    "env_value_not_string.toml": "env_value_not_string.toml:9: server.env.HF_HUB_OFFLINE: 1 is not a string "
    "(text in quotes)",
    "section_not_a_table.toml": "section_not_a_table.toml:1: gpu: 2 is not a table "
    "(keys count, name, compute_capability, memory_gib, min_driver)",
    "running_not_boolean.toml": 'running_not_boolean.toml:6: server.running: "yes" is not a boolean '
    "(true or false, without quotes)",
    "bad_supervisor.toml": 'bad_supervisor.toml:3: server.supervisor: "docker" is not one of the choices '
    '("process" or "systemd")',
    # versions and names
    "bad_version_specifier.toml": 'bad_version_specifier.toml:3: venv.packages.vllm: ">>0.26" is not a '
    'version specifier ("*", "==0.26.0", ">=0.26.0rc1", "~=1.11")',
    "bad_package_name.toml": 'bad_package_name.toml:6: venv.packages."hugging face hub": "hugging face hub" '
    "is not a package name (letters, digits, '.', '_', '-')",
    "bad_apt_package.toml": 'bad_apt_package.toml:5: apt.packages[2]: "CUDA-CCCL-13-0" is not an apt '
    'package (a lowercase name, optionally "name=version")',
    "bad_hub_repo.toml": 'bad_hub_repo.toml:2: model.repo: "nvidia/NVIDIA Nemotron/3" is not a hub repo id '
    "(owner/name)",
    "bad_compute_capability.toml": 'bad_compute_capability.toml:3: gpu.compute_capability: "sm_120" is not '
    'a compute capability (major.minor, e.g. "12.0")',
    "bad_gpu_arch.toml": 'bad_gpu_arch.toml:2: cuda.gpu_arch[0]: "120" is not an nvcc arch '
    '(as `nvcc --list-gpu-arch` prints it, e.g. "compute_120")',
    "bad_min_driver.toml": 'bad_min_driver.toml:2: gpu.min_driver: "580.95-open" is not a driver version '
    '(dotted numbers, e.g. "580.95")',
    "bad_key_mode.toml": 'bad_key_mode.toml:3: api_key.mode: "rw-------" is not a file mode '
    '(octal digits, e.g. "0600")',
    "empty_server_name.toml": 'empty_server_name.toml:2: server.name: "" is not a deployment name '
    "(letters, digits, '.', '_', '-'; a letter or digit first; at most 64)",
    # paths that must be absolute
    "relative_venv_path.toml": 'relative_venv_path.toml:2: venv.path: "opt/vllm-venv" is a relative path '
    "(an absolute path, starting with /)",
    "relative_model_dir.toml": 'relative_model_dir.toml:3: model.dir: "models/NVIDIA-Nemotron-3-Nano-30B-'
    'A3B-NVFP4" is a relative path (an absolute path, starting with /)',
    "relative_server_log.toml": 'relative_server_log.toml:5: server.log: "nemotron.log" is a relative path '
    "(an absolute path, starting with /)",
    "relative_api_key_file.toml": 'relative_api_key_file.toml:2: api_key.file: "~/vllm-api.key" is a '
    "relative path (an absolute path, starting with /)",
    "relative_cuda_home.toml": 'relative_cuda_home.toml:2: cuda.home: "usr/local/cuda" is a relative path '
    "(an absolute path, starting with /)",
    # ports and durations
    "port_zero.toml": "port_zero.toml:5: server.port: 0 is not a port (an integer 1-65535)",
    "port_too_big.toml": "port_too_big.toml:3: server.port: 70000 is not a port (an integer 1-65535)",
    "port_negative.toml": "port_negative.toml:7: server.port: -1 is not a port (an integer 1-65535)",
    "bad_duration.toml": 'bad_duration.toml:6: server.startup_timeout: "15 minutes" is not a duration '
    + DURATIONS,
    "zero_duration.toml": 'zero_duration.toml:2: health.timeout: "0s" is not a positive duration '
    + DURATIONS,
    "inline_table_multiline_error.toml": "inline_table_multiline_error.toml:10: server.crash_loop.window: "
    f'"a while" is not a duration {DURATIONS}',
    # extends
    "extends_self.toml": 'extends_self.toml:2: extends: "extends_self.toml" is this file itself '
    "(a spec cannot extend itself)",
    "extends_cycle_a.toml": 'extends_cycle_b.toml:2: extends: "extends_cycle_a.toml" makes a cycle: '
    "extends_cycle_a.toml -> extends_cycle_b.toml -> extends_cycle_a.toml (bases cannot extend back)",
    "extends_cycle_b.toml": 'extends_cycle_a.toml:1: extends: "extends_cycle_b.toml" makes a cycle: '
    "extends_cycle_b.toml -> extends_cycle_a.toml -> extends_cycle_b.toml (bases cannot extend back)",
    "extends_missing_base.toml": 'extends_missing_base.toml:1: extends: "fleet-base.toml" not found '
    "(looked at {dir}/fleet-base.toml; relative to this file)",
    "extends_not_a_string.toml": 'extends_not_a_string.toml:1: extends: ["base.toml"] is not a file name '
    "(a base spec, relative to here)",
    "extends_base_with_error.toml": '_base_bad_timeout.toml:6: health.timeout: "soon" is not a duration '
    f"{DURATIONS}",
    "_base_bad_timeout.toml": '_base_bad_timeout.toml:6: health.timeout: "soon" is not a duration '
    + DURATIONS,
    # references
    "ref_unknown_path.toml": "ref_unknown_path.toml:8: server.args.reasoning-parser-plugin: "
    "{model.directory} refers to nothing (a key of this spec, e.g. {model.dir})",
    "ref_to_table.toml": "ref_to_table.toml:6: machine.description: {model.config} is a table "
    "(a reference names one string, number or boolean)",
    "ref_cycle.toml": "ref_cycle.toml:2: machine.hostname: {machine.description} makes a cycle: "
    "machine.hostname -> machine.description -> machine.hostname (no value may refer back to itself)",
    "ref_self.toml": "ref_self.toml:2: venv.path: {venv.path} makes a cycle: venv.path -> venv.path "
    "(no value may refer back to itself)",
    # rules across keys
    "apt_repository_unsigned.toml": "apt_repository_unsigned.toml:4: apt.repositories[0].keyring: missing "
    "(a keyring path, or trusted = true for a local test repository)",
    "api_key_in_args.toml": "api_key_in_args.toml:11: server.args.api-key: puts the key on the command line "
    "(use [api_key] file = ... instead)",
    "liveness_deadline_too_long.toml": "liveness_deadline_too_long.toml:9: server.liveness.deadline: "
    "is 300s; at most 120s (plan and apply wait for it: a stall longer than that is what `window` is for, "
    'e.g. deadline = "15s", window = "5m")',
    "unknown_liveness_key.toml": "unknown_liveness_key.toml:6: server.liveness.dedline: unknown key, "
    "did you mean deadline? (allowed: check, deadline, window)",
    "flag_with_dashes.toml": "flag_with_dashes.toml:8: server.args.--max-model-len: write the flag without "
    "its leading dashes (max-model-len = ...)",
    "repo_and_source.toml": "repo_and_source.toml:4: model.source: set with repo too "
    "(one of them: repo for the hub, source for a directory)",
    "missing_venv_path.toml": "missing_venv_path.toml:4: venv.path: missing "
    "(required: the virtual environment's directory, an absolute path)",
    "server_without_model.toml": "server_without_model.toml:4: server: nothing to serve "
    "(set model, or add a [model] section)",
    "first_error_in_file_order.toml": "first_error_in_file_order.toml:7: server.port: 0 is not a port "
    "(an integer 1-65535)",
    # hostile values: control characters, names that inject, numbers that are not numbers
    "control_char_in_log.toml": "control_char_in_log.toml:5: server.log: "
    '"/var/log/vllm/nemotron.log\\nExecStartPre=/bin/sh -c id" holds a control character (\\n) ' + CTRL,
    "control_char_in_env_key.toml": "control_char_in_env_key.toml:6: "
    'server.env."HF_HUB_OFFLINE=1\\nLD_PRELOAD": the key holds a control character (\\n) ' + CTRL,
    "env_key_with_equals.toml": 'env_key_with_equals.toml:8: server.env."VLLM_PORT=1": "VLLM_PORT=1" '
    "is not an environment variable name (letters, digits and _, not starting with a digit)",
    "escape_in_description.toml": "escape_in_description.toml:3: machine.description: "
    '"a box \\u001b[2J\\u001b[H cleared your terminal" holds a control character (\\x1b) ' + CTRL,
    "newline_in_cron_state_dir.toml": "newline_in_cron_state_dir.toml:2: machine.state_dir: "
    '"/var/lib/reconcile\\n* * * * * root /tmp/evil" holds a control character (\\n) ' + CTRL,
    "port_true.toml": "port_true.toml:6: server.port: true is not a port (an integer 1-65535)",
    "gpu_count_true.toml": "gpu_count_true.toml:2: gpu.count: true is not an integer (a whole number >= 0)",
    "stop_timeout_nan.toml": "stop_timeout_nan.toml:6: server.stop_timeout: nan is not a finite duration "
    + DURATIONS,
    "startup_timeout_inf.toml": "startup_timeout_inf.toml:6: server.startup_timeout: inf is not a finite "
    "duration " + DURATIONS,
    "duration_too_long.toml": 'duration_too_long.toml:2: health.timeout: "48h" is longer than a day '
    + DURATIONS,
    "model_dir_root.toml": 'model_dir_root.toml:3: model.dir: "/" is a system directory ' + OWN_DIR,
    "state_dir_tmp.toml": 'state_dir_tmp.toml:3: machine.state_dir: "/tmp/" is a system directory ' + OWN_DIR,
    "venv_path_usr.toml": 'venv_path_usr.toml:2: venv.path: "/usr/local/../" is a system directory '
    + OWN_DIR,
    "apt_keyring_with_option.toml": "apt_keyring_with_option.toml:8: apt.repositories[0].keyring: "
    '"/etc/apt/keyrings/cuda.gpg] [trusted=yes" is not a keyring path for apt (an absolute path without '
    "spaces, quotes, brackets, commas or #)",
    "apt_suite_with_space.toml": "apt_suite_with_space.toml:4: apt.repositories[0].suite: "
    '"bookworm [trusted=yes]" is not an apt suite (one word without spaces, quotes, brackets or #, '
    'e.g. "bookworm" or "/")',
    "apt_repository_bad_name.toml": "apt_repository_bad_name.toml:2: apt.repositories[0].name: "
    "\"../../sources.list\" is not a repository name "
    "(letters, digits, '.', '_', '-'; a letter or digit first; at most 64; a file stem)",
}


def test_every_bad_spec_has_an_expected_message() -> None:
    on_disk = {p.name for p in BAD.glob("*.toml")}
    assert on_disk == set(EXPECTED), (on_disk - set(EXPECTED), set(EXPECTED) - on_disk)
    assert len(on_disk) >= 35


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_spec_fails_with_one_exact_line(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(BAD)
    with pytest.raises(SpecError) as caught:
        load_spec(name)
    message = str(caught.value)
    assert message == EXPECTED[name].replace("{dir}", str(BAD))
    assert "\n" not in message
    assert "Input should" not in message and "Value error" not in message  # pydantic's own words
    # The file and line it names hold the offending key (or, for a missing key, its section).
    err = caught.value
    assert message.startswith(f"{err.file}:{err.line}: ")
    lines = (BAD / err.file).read_text().splitlines()
    assert err.line is not None and 1 <= err.line <= len(lines)
    if err.key and not err.key.endswith("]") and not err.message.startswith("defined twice"):
        last = re.split(r"[.\]]", err.key.replace('"', ""))[-1]
        held = lines[err.line - 1]
        assert last in held or held.lstrip().startswith(("[", "{")), (err.key, held)


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


BASE = """
[venv]
path = "/opt/vllm-venv"
packages = { ninja = "*", huggingface_hub = "*" }

[apt]
packages = ["cuda-nvcc-13-0", "libcurand-dev-13-0"]

[server]
port = 8000
log = "/var/log/vllm/{server.name}.log"
env = { HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false" }
"""
MACHINE = """extends = "../fleet/base.toml"

[venv]
packages = { vllm = ">=0.26.0rc1" }

[apt]
packages = ["python3.10-venv"]

[model]
dir = "/root/models/nemotron"

[server]
name = "nemotron"
port = 20000
env = { TOKENIZERS_PARALLELISM = "true" }
"""


def test_extends_merges_tables_and_lets_the_machine_replace_arrays_and_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "fleet/base.toml", BASE)
    _write(tmp_path / "machines/box.toml", MACHINE)
    loaded = load_spec("machines/box.toml")
    spec = loaded.spec
    assert spec.venv is not None and spec.apt is not None and spec.server is not None
    assert spec.venv.path == "/opt/vllm-venv"
    assert spec.venv.packages == {"ninja": "*", "huggingface_hub": "*", "vllm": ">=0.26.0rc1"}
    assert spec.apt.packages == ["python3.10-venv"]  # arrays replace
    assert spec.server.port == 20000
    assert spec.server.env == {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "true"}
    assert spec.server.log == "/var/log/vllm/nemotron.log"  # a base value that refers to the machine's
    assert loaded.path == "machines/box.toml"
    assert loaded.text == MACHINE
    assert loaded.files == (str(tmp_path / "machines/box.toml"), str(tmp_path / "fleet/base.toml"))


def test_a_change_in_the_base_changes_the_sha256_but_not_the_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "fleet/base.toml", BASE)
    _write(tmp_path / "machines/box.toml", MACHINE)
    before = load_spec("machines/box.toml")
    assert load_spec("machines/box.toml").sha256 == before.sha256  # stable
    _write(tmp_path / "fleet/base.toml", BASE.replace('huggingface_hub = "*"', 'huggingface_hub = ">=0.30"'))
    after = load_spec("machines/box.toml")
    assert after.text == before.text
    assert after.sha256 != before.sha256
    _write(tmp_path / "fleet/base.toml", "# only a comment differs\n" + BASE)
    assert load_spec("machines/box.toml").sha256 == before.sha256  # hashes the document, not the bytes


def test_an_error_from_the_base_names_the_base_file_as_seen_from_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "fleet/base.toml", BASE.replace("port = 8000", "port = 0"))
    _write(tmp_path / "machines/box.toml", MACHINE.replace("port = 20000\n", ""))
    with pytest.raises(SpecError) as caught:
        load_spec("machines/box.toml")
    assert str(caught.value) == "fleet/base.toml:10: server.port: 0 is not a port (an integer 1-65535)"


def test_a_machine_value_that_replaces_a_bad_base_value_wins(tmp_path: Path) -> None:
    _write(tmp_path / "fleet/base.toml", BASE.replace("port = 8000", "port = 0"))
    box = _write(tmp_path / "machines/box.toml", MACHINE)
    spec = load_spec(box).spec
    assert spec.server is not None and spec.server.port == 20000


def test_a_missing_key_of_a_section_defined_in_both_is_reported_at_the_machine_header(tmp_path: Path) -> None:
    _write(tmp_path / "base.toml", '[venv]\npython = "python3.10"\n')
    box = _write(tmp_path / "box.toml", 'extends = "base.toml"\n\n[venv]\npackages = { vllm = "*" }\n')
    with pytest.raises(SpecError) as caught:
        load_spec(box)
    assert (caught.value.file, caught.value.line, caught.value.key) == (box, 3, "venv.path")


def test_bases_can_extend_bases(tmp_path: Path) -> None:
    _write(tmp_path / "a.toml", '[machine]\ndescription = "a"\nstate_dir = "/srv/a"\n')
    _write(tmp_path / "b.toml", 'extends = "a.toml"\n[machine]\ndescription = "b"\n')
    c = _write(tmp_path / "c.toml", 'extends = "b.toml"\n[machine]\nhostname = "c"\n')
    loaded = load_spec(c)
    assert loaded.spec.machine.model_dump() == {"hostname": "c", "state_dir": "/srv/a", "description": "b"}
    assert [os.path.basename(f) for f in loaded.files] == ["c.toml", "b.toml", "a.toml"]


REFS = """
[machine]
state_dir = "/srv/reconcile"
description = "{server.name} on port {server.port}, gpu check {health.check_models}"

[model]
dir = "{machine.state_dir}/models/tiny"

[venv]
path = "{machine.state_dir}/venv"

[server]
name = "tiny"
port = 8001
log = "{model.dir}/../tiny.log"
executable = "{spec_dir}/../bin/./vllm"
served_model_name = "{{model.dir}} stays literal"
args = { reasoning-parser-plugin = "{model.dir}/plugin.py",
         hf-overrides = '{"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}',
         chat-template = "{% if x %}{{ x }}{% endif %}" }
env = { STATE = "{machine.state_dir}", DEFAULT_PYTHON = "{venv.python}" }
"""


def test_references_resolve_nested_escaped_and_leave_other_braces_alone(tmp_path: Path) -> None:
    path = _write(tmp_path / "specs/refs.toml", REFS)
    spec = load_spec(path).spec
    assert spec.model is not None and spec.server is not None and spec.venv is not None
    assert spec.model.dir == "/srv/reconcile/models/tiny"
    assert spec.server.args["reasoning-parser-plugin"] == "/srv/reconcile/models/tiny/plugin.py"  # nested
    assert spec.machine.description == "tiny on port 8001, gpu check true"  # scalars as TOML writes them
    assert spec.server.served_model_name == "{model.dir} stays literal"  # escaped
    assert spec.server.args["hf-overrides"] == '{"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}'
    assert spec.server.args["chat-template"] == "{% if x %}{{ x }}{% endif %}"
    assert spec.server.env == {"STATE": "/srv/reconcile", "DEFAULT_PYTHON": "python3"}  # a default
    assert spec.server.log == "/srv/reconcile/models/tiny/../tiny.log"  # only {spec_dir} paths are normalised
    assert spec.server.executable == str(tmp_path / "bin/vllm")


def test_references_resolve_in_list_items_and_the_resolved_document_is_recorded(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "s.toml",
        '[model]\ndir = "/m"\nrequired_files = ["x.py", "{model.dir}/y.py"]\n',
    )
    loaded = load_spec(path)
    assert loaded.spec.model is not None and loaded.spec.model.required_files == ["x.py", "/m/y.py"]
    assert loaded.resolved == {"model": {"dir": "/m", "required_files": ["x.py", "/m/y.py"]}}


def test_a_value_left_unresolved_reports_the_reference_not_a_side_effect(tmp_path: Path) -> None:
    # venv.path refers to a value with a broken reference; the error is that reference, not
    # "relative path" for the venv.path left holding "{model.base}".
    text = '[venv]\npath = "{model.base}"\n\n[model]\nbase = "{nope.x}"\ndir = "/m"\n'
    path = _write(tmp_path / "s.toml", text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(caught.value) == (
        f"{path}:5: model.base: {{nope.x}} refers to nothing (a key of this spec, e.g. {{model.dir}})"
    )


def test_errors_are_found_in_dotted_keys_quoted_keys_and_second_array_entries(tmp_path: Path) -> None:
    text = '''# a comment with [brackets] and = signs
server.port = 8000
description = """
[not a table]
x = 1
"""

[[apt.repositories]]
name = "one"
uri = "file:/srv/one"
suite = "/"
trusted = true

[[apt.repositories]]
"name" = 'two'
uri = "file:/srv/two"
suite = "/"
'''
    path = _write(
        tmp_path / "s.toml",
        text.replace("server.port = 8000", 'machine.hostname = "box"').replace(
            "description", "machine.description"
        ),
    )
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(caught.value) == (
        f"{path}:14: apt.repositories[1].keyring: missing "
        "(a keyring path, or trusted = true for a local test repository)"
    )


def test_a_spec_with_crlf_line_endings_loads_and_reports_lines(tmp_path: Path) -> None:
    good = tmp_path / "crlf.toml"
    text = '[machine]\r\nhostname = "box"\r\n\r\n[server]\r\nname = "x"\r\n'
    good.write_bytes(text.replace("[server]", "[health]").replace('name = "x"', 'timeout = "3s"').encode())
    loaded = load_spec(str(good))
    assert loaded.spec.machine.hostname == "box" and loaded.spec.health.timeout == 3.0
    assert "\r\n" in loaded.text
    bad = tmp_path / "bad.toml"
    bad.write_bytes(text.replace("[server]", "[health]").replace('name = "x"', 'timeout = "soon"').encode())
    with pytest.raises(SpecError) as caught:
        load_spec(str(bad))
    assert (caught.value.line, caught.value.key) == (5, "health.timeout")


def test_an_empty_file_is_a_spec_of_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    loaded = load_spec(str(empty))
    assert loaded.spec == Spec()
    assert loaded.spec.machine.state_dir == "/var/lib/reconcile"
    assert loaded.resolved == {} and loaded.text == ""
    assert len(loaded.sha256) == 64


def test_a_missing_spec_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(str(tmp_path / "nope.toml"))
    assert str(caught.value) == f"{tmp_path}/nope.toml: cannot read (No such file or directory)"


def test_a_spec_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[machine]\ndescription = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(SpecError) as caught:
        load_spec(str(path))
    assert str(caught.value) == f"{path}:2: not UTF-8 text (a TOML file is UTF-8)"


def test_loaded_spec_is_frozen(tmp_path: Path) -> None:
    loaded = load_spec(_write(tmp_path / "s.toml", ""))
    with pytest.raises(AttributeError):
        loaded.path = "other"  # type: ignore[misc]


def test_a_recorded_resolved_document_loads_back_to_the_same_spec(tmp_path: Path) -> None:
    path = _write(tmp_path / "specs/refs.toml", REFS)
    loaded = load_spec(path)
    again = spec_from_resolved(loaded.resolved, loaded.text, path)
    assert again.spec == loaded.spec and again.sha256 == loaded.sha256 and again.text == loaded.text
    with pytest.raises(SpecError) as caught:
        spec_from_resolved({"server": {"port": 0}}, "", "/gen/7.toml")
    assert str(caught.value).startswith("/gen/7.toml: server")


def test_find_spec_prefers_the_explicit_path(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    _write(specs / "box.toml", "")
    explicit = _write(tmp_path / "other.toml", "")
    assert find_spec(explicit, str(specs), hostname="box") == explicit
    with pytest.raises(ReconcileError) as caught:
        find_spec(str(tmp_path / "typo.toml"), str(specs), hostname="box")
    assert str(caught.value) == f"--spec {tmp_path}/typo.toml: no such file (give the path of a spec file)"


def test_find_spec_falls_back_to_the_hostname_file(tmp_path: Path) -> None:
    import socket

    specs = tmp_path / "specs"
    _write(specs / "box.toml", "")
    assert find_spec(None, str(specs), hostname="box") == f"{specs}/box.toml"
    _write(specs / f"{socket.gethostname()}.toml", "")
    assert find_spec(None, str(specs)) == f"{specs}/{socket.gethostname()}.toml"


def test_find_spec_without_either_says_where_it_looked_and_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(ReconcileError) as caught:
        find_spec(None, str(tmp_path / "specs"), hostname="gpu-box-1")
    assert str(caught.value) == (
        f"no spec: --spec not given and {tmp_path}/specs/gpu-box-1.toml does not exist "
        f"(pass --spec PATH, or run `reconcile init` to write {tmp_path}/specs/gpu-box-1.toml)"
    )
    assert not isinstance(caught.value, SpecError)


def test_schema_text_lists_every_key_with_default_and_description() -> None:
    text = schema_text()
    from pydantic import BaseModel

    def keys(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, field in model.model_fields.items():
            ann = field.annotation
            sub = next(
                (
                    a
                    for a in (ann, *getattr(ann, "__args__", ()))
                    if isinstance(a, type) and issubclass(a, BaseModel)
                ),
                None,
            )
            if sub is not None:
                many = "list" in str(ann)
                keyed = str(ann).startswith("dict")  # [deployments.<name>]
                out += keys(sub, f"{prefix}{name}{'[]' if many else ''}{'.<name>' if keyed else ''}.")
            else:
                out.append(f"{prefix}{name} = ")
        return out

    for key in keys(Spec, ""):
        assert f"  {key}" in text, key
    assert "  server.port = 8000\n      a port (an integer 1-65535). --port." in text
    assert "  venv.path = (required)\n" in text
    assert "  apt.repositories[].keyring = (unset)\n" in text
    assert "[server.crash_loop]  Crash-loop guard." in text
    assert "extends" in text and "{spec_dir}" in text


TRICKY = '''
a.b.c = 1
"quoted key".x = 'lit'
[t]
s = """multi
line "" with [fake] = header
"""
u = \'\'\'raw ''
[x] y = 2\'\'\'
dt = 1979-05-27 07:32:00Z
arr = [ [1, 2], [ "a",
   "b" ], ]  # trailing comment
inl = { a = 1, b = { c = [ { d = 4 } ] } }
[[aot]]
n = 1
[aot.sub]
m = 2
[[aot]]
n = 2
[t.deeper]
k = "v"
'''


def test_the_line_index_finds_every_key_where_it_is_written() -> None:
    # tomlkit keeps no positions; the loader's own scan must agree with tomlkit about every key.
    from reconcile.spec.loader import _Scan

    index = _Scan(TRICKY).lines
    assert {
        k: index[k]
        for k in (
            "a.b.c",
            '"quoted key".x',
            "t.u",
            "t.dt",
            "t.arr[1][1]",
            "t.inl.b.c[0].d",
            "aot[0].sub.m",
            "aot[1].n",
            "t.deeper.k",
        )
    } == {
        "a.b.c": 2,
        '"quoted key".x': 3,
        "t.u": 8,
        "t.dt": 10,
        "t.arr[1][1]": 12,
        "t.inl.b.c[0].d": 13,
        "aot[0].sub.m": 17,
        "aot[1].n": 19,
        "t.deeper.k": 21,
    }
    assert "x" not in index and "x.y" not in index  # inside a multi-line literal string


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parent.parent / "specs").glob("*.toml")), ids=lambda p: p.name
)
def test_every_key_of_a_showcase_spec_is_indexed_at_its_line(path: Path) -> None:
    import tomlkit

    from reconcile.spec.loader import _Scan, dotted

    text = path.read_text()
    index, lines = _Scan(text).lines, text.splitlines()

    def walk(node: object, parts: list[str | int]) -> None:
        if parts:
            name = dotted(parts)
            assert name in index, name
            if isinstance(parts[-1], str):
                assert parts[-1] in lines[index[name] - 1], (name, index[name])
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            walk(value, [*parts, key])

    walk(tomlkit.parse(text).unwrap(), [])


def _check_indexed(text: str) -> None:
    import tomlkit

    from reconcile.spec.loader import _Scan, dotted

    index, lines = _Scan(text).lines, text.splitlines()

    def walk(node: object, parts: list[str | int]) -> None:
        if parts:
            name = dotted(parts)
            assert name in index, (name, text)
            if isinstance(parts[-1], str):
                assert parts[-1] in lines[index[name] - 1], (name, index[name], text)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            walk(value, [*parts, key])

    walk(tomlkit.parse(text).unwrap(), [])


def test_the_line_index_agrees_with_tomlkit_on_generated_documents() -> None:
    import tomlkit
    from hypothesis import given, settings
    from hypothesis import strategies as st

    keys = st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True) | st.sampled_from(["with space", "dot.ted"])
    scalars = st.integers(-5, 5) | st.booleans() | st.text("ab{}[]=#\"'\n ", max_size=8) | st.floats(0, 2)
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=12,
    )

    @settings(max_examples=150, deadline=None)
    @given(st.dictionaries(keys, values, max_size=5))
    def check(doc: dict[str, object]) -> None:
        _check_indexed(tomlkit.dumps(doc))

    check()
