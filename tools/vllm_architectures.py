"""reconcile/data/vllm_architectures.json from a vLLM release's own source (issue 28): every
text-generation architecture of its model registry, whether reconcile's KV-cache engine models it,
why not where it does not, and which oracle rows check it.

The registry is read with `ast` (vllm/model_executor/models/registry.py: _TEXT_GENERATION_MODELS and
the text models of _TRANSFORMERS_SUPPORTED_MODELS), each model's module as text: what its cache
holds (vLLM's MambaStateShapeCalculator, cross-layer KV sharing, a sparse indexer, compressed MLA)
and how its attention sizes a head (`head_dim = hidden_size // total_num_heads` with no config
fallback). Evidence: the corpus configs the config oracle builds (tests/data/model_configs) and the
served rows of tools/preflight_serve_check.py.
Each architecture reconcile lays out also gets a `family`: the path reconcile's KV-cache engine
(reconcile/vllm/kvspec.py, families.py, budget.py) takes for it, read from its module and the model
modules whose attention, decoder layer or model it imports: the recurrent state where there is one
(engine.kvspec.mamba_state's variants and layer_kinds' hybrids), else the attention kind (MLA: a
kv_lora_rank; vLLM's Transformers backend), its window (full; one sliding window; per-layer from
layer_types; chunked local), MoE or dense (FusedMoE), and whether heads are sized from hidden_size.
A family is checked on the lab when one of its architectures has a served row.
Usage: python3 tools/vllm_architectures.py SITE_DIR_WITH_VLLM [VERSION]  (rewrites the JSON)
       python3 tools/vllm_architectures.py --markdown | --families  (the tables for docs/preflight.md)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reconcile" / "data" / "vllm_architectures.json"
# Modules whose recurrent state reconcile models (engine.kvspec.mamba_state, shape.MambaShape).
STATE_MODELLED = {"nemotron_h", "jamba", "granitemoehybrid", "falcon_h1", "zamba2", "qwen3_next", "qwen3_5"}
# What a module's source shows that the engine does not lay out, and what to call it.
UNMODELLED = (
    ("kv_sharing_target_layer_name", "layers that reuse another layer's KV cache"),
    # Ouro (total_ut_steps, default 4) and IQuest-LoopCoder (loop_num, default 2, later loops with their
    # own window) build one Attention per loop step in every decoder layer: a KV cache of loops x layers.
    ("unique_layer_idx", "looped layers (an attention and its KV cache per loop step of every layer)"),
)
# Config keys that switch such a cache on in a module that otherwise lays out plainly: the plan
# refuses to size a config that sets one (engine.architectures.coverage).
WHEN_SET = {
    "index_topk": "a sparse-attention indexer cache (DeepSeek V3.2 style)",
    "compress_ratios": "compressed sparse MLA (DeepSeek V4)",
    "use_cla": "cross-layer attention (layers reuse another layer's KV cache)",
    # openPangu, Jais2, PLaMo 3: a window per layer from this key (an int, or a list taken by layer
    # index modulo its length), which the engine does not read; openPangu's static sink tokens.
    "interleaved_sliding_window": "per-layer windows from interleaved_sliding_window",
    "param_sink_number": "static sink tokens kept in the KV cache (StaticSinkAttention)",
}
# The head-size rule of attention code that ignores config.json's head_dim.
_FROM_HIDDEN = re.compile(
    r"self\.head_dim = \(?(self\.)?(config\.)?hidden_size // self\.total_num_heads\)?\s*$", re.M
)
# The recurrent-state paths of the engine, by module (engine.kvspec.layer_kinds and mamba_state).
STATE_FAMILY = {
    "nemotron_h": "Mamba-2 layers between attention layers",
    "granitemoehybrid": "Mamba-2 layers between attention layers",
    "falcon_h1": "Mamba-2 beside attention in every layer (parallel hybrid)",
    "zamba2": "Mamba-2 in every layer, a shared attention block",
    "jamba": "Mamba-1 layers between attention layers",
    "qwen3_next": "gated delta-net layers between attention layers",
    "qwen3_5": "gated delta-net layers between attention layers",
}
# Imports that bring no attention, decoder layer or model of another architecture.
_NOT_BASES = {"utils", "interfaces", "interfaces_base", "registry", "module_mapping", "vision", "adapters"}
_IMPORT = re.compile(r"^from (?:\.|vllm\.model_executor\.models\.)(\w+) import (\([^)]*\)|[^\n]*)", re.M)
_BASE_NAMES = re.compile(r"\w+(Attention|DecoderLayer|Model|ForCausalLM)\b")
# vLLM's MLA layers (model_executor/layers/mla.py, deepseek_v2.py): a module that reads kv_lora_rank
# without building one (MiniCPM3: `Attention(heads, qk_nope + qk_rope, num_kv_heads=heads)`) keeps a
# per-head K and V cache, and ModelConfig.use_mla is false for its model_type.
_MLA_LAYERS = re.compile(r"MultiHeadLatentAttentionWrapper|MLAAttention\b|DeepseekV2MLAAttention|use_mla")
# Served cases written for families without a served row, not yet run on the lab (issue 28, 28c/28d in
# tools/preflight_oracle_lab.sh); a row moves to SERVED once the lab has run it.
PLANNED: dict[str, str] = {}
# Served rows (tools/preflight_serve_check.py) by architecture, and the config oracle's corpus rows.
SERVED = {
    "LlamaForCausalLM": ["serve: dense", "serve: dense-nofit", "serve: dense-kvbytes-nofit",
                         "serve: dense-kvbytes-fits"],
    "Qwen3MoeForCausalLM": ["serve: moe"],
    "DeepseekV2ForCausalLM": ["serve: mla"],
    "MistralForCausalLM": ["serve: sliding", "serve: sliding-fits"],
    "Gemma3ForCausalLM": ["serve: interleaved"],
    "NemotronHForCausalLM": ["serve: mamba-hybrid", "serve: mamba-hybrid-pc", "serve: mamba-kvbytes-graphs",
                             "serve: nemotronh-pad"],
    "Cohere2ForCausalLM": ["serve: cohere2"],
    "Llama4ForCausalLM": ["serve: llama4-text"],
    "GraniteMoeHybridForCausalLM": ["serve: granite-h"],
    "Zamba2ForCausalLM": ["serve: zamba2"],
    "FalconH1ForCausalLM": ["serve: falcon-h1"],
    "Qwen3NextForCausalLM": ["serve: qwen3-next"],
    "JambaForCausalLM": ["serve: jamba"],
    "MiniCPM3ForCausalLM": ["serve: minicpm3"],
    "Glm4MoeLiteForCausalLM": ["serve: glm4-moe-lite"],
    "Qwen2ForCausalLM": ["serve: qwen2-heads"],
    "PhiMoEForCausalLM": ["serve: phimoe"],
    "Cohere2MoeForCausalLM": ["serve: cohere2-moe"],
    "GPTBigCodeForCausalLM": ["serve: gptbigcode-tf"],
    "GPT2LMHeadModel": ["serve: gpt2"],
    "Qwen2MoeForCausalLM": ["serve: qwen2-moe"],
    "Qwen3ForCausalLM": ["serve: qwen3-sliding"],
}  # fmt: skip


def _registry(path: Path) -> dict[str, tuple[str, str]]:
    tree = ast.parse(path.read_text())
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        name = getattr(target, "id", "")
        if name in ("_TEXT_GENERATION_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS") and node.value is not None:
            tables[name] = ast.literal_eval(node.value)  # type: ignore[arg-type]
    text = dict(tables["_TEXT_GENERATION_MODELS"])
    for arch, (module, cls) in tables["_TRANSFORMERS_SUPPORTED_MODELS"].items():
        if cls == "TransformersForCausalLM":
            text[arch] = (module, cls)
    return text


def _corpus() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for f in sorted((ROOT / "tests" / "data" / "model_configs").glob("*.json")):
        cfg = json.loads(f.read_text()).get("config", {})
        for arch in cfg.get("architectures") or []:
            rows.setdefault(arch, []).append(f"oracle: {f.stem}")
    return rows


def _head_from_hidden(src: str) -> bool:
    """The attention's head size is hidden_size // heads unconditionally (not as a fallback inside an
    `if`/`else` branch, not `head_dim or ...`)."""
    lines = src.splitlines()
    for m in _FROM_HIDDEN.finditer(src):
        at = src.count("\n", 0, m.start())
        before = next((ln for ln in reversed(lines[:at]) if ln.strip()), "")
        if not before.rstrip().endswith(":"):
            return True
    return False


def module_source(models: Path, module: str, seen: set[str] | None = None) -> str:
    """A model module's code with that of the modules it takes its attention, decoder layer or model
    from (Mistral's is Llama's), which decide the path as much as its own."""
    seen = set() if seen is None else seen
    if module in seen:
        return ""
    seen.add(module)
    if module.startswith("vllm.models."):  # a package of its own: vllm/models/NAME/*.py
        pkg = models.parent.parent.parent / "models" / module.rsplit(".", 1)[-1]
        src = "\n".join(f.read_text() for f in sorted(pkg.glob("*.py")))
    else:
        src = (models / f"{module}.py").read_text() if (models / f"{module}.py").exists() else ""
    bases = [
        module_source(models, m.group(1), seen)
        for m in _IMPORT.finditer(src)
        if m.group(1) not in _NOT_BASES and _BASE_NAMES.search(m.group(2))
    ]
    return "\n".join([src, *bases])


def builds_mla(src: str) -> bool:
    """The module (or a base) builds vLLM's MLA layers, whose cache is one latent vector a token."""
    return bool(_MLA_LAYERS.search(src))


