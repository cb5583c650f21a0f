"""`jaxrl-llm bench train`: tokens/s and model-FLOPs utilisation of the policy train step.

Times the real jitted `make_policy_step` (clipped PG loss + entropy, forward, backward, AdamW)
on one micro-batch of `--batch` random sequences of `--seq-len` tokens, and, on the same
checkpoint and shapes, the HF `transformers` model in PyTorch: forward + backward (log-softmax
gather loss), alone and followed by global-norm clipping and fused AdamW, the same work as our
step (`speedup_vs_torch`; `speedup_vs_torch_fwd_bwd` is ours against the forward + backward
alone). The float32 matmul ceiling is measured in the same run, so the output reads as
ratios. The step runs twice: with the layers unrolled (the default, `train_step`) and scanned
(`ModelConfig.scan_layers`, `train_step_scanned`); `compile_s` is XLA's compile time of the
first call, with the persistent compile cache off (`jaxrl-llm bench` turns it off:
`ceilings.host.compile_cache` is false), so it is a compile, never a load from disk.
`--profile` adds where the unrolled step's time goes, op by op, grouped by source function
(`bench.op_profile`).

Model FLOPs per step (documented, as in PaLM's MFU, Chowdhery et al. 2022, appendix B):
    6 * P * tokens  +  12 * L * N * H * t^2 * B
with P the parameters that multiply activations (all but the embedding gather; a tied
embedding counts once, as the LM head), tokens = B * t, t = seq_len - 1 positions the step
runs on, and the attention term the forward's q k^T and p v (2 * 2 * t^2 * N * H per layer and
sequence) times 3 for forward + backward. The implementation computes the full [t, t] score
matrix under a causal mask, so the term is not halved. MFU = model FLOP/s / matmul FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxrl_llm.bench.machine import bench_checkpoint, machine_ceilings
from jaxrl_llm.bench.op_profile import profile_call


def model_flops(cfg, n_params: int, batch: int, seq_len: int) -> float:
    t = seq_len - 1
    matmul_params = n_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * t * t * batch
    return 6.0 * matmul_params * batch * t + attention


def _ids(vocab: int, batch: int, seq_len: int) -> np.ndarray:
    return np.random.RandomState(0).randint(3, vocab, (batch, seq_len)).astype(np.int32)


def bench_jax(
    path: Path, batch: int, seq_len: int, repeats: int, scan_layers: bool, profile: bool = False
) -> dict:
    """The policy step's best time over `repeats` calls and its first call's XLA compile
    seconds (`jax.monitoring`'s backend compile events, not the first call's wall time);
    with `profile`, one more call traced op by op (`bench.op_profile`)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_llm.bench.clock import CompileClock
    from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
    from jaxrl_llm.learner.rl_config import AlgoConfig
    from jaxrl_llm.learner.state import TrainState
    from jaxrl_llm.learner.steps import make_policy_step
    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.types import TrainBatch

    model = from_pretrained(path, scan_layers=scan_layers)
    cfg = model.config
    graphdef, params = nnx.split(model)
    n_params = int(sum(x.size for x in jax.tree.leaves(params)))
    tx = make_optimizer(OptimConfig(lr=1e-6), 1000)
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    step = make_policy_step(graphdef, tx, AlgoConfig(), 1.0)
    ids = jnp.asarray(_ids(cfg.vocab_size, batch, seq_len))[None]
    f = lambda v: jnp.full(ids.shape, v, jnp.float32)
    mask = f(1.0).at[..., 0].set(0.0)
    tb = TrainBatch(
        input_ids=ids, loss_mask=mask, old_logprobs=f(-3.0), ref_logprobs=f(-3.0),
        advantages=f(0.5), returns=f(0.5), old_values=f(0.0), rollout_logprobs=f(-3.0),
    )  # fmt: skip
    with CompileClock() as clock:
        t0 = time.perf_counter()
        state, m = step(state, tb)  # compiles
        jax.block_until_ready(m)
        first_call_s = time.perf_counter() - t0
    compile_s = clock.between(t0, time.perf_counter())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, m = step(state, tb)
        jax.block_until_ready(m)
        best = min(best, time.perf_counter() - t0)
    flops = model_flops(cfg, n_params, batch, seq_len)
    extra = {"profile": profile_call(step, state, tb).to_json()} if profile else {}
    return extra | {
        "params": n_params,
        "scan_layers": scan_layers,
        "step_s": best,
        "compile_s": compile_s,
        "first_call_s": first_call_s,
        "tokens_per_s": batch * (seq_len - 1) / best,
        "model_flops_per_step": flops,
        "model_flops_per_s": flops / best,
        "loss_finite": bool(np.isfinite(float(m["actor/loss"]))),
    }


