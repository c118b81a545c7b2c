"""Model probe: real model directories in temp dirs, built from the recorded config fixtures."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from probes import model
from probes.common import Absent, Invalid
from reconcile.spec.models import Spec
from tests.records_support import same

MODELS = Path(__file__).parent / "fixtures" / "models"
REQUIRED = ["nano_v3_reasoning_parser.py", "chat_template.jinja"]


def spec_for(path: Path, required: list[str] = REQUIRED) -> Spec:
    return Spec.model_validate({"model": {"dir": str(path), "required_files": required}})


@pytest.fixture
def nemotron_dir(tmp_path: Path) -> Path:
    """A Nemotron-H download as `hf download --local-dir` leaves it (weights shrunk to a few bytes)."""
    root = tmp_path / "NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
    root.mkdir()
    for name in ("config.json", "hf_quant_config.json"):
        shutil.copy(MODELS / "nemotron-h-nano" / name, root / name)
    for i in (1, 2):
        (root / f"model-0000{i}-of-00002.safetensors").write_bytes(b"\0" * (1000 * i))
    (root / "nano_v3_reasoning_parser.py").write_text("# parser plugin\n")
    (root / "tokenizer" / "extra").mkdir(parents=True)
    (root / "tokenizer" / "extra" / "merges.txt").write_text("a b\n")
    (root / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("abc\n")
    files = {"config.json": (root / "config.json").stat().st_size}
    (root / model.RECORD_NAME).write_text(
        json.dumps(
            {
                "repo": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4",
                "revision": "main",
                "commit": "4f0cf9da" * 5,
                "files": files,
            }
        )
    )
    return root


def test_no_model_section_probes_nothing() -> None:
    assert model.probe(Spec()) is None


def test_downloaded_nemotron_directory(nemotron_dir: Path) -> None:
    result = model.probe(spec_for(nemotron_dir))
    assert isinstance(result, model.ModelObservation)
    assert result.files == {
        model.RECORD_NAME: (nemotron_dir / model.RECORD_NAME).stat().st_size,
        "config.json": (MODELS / "nemotron-h-nano" / "config.json").stat().st_size,
        "hf_quant_config.json": (MODELS / "nemotron-h-nano" / "hf_quant_config.json").stat().st_size,
        "model-00001-of-00002.safetensors": 1000,
        "model-00002-of-00002.safetensors": 2000,
        "nano_v3_reasoning_parser.py": 16,
        os.path.join("tokenizer", "extra", "merges.txt"): 4,
    }
    assert isinstance(result.record, model.DownloadRecord)
    assert (result.record.repo, result.record.revision, result.record.commit) == (
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4",
        "main",
        "4f0cf9da" * 5,
    )
    assert isinstance(result.config, model.JsonDoc)
    cfg = result.config.data
    assert cfg["architectures"] == ["NemotronHForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
        2688,
        52,
        2,
        128,
    )
    assert cfg["hybrid_override_pattern"].count("*") == 6
    assert isinstance(result.quant_config, model.JsonDoc)
    assert result.quant_config.data["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert same(result.config_backup, Absent(str(nemotron_dir / "config.json.bak")))
    assert result.required == {"nano_v3_reasoning_parser.py": True, "chat_template.jinja": False}
    assert result.missing_required == ("chat_template.jinja",)
    assert result.broken_links == ()


def test_patched_config_with_its_backup(nemotron_dir: Path) -> None:
    shutil.copy(nemotron_dir / "config.json", nemotron_dir / "config.json.bak")
    patched = json.loads((nemotron_dir / "config.json").read_text())
    patched["rope_parameters"] = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 262144,
    }
    (nemotron_dir / "config.json").write_text(json.dumps(patched, indent=2))
    result = model.probe(spec_for(nemotron_dir))
    assert isinstance(result, model.ModelObservation)
    assert isinstance(result.config, model.JsonDoc) and isinstance(result.config_backup, model.JsonDoc)
    assert result.config.data["rope_parameters"]["factor"] == 4.0
    assert "rope_parameters" not in result.config_backup.data


def test_llama_config_fixture_reads_its_rope_scaling(tmp_path: Path) -> None:
    shutil.copytree(MODELS / "llama-3.1-8b", tmp_path / "llama")
    result = model.probe(spec_for(tmp_path / "llama", []))
    assert isinstance(result, model.ModelObservation) and isinstance(result.config, model.JsonDoc)
    cfg = result.config.data
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (32, 32, 8)
    assert cfg["max_position_embeddings"] == 131072
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["rope_scaling"]["factor"] == 8.0
    assert same(result.quant_config, Absent(str(tmp_path / "llama" / "hf_quant_config.json")))
    assert same(result.record, Absent(str(tmp_path / "llama" / model.RECORD_NAME)))


def test_truncated_config_json_is_invalid_with_the_parser_message_and_text(nemotron_dir: Path) -> None:
    text = (nemotron_dir / "config.json").read_text()[:200]
    (nemotron_dir / "config.json").write_text(text)
    result = model.probe(spec_for(nemotron_dir))
    assert isinstance(result, model.ModelObservation)
    assert isinstance(result.config, Invalid)
    assert result.config.message.startswith("not valid JSON: ")
    assert result.config.raw == text


def test_config_json_that_is_not_an_object_is_invalid(nemotron_dir: Path) -> None:
    (nemotron_dir / "config.json").write_text("[1, 2]")
    result = model.probe(spec_for(nemotron_dir))
    assert isinstance(result, model.ModelObservation) and isinstance(result.config, Invalid)
    assert "expected a JSON object, found list" in result.config.message


def test_download_record_with_missing_fields_is_invalid(nemotron_dir: Path) -> None:
    (nemotron_dir / model.RECORD_NAME).write_text(json.dumps({"repo": "x/y", "files": {"a": "big"}}))
    result = model.probe(spec_for(nemotron_dir))
    assert isinstance(result, model.ModelObservation) and isinstance(result.record, Invalid)
    assert result.record.message == "download record has bad or missing revision, commit, files"


def test_broken_symlink_is_reported_not_sized(nemotron_dir: Path) -> None:
    os.symlink(nemotron_dir / "blobs" / "gone", nemotron_dir / "model-00003-of-00003.safetensors")
    result = model.probe(spec_for(nemotron_dir))
    assert isinstance(result, model.ModelObservation)
    assert result.broken_links == ("model-00003-of-00003.safetensors",)
    assert "model-00003-of-00003.safetensors" not in result.files


def test_absent_dir_and_a_file_in_its_place(tmp_path: Path) -> None:
    assert same(model.probe(spec_for(tmp_path / "none")), Absent(str(tmp_path / "none")))
    (tmp_path / "file").write_text("")
    result = model.probe(spec_for(tmp_path / "file"))
    assert isinstance(result, Invalid) and "not a directory" in result.message
