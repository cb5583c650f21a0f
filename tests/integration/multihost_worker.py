"""One GRPO policy update on a global mesh, run by every process of a (multi-)process job.

    python tests/integration/multihost_worker.py --out RESULT.json \
        [--coordinator 127.0.0.1:PORT --num-processes 2 --process-id I]

The caller sets `XLA_FLAGS=--xla_force_host_platform_device_count=<devices per process>` and
`JAX_PLATFORMS=cpu` in this process's environment. Without `--coordinator` it runs alone
(the single-process reference). Every process builds the same global numpy batch from a
seed and contributes only the rows its own devices hold
(`jax.make_array_from_process_local_data`). For each mesh layout it runs one real
`make_policy_step` and gathers the metrics and updated parameters to every host with
`process_allgather`; process 0 writes RESULT.json (metrics, per-parameter sums, placement)
and RESULT.npz (every updated parameter, by path).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

# Each entry is (data, fsdp, tensor). fsdp=4 splits every weight across both processes
# (cross-process all-gathers and reduce-scatters); data=2 x fsdp=2 is the usual multi-host
# layout: FSDP inside a host, data parallel across hosts (a cross-process gradient all-reduce).
MESHES = ((1, 4, 1), (2, 2, 1))
M, MB, T = 2, 8, 16  # micro-batches, rows per micro-batch (divisible by 4 devices), tokens
SEED = 0


def model_config():
    from jaxrl_llm.testing import tiny_config

    return tiny_config()


def global_batch(vocab: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """The same [B, T] numpy batch on every host (B = M * MB): response masks of varied length."""
    rng = np.random.default_rng(seed)
    B = M * MB
    ids = rng.integers(0, vocab, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    for b in range(B):
        start = int(rng.integers(3, 8))
        mask[b, start : start + int(rng.integers(2, T - start))] = 1
    f = lambda: rng.normal(size=(B, T)).astype(np.float32) * 0.1
    # GRPO: one scalar advantage per sequence (groups of 4), broadcast over its tokens.
    scores = rng.integers(0, 2, B).astype(np.float32).reshape(-1, 4)
    adv = (scores - scores.mean(1, keepdims=True)) / (scores.std(1, ddof=1, keepdims=True) + 1e-6)
    return dict(
        input_ids=ids,
        loss_mask=mask,
        old_logprobs=f() - 4.0,
        ref_logprobs=f() - 4.0,
        advantages=adv.reshape(B, 1) * mask,
        returns=adv.reshape(B, 1) * mask,
        old_values=np.zeros((B, T), np.float32),
        rollout_logprobs=f() - 4.0,
    )


def process_rows(sharding, global_shape) -> slice:
    """The contiguous slice of axis 1 (rows of a micro-batch) that this process's devices hold."""
    idx = sharding.addressable_devices_indices_map(global_shape).values()
    starts = sorted({(i[1].start or 0, global_shape[1] if i[1].stop is None else i[1].stop)
                     for i in idx})  # fmt: skip
    lo, hi = starts[0][0], starts[-1][1]
    assert sum(b - a for a, b in starts) == hi - lo, f"non-contiguous rows {starts}"
    return slice(lo, hi)


def run_layout(shape) -> tuple[dict, dict[str, np.ndarray]]:
    import jax
    from flax import nnx
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
    from jaxrl_llm.learner.rl_config import AlgoConfig
    from jaxrl_llm.learner.state import TrainState
    from jaxrl_llm.learner.steps import make_policy_step, to_micro_batches
    from jaxrl_llm.models import init_model
    from jaxrl_llm.sharding import TRAIN_RULES, build_mesh
    from jaxrl_llm.types import TrainBatch

    cfg = model_config()
    mesh = build_mesh(*shape)
    model = init_model(cfg, seed=1, mesh=mesh, rules=TRAIN_RULES)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(OptimConfig(lr=1e-3, weight_decay=0.01, max_grad_norm=1.0), 1)
    algo = AlgoConfig(use_kl_loss=True, entropy_coef=0.01, is_cap=2.0, micro_batch_size=MB)
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    step = make_policy_step(graphdef, tx, algo, temperature=1.0)

    # Global [M, MB, T] numpy arrays, identical on every host; each host passes its rows.
    host = to_micro_batches(TrainBatch(**global_batch(cfg.vocab_size)), np.arange(M * MB), MB)
    sharding = NamedSharding(mesh, P(None, ("data", "fsdp")))
    rows = process_rows(sharding, (M, MB, T))
    batch = jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, x[:, rows], x.shape), host
    )

    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - t0

    gather = lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True))
    flat = {
        "/".join(map(str, path)): gather(var.get_value())
        for path, var in nnx.to_flat_state(state.params)
    }
    q = state.params["model"]["layers"][0]["self_attn"]["q_proj"].get_value()
    out = {
        "mesh": dict(zip(mesh.axis_names, map(int, mesh.devices.shape))),
        "rows_of_this_process": [rows.start, rows.stop],
        "metrics": {k: float(gather(v)) for k, v in metrics.items()},
        # What the RL loop and MetricsWriter do: float() of a replicated scalar, no gather.
        "metrics_direct": {k: float(v) for k, v in metrics.items()},
        "metrics_fully_addressable": all(v.is_fully_addressable for v in metrics.values()),
        "step": int(gather(state.step)),
        "param_sums": {k: float(v.astype(np.float64).sum()) for k, v in flat.items()},
        "param_abs_sums": {k: float(np.abs(v).astype(np.float64).sum()) for k, v in flat.items()},
        "q_proj_spec": str(q.sharding.spec),
        "q_proj_fully_addressable": bool(q.is_fully_addressable),
        "step_seconds_incl_compile": seconds,
    }
    return out, flat


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="result JSON path (written by process 0)")
    p.add_argument("--coordinator", default=None, help="host:port; omit for one process")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    args = p.parse_args(argv)

    import jax

    if args.coordinator:
        from jaxrl_llm.sharding import initialize_distributed

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    result = {
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "layouts": {},
    }
    arrays = {}
    for shape in MESHES:
        key = "x".join(map(str, shape))
        result["layouts"][key], flat = run_layout(shape)
        arrays.update({f"{key}:{k}": v for k, v in flat.items()})
    if jax.process_index() == 0:
        out = Path(args.out)
        np.savez(out.with_suffix(".npz"), **arrays)
        out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if args.coordinator:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
