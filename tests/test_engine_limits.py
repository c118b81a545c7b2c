"""The max_model_len vLLM derives, on the real config.json of NemotronH Nano 30B and Llama 3.1 8B."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconcile.vllm.limits import (
    MaxLenError,
    apply_hf_overrides,
    auto_supported,
    derive_max_model_len,
    parse_max_model_len,
    rope_factor_for,
    ways_to_extend,
)

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"
YARN_1M = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}


def load(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return config


@pytest.fixture
def nemotron() -> dict[str, Any]:
    return load("nemotron-h-nano")


@pytest.fixture
def llama() -> dict[str, Any]:
    return load("llama-3.1-8b")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1048576, 1048576),
        ("1M", 1048576),
        ("1m", 1_000_000),
        ("32k", 32_000),
        ("32K", 32_768),
        ("25.6k", 25_600),
        ("131072", 131072),
        ("auto", None),
        (-1, None),
        ("-1", None),
    ],
)
def test_max_model_len_is_read_as_vllm_reads_it(value: object, expected: int | None) -> None:
    assert parse_max_model_len(value) == expected


@pytest.mark.parametrize("value", ["1.5M", "lots", True, [1]])
def test_max_model_len_that_vllm_rejects_is_an_error(value: object) -> None:
    with pytest.raises(MaxLenError):
        parse_max_model_len(value)


def test_nemotron_unpatched_is_its_native_256k(nemotron: dict[str, Any]) -> None:
    d = derive_max_model_len(nemotron, "0.26.0")
    assert (d.value, d.key, d.rope_type) == (262144, "max_position_embeddings", None)


def test_yarn_factor_4_gives_the_articles_1m_up_to_0_29(nemotron: dict[str, Any]) -> None:
    patched = {**nemotron, "rope_parameters": YARN_1M}
    d = derive_max_model_len(patched, "0.26.0rc1")
    assert d.value == 1048576 == 262144 * 4
    # The article's error text, gotcha 2: "(max_position_embeddings=1048576.0)".
    assert d.vllm_message(1056768) == (
        "User-specified max_model_len (1056768) is greater than the derived max_model_len "
        "(max_position_embeddings=1048576.0 or model_max_length=None in model's config.json)."
    )
    assert d.allows(1048576) and not d.allows(1048577)
    assert derive_max_model_len(patched, "0.29.0").value == 1048576


def test_yarn_is_not_scaled_from_0_30(nemotron: dict[str, Any]) -> None:
    patched = {**nemotron, "rope_parameters": YARN_1M}
    d = derive_max_model_len(patched, "0.30.0")
    assert (d.value, d.factor, d.rope_type) == (262144, 1.0, "yarn")
    assert "not scaled from vLLM 0.30" in d.note
    fixes = ways_to_extend(d, 1048576, "0.30.0", patched)
    assert fixes == [
        "or (vLLM >= 0.30 no longer scales yarn) [model] config = { max_position_embeddings = 1048576 }"
    ]


def test_rope_parameters_are_invisible_before_0_12_but_legacy_rope_scaling_is_read(
    nemotron: dict[str, Any],
) -> None:
    assert derive_max_model_len({**nemotron, "rope_parameters": YARN_1M}, "0.11.0").value == 262144
    legacy = {
        **nemotron,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144},
    }
    assert derive_max_model_len(legacy, "0.11.0").value == 1048576
    assert derive_max_model_len(legacy, "0.26.0").value == 1048576  # converted from 0.12 on


def test_llama3_rope_scaling_does_not_scale_the_length(llama: dict[str, Any]) -> None:
    d = derive_max_model_len(llama, "0.26.0")
    assert (d.value, d.rope_type) == (131072, "llama3")
    assert d.raw == 131072.0


@pytest.mark.parametrize("rope_type", ["linear", "dynamic"])
def test_linear_and_dynamic_multiply_by_factor(llama: dict[str, Any], rope_type: str) -> None:
    config = {
        **llama,
        "max_position_embeddings": 8192,
        "rope_scaling": {"rope_type": rope_type, "factor": 2.0},
    }
    assert derive_max_model_len(config, "0.26.0").value == 16384


def test_per_layer_type_rope_parameters_are_understood(llama: dict[str, Any]) -> None:
    config = {**llama, "max_position_embeddings": 4096,
              "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0},
                                  "sliding_attention": {"rope_type": "default"}}}  # fmt: skip
    assert derive_max_model_len(config, "0.26.0").value == 8192


def test_model_max_length_in_config_wins_and_tokenizer_caps(llama: dict[str, Any]) -> None:
    assert derive_max_model_len({**llama, "model_max_length": 65536}, "0.26.0").key == "model_max_length"
    d = derive_max_model_len(llama, "0.26.0", tokenizer_config={"model_max_length": 32768})
    assert d.value == 32768


def test_multimodal_configs_use_their_text_config(llama: dict[str, Any]) -> None:
    wrapped = {"model_type": "llava", "text_config": llama, "vision_config": {"image_size": 336}}
    assert derive_max_model_len(wrapped, "0.26.0").value == 131072


def test_disabled_sliding_window_caps_the_length(llama: dict[str, Any]) -> None:
    config = {**llama, "sliding_window": 4096}
    assert derive_max_model_len(config, "0.26.0").value == 131072
    d = derive_max_model_len(config, "0.26.0", disable_sliding_window=True)
    assert (d.value, d.key) == (4096, "sliding_window")


def test_a_config_without_length_keys_gets_2048() -> None:
    d = derive_max_model_len({"model_type": "tiny", "hidden_size": 64}, "0.26.0")
    assert (d.value, d.key) == (2048, "default")


def test_hf_overrides_merge_into_config(nemotron: dict[str, Any]) -> None:
    merged = apply_hf_overrides(nemotron, json.dumps({"rope_parameters": YARN_1M}))
    assert derive_max_model_len(merged, "0.26.0").value == 1048576
    assert apply_hf_overrides(nemotron, "not json") is nemotron


def test_extension_advice_names_the_yarn_factor_for_the_requested_length(nemotron: dict[str, Any]) -> None:
    d = derive_max_model_len(nemotron, "0.26.0")
    assert rope_factor_for(1048576, 262144) == 4.0
    assert rope_factor_for(300000, 262144) == 1.5
    assert ways_to_extend(d, 1048576, "0.26.0", nemotron) == [
        'or extend it with YaRN: [model] config = { rope_parameters = { rope_type = "yarn", factor = 4.0, '
        "original_max_position_embeddings = 262144 } }"
    ]


def test_auto_max_model_len_needs_0_14() -> None:
    assert auto_supported("0.13.0") is False
    assert auto_supported("0.14.0") is True
    assert auto_supported(None) is None
