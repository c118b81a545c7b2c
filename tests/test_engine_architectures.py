"""The architecture table (issue 28): every text-generation architecture of the pinned vLLM's
registry has a status, the plan names the ones it does not model instead of guessing, and the
architectures' own head-size rules are applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconcile.vllm.architectures import coverage, table
from reconcile.vllm.kvspec import layer_specs
from tests.test_preflight import findings, load, spec, the
from tests.test_preflight_memory import H100, NO_PARSER

CORPUS = Path(__file__).resolve().parent / "data" / "model_configs"


def _corpus(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CORPUS / f"{name}.json").read_text())["config"]
    return data


def _fit(config: dict[str, Any]) -> Any:
    s = spec(server={"args": {"tensor-parallel-size": 1, "max-model-len": 4096, **NO_PARSER}})
    return the(
        findings(s, gpus=(H100,), model_config=config, hf_quant_config=None,
                 model_file_sizes={"model.safetensors": 10**9}),
        "memory.fit",
    )  # fmt: skip


def test_every_architecture_has_a_status_and_its_reason() -> None:
    archs = table()["architectures"]
    assert len(archs) > 130 and table()["vllm"] == "0.26.0"
    for arch, e in archs.items():
        assert e["status"] in ("verified", "modelled", "not modelled"), arch
        assert (e["status"] == "not modelled") == bool(e.get("why")), arch
        assert (e["status"] == "verified") == bool(e.get("evidence")), arch
    # Every corpus model the config oracle builds is verified, by its row.
    for f in CORPUS.glob("*.json"):
        c = coverage(_corpus(f.stem))
        assert c.status == "verified" and f"oracle: {f.stem}" in c.evidence, f.stem


def test_the_plan_names_an_architecture_it_does_not_model() -> None:
    kimi = {**load("llama-3.1-8b"), "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear"}
    f = _fit(kimi)
    assert f.severity == "warning"
    assert f.message == (
        "memory not checked: vLLM 0.26.0 serves KimiLinearForCausalLM, but reconcile does not model its "
        "KV cache: recurrent state (kda_state_shape) of kimi_linear.py (docs/preflight.md, the architecture "
        "table)"
    )


def test_a_config_that_switches_on_an_unmodelled_cache_is_named_too() -> None:
    v3 = _corpus("deepseek-v3")
    assert coverage(v3).status == "verified"
    sparse = coverage({**v3, "index_topk": 2048})
    assert sparse.status == "not modelled" and sparse.why.startswith("a sparse-attention indexer cache")
    assert "index_topk is set" in _fit({**v3, "index_topk": 2048}).message


def test_looped_layers_and_per_layer_windows_of_their_own_key_are_named_not_guessed() -> None:
    """Ouro builds an attention (and a KV cache) per loop step of every layer, total_ut_steps of them
    (4 by default: vLLM 0.26.0's ouro.py), IQuest-LoopCoder loop_num; the generic rules would count one a
    layer, a quarter of what vLLM keeps. openPangu's windows come from interleaved_sliding_window and its
    sinks from param_sink_number, which the engine does not read. The plan names each; it never sizes them."""
    base = load("llama-3.1-8b")
    for arch, model_type in (("OuroForCausalLM", "ouro"), ("IQuestLoopCoderForCausalLM", "iquest_loopcoder")):
        f = _fit({**base, "architectures": [arch], "model_type": model_type})
        assert f.severity == "warning" and f.message.startswith("memory not checked"), arch
        assert f"{arch}, but reconcile does not model its KV cache: looped layers" in f.message, arch
    pangu = {**base, "architectures": ["PanguEmbeddedForCausalLM"], "model_type": "openpangu_embedded"}
    assert coverage(pangu).status == "modelled"  # no window or sink key: the generic rules, said unchecked
    f = _fit({**pangu, "interleaved_sliding_window": [4096, None]})
    assert "interleaved_sliding_window is set" in f.message and f.message.startswith("memory not checked")
    assert "param_sink_number is set" in _fit({**pangu, "param_sink_number": 128}).message


def test_an_unchecked_architecture_says_so_beside_its_figures() -> None:
    olmoe = {**load("llama-3.1-8b"), "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe"}
    f = _fit(olmoe)
    assert f.severity == "info"
    assert "OlmoeForCausalLM: laid out by the generic rules" in f.evidence["table"]
    assert "no oracle row has checked it against vLLM 0.26.0 yet" in f.evidence["table"]
    assert "no oracle row" not in _fit(load("llama-3.1-8b")).evidence["table"]  # verified: no note


def test_an_architecture_whose_attention_ignores_head_dim_is_sized_from_hidden() -> None:
    # Qwen2Attention: head_dim = hidden_size // total_num_heads, whatever config.json says.
    qwen = {**_corpus("qwen2.5-7b"), "head_dim": 256}
    assert {s.head_size for s in layer_specs(qwen)} == {3584 // 28}
    stays = {**load("llama-3.1-8b"), "head_dim": 256}  # LlamaAttention reads head_dim
    assert {s.head_size for s in layer_specs(stays)} == {256}


def test_the_docs_table_lists_every_architecture_with_its_status() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "preflight.md").read_text()
    for arch, e in table()["architectures"].items():
        assert f"| {arch} | {e['module']} | {e['status']} |" in docs, arch


def test_an_architecture_outside_the_table_is_laid_out_with_a_note() -> None:
    mistral3 = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
                "text_config": _corpus("mistral-7b-instruct-v0.3")}  # fmt: skip
    c = coverage(mistral3)
    assert c.status == "unlisted" and c.note is not None
    assert c.note.startswith("Mistral3ForConditionalGeneration is not among vLLM 0.26.0's text-generation")
    assert coverage({"model_type": "llama"}).note is None  # no architectures: nothing to say


def _tool(name: str) -> Any:
    """A script under tools/, loaded as a module."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tools_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Families with no served row that no case can be built for offline (no transformers config class).
# openPangu's three: no transformers config class (their authors' remote code) to build a model from offline.
UNBUILDABLE = {"MLA, one sliding window, MoE"}


def _lab_case(lab: str, name: str) -> list[str]:
    return lab[lab.index(f"{name})") : lab.index(";;", lab.index(f"{name})"))].split()


def test_every_laid_out_architecture_has_a_family_and_every_family_a_served_case() -> None:
    arch_tool, serve = _tool("vllm_architectures"), _tool("preflight_serve_check")
    data = table()
    for arch, e in data["architectures"].items():
        assert ("family" in e) == (e["status"] != "not modelled"), arch
    lab = (Path(__file__).resolve().parent.parent / "tools" / "preflight_oracle_lab.sh").read_text()
    without = set()
    for fam, members in arch_tool.families(data).items():
        served = any(
            r.startswith("serve: ") for a in members for r in data["architectures"][a].get("evidence", ())
        )
        if not served:
            without.add(fam)
    # 14 families had no served row before 28c; 28c and 28d (2026-12-02) served one of each of 12. The
    # looped layers of Ouro and IQuest-LoopCoder are "not modelled" now, which took their family away.
    assert without == UNBUILDABLE and len(arch_tool.families(data)) == 20
    assert not arch_tool.PLANNED
    # 28c then 28d serve the family cases, in FAMILY_CASES' order (most informative first), all of them.
    cases = [w for w in _lab_case(lab, "28c") + _lab_case(lab, "28d") if w in serve.MODELS]
    assert cases == list(serve.FAMILY_CASES)
    for case in cases:
        cls, _ = serve.MODELS[case]
        assert f"serve: {case}" in data["architectures"][serve.ARCH[cls]]["evidence"], case
    docs = (Path(__file__).resolve().parent.parent / "docs" / "preflight.md").read_text()
    assert arch_tool.family_markdown() in docs


def test_a_family_is_read_from_the_module_and_the_modules_it_builds_on(tmp_path: Path) -> None:
    tool = _tool("vllm_architectures")
    (tmp_path / "base.py").write_text("class BaseAttention:\n    w = config.layer_types\nFusedMoE\n")
    (tmp_path / "child.py").write_text("from .base import (\n    BaseAttention,\n)\nfrom .utils import x\n")
    (tmp_path / "alone.py").write_text("from .base import base_helper\nkv_lora_rank = 1\nsliding_window\n")
    (tmp_path / "utils.py").write_text("attention_chunk_size\n")
    child = tool.module_source(tmp_path, "child")
    assert tool.family("child", child, False) == "attention, window per layer (layer_types), MoE"
    alone = tool.module_source(tmp_path, "alone")  # imports no attention, layer or model: not a base
    # kv_lora_rank without an MLA layer (MiniCPM3) is a per-head cache; with one, MLA.
    assert tool.family("alone", alone, True) == (
        "attention with latent projections (per-head cache), one sliding window, dense, "
        "heads from hidden_size"
    )
    assert tool.family("alone", alone + "\nMLAAttention\n", False) == "MLA, one sliding window, dense"
    assert tool.family("falcon_h1", "", False).startswith("Mamba-2 beside attention")
    assert (
        tool.family("transformers", "", False) == "attention through vLLM's Transformers backend, full, dense"
    )


def test_minicpm3_reads_kv_lora_rank_but_keeps_a_per_head_cache() -> None:
    # vLLM 0.26.0 minicpm3.py: Attention(heads, qk_nope + qk_rope, num_kv_heads=heads), and its
    # model_type is not among ModelConfig.is_deepseek_mla's: no MLA layer, no latent cache. The config
    # is the one transformers 5.17 writes for tools/preflight_serve_check.py's minicpm3 case.
    minicpm3 = {"architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "hidden_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
                "kv_lora_rank": 512, "q_lora_rank": 256, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "vocab_size": 512, "intermediate_size": 512}  # fmt: skip
    specs = layer_specs(minicpm3)
    assert {(s.kind, s.num_kv_heads, s.head_size) for s in specs} == {("full", 16, 192)}
    assert sum(s.bytes_per_token for s in specs) == 2 * 2 * 16 * 192 * 2  # K and V, 2 layers, bf16
    assert coverage(minicpm3).status == "verified"  # served on the lab: 28c, +1.90%
    # The same keys under DeepSeek-V2 are MLA: one 512 + 64 latent vector a token and layer.
    deepseek = {**minicpm3, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2"}
    assert {(s.kind, s.num_kv_heads, s.head_size) for s in layer_specs(deepseek)} == {("mla", 1, 576)}
