"""reconcile/data/vllm_architectures.json from a vLLM release's own source (issue 28): every
text-generation architecture of its model registry, whether reconcile's KV-cache engine models it,
why not where it does not, and which oracle rows check it.

The registry is read with `ast` (vllm/model_executor/models/registry.py: _TEXT_GENERATION_MODELS and
the text models of _TRANSFORMERS_SUPPORTED_MODELS), each model's module as text: what its cache
holds (vLLM's MambaStateShapeCalculator, cross-layer KV sharing, a sparse indexer, compressed MLA)
and how its attention sizes a head (`head_dim = hidden_size // total_num_heads` with no config
fallback). Evidence: the corpus configs the config oracle builds (tests/data/model_configs) and the
served rows of tools/preflight_serve_check.py.
Usage: python3 tools/vllm_architectures.py SITE_DIR_WITH_VLLM [VERSION]  (rewrites the JSON)
       python3 tools/vllm_architectures.py --markdown  (the table for docs/preflight.md)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reconcile" / "data" / "vllm_architectures.json"
# Modules whose recurrent state reconcile models (engine.kvspec.mamba_state, shape.MambaShape).
STATE_MODELLED = {"nemotron_h", "jamba", "granitemoehybrid", "falcon_h1", "zamba2", "qwen3_next", "qwen3_5"}
# What a module's source shows that the engine does not lay out, and what to call it.
UNMODELLED = (("kv_sharing_target_layer_name", "layers that reuse another layer's KV cache"),)
# Config keys that switch such a cache on in a module that otherwise lays out plainly: the plan
# refuses to size a config that sets one (engine.architectures.coverage).
WHEN_SET = {
    "index_topk": "a sparse-attention indexer cache (DeepSeek V3.2 style)",
    "compress_ratios": "compressed sparse MLA (DeepSeek V4)",
    "use_cla": "cross-layer attention (layers reuse another layer's KV cache)",
}
# The head-size rule of attention code that ignores config.json's head_dim.
_FROM_HIDDEN = re.compile(
    r"self\.head_dim = \(?(self\.)?(config\.)?hidden_size // self\.total_num_heads\)?\s*$", re.M
)
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


def entry(arch: str, module: str, src: str, evidence: list[str]) -> dict[str, object]:
    out: dict[str, object] = {"module": module}
    why = [what for key, what in UNMODELLED if key in src]
    calc = sorted(set(re.findall(r"MambaStateShapeCalculator\.(\w+)", src)))
    if "get_mamba_state_shape_from_config" in src and module not in STATE_MODELLED:
        why.append(f"recurrent state ({', '.join(calc) or 'its own'}) of {module}.py")
    if module in ("mamba", "mamba2"):
        why.append("an attention-free state-space model")
    if _head_from_hidden(src):
        out["layer_head_dim"] = "hidden_size // num_attention_heads"
    when = {key: what for key, what in WHEN_SET.items() if key in src}
    if when:
        out["not_modelled_when"] = when
    if why:
        out["status"], out["why"] = "not modelled", "; ".join(why)
    else:
        out["status"] = "verified" if evidence else "modelled"
    if evidence:
        out["evidence"] = evidence
    return out


def markdown() -> str:
    """The table docs/preflight.md shows, from the JSON."""
    data = json.loads(OUT.read_text())
    lines = [
        "| architecture | vLLM module | status | oracle rows, or what is not modelled |",
        "| --- | --- | --- | --- |",
    ]
    for arch, e in data["architectures"].items():
        rows = ", ".join(e.get("evidence", ())) or "none yet"
        what = e.get("why") or rows
        when = "; ".join(
            f"not modelled when {k} is set: {v}" for k, v in e.get("not_modelled_when", {}).items()
        )
        head = "heads from hidden_size" if e.get("layer_head_dim") else ""
        extra = "; ".join(x for x in (head, when) if x)
        lines.append(f"| {arch} | {e['module']} | {e['status']} | {what}{f' ({extra})' if extra else ''} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        print(markdown())
        return 0
    site = Path(argv[0])
    version = argv[1] if len(argv) > 1 else "0.26.0"
    models = site / "vllm" / "model_executor" / "models"
    corpus = _corpus()
    table: dict[str, dict[str, object]] = {}
    for arch, (module, _cls) in sorted(_registry(models / "registry.py").items()):
        src = (models / f"{module}.py").read_text() if (models / f"{module}.py").exists() else ""
        table[arch] = entry(arch, module, src, corpus.get(arch, []) + SERVED.get(arch, []))
    # Multimodal architectures whose language model the engine reads from text_config, with rows.
    for arch in ("Gemma3ForConditionalGeneration", "Qwen3_5ForConditionalGeneration"):
        table[arch] = {"module": "multimodal: text_config", "status": "verified", "evidence": corpus[arch]}
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
