"""Which files of a model directory vLLM loads weights from.

Called by reconcile.vllm.memory and by the preflight's gathering (reconcile.preflight.gather), which
must not import the whole memory model for it on a converged plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_WEIGHTS = re.compile(r"\.(safetensors|bin|pt|pth)\Z")


def weight_files(file_sizes: Mapping[str, int]) -> dict[str, int]:
    """The files vLLM loads weights from: safetensors when any, else .bin/.pt; Mistral's duplicate
    consolidated.safetensors is left out when sharded model-*.safetensors are there."""
    found = {n: s for n, s in file_sizes.items() if _WEIGHTS.search(n)}
    st = {n: s for n, s in found.items() if n.endswith(".safetensors")}
    if st:
        sharded = {n: s for n, s in st.items() if not n.rsplit("/", 1)[-1].startswith("consolidated")}
        return sharded or st
    return {n: s for n, s in found.items() if not n.endswith(("training_args.bin", "optimizer.pt"))}
