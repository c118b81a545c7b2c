"""The launch identity changes exactly when a restart is needed, says why, and never stores a secret;
the command line is rendered in a stable order without the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from actions.launching import CACHE_ENV_DIRS, LaunchInputs, build_argv, launch_command, render_args
from reconcile.errors import ActionError
from reconcile.identity import explain_change, launch_identity, redact_argv
from reconcile.spec.models import Spec

ARGV = [
    "/opt/venv/bin/vllm",
    "serve",
    "/models/m",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--max-model-len",
    "1024",
]
ENV = {"PATH": "/opt/venv/bin:$PATH", "HF_HUB_OFFLINE": "1", "VLLM_API_KEY": "sk-very-secret"}
CONFIG = b'{"max_position_embeddings": 4096, "model_type": "llama"}'


def ident(**over: Any) -> Any:
    args: dict[str, Any] = {
        "argv": ARGV,
        "env": ENV,
        "secret_env_keys": {"VLLM_API_KEY"},
        "packages": {"vllm": "0.26.0"},
        "model_revision": "abc123",
        "config_json": CONFIG,
    }
    args.update(over)
    return launch_identity(**args)


def test_same_inputs_give_the_same_identity_whatever_the_env_order() -> None:
    assert ident().digest == ident(env=dict(reversed(list(ENV.items())))).digest


def test_reformatted_config_json_is_the_same_identity() -> None:
    assert (
        ident().digest
        == ident(config_json=b'{\n  "model_type": "llama",\n  "max_position_embeddings": 4096\n}').digest
    )


@pytest.mark.parametrize(
    ("over", "component", "reason"),
    [
        ({"argv": [*ARGV[:-1], "2048"]}, "argv", "args changed: --max-model-len 1024 -> 2048"),
        ({"argv": [*ARGV, "--enforce-eager"]}, "argv", "args changed: --enforce-eager added"),
        ({"argv": ARGV[:-2]}, "argv", "args changed: --max-model-len 1024 removed"),
        (
            {"argv": [ARGV[0], "serve", "/models/n", *ARGV[3:]]},
            "argv",
            "args changed: model /models/m -> /models/n",
        ),
        ({"env": {**ENV, "HF_HUB_OFFLINE": "0"}}, "env", "env changed: HF_HUB_OFFLINE 1 -> 0"),
        (
            {"env": {**ENV, "VLLM_API_KEY": "sk-rotated"}},
            "env",
            "env changed: VLLM_API_KEY (sensitive) changed",
        ),
        ({"packages": {"vllm": "0.27.0"}}, "packages", "packages changed: vllm 0.26.0 -> 0.27.0"),
        ({"packages": {"vllm": "0.26.0", "Ninja": "1.11"}}, "packages", "packages changed: ninja 1.11 added"),
        ({"model_revision": "def456"}, "model_revision", "model revision changed: abc123 -> def456"),
        ({"config_json": b'{"max_position_embeddings": 8192}'}, "config_json", "config.json changed"),
    ],
)
def test_each_input_changes_its_component_and_explains_itself(
    over: dict[str, Any], component: str, reason: str
) -> None:
    old, new = ident(), ident(**over)
    assert old.digest != new.digest
    changed = [
        k
        for k in ("argv", "env", "packages", "model_revision", "config_json")
        if old.components[k] != new.components[k]
    ]
    assert changed == [component]
    assert explain_change(old.components, new.components) == reason


def test_boolean_flip_is_shown_as_one_flag() -> None:
    old = ident(argv=[*ARGV, "--enable-prefix-caching"])
    new = ident(argv=[*ARGV, "--no-enable-prefix-caching"])
    assert explain_change(old.components, new.components) == (
        "args changed: --enable-prefix-caching -> --no-enable-prefix-caching"
    )


def test_two_inputs_changed_are_both_named() -> None:
    reason = explain_change(ident().components, ident(config_json=b"{}", model_revision="z").components)
    assert reason == "model revision changed: abc123 -> z; config.json changed"


def test_no_record_and_no_change_are_said_plainly() -> None:
    assert explain_change({}, ident().components) == "no recorded launch identity"
    assert explain_change(ident().components, ident().components) == "launch identity unchanged"


def test_secret_values_are_never_in_the_components() -> None:
    identity = ident(argv=[*ARGV, "--api-key", "sk-argv-secret"])
    text = json.dumps(dict(identity.components))
    assert "sk-very-secret" not in text and "sk-argv-secret" not in text
    assert json.loads(identity.components["env.shown"])["VLLM_API_KEY"] == "(sensitive)"


def test_redact_argv_hides_api_key_values_in_both_forms() -> None:
    assert redact_argv(["vllm", "--api-key", "a", "b", "--port", "1", "--api-key=c"]) == [
        "vllm",
        "--api-key",
        "(sensitive)",
        "(sensitive)",
        "--port",
        "1",
        "--api-key=(sensitive)",
    ]


def test_args_render_sorted_with_bools_lists_and_json() -> None:
    args: dict[str, Any] = {
        "tensor-parallel-size": 2,
        "enable-prefix-caching": False,
        "enforce-eager": True,
        "hf-overrides": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
        "cudagraph-capture-sizes": [1, 2, 4],
        "gpu-memory-utilization": 0.9,
        "middleware": ["a.B", "c.D"],
    }
    assert render_args(args) == [
        "--cudagraph-capture-sizes",
        "1",
        "2",
        "4",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.9",
        "--hf-overrides",
        '{"rope_parameters":{"factor":4.0,"rope_type":"yarn"}}',
        "--middleware",
        "a.B",
        "--middleware",
        "c.D",
        "--tensor-parallel-size",
        "2",
    ]


def _spec(tmp_path: Path, **server: Any) -> Spec:
    key = tmp_path / "key"
    key.write_text("sk-from-file\n")
    return Spec.model_validate(
        {
            "machine": {"state_dir": str(tmp_path)},
            "venv": {"path": "/opt/venv"},
            "cuda": {"home": "/usr/local/cuda"},
            "model": {"dir": "/models/m"},
            "api_key": {"file": str(key)},
            "server": {
                "name": "n",
                "log": str(tmp_path / "log"),
                "served_model_name": "nano",
                "args": {"max-model-len": "1M"},
                "env": {"HF_HUB_OFFLINE": "1"},
                **server,
            },
        }
    )


def test_launch_command_builds_argv_and_a_clean_env(tmp_path: Path) -> None:
    cmd = launch_command(
        _spec(tmp_path), LaunchInputs(), base_env={"PATH": "/usr/bin", "HOME": "/root", "X": "1"}
    )
    assert list(cmd.argv) == [
        "/opt/venv/bin/vllm",
        "serve",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served-model-name",
        "nano",
        "--max-model-len",
        "1M",
        "--shutdown-timeout",  # reconcile's drain: stop_timeout (30 s by default) less vLLM's exit
        "20",
    ]
    assert dict(cmd.env) == {
        "PATH": "/opt/venv/bin:/usr/local/cuda/bin:/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "CUDA_HOME": "/usr/local/cuda",
        "HF_HUB_OFFLINE": "1",
        "VLLM_API_KEY": "sk-from-file",
        "RECONCILE_DEPLOYMENT": f"n@{tmp_path}",  # name and state dir: unique per spec
        "RECONCILE_IDENTITY": cmd.identity.digest,
        # vLLM's compile and JIT caches, kept per machine under the state dir (docs/switching.md)
        **{name: f"{tmp_path}/vllm-cache/{sub}" for name, sub in CACHE_ENV_DIRS.items()},
    }
    assert "sk-from-file" not in repr(cmd)


def test_the_callers_path_and_home_do_not_change_the_identity(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    a = launch_command(spec, LaunchInputs(), base_env={"PATH": "/usr/bin", "HOME": "/root"})
    b = launch_command(
        spec, LaunchInputs(), base_env={"PATH": "/bin:/sbin", "HOME": "/home/x", "LANG": "de_DE"}
    )
    assert a.identity == b.identity
    assert a.env["PATH"] != b.env["PATH"]


def test_a_flag_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ActionError, match=r"args.port repeats a \[server\] field"):
        build_argv(_spec(tmp_path, args={"port": 9000}))


def test_rotating_only_hf_token_names_hf_token_not_the_api_key() -> None:
    """Issue 13: after rotating only HF_TOKEN the restart reason said the API key changed."""
    env = {**ENV, "HF_TOKEN": "hf_first_token_value_0123456789"}
    secret = {"VLLM_API_KEY", "HF_TOKEN"}
    old = ident(env=env, secret_env_keys=secret)
    new = ident(env={**env, "HF_TOKEN": "hf_rotated_token_value_987654"}, secret_env_keys=secret)
    reason = explain_change(old.components, new.components)
    assert reason == "env changed: HF_TOKEN (sensitive) changed"
    assert "hf_first" not in json.dumps(dict(old.components))
    assert "hf_rotated" not in json.dumps(dict(new.components))


def test_rotating_a_proxys_password_names_the_proxy_not_the_api_key() -> None:
    """Round 15 saw it: a URL's password is a secret since round 14b (kept as a hash, shown as
    `(sensitive)@`), but only secret names were hashed one by one, so a new proxy password read as
    `one of VLLM_API_KEY (sensitive) changed`."""
    env = {**ENV, "https_proxy": "http://user:first-pass@proxy:3128"}
    secret = {"VLLM_API_KEY"}
    old = ident(env=env, secret_env_keys=secret)
    new = ident(env={**env, "https_proxy": "http://user:second-pass@proxy:3128"}, secret_env_keys=secret)
    assert explain_change(old.components, new.components) == "env changed: https_proxy (sensitive) changed"
    assert "first-pass" not in json.dumps(dict(old.components))
    assert "second-pass" not in json.dumps(dict(new.components))