def bench_torch(path: Path, batch: int, seq_len: int, repeats: int) -> dict:
    """PyTorch forward + backward of the HF model (`step_s`) and the same followed by what our
    step also does, global-norm clipping and AdamW (`step_with_adamw_s`: the same work), on
    the device kind JAX runs ours on (`torch_device`)."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch_device()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model = model.to(device).train()
    ids = torch.from_numpy(_ids(model.config.vocab_size, batch, seq_len).astype(np.int64))
    ids = ids.to(device)
    # Our OptimConfig's defaults; `fused` is PyTorch's fastest AdamW (one kernel).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, fused=True)

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(ids[:, :-1]).logits.float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])
        (-logp.mean()).backward()

    def with_adamw() -> None:
        fwd_bwd()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()

    def waited(fn) -> float:  # a GPU's kernels run after the call returns
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    waited(with_adamw)  # warm-up (and the optimiser's state)
    best = {"fwd_bwd": float("inf"), "adamw": float("inf")}
    for _ in range(repeats):  # interleaved, so both see the same machine
        for key, fn in (("fwd_bwd", fwd_bwd), ("adamw", with_adamw)):
            best[key] = min(best[key], waited(fn))
    return {
        "step_s": best["fwd_bwd"],
        "tokens_per_s": batch * (seq_len - 1) / best["fwd_bwd"],
        "step_with_adamw_s": best["adamw"],
        "tokens_per_s_with_adamw": batch * (seq_len - 1) / best["adamw"],
        "torch_threads": torch.get_num_threads(),
        "torch_device": str(device),
        # float32 matmuls on an NVIDIA GPU: TF32 on both sides (JAX's default precision there).
        "torch_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }


def torch_device():
    """CUDA when JAX runs on a GPU and this PyTorch build has CUDA (the same chip for both),
    else the CPU. On CUDA, float32 matmuls may use TF32, as XLA's default precision does
    there: PyTorch's own default (full float32) would compare unlike work."""
    import jax
    import torch

    if jax.default_backend() == "gpu" and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.device("cuda")
    return torch.device("cpu")


def main(args: argparse.Namespace) -> int:
    B, T = args.batch, args.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(args.checkpoint, Path(tmp))
        ours = bench_jax(path, B, T, args.repeats, scan_layers=False, profile=args.profile)
        scanned = bench_jax(path, B, T, args.repeats, scan_layers=True)
        torch_run = None if args.skip_hf else bench_torch(path, B, T, args.repeats)
    ceilings = machine_ceilings()
    result = {
        "suite": "train",
        "checkpoint": args.checkpoint,
        "batch": B,
        "seq_len": T,
        "train_step": ours,
        "train_step_scanned": scanned,
        "scanned_vs_unrolled": {
            "compile": scanned["compile_s"] / ours["compile_s"],
            "step": scanned["step_s"] / ours["step_s"],
        },
        "torch_fwd_bwd": torch_run,
        "ceilings": ceilings,
        "mfu": ours["model_flops_per_s"] / ceilings["matmul_flops"],
        # Same work: our step (forward, backward, clipping, AdamW) vs PyTorch's doing all four.
        "speedup_vs_torch": None
        if torch_run is None
        else ours["tokens_per_s"] / torch_run["tokens_per_s_with_adamw"],
        # Our whole step vs PyTorch's forward + backward alone (the ratio that the entries of
        # docs/performance.md before 5d5a95f quote).
        "speedup_vs_torch_fwd_bwd": None
        if torch_run is None
        else ours["tokens_per_s"] / torch_run["tokens_per_s"],
    }
    print(json.dumps(result, indent=1))
    return 0
