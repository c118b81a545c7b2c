"""The server's compile and JIT caches (issue 30, "prepare before stopping"): a deliberate directory
under the state dir, root's 0700, named to vLLM, Triton, Inductor, FlashInfer and CUDA by the
launch's environment, and kept across generations, so a switch whose compile key did not change
starts warm (gpu-memory-utilization is not in vLLM's torch.compile key, nor in the fake's)."""

from __future__ import annotations

import stat

from tests.apply_support import Demo


def test_a_switch_starts_warm_from_the_cache_the_first_generation_built(demo: Demo) -> None:
    demo.write_spec(lambda doc: doc["server"]["args"].__setitem__("gpu-memory-utilization", 0.5))
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    root = demo.state_dir / "vllm-cache"
    assert demo.server_environ("VLLM_CACHE_ROOT") == str(root / "vllm")
    assert demo.server_environ("TRITON_CACHE_DIR") == str(root / "triton")
    assert demo.server_environ("CUDA_CACHE_PATH") == str(root / "nv-compute")
    st = root.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == 0
    log = demo.log.read_text(errors="replace")
    assert "Compiling a graph for compile range" in log and "from the cache" not in log  # cold
    assert f"Using cache directory: {root}/vllm/torch_compile_cache/" in log

    demo.write_spec(
        lambda doc: doc["server"]["args"].__setitem__("gpu-memory-utilization", 0.6)
    )  # a new generation
    switched = demo.cli("apply")
    assert switched.returncode == 2, switched.output
    assert demo.starts_in_log() == 2
    after = demo.log.read_text(errors="replace")[len(log) :]
    assert "Directly load the compiled graph(s) for compile range (1, 8192) from the cache" in after  # warm
    assert "Compiling a graph" not in after
    assert demo.server_environ("VLLM_CACHE_ROOT") == str(root / "vllm")


def test_a_cache_variable_the_spec_sets_is_left_as_written(demo: Demo, tmp_path: object) -> None:
    own = str(demo.root / "my-vllm-cache")
    demo.write_spec(lambda doc: doc["server"]["env"].__setitem__("VLLM_CACHE_ROOT", own))
    done = demo.cli("apply")
    assert done.returncode == 2, done.output
    assert demo.server_environ("VLLM_CACHE_ROOT") == own
    assert demo.server_environ("TRITON_CACHE_DIR") == str(demo.state_dir / "vllm-cache" / "triton")
    assert f"Using cache directory: {own}/torch_compile_cache/" in demo.log.read_text(errors="replace")
