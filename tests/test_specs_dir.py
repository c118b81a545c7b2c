"""Every spec in specs/ loads; the showcase specs say what the reference article and gpu-lab say.

A file that another spec extends (base.toml) is a partial, not a machine: it is checked through
the specs that extend it, and it must be extended by at least one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from reconcile.spec.loader import LoadedSpec, load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
SHARED = Path("/work/shared")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="the project's shared/ references are not here")


def _extends(path: Path) -> str | None:
    m = re.search(r'^extends\s*=\s*"([^"]+)"', path.read_text(), re.M)
    return str((path.parent / m.group(1)).resolve()) if m else None


ALL = sorted(SPECS.glob("*.toml"))
PARTIALS = {p for p in (_extends(f) for f in ALL) if p}
MACHINES = [p for p in ALL if str(p.resolve()) not in PARTIALS]


def _load(name: str) -> LoadedSpec:
    return load_spec(str(SPECS / name))


def test_the_showcase_specs_are_there() -> None:
    assert {p.name for p in ALL} >= {"base.toml", "blackwell-2x5090.toml", "h200-lab.toml", "cpu-demo.toml"}
    assert [p.name for p in ALL if str(p.resolve()) in PARTIALS] == ["base.toml"]


@pytest.mark.parametrize("path", MACHINES, ids=lambda p: p.name)
def test_every_machine_spec_loads(path: Path) -> None:
    loaded = load_spec(str(path))
    assert loaded.files[0] == str(path)
    assert all(os.path.isfile(f) for f in loaded.files)


def test_every_partial_is_extended_and_used() -> None:
    used = {f for p in MACHINES for f in load_spec(str(p)).files[1:]}
    assert used >= PARTIALS


@needs_shared
def test_the_reference_machine_is_the_article_launch_script() -> None:
    loaded = _load("blackwell-2x5090.toml")
    spec = loaded.spec
    assert spec.gpu is not None and spec.cuda is not None and spec.apt is not None
    assert spec.venv is not None and spec.model is not None and spec.server is not None
    assert spec.api_key is not None
    assert loaded.files[1] == str(SPECS / "base.toml")
    assert (spec.gpu.count, spec.gpu.compute_capability, spec.gpu.memory_gib, spec.gpu.min_driver) == (
        2,
        "12.0",
        31.36,
        "580.95",
    )
    assert (spec.cuda.home, spec.cuda.target, spec.cuda.gpu_arch, spec.cuda.min_version) == (
        "/usr/local/cuda",
        "/usr/local/cuda-13.0",
        ["compute_120"],
        "12.9",
    )
    assert spec.cuda.headers == ["cublasLt.h", "curand_kernel.h", "nvrtc.h", "cusparse.h"]
    article = (SHARED / "reference/nemotron-on-blackwell.txt").read_text()
    step2 = article[article.index("Step 2") : article.index("Reasoning: vLLM nightly")]
    step2_packages = set(re.findall(r"^([a-z0-9.+-]+-(?:13-0|cuda-13)) ?\\?$", step2, re.M))
    assert len(step2_packages) == 10 and step2_packages <= set(spec.apt.packages)
    assert len(set(spec.apt.packages)) == 11  # the ten of step 2 and step 1's python3.10-venv
    assert (spec.venv.path, spec.venv.python, spec.venv.extra_index_urls) == (
        "/opt/vllm-venv",
        "python3.10",
        ["https://wheels.vllm.ai/nightly"],
    )
    assert spec.venv.packages == {"ninja": "*", "huggingface_hub": "*", "vllm": ">=0.26.0rc1"}
    assert spec.model.repo == "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
    assert spec.model.dir == "/root/models/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
    assert spec.model.config == {
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
    }
    assert spec.api_key.file == "/root/vllm-api.key"
    assert (spec.server.name, spec.server.host, spec.server.port, spec.server.served_model_name) == (
        "nemotron",
        "0.0.0.0",
        20000,
        "nemotron-nano",
    )
    assert (spec.server.log, spec.server.startup_timeout) == ("/var/log/vllm/nemotron.log", 900.0)
    # Every flag of the launch script but --api-key (the key goes by environment), in its words.
    script = article[article.index("exec $VENV/bin/vllm serve") : article.index(">> $LOG")]
    flags = dict(re.findall(r"--([a-z-]+)(?: ([^\s\\]+))?", script))
    flags.pop("api-key")
    for owned in ("host", "port", "served-model-name"):
        flags.pop(owned)
    flags["reasoning-parser-plugin"] = flags["reasoning-parser-plugin"].replace("$MODEL_DIR", spec.model.dir)

    def same(text: str) -> str:  # 0.90 in the script, 0.9 once parsed
        return repr(float(text)) if re.fullmatch(r"[\d.]+", text) else text

    rendered = {k: "" if v is True else same(str(v)) for k, v in spec.server.args.items()}
    assert rendered == {k: same(v) for k, v in flags.items()}
    exports = dict(re.findall(r"^export (\w+)=(\S+)$", article, re.M))
    assert exports.pop("PATH") == "/opt/vllm-venv/bin:/usr/local/cuda/bin:$PATH"  # the launcher's own
    assert exports.pop("CUDA_HOME") == spec.cuda.home  # likewise, from [cuda]
    assert spec.server.env == exports


@needs_shared
def test_the_h200_lab_spec_matches_the_gpu_lab_readme() -> None:
    spec = _load("h200-lab.toml").spec
    assert spec.gpu is not None and spec.cuda is not None and spec.venv is not None
    assert spec.model is not None and spec.server is not None
    assert (spec.gpu.name, spec.gpu.compute_capability, spec.gpu.count) == ("NVIDIA H200", "9.0", 1)
    assert (spec.cuda.target, spec.cuda.gpu_arch) == (None, ["compute_90"])
    assert spec.apt is None
    assert spec.venv.extra_site_packages == ["/opt/torch/.venv/lib/python3.12/site-packages"]
    assert (spec.venv.wheelhouse, spec.venv.no_deps) == ("/opt/reconcile-lab/wheelhouse", True)
    wheels = (SHARED / "gpu-lab/wheels.txt").read_text()
    pins = {name: f"=={version}" for name, version in re.findall(r"^([\w.-]+)==(\S+)$", wheels, re.M)}
    assert spec.venv.packages == {"vllm": "==0.26.0", **pins}
    readme = (SHARED / "gpu-lab/README.md").read_text()
    offline = re.search(r"Environment for an offline start: `([^`]+)`", readme.replace("\n  ", " "))
    assert offline is not None
    assert spec.server.env == dict(kv.split("=") for kv in offline.group(1).split())
    assert spec.model.source == "/opt/reconcile-lab/tiny-llama-src"
    assert spec.server.args == {"max-model-len": 1024, "enforce-eager": True, "gpu-memory-utilization": 0.3}
    assert spec.machine.state_dir == "/opt/reconcile-lab/state"


def test_the_cpu_demo_writes_only_under_tmp_and_runs_the_fake_vllm() -> None:
    spec = _load("cpu-demo.toml").spec
    assert spec.gpu is None and spec.cuda is None
    assert spec.venv is not None and spec.model is not None and spec.server is not None
    assert spec.api_key is not None
    written = [
        spec.machine.state_dir,
        spec.venv.path,
        spec.model.dir,
        spec.api_key.file,
        spec.server.log,
        spec.server.pidfile,
    ]
    assert all(str(p).startswith("/tmp/reconcile-demo/") for p in written), written
    repo = SPECS.parent
    assert spec.server.executable == str(repo / "tests/fakes/vllm")
    assert spec.model.source == str(SPECS / "demo-model")
    for name in spec.model.required_files:
        assert (SPECS / "demo-model" / name).is_file()