def family(module: str, src: str, heads_from_hidden: bool) -> str:
    """The engine's path for an architecture (see the module docstring)."""
    if module in STATE_FAMILY:
        return STATE_FAMILY[module]
    cache = "attention"
    if "kv_lora_rank" in src:
        cache = "MLA" if builds_mla(src) else "attention with latent projections (per-head cache)"
    if module == "transformers":
        cache = "attention through vLLM's Transformers backend"
    if "attention_chunk_size" in src:
        window = "chunked local"
    elif re.search(r"layer_types|sliding_window_pattern|is_sliding", src):
        window = "window per layer (layer_types)"
    elif "sliding_window" in src:
        window = "one sliding window"
    else:
        window = "full"
    moe = "MoE" if "FusedMoE" in src else "dense"
    return f"{cache}, {window}, {moe}" + (", heads from hidden_size" if heads_from_hidden else "")


def entry(arch: str, module: str, src: str, evidence: list[str], full_src: str = "") -> dict[str, object]:
    out: dict[str, object] = {"module": module}
    why = [what for key, what in UNMODELLED if key in src]
    calc = sorted(set(re.findall(r"MambaStateShapeCalculator\.(\w+)", src)))
    if "get_mamba_state_shape_from_config" in src and module not in STATE_MODELLED:
        why.append(f"recurrent state ({', '.join(calc) or 'its own'}) of {module}.py")
    if module in ("mamba", "mamba2"):
        why.append("an attention-free state-space model")
    if _head_from_hidden(src):
        out["layer_head_dim"] = "hidden_size // num_attention_heads"
    if "kv_lora_rank" in (full_src or src) and not builds_mla(full_src or src):
        out["latent_cache"] = False  # engine.architectures.latent_cache
        out["layer_kv_heads"] = "num_attention_heads"
        out["layer_head_dim"] = "qk_nope_head_dim + qk_rope_head_dim"
    when = {key: what for key, what in WHEN_SET.items() if key in src}
    if when:
        out["not_modelled_when"] = when
    if why:
        out["status"], out["why"] = "not modelled", "; ".join(why)
    else:
        out["status"] = "verified" if evidence else "modelled"
        from_hidden = str(out.get("layer_head_dim", "")).startswith("hidden_size")
        out["family"] = family(module, full_src or src, from_hidden)
    if evidence:
        out["evidence"] = evidence
    return out


