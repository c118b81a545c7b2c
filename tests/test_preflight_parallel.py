"""Parallelism rules (`memory.tp`): TP x PP x DP against the probed GPUs or the spec's [gpu] count, and
the head counts vLLM 0.26 requires tensor parallel to divide. Each with a failing and a passing case."""

from __future__ import annotations

from typing import Any

from reconcile.plan.records import Finding
from tests.test_preflight import findings, load, of, rtx5090, spec

NO_PARSER: dict[str, Any] = {"reasoning-parser": None, "reasoning-parser-plugin": None}


def tp_errors(found: list[Finding]) -> list[str]:
    return [f.message for f in of(found, "memory.tp") if f.severity == "error"]


def test_tp_8_on_4_probed_gpus_fails_and_on_8_passes() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 8}})
    four = tuple(rtx5090(i) for i in range(4))
    assert tp_errors(findings(s, gpus=four)) == ["tensor-parallel-size 8 needs 8 GPUs; 4 visible"]
    assert tp_errors(findings(s, gpus=tuple(rtx5090(i) for i in range(8)))) == []


def test_without_nvml_the_spec_gpu_count_is_the_limit() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 8}}, gpu={"count": 4})
    f = of(findings(s, gpus=None), "memory.tp")
    assert [x.message for x in f] == ["tensor-parallel-size 8 needs 8 GPUs; 4 in [gpu] count (not probed)"]
    assert f[0].fix == "set args.tensor-parallel-size = 4"
    assert (
        tp_errors(findings(spec(server={"args": {"tensor-parallel-size": 8}}, gpu={"count": 8}), gpus=None))
        == []
    )


def test_pipeline_and_data_parallel_ranks_need_their_own_gpus() -> None:
    s = spec(server={"args": {"pipeline-parallel-size": 2}})
    errors = tp_errors(findings(s))  # the reference machine has 2 GPUs: TP 2 x PP 2 needs 4
    assert errors == ["tensor-parallel-size 2 x pipeline-parallel-size 2 needs 4 GPUs; 2 visible"]
    assert tp_errors(findings(s, gpus=tuple(rtx5090(i) for i in range(4)))) == []
    dp = spec(server={"args": {"data-parallel-size": 2}}, gpu={"count": 2})
    assert "x data-parallel-size 2 needs 4 GPUs" in tp_errors(findings(dp, gpus=None))[0]


def test_kv_heads_must_divide_or_be_divided_by_tp() -> None:
    # 28 query heads and 4 KV heads (Qwen2.5-7B's shape): TP 7 splits the queries but not the KV heads.
    qwen = {**load("llama-3.1-8b"), "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}
    s = spec(server={"args": {"tensor-parallel-size": 7, **NO_PARSER}})
    seven = tuple(rtx5090(i) for i in range(7))
    errors = tp_errors(findings(s, gpus=seven, model_config=qwen, hf_quant_config=None))
    assert errors == [
        "4 KV heads cannot be split over tensor-parallel-size 7: vLLM needs one to divide the other "
        '(it fails with "7 is not divisible by 4")'
    ]
    fix = next(f.fix for f in findings(s, gpus=seven, model_config=qwen) if f.rule == "memory.tp")
    assert fix == "use a tensor-parallel-size of 4 or 8"
    # TP 8 > 4 KV heads: each is replicated twice, which vLLM allows (28 heads then fail on their own).
    eight = spec(server={"args": {"tensor-parallel-size": 8, **NO_PARSER}})
    errors = tp_errors(findings(eight, gpus=(*seven, rtx5090(7)), model_config=qwen, hf_quant_config=None))
    assert errors == ["28 attention heads do not divide by tensor-parallel-size 8"]
    four = spec(server={"args": {"tensor-parallel-size": 4, **NO_PARSER}})
    assert tp_errors(findings(four, gpus=seven[:4], model_config=qwen, hf_quant_config=None)) == []


def test_mamba_heads_and_groups_must_divide_by_tp() -> None:
    # NemotronH Nano: 64 Mamba heads, 8 groups. TP 16 splits the heads by 4 and leaves half a group each.
    config = {**load("nemotron-h-nano"), "num_attention_heads": 32, "mamba_num_heads": 64, "n_groups": 8}
    s = spec(server={"args": {"tensor-parallel-size": 16}})
    sixteen = tuple(rtx5090(i) for i in range(16))
    errors = tp_errors(findings(s, gpus=sixteen, model_config=config))
    assert errors == [
        "8 Mamba groups do not divide by tensor-parallel-size 16 (vLLM replicates groups only when there is "
        'one: "... then num_groups must equal 1.")'
    ]
    one_group = {**config, "n_groups": 1}
    assert tp_errors(findings(s, gpus=sixteen, model_config=one_group)) == []
    odd = {**config, "mamba_num_heads": 40}
    assert any("40 Mamba heads" in m for m in tp_errors(findings(s, gpus=sixteen, model_config=odd)))
