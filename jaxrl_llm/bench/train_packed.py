"""`jaxrl-llm bench train --packed`: the policy step on RL-shaped lengths, packed vs padded.

`--batch` samples of `--prompt-len` prompt tokens and responses drawn uniformly from
[`--min-response`, `--max-response`] (seeded), so rows are T = prompt + max response long.
The same jitted `make_policy_step` runs once with one right-padded sample per row and once
on packed rows (`learner.packing`), and a PyTorch forward + backward of the HF model runs on
the padded rows (how an unpacked trainer spends its time). Throughput counts real tokens only;
model FLOPs count each sample's own length (matmuls 6 * P * n, attention 12 * L * N * H * n^2),
so MFU is the useful work per second over the machine's measured float32 matmul ceiling.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxrl_llm.bench.machine import bench_checkpoint, machine_ceilings


def rl_lengths(args: argparse.Namespace) -> tuple[np.ndarray, int]:
    """Sample lengths [B] (prompt + response) and the row length T."""
    rng = np.random.default_rng(0)
    responses = rng.integers(args.min_response, args.max_response + 1, args.batch)
    return args.prompt_len + responses, args.prompt_len + args.max_response


def useful_flops(cfg, n_params: int, lengths: np.ndarray) -> float:
    """Forward + backward FLOPs of the samples at their own lengths (see the module doc)."""
    matmul_params = n_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    n = lengths.astype(np.float64) - 1
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * float(np.sum(n * n))
    return 6.0 * matmul_params * float(n.sum()) + attention


def _time(fn, repeats: int) -> tuple[float, float]:
    """(first call seconds: compile + run, best of `repeats` later calls)."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return first, best


def bench_steps(path: Path, lengths: np.ndarray, T: int, prompt: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
    from jaxrl_llm.learner.packing import packing_layout, padding_fraction
    from jaxrl_llm.learner.rl_config import AlgoConfig
    from jaxrl_llm.learner.state import TrainState
    from jaxrl_llm.learner.steps import make_policy_step
    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.types import TrainBatch

    model = from_pretrained(path)
    graphdef, params = nnx.split(model)
    n_params = int(sum(x.size for x in jax.tree.leaves(params)))
    tx = make_optimizer(OptimConfig(lr=1e-6), 1000)
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    step = make_policy_step(graphdef, tx, AlgoConfig(), 1.0)
    B = len(lengths)
    ids = np.random.RandomState(0).randint(3, model.config.vocab_size, (1, B, T))
    t = np.arange(T)[None, None, :]
    mask = jnp.asarray(((t >= prompt) & (t < lengths[None, :, None])).astype(np.float32))
    f = lambda v: jnp.full(mask.shape, v, jnp.float32) * mask
    tb = TrainBatch(
        input_ids=jnp.asarray(ids, jnp.int32), loss_mask=mask, old_logprobs=f(-3.0),
        ref_logprobs=f(-3.0), advantages=f(0.5), returns=f(0.5), old_values=f(0.0),
        rollout_logprobs=f(-3.0),
    )  # fmt: skip
    packing = packing_layout(lengths, B, T)
    holder = {"state": state}

    def run(p):
        holder["state"], m = step(holder["state"], tb, p)
        return m

    out: dict = {"params": n_params}
    flops = useful_flops(model.config, n_params, lengths)
    device_packing = jax.tree.map(jnp.asarray, packing)
    for name, p, host in (("padded", None, None), ("packed", device_packing, packing)):
        first, best = _time(lambda p=p: run(p), repeats)
        out[name] = {
            "rows": B if host is None else int(host.src.shape[1]),
            "padding_frac": padding_fraction(lengths, host, T),
            "step_s": best,
            "first_call_s": first,
            "real_tokens_per_s": float(lengths.sum()) / best,
            "useful_flops_per_s": flops / best,
        }
    return out


def bench_torch_padded(path: Path, lengths: np.ndarray, T: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).train()
    B = len(lengths)
    ids = torch.from_numpy(np.random.RandomState(0).randint(3, model.config.vocab_size, (B, T)))
    keep = torch.from_numpy(np.arange(T)[None, 1:] < lengths[:, None]).float()

    def one() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(ids[:, :-1]).logits.float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        (-(logp * keep).sum() / keep.sum()).backward()

    one()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        one()
        best = min(best, time.perf_counter() - t0)
    return {"step_s": best, "real_tokens_per_s": float(lengths.sum()) / best}


def main(args: argparse.Namespace) -> int:
    lengths, T = rl_lengths(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(args.checkpoint, Path(tmp))
        ours = bench_steps(path, lengths, T, args.prompt_len, args.repeats)
        torch_run = None if args.skip_hf else bench_torch_padded(path, lengths, T, args.repeats)
    ceilings = machine_ceilings()
    packed, padded = ours["packed"], ours["padded"]
    result = {
        "suite": "train --packed",
        "checkpoint": args.checkpoint,
        "batch": len(lengths),
        "seq_len": T,
        "lengths": {"prompt": args.prompt_len, "response": [args.min_response, args.max_response]},
        "train_step": ours,
        "torch_fwd_bwd_padded": torch_run,
        "ceilings": ceilings,
        "mfu_packed": packed["useful_flops_per_s"] / ceilings["matmul_flops"],
        "mfu_padded": padded["useful_flops_per_s"] / ceilings["matmul_flops"],
        "packed_vs_padded": packed["real_tokens_per_s"] / padded["real_tokens_per_s"],
        "packed_vs_torch": None
        if torch_run is None
        else packed["real_tokens_per_s"] / torch_run["real_tokens_per_s"],
    }
    print(json.dumps(result, indent=1))
    return 0