def families(data: dict[str, Any]) -> dict[str, list[str]]:
    """{family: its architectures}, in the table's order."""
    out: dict[str, list[str]] = {}
    for arch, e in data["architectures"].items():
        if "family" in e:
            out.setdefault(e["family"], []).append(arch)
    return out


def family_markdown() -> str:
    """The families table docs/preflight.md shows: each family, whether a served row checks it, and
    the served case written for it where none does yet (PLANNED)."""
    data = json.loads(OUT.read_text())
    archs = data["architectures"]
    lines = [
        "| family (the engine's path) | architectures | served rows | case for the lab (28c) |",
        "| --- | --- | --- | --- |",
    ]
    for fam, members in sorted(families(data).items()):
        served = [r[7:] for a in members for r in archs[a].get("evidence", ()) if r.startswith("serve: ")]
        planned = [f"{a}: {PLANNED[a][7:]}" for a in members if a in PLANNED]
        lines.append(
            f"| {fam} | {len(members)} | {', '.join(served) or 'none'} | "
            f"{', '.join(planned) or ('' if served else 'none: no transformers config class to build one')} |"
        )
    return "\n".join(lines)


def markdown() -> str:
    """The table docs/preflight.md shows, from the JSON."""
    data = json.loads(OUT.read_text())
    lines = [
        "| architecture | vLLM module | status | family | oracle rows, or what is not modelled |",
        "| --- | --- | --- | --- | --- |",
    ]
    for arch, e in data["architectures"].items():
        rows = ", ".join(e.get("evidence", ())) or "none yet"
        what = e.get("why") or rows
        when = "; ".join(
            f"not modelled when {k} is set: {v}" for k, v in e.get("not_modelled_when", {}).items()
        )
        head = "heads from hidden_size" if e.get("layer_head_dim", "").startswith("hidden_size") else ""
        if e.get("latent_cache") is False:
            head = "no MLA layer: K and V of num_attention_heads x (qk_nope + qk_rope) a token"
        extra = "; ".join(x for x in (head, when) if x)
        fam = e.get("family", "")
        lines.append(
            f"| {arch} | {e['module']} | {e['status']} | {fam} | {what}{f' ({extra})' if extra else ''} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        print(markdown())
        return 0
    if argv == ["--families"]:
        print(family_markdown())
        return 0
    site = Path(argv[0])
    version = argv[1] if len(argv) > 1 else "0.26.0"
    models = site / "vllm" / "model_executor" / "models"
    corpus = _corpus()
    table: dict[str, dict[str, object]] = {}
    for arch, (module, _cls) in sorted(_registry(models / "registry.py").items()):
        src = (models / f"{module}.py").read_text() if (models / f"{module}.py").exists() else ""
        full = module_source(models, module)
        table[arch] = entry(arch, module, src, corpus.get(arch, []) + SERVED.get(arch, []), full)
    # Multimodal architectures whose language model the engine reads from text_config, with rows.
    multimodal = {"Gemma3ForConditionalGeneration": "gemma3", "Qwen3_5ForConditionalGeneration": "qwen3_5"}
    for arch, text in multimodal.items():
        fam = family(text, module_source(models, text), False)
        table[arch] = {"module": "multimodal: text_config", "status": "verified", "family": fam,
                       "evidence": corpus[arch]}  # fmt: skip
    data = {
        "_about": f"vLLM {version}'s text-generation architectures (model registry) and whether "
        "reconcile's KV-cache engine models them. Written by tools/vllm_architectures.py from that "
        "release's source; read by reconcile/vllm/architectures.py.",
        "vllm": version,
        "architectures": table,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    counts: dict[str, int] = {}
    for e in table.values():
        counts[str(e["status"])] = counts.get(str(e["status"]), 0) + 1
    print(OUT, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
