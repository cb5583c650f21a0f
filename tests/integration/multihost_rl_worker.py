"""A short GRPO run (`run_rl`) as one process of a (multi-)process job; the RL-loop half of the
multi-host test.

    JAXRL_COORDINATOR_ADDRESS=127.0.0.1:PORT JAXRL_NUM_PROCESSES=2 JAXRL_PROCESS_ID=I \\
        python tests/integration/multihost_rl_worker.py --run-dir RUN --out OUT \\
        [--steps N] [--stop-after K] [--resume] [--gin BINDING ...]

The caller sets `XLA_FLAGS=--xla_force_host_platform_device_count=<devices per process>` and
`JAX_PLATFORMS=cpu`; without the JAXRL_* variables it runs alone (the reference). Every
process joins through `initialize_distributed` (gloo on CPU), as `jaxrl-llm train` does, and
writes OUT.p<process>.json: the metric records `run_rl` returned on that process, plus what
it saw of the run (process and device counts, the prompts of the first rollout).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PARAMS = [
    "RLConfig.eval_every = 2",
    "RLConfig.save_every = 2",
    "RLConfig.seed = 5",
    "MeshConfig.fsdp = 4",  # every weight split across both hosts' devices
    "DataConfig.prompts_per_step = 4",
    "DataConfig.val_size = 6",  # 6 rows over 2 hosts, and one batch of 6 on the reference
    "DataConfig.builtin_train_size = 32",
    "DataConfig.builtin_levels = (1,)",
    "RolloutConfig.n = 4",
    "RolloutConfig.max_new_tokens = 12",
    "RolloutConfig.max_slots = 8",
    "AlgoConfig.mini_batches = 2",
    "AlgoConfig.micro_batch_size = 4",
    "AlgoConfig.use_kl_loss = True",  # a reference model on the global mesh too
    "RewardConfig.name = 'digit_fraction'",
    "RewardConfig.workers = 1",
    "OptimConfig.lr = 2e-4",
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True, help="result path prefix (OUT.p<process>.json)")
    p.add_argument("--steps", type=int, default=3, help="RLConfig.steps")
    p.add_argument("--stop-after", type=int, default=None, help="end early (a checkpoint)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--gin", action="append", default=[], help="another binding")
    args = p.parse_args(argv)

    import jax

    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.learner.rl_loop import run_rl
    from jaxrl_llm.sharding import initialize_distributed
    from jaxrl_llm.testing import register_test_rewards

    register_test_rewards()
    distributed = initialize_distributed()
    parse_gin(
        [],
        [*PARAMS, *args.gin, f"RLConfig.steps = {args.steps}",
         f"RLConfig.run_dir = '{args.run_dir}'"],
    )  # fmt: skip
    records = run_rl(RLConfig(), resume=args.resume, stop_after=args.stop_after)
    result = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "records": records,
    }
    out = Path(f"{args.out}.p{jax.process_index()}.json")
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if distributed:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
