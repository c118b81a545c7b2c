"""The weights' size before download, as the planner gathers it: the safetensors index in the model dir,
else the loopback hub's listing (one metadata call, cached under the state dir, pinned to the commit;
none when offline), and the memory rule counting it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.common import Unavailable
from probes.hub import HubListing, listing
from probes.model import read_model_dir
from reconcile.plan.prober import Observed
from reconcile.preflight.gather import inputs_from
from reconcile.spec.models import Spec
from tests.fakes.hub_server import FakeHub
from tests.test_preflight import load, spec

REPO = "meta-llama/Llama-3.1-8B-Instruct"
SHARDS = {f"model-0000{i}-of-00004.safetensors": b"\x00" * (1000 + i) for i in range(1, 5)}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield h


def llama_dir(tmp_path: Path, **extra_files: Any) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(load("llama-3.1-8b")))
    for name, data in extra_files.items():
        (d / name).write_text(json.dumps(data))
    return d


def observed(model_dir: Path) -> Observed:
    return Observed(model=read_model_dir(str(model_dir), ()))


def llama_spec(tmp_path: Path, model_dir: Path, **model: Any) -> Spec:
    data = spec(model={"repo": REPO, "dir": str(model_dir), "required_files": [], "config": {}, **model})
    return Spec.model_validate({**data.model_dump(), "machine": {"state_dir": str(tmp_path / "state")}})


def metadata_calls(hub: FakeHub) -> int:
    return sum(1 for r in hub.requests() if r.path.startswith("/api/models/"))


def test_the_index_total_size_counts_before_the_shards_are_there(tmp_path: Path) -> None:
    index = {"metadata": {"total_size": 16_060_522_496}, "weight_map": {}}
    d = llama_dir(tmp_path, **{"model.safetensors.index.json": index})
    inputs = inputs_from(llama_spec(tmp_path, d, offline=True), observed(d))
    assert inputs.weights is not None and inputs.weights.total == 16_060_522_496
    assert inputs.weights.source == f"model.safetensors.index.json in {d}"


def test_the_hub_listing_is_one_cached_call_pinned_to_the_commit(tmp_path: Path, hub: FakeHub) -> None:
    commit = hub.add_commit(REPO, {"config.json": b"{}", **SHARDS})
    d = llama_dir(tmp_path)
    s = llama_spec(tmp_path, d)

    first = inputs_from(s, observed(d)).weights
    assert first is not None and first.total == sum(len(b) for b in SHARDS.values()) and first.files == 4
    assert first.source == f"the hub's listing of {REPO}@{commit[:12]}"
    assert metadata_calls(hub) == 1 and not hub.downloads()  # sizes only: nothing downloaded

    assert inputs_from(s, observed(d)).weights == first  # the next plan answers from the cache
    assert metadata_calls(hub) == 1
    cached = tmp_path / "state" / "cache" / "hub" / "meta-llama__Llama-3.1-8B-Instruct"
    assert sorted(p.name for p in cached.iterdir()) == sorted([f"{commit}.json", "main.json"])
    assert stat.S_IMODE(os.stat(cached / "main.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cached).st_mode) == 0o700


def test_offline_never_asks_the_hub_and_the_memory_rule_estimates(tmp_path: Path, hub: FakeHub) -> None:
    hub.add_commit(REPO, {"config.json": b"{}", **SHARDS})
    d = llama_dir(tmp_path)
    inputs = inputs_from(llama_spec(tmp_path, d, offline=True), observed(d))
    assert inputs.weights is None and metadata_calls(hub) == 0
    found = listing(REPO, "main", str(tmp_path / "cache"), offline=True)
    assert isinstance(found, Unavailable) and "offline" in found.reason


def test_a_hub_that_does_not_know_the_repo_leaves_the_weights_unknown(tmp_path: Path, hub: FakeHub) -> None:
    found = listing("nobody/nothing", "main", str(tmp_path / "cache"), offline=False)
    assert isinstance(found, Unavailable) and "nobody/nothing@main" in found.reason
    assert metadata_calls(hub) == 1
    # The next plans (a timer's) do not wait on the hub again for a while.
    again = listing("nobody/nothing", "main", str(tmp_path / "cache"), offline=False)
    assert isinstance(again, Unavailable) and "asked less than 15 minutes ago" in again.reason
    assert metadata_calls(hub) == 1
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_repo_ids_that_would_escape_the_cache_dir_are_refused(tmp_path: Path, hub: FakeHub) -> None:
    for repo, rev in (("../../etc", "main"), ("a/b", "../x"), ("a/b", "x/y")):
        found = listing(repo, rev, str(tmp_path / "cache"), offline=False)
        assert isinstance(found, Unavailable), (repo, rev)
    assert metadata_calls(hub) == 0


def test_a_commit_listing_is_used_from_the_cache_even_offline(tmp_path: Path, hub: FakeHub) -> None:
    commit = hub.add_commit(REPO, {"config.json": b"{}", **SHARDS})
    cache = str(tmp_path / "cache")
    assert isinstance(listing(REPO, commit, cache, offline=False), HubListing)
    again = listing(REPO, commit, cache, offline=True)
    assert isinstance(again, HubListing) and again.cached and again.commit == commit


def test_the_planner_budgets_from_cudas_total_not_nvmls(tmp_path: Path) -> None:
    # vLLM multiplies gpu-memory-utilization by cudaMemGetInfo's total, which leaves out the 615 MiB
    # the H200's driver reserves; NVML's total counts them.
    from probes import gpu
    from tests.fakes import fake_nvml

    s = spec(gpu={"count": 1, "name": "NVIDIA H200", "compute_capability": "9.0"})
    inventory = gpu.probe(s, nvml=fake_nvml.h200())
    inputs = inputs_from(s, Observed(gpu=inventory))
    assert inputs.gpus is not None
    assert inputs.gpus[0].total_bytes == (143771 - 615) * 2**20
