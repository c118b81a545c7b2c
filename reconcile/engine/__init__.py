"""Engine knowledge: vLLM flags by version, the max_model_len vLLM derives, memory math, known failures.

Pure functions over plain values (config.json dicts, version strings); used by the preflight and
the server lifecycle. Facts: reference/vllm-facts.md.
"""
