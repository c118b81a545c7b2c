"""The preflight stage: rules that catch, in `plan`, what would fail minutes into a vLLM boot."""
