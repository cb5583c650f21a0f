"""The update's programs compiled on a thread of their own while the experience pass runs.

A step's update programs are fixed once its samples are: the mini-batches' rows follow from
the seed and the step (`learn.mini_batch_plan`), their packing from the samples' lengths, and
every argument's shape, dtype and layout from those and the learner's state. So
`learn.make_experience` hands them to `UpdateCompiler.start` before it runs the experience
pass, and a thread traces and compiles each update program this process has not compiled yet
(`jit(...).lower(abstract arguments).compile()`, which fills the same in-memory cache the
update's calls read). The experience pass traces, compiles and runs meanwhile; `wait`, at the
start of `learn.update`, joins the thread before the first call, which then finds its program
compiled. Only a new program costs anything: the first step's, and a step whose packing needs
a row count not seen before (at most four per mini-batch size, `packing.row_bucket`).

Nothing here decides a result: a program compiled here is the one the call would have
compiled (the same function, arguments of the same shapes, dtypes and shardings), and if a
compile here fails or its arguments miss the call's, the call compiles its own (and raises
its own error). XLA:CPU compiles on about 1.7 of a two-core host's cores, so what this overlaps
is the update's tracing (Python, one core) and the experience pass's run with the update's
compile; docs/performance.md has the measured first step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.learner.packing import Packing
from jaxrl_llm.sharding import hosts
from jaxrl_llm.sharding.reshard import abstract
from jaxrl_llm.types import TrainBatch

if TYPE_CHECKING:
    from jax.sharding import Mesh

log = logging.getLogger(__name__)


def abstract_micro_batches(
    mesh: Mesh, shape: tuple[int, int, int], float_dtype: Any
) -> TrainBatch[jax.ShapeDtypeStruct]:
    """A mini-batch's [M, mb, T] fields as `learner.micro_batches` lays them out (rows over
    ("data", "fsdp"), `hosts.batch_sharding`)."""
    sharding = hosts.batch_sharding(mesh, shape, 1)
    f = lambda dt: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)
    g = lambda: f(float_dtype)
    return TrainBatch(
        input_ids=f(jnp.int32), loss_mask=g(), old_logprobs=g(), ref_logprobs=g(),
        advantages=g(), returns=g(), old_values=g(), rollout_logprobs=g(),
    )  # fmt: skip


def abstract_packing(mesh: Mesh, packing: Packing[np.ndarray] | None) -> Packing | None:
    """`packing` as `learn._put_packing` places it (rows, axis 1, split like the batch's)."""
    if packing is None:
        return None
    place = lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=hosts.batch_sharding(mesh, x.shape, 1)
    )
    return jax.tree.map(place, packing)


def _variant(shape: tuple[int, ...], packing: Packing[np.ndarray] | None) -> tuple:
    """What makes one update program differ from another within a run."""
    return (shape, None if packing is None else tuple(x.shape for x in jax.tree.leaves(packing)))


class UpdateCompiler:
    """Compiles a learner's update programs ahead of their first call (module docstring)."""

    def __init__(self) -> None:
        self._seen: set[tuple] = set()
        self._thread: threading.Thread | None = None

    def start(
        self,
        learner: Any,
        shapes: Sequence[tuple[int, int, int]],
        packings: Sequence[Packing[np.ndarray] | None],
        float_dtype: Any,
    ) -> None:
        """Compiles, on a thread, `learner`'s (a `run.Learner`, which holds this) policy
        and critic step for each mini-batch of [M, mb, T] `shapes` with its `packings`
        that no earlier call here has compiled."""
        self.wait()
        jobs = []
        for shape, packing in zip(shapes, packings, strict=True):
            key = _variant(shape, packing)
            if key not in self._seen:
                self._seen.add(key)
                mb = abstract_micro_batches(learner.mesh, shape, float_dtype)
                jobs.append((mb, abstract_packing(learner.mesh, packing)))
        if not jobs:
            return
        policy = abstract(learner.state.policy)
        critic = learner.state.critic
        critic = None if critic is None else abstract(critic)
        args = (learner, policy, critic, jobs)
        self._thread = threading.Thread(target=_compile, args=args, name="compile-ahead")
        self._thread.start()

    def wait(self) -> None:
        """Returns when the thread's compiles are done (at once if none runs)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _compile(learner: Any, policy: Any, critic: Any, jobs: list) -> None:
    try:
        for mb, packing in jobs:
            if learner.critic_step is not None:
                learner.critic_step.lower(critic, mb, packing).compile()
            learner.policy_step.lower(policy, mb, packing, learner.frozen).compile()
    except Exception:  # the call compiles its own program and raises its own error
        log.debug("compiling the update ahead failed; its first call compiles it", exc_info=True)
