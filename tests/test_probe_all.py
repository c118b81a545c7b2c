"""The probe runner: every probe at once, each guarded; real probes on temp dirs, with failing and
slow probes injected through `probe_all(..., probes=...)`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from probes import api_key, cuda, model
from probes.common import Absent, ProbeFailure, Unavailable
from reconcile.plan import prober as probing
from reconcile.spec.models import Spec
from tests.records_support import same

MODELS = Path(__file__).parent / "fixtures" / "models"


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A model dir and a key file in temp dirs; a CUDA home that is absent; its own nvcc cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model_dir = tmp_path / "model"
    shutil.copytree(MODELS / "llama-3.1-8b", model_dir)
    key = tmp_path / "api.key"
    key.write_text("secret\n")
    key.chmod(0o600)
    return {"model": model_dir, "key": key, "cuda": tmp_path / "no-cuda", "venv": tmp_path / "venv"}


def spec_for(m: dict[str, Path], **extra: object) -> Spec:
    return Spec.model_validate(
        {
            "gpu": {"count": 1},
            "cuda": {"home": str(m["cuda"]), "headers": ["nvrtc.h"]},
            "venv": {"path": str(m["venv"])},
            "model": {"dir": str(m["model"])},
            "api_key": {"file": str(m["key"])},
            **extra,
        }
    )


def crashes(spec: Spec) -> object:
    raise RuntimeError("NVML segfaulted, or so it says")


def slow(result: object, seconds: float = 0.5) -> probing.ProbeFn:
    def probe(spec: Spec) -> object:
        time.sleep(seconds)
        return result

    return probe


def must_not_run(spec: Spec) -> object:
    raise AssertionError("this probe's section is not in the spec")


def test_a_crashing_probe_is_its_own_failure_and_the_others_still_report(machine: dict[str, Path]) -> None:
    observed = probing.probe_all(spec_for(machine), probes={"gpu": crashes})
    assert isinstance(observed.gpu, ProbeFailure)
    assert observed.gpu.reason == "gpu probe crashed: RuntimeError: NVML segfaulted, or so it says"
    assert "Traceback" in observed.gpu.raw
    assert isinstance(observed.cuda, cuda.CudaToolkit) and observed.cuda.home.state == "absent"
    assert same(observed.venv, Absent(str(machine["venv"])))
    assert isinstance(observed.model, model.ModelObservation)
    assert isinstance(observed.model.config, model.JsonDoc)
    assert isinstance(observed.api_key, api_key.FileFacts) and observed.api_key.mode == "0600"
    assert [n for n in probing.PROBE_NAMES if isinstance(getattr(observed, n), ProbeFailure)] == ["gpu"]


def test_sections_missing_from_the_spec_are_none_and_not_probed() -> None:
    stub = {name: must_not_run for name in probing.PROBE_NAMES}
    observed = probing.probe_all(Spec(), probes=stub)
    assert observed == probing.Observed()


def test_probes_that_wait_run_at_once_beside_the_others(machine: dict[str, Path]) -> None:
    """gpu, cuda and health wait on the driver, nvcc and a socket: each in a thread, at once, while
    the file-reading probes run one after another in the caller's thread."""
    server = {"name": "nemotron", "log": str(machine["model"] / "log"), "executable": "/bin/true"}
    probes = {
        "gpu": slow(Unavailable("no GPU"), 0.5),
        "cuda": slow("cuda-observation", 0.5),
        "health": slow("health-observation", 0.5),
        "venv": slow(Absent("/opt/vllm-venv"), 0.5),
    }
    started = time.monotonic()
    observed = probing.probe_all(spec_for(machine, server=server), probes=probes)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"four 0.5 s probes took {elapsed:.2f} s: the waiting ones did not overlap"
    assert same(observed.gpu, Unavailable("no GPU")) and observed.cuda == "cuda-observation"
    assert observed.health == "health-observation" and same(observed.venv, Absent("/opt/vllm-venv"))
    assert isinstance(observed.api_key, api_key.FileFacts)


def test_file_reading_probes_run_in_the_callers_thread(machine: dict[str, Path]) -> None:
    import threading

    seen: dict[str, str] = {}

    def where(name: str) -> probing.ProbeFn:
        def probe(spec: object) -> str:
            seen[name] = threading.current_thread().name
            return name

        return probe

    server = {"name": "nemotron", "log": str(machine["model"] / "log"), "executable": "/bin/true"}
    names = ("gpu", "cuda", "apt", "venv", "model", "api_key", "server", "health")
    observed = probing.probe_all(
        spec_for(machine, server=server), probes={name: where(name) for name in names}
    )
    assert observed.venv == "venv" and observed.health == "health"
    here = threading.current_thread().name
    assert seen == {
        **dict.fromkeys(("venv", "model", "api_key", "server"), here),
        **{n: f"probe-{n}" for n in ("gpu", "cuda", "health")},
    }


def test_server_and_health_run_when_the_spec_has_a_server(machine: dict[str, Path]) -> None:
    server = {"name": "nemotron", "log": str(machine["model"] / "log"), "executable": "/bin/true"}
    probes: dict[str, probing.ProbeFn] = {
        "server": lambda s: f"server {s.server.name if s.server else None}",
        "health": lambda s: "health-observation",
    }
    observed = probing.probe_all(spec_for(machine, server=server), probes=probes)
    assert (observed.server, observed.health) == ("server nemotron", "health-observation")


def test_every_probe_of_the_table_resolves_to_its_module() -> None:
    # Probe modules are imported lazily by name: a typo in the table would only show on a spec that
    # needs that probe, so resolve every row here.
    for name in probing.PROBE_NAMES:
        assert callable(probing.default_probe(name))


def test_probe_one_re_probes_a_single_resource(machine: dict[str, Path]) -> None:
    spec = spec_for(machine)
    before = probing.probe_one(spec, "api_key")
    assert isinstance(before, api_key.FileFacts) and before.mode == "0600"
    machine["key"].chmod(0o640)
    after = probing.probe_one(spec, "api_key")
    assert isinstance(after, api_key.FileFacts) and after.mode == "0640"
    crashed = probing.probe_one(spec, "gpu", probes={"gpu": crashes})
    assert isinstance(crashed, ProbeFailure) and crashed.reason.startswith("gpu probe crashed: RuntimeError")
    assert probing.probe_one(Spec(), "model") is None


def test_unknown_probe_names_are_refused(machine: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="unknown probe"):
        probing.probe_one(spec_for(machine), "gpus")
    with pytest.raises(ValueError, match="unknown probe"):
        probing.probe_all(spec_for(machine), probes={"gpus": crashes})
