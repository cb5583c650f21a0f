"""The update's programs compiled ahead (`learner/compile_ahead.py`): a run lowers every
policy and critic update program on the compile-ahead thread while its experience pass runs,
none in the update's own calls, on a sharded mesh with packed mini-batches; and its numbers
equal those of the same run with the update compiled by its first call (the old path)."""

import logging
import threading
from types import SimpleNamespace

import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner import compile_ahead
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS

# The update programs' lowering, logged (at DEBUG) by the thread that lowers them.
LOWERING = "Compiling jit(constrained)"


class _Lowerings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.threads: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(LOWERING):
            self.threads.append(record.threadName)


def _run(tmp_path, name: str) -> tuple[list[dict], list[str]]:
    """Two PPO steps with a critic over all 8 devices; the metrics and the threads that
    lowered an update program."""
    parse_gin([], [
        *TINY_RL_PARAMS, f"RLConfig.run_dir = '{tmp_path / name}'", "RLConfig.steps = 2",
        "RLConfig.save_every = 0", "AlgoConfig.estimator = 'gae'", "MeshConfig.devices = -1",
        # Micro-batches of 4 samples, several to a packed row of 116 tokens.
        "AlgoConfig.micro_batch_size = 4", "AlgoConfig.ppo_epochs = 2",
        "DataConfig.max_prompt_length = 100",
    ])  # fmt: skip
    logger = logging.getLogger("jax._src.interpreters.pxla")
    handler, level = _Lowerings(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        records = run_rl(RLConfig())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return records, handler.threads


def _numbers(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in records]


@pytest.mark.slow  # two 2-step runs on 8 devices
def test_the_update_compiles_ahead_and_trains_the_same(tmp_path, monkeypatch):
    register_test_rewards()
    ahead, threads = _run(tmp_path, "ahead")
    # Policy and critic, each mini-batch's packing: every update program lowered ahead.
    assert len(threads) >= 2 and set(threads) == {"compile-ahead"}, threads

    monkeypatch.setattr(compile_ahead.UpdateCompiler, "start", lambda self, *a: None)
    plain, threads = _run(tmp_path, "plain")
    assert threads and set(threads) == {threading.main_thread().name}  # the check can fail
    assert [r["step"] for r in ahead] == [1, 2]
    assert _numbers(ahead) == _numbers(plain)


class _Step:
    """An update step's stand-in: records the packings it was lowered for."""

    def __init__(self) -> None:
        self.lowered: list = []

    def lower(self, state, mb, packing, *frozen):
        self.lowered.append(None if packing is None else packing.src.shape)
        return self

    def compile(self):
        return self


def test_each_new_program_is_compiled_once(tmp_path):
    """A program (mini-batch shape, packed row count) is compiled ahead once per run, the
    critic's beside the policy's; a shape seen before compiles nothing."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jaxrl_llm.learner.packing import Packing

    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    state = jax.numpy.zeros(3)
    policy, critic = _Step(), _Step()
    learner = SimpleNamespace(
        mesh=mesh, policy_step=policy, critic_step=critic, frozen=None,
        state=SimpleNamespace(policy=state, critic=state),
    )  # fmt: skip
    packed = lambda rows: Packing(*(np.zeros((1, rows, 8), np.int32) for _ in range(3)),
                                  dst=np.zeros((1, 4, 8), np.int32))  # fmt: skip
    compiler = compile_ahead.UpdateCompiler()
    shape = (1, 4, 8)
    compiler.start(learner, [shape, shape, shape], [None, packed(2), packed(2)], np.float32)
    compiler.start(learner, [shape, shape], [packed(3), None], np.float32)
    compiler.wait()
    assert policy.lowered == [None, (1, 2, 8), (1, 3, 8)] and critic.lowered == policy.lowered
