"""Engine knowledge: vLLM flags by version, the max_model_len vLLM derives, memory math (vLLM's own
KV-cache specs and groups, the transformers config defaults it reads configs with), known failures.

Pure functions over plain values (config.json dicts, version strings); used by the preflight and
the server lifecycle. Facts: reference/vllm-facts.md.
"""
