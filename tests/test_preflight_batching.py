"""`scheduler.batched-tokens`: max-num-batched-tokens against max-model-len (chunked prefill off, explicit
or derived length) and max-num-seqs, as vLLM 0.26's SchedulerConfig refuses them."""

from __future__ import annotations

from typing import Any

from tests.test_preflight import findings, load, spec, the

NO_PARSER: dict[str, Any] = {"reasoning-parser": None, "reasoning-parser-plugin": None}


def batched(**args: Any) -> Any:
    s = spec(server={"args": {"tensor-parallel-size": 2, **NO_PARSER, **args}})
    return the(
        findings(s, model_config=load("llama-3.1-8b"), hf_quant_config=None), "scheduler.batched-tokens"
    )


def test_batched_tokens_below_max_model_len_without_chunked_prefill_fails() -> None:
    f = batched(**{"max-model-len": 32768, "max-num-batched-tokens": 8192, "enable-chunked-prefill": False})
    assert (
        f.severity == "error"
        and "max_num_batched_tokens (8192) is smaller than max_model_len (32768)" in f.message
    )
    assert f.fix.startswith("set args.max-num-batched-tokens >= 32768")
    on = batched(**{"max-model-len": 32768, "max-num-batched-tokens": 8192})  # chunked prefill on (default)
    assert on.severity == "info"
    enough = batched(
        **{"max-model-len": 8192, "max-num-batched-tokens": 8192, "enable-chunked-prefill": False}
    )
    assert enough.severity == "info"


def test_an_unset_max_model_len_is_the_derived_one() -> None:
    # Llama 3.1 derives 131,072: a request of that length cannot be scheduled in 8,192 batched tokens.
    f = batched(**{"max-model-len": None, "max-num-batched-tokens": 8192, "enable-chunked-prefill": False})
    assert f.severity == "error" and "max-model-len 131,072 (unset: the derived length)" in f.message


def test_batched_tokens_below_max_num_seqs_fails() -> None:
    f = batched(**{"max-num-batched-tokens": 8, "max-num-seqs": 16})
    assert f.severity == "error" and "must be greater than or equal to max_num_seqs (16)" in f.message
    assert batched(**{"max-num-batched-tokens": 16, "max-num-seqs": 16}).severity == "info"


def test_without_an_explicit_batch_limit_vllm_picks_one_that_fits() -> None:
    s = spec(server={"args": {"enable-chunked-prefill": False}})
    assert not [f for f in findings(s) if f.rule == "scheduler.batched-tokens"]
