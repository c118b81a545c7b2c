"""The store by default (issue 26, items 1 and 2): the demo spec with no `[venv] store` line realizes
its venv and its model under `<state_dir>/store`; the model's files are kept by content in
huggingface_hub's cache layout; a rollback across a local source edit restores the exact bytes,
offline, and holds; gc keeps what runs. Real venvs from a local wheelhouse, real files, the fake vLLM."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from tests.apply_support import DEMO_MODEL, Demo, demo_in
from tests.generations_support import build_wheelhouse, cli_env, offline_env, server_cmdline


@pytest.fixture
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.getbasetemp())


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


def _spec(demo: Demo, wheels: Path, version: str, source: Path, **venv: Any) -> Path:
    """specs/cpu-demo.toml as a user has it (no store line), its one package tinyserve from the local
    wheelhouse (so the test runs offline), its model copied from a source directory the test edits."""

    def edit(doc: Any) -> None:
        doc["venv"]["wheelhouse"] = str(wheels)
        doc["venv"]["installer"] = "pip"
        packages = tomlkit.inline_table()
        packages.update({"tinyserve": f"=={version}"})
        doc["venv"]["packages"] = packages
        for key, value in venv.items():
            doc["venv"][key] = value
        doc["model"]["source"] = str(source)
        del doc["server"]["executable"]  # served by tinyserve's `vllm`, from the generation's venv

    return demo.write_spec(edit)


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "demo-model-src"
    shutil.copytree(DEMO_MODEL, source)
    return source


def _hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below `root` (followed through the `[model] dir` link)."""
    out = {}
    for directory, _dirs, names in os.walk(os.path.realpath(root)):
        for name in names:
            path = Path(directory) / name
            out[str(path.relative_to(os.path.realpath(root)))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _store(demo: Demo) -> Path:
    return demo.state_dir / "store"


def _realizations(demo: Demo, kind: str) -> list[Path]:
    return sorted(p for p in _store(demo).iterdir() if p.name.endswith(f"-{kind}"))


def test_the_demo_spec_realizes_venv_and_model_and_rolls_back_across_a_source_edit_offline(
    demo: Demo, wheels: Path, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    # A: the demo spec, no store line: both realized under <state_dir>/store, the profile links made.
    _spec(demo, wheels, "1.0", source)
    plan = demo.cli("plan")
    assert "store" not in plan.stdout or "made before the store" not in plan.stdout, plan.output
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    (venv_a,) = _realizations(demo, "venv")
    (model_a,) = _realizations(demo, "model")
    assert os.readlink(demo.venv) == str(venv_a) and os.readlink(demo.model_dir) == str(model_a)
    assert f"{venv_a}/bin/vllm serve {model_a}" in server_cmdline(demo)
    bytes_a = _hashes(demo.model_dir)
    assert json.loads((demo.model_dir / "config.json").read_text())["rope_parameters"]["factor"] == 2.0

    # Kept by content in huggingface_hub's cache layout: each file a hard link to blobs/<sha256>, the
    # snapshot (id: a hash of the source's content) links to the blobs, read back by scan_cache_dir.
    from huggingface_hub import scan_cache_dir

    seal = json.loads((model_a / ".reconcile-realization.json").read_text())
    repo = _store(demo) / "hub" / "models--local--demo-model-src"
    assert seal["repo_folder"] == repo.name
    tokenizer = model_a / "tokenizer_config.json"
    blob = repo / "blobs" / hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    assert os.path.samefile(blob, tokenizer)
    original = repo / "snapshots" / seal["snapshot"] / "config.json"
    assert original.is_symlink() and original.read_bytes() == (source / "config.json").read_bytes()
    assert not os.path.samefile(model_a / "config.json", original)  # its own, patched
    cache = scan_cache_dir(_store(demo) / "hub")
    assert [(r.repo_id, [v.commit_hash for v in r.revisions]) for r in cache.repos] == [
        ("local/demo-model-src", [seal["snapshot"]])
    ]

    # B: one package changed; the model is the same realization.
    _spec(demo, wheels, "2.0", source)
    second = demo.cli("apply")
    assert second.returncode == 2, second.output
    (venv_b,) = [p for p in _realizations(demo, "venv") if p != venv_a]
    assert _realizations(demo, "model") == [model_a]
    assert f"{venv_b}/bin/vllm serve {model_a}" in server_cmdline(demo)

    # B': a model file edited in the local source (the same size: only its content tells).
    text = (source / "tokenizer_config.json").read_text()
    edited = text.replace('"', "'", 1) if text.count('"') else text
    edited = text.replace("true", "TRUE", 1) if edited == text else edited
    assert edited != text and len(edited) == len(text)
    (source / "tokenizer_config.json").write_text(edited)
    third = demo.cli("apply")
    assert third.returncode == 2, third.output
    (model_b,) = [p for p in _realizations(demo, "model") if p != model_a]
    assert os.readlink(demo.model_dir) == str(model_b)
    assert (demo.model_dir / "tokenizer_config.json").read_text() == edited
    assert f"{venv_b}/bin/vllm serve {model_b}" in server_cmdline(demo)
    assert _hashes(model_a) == bytes_a  # never written to again
    starts = demo.starts_in_log()

    # Rollback to A, with the wheelhouse gone and every index unreachable: A's venv and A's bytes.
    shutil.move(str(wheels), str(tmp_path / "wheels-away"))
    try:
        offline = offline_env(demo)
        back = cli_env(demo, "rollback", "1", env=offline)
        assert back.returncode == 2, back.output
        assert "rolled back to generation 1" in back.stdout, back.output
        assert f"{venv_a}/bin/vllm serve {model_a}" in server_cmdline(demo)
        assert os.readlink(demo.model_dir) == str(model_a) and os.readlink(demo.venv) == str(venv_a)
        assert _hashes(demo.model_dir) == bytes_a
        assert demo.starts_in_log() == starts + 1
        assert (source / "tokenizer_config.json").read_text() == edited  # the source is not touched
        pid = int(demo.pidfile.read_text().split()[0])

        # It holds: a scheduled apply keeps it, restarts nothing, copies nothing.
        again = cli_env(demo, "apply", "--scheduled", env=offline)
        assert again.returncode == 0, again.output
        assert int(demo.pidfile.read_text().split()[0]) == pid and demo.starts_in_log() == starts + 1
        assert _hashes(demo.model_dir) == bytes_a

        # gc keeps what runs (and what the spec and the last generations use); A's bytes stay.
        gc = cli_env(demo, "gc", "--keep", "0", env=offline)
        assert gc.returncode == 0, gc.output
        for kept in (model_a, venv_a):  # running, and current: either reason is said
            assert f"kept     {kept}: a running process uses it" in gc.stdout, gc.output
        assert venv_a.is_dir() and _hashes(demo.model_dir) == bytes_a and blob.is_file()
        assert int(demo.pidfile.read_text().split()[0]) == pid
    finally:
        shutil.move(str(tmp_path / "wheels-away"), str(wheels))


def test_gc_removes_an_unused_model_realization_and_the_blobs_only_it_held(
    demo: Demo, wheels: Path, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    _spec(demo, wheels, "1.0", source)
    assert demo.cli("apply").returncode == 2
    (model_a,) = _realizations(demo, "model")
    repo = _store(demo) / "hub" / "models--local--demo-model-src"
    old_template = hashlib.sha256((source / "chat_template.jinja").read_bytes()).hexdigest()
    kept_blob = repo / "blobs" / hashlib.sha256((source / "tokenizer_config.json").read_bytes()).hexdigest()
    (source / "chat_template.jinja").write_text("{{ messages }}\n")  # B: another template
    assert demo.cli("apply").returncode == 2
    (model_b,) = [p for p in _realizations(demo, "model") if p != model_a]
    assert (repo / "blobs" / old_template).is_file()
    # Kept: the current (B, running) only: A's realization, its snapshot and its one own blob go.
    gc = demo.cli("gc", "--keep", "1")
    assert gc.returncode == 0, gc.output
    assert f"removed  {model_a}" in gc.stdout, gc.output
    assert not model_a.exists() and model_b.is_dir()
    assert not (repo / "blobs" / old_template).exists()
    assert kept_blob.is_file() and os.path.samefile(kept_blob, model_b / "tokenizer_config.json")
    from huggingface_hub import scan_cache_dir

    (cached,) = scan_cache_dir(_store(demo) / "hub").repos
    assert [v.commit_hash for v in cached.revisions] == [
        json.loads((model_b / ".reconcile-realization.json").read_text())["snapshot"]
    ]
    assert demo.cli("plan").returncode == 0


def test_store_false_keeps_everything_in_place_and_the_plan_says_what_is_lost(
    demo: Demo, wheels: Path, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    _spec(demo, wheels, "1.0", source, store=False)
    plan = demo.cli("plan")
    assert "[venv] store = false: nothing is realized" in plan.stdout, plan.output
    assert demo.cli("apply").returncode == 2
    assert demo.venv.is_dir() and not demo.venv.is_symlink()
    assert demo.model_dir.is_dir() and not demo.model_dir.is_symlink()
    assert not _store(demo).exists()
    assert f"{demo.venv}/bin/vllm serve {demo.model_dir}" in server_cmdline(demo)


def test_a_model_dir_made_before_the_store_is_used_in_place_and_never_broken(
    demo: Demo, wheels: Path, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    _spec(demo, wheels, "1.0", source, store=False)
    assert demo.cli("apply").returncode == 2  # an older reconcile's layout: real venv, real model dir
    before = _hashes(demo.model_dir)
    _spec(demo, wheels, "1.0", source)  # the store is now the default
    plan = demo.cli("plan")
    assert plan.returncode == 0, plan.output
    for what, path in (("[venv] path", demo.venv), ("[model] dir", demo.model_dir)):
        assert f"{what} {path} was made before the store: used in place" in plan.stdout, plan.output
    assert demo.cli("apply").returncode == 0
    assert not demo.model_dir.is_symlink() and _hashes(demo.model_dir) == before
    assert f"{demo.venv}/bin/vllm serve {demo.model_dir}" in server_cmdline(demo)


def test_a_hub_model_is_kept_in_huggingface_hubs_cache_and_an_older_commit_comes_back_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import scan_cache_dir

    from reconcile.cli import main
    from tests.fakes.hub_server import FakeHub

    def spec(revision: str) -> Path:
        path = tmp_path / "specs" / "box.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'[machine]\nstate_dir = "{tmp_path / "state"}"\n\n[model]\nrepo = "org/toy"\n'
            f'revision = "{revision}"\ndir = "{tmp_path / "model"}"\nconfig = {{ rope_theta = 5.0 }}\n'
        )
        return path

    weights = os.urandom(1 << 20)
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        first = hub.add_commit("org/toy", {"config.json": b'{"a": 1}\n', "model.safetensors": weights})
        second = hub.add_commit("org/toy", {"config.json": b'{"a": 2}\n', "model.safetensors": weights})
        assert main(["apply", "--spec", str(spec(first))]) == 2
        model_1 = Path(os.readlink(tmp_path / "model"))
        bytes_1 = _hashes(tmp_path / "model")
        assert main(["apply", "--spec", str(spec(second))]) == 2
        model_2 = Path(os.readlink(tmp_path / "model"))
        assert model_2 != model_1 and json.loads((model_2 / "config.json").read_text()) == {
            "a": 2,
            "rope_theta": 5.0,
        }
        weights_downloads = len(hub.downloads("model.safetensors"))
    store = tmp_path / "state" / "store"
    (cached,) = scan_cache_dir(store / "hub").repos
    assert cached.repo_id == "org/toy" and {r.commit_hash for r in cached.revisions} == {first, second}
    # One blob for the weights both commits hold; each realization's file is that blob.
    blob = store / "hub" / "models--org--toy" / "blobs" / hashlib.sha256(weights).hexdigest()
    assert os.path.samefile(blob, model_1 / "model.safetensors")
    assert os.path.samefile(blob, model_2 / "model.safetensors") and weights_downloads == 1
    # The hub is gone: the first commit comes back from the store, its exact bytes.
    # No file changes (the realization is all there): the profile link moves back, generation 1 again.
    assert main(["apply", "--spec", str(spec(first))]) in (0, 2)
    assert os.readlink(tmp_path / "model") == str(model_1) and _hashes(tmp_path / "model") == bytes_1
    assert main(["plan", "--spec", str(spec(first))]) == 0
