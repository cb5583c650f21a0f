"""Test doubles shipped with the package: tiny configs, reference checkpoints, a scripted
engine, a dense test reward and float32 tolerances. Importing this module registers nothing
and imports no JAX.

- `tiny_config()`: the small transformer shape the sharding, state and step tests share.
- `write_reference_checkpoint`: a random checkpoint built with `transformers` (PyTorch), so
  tests compare our model against an independent implementation (needs the `test` extra).
- `write_reward_model`: the same for a `*ForSequenceClassification` reward model folder,
  with the shipped byte-level tokenizer (and, optionally, its chat template).
- `ScriptedEngine`: the Engine methods `RolloutDriver` calls, emitting fixed text per turn.
- `register_test_rewards()`: adds the `digit_fraction` reward to the registry, on request.
- `float32_sum_tolerance`: how far two float32 programs may disagree on one sum.
- `aggregation_weights`: each token's float64 weight in `aggregate_loss`, the sum's terms.
- `log_softmax_tolerance`: the float64 log-softmax and how far two float32 programs may
  disagree on it.
- `float64_twin`, `assert_as_accurate`: a whole model's float32 path against the trusted
  path, both measured against the same computation in float64.
- `as_float64`: a pytree's floating-point arrays upcast to float64 (exactly), the inputs of
  that float64 run.
- `jitted(method)`: a model's method as one jitted program, shared by the tests of a process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TINY_SHAPES: dict[str, Any] = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the tiny test sequences cross the interpolated band.
    "original_max_position_embeddings": 16,
}


FLOAT32_EPS = float(np.finfo(np.float32).eps)  # 2**-23


def float32_sum_tolerance(terms, axis: int = 0, *, roundings: int | None = None) -> np.ndarray:
    """How far two float32 programs may disagree on ``sum(terms, axis)``:
    ``roundings * FLOAT32_EPS * sum(|terms|)``, ``roundings`` defaulting to n - 1 for n terms.

    XLA:CPU fuses and orders a sum differently per program and per instruction set (AVX2 vs
    AVX-512), so a tolerance picked on one host fails on another; this one follows from the
    terms. ``terms`` are the summands' float64 values (from a float64 reference run). Each
    program is within ``roundings * u * sum(|terms|)`` of the exact sum, u = eps32 / 2, in any
    order (Higham 2002, Accuracy and Stability of Numerical Algorithms, §4.2, first order in
    u); two programs are within twice that. A larger difference is a bug, not rounding.
    """
    terms = np.abs(np.asarray(terms, np.float64))
    n = max(terms.shape[axis] - 1, 1) if roundings is None else roundings
    return n * FLOAT32_EPS * terms.sum(axis)


def aggregation_weights(mask, mode: str, **kwargs: Any) -> np.ndarray:
    """Each token's weight in ``aggregate_loss(loss, mask, mode, **kwargs)``, in float64.

    The aggregate is linear in ``loss`` (``sum(weights * loss)``), so ``weights * loss`` are the
    terms a float32 program sums: the input of `float32_sum_tolerance`. Shapes: [B, T] -> [B, T].
    """
    import jax

    from jaxrl_llm.algorithms import aggregate_loss

    mask = np.asarray(mask, np.float64)
    kwargs = {k: None if v is None else float(v) for k, v in kwargs.items()}
    with jax.enable_x64(True):
        fn = lambda loss: aggregate_loss(loss, mask, mode, **kwargs)
        return np.asarray(jax.grad(fn)(np.zeros_like(mask)))


def log_softmax_tolerance(
    logits, temperature: float = 1.0, *, logit_error=0.0
) -> tuple[np.ndarray, np.ndarray]:
    """``(log_softmax(x), tolerance)`` in float64 for ``x = logits / temperature`` [..., V]:
    how far two float32 programs computing ``s - log sum exp s``, ``s = x - max x``, may
    disagree (`algorithms.token_logprobs`, `jax.nn.log_softmax`).

    Two programs' disagreement, eps per rounding, 2 eps per exp or log (1 ulp each): ``s`` errs
    by ``eps (|x| + |s|)`` (the division, the subtraction; the max is exact) plus the logits'
    own ``logit_error`` (e.g. a matmul's, from `float32_sum_tolerance`; the max's error shifts
    every ``s`` alike, which the result ignores); ``log Z`` by the sum's ``(V - 1) eps``
    relative error, the terms' (exp's 2 eps and their ``s`` error) and the log's 2 eps; the
    result by both plus one subtraction.
    """
    x = np.asarray(logits, np.float64) / temperature
    s = x - x.max(-1, keepdims=True)
    e_x = np.broadcast_to(np.asarray(logit_error, np.float64) / abs(temperature), x.shape)
    e_s = FLOAT32_EPS * (np.abs(x) + np.abs(s)) + e_x
    p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    log_z = np.log(np.exp(s).sum(-1, keepdims=True))
    e_log_z = (
        (s.shape[-1] - 1) * FLOAT32_EPS
        + (p * (e_s + 2 * FLOAT32_EPS)).sum(-1, keepdims=True)
        + 2 * FLOAT32_EPS * log_z
    )
    lp = s - log_z
    return lp, e_s + e_log_z + FLOAT32_EPS * np.abs(lp)


def float64_twin(model: Any) -> Any:
    """``model`` (a `CausalLM` or `ValueModel`, sharded or not) computing in float64: a model
    of its class whose ``dtype`` and ``param_dtype`` are float64, holding its parameters
    upcast (exactly), unsharded. Build and call it under ``jax.enable_x64(True)``: the exact
    reference that `assert_as_accurate` measures float32 programs against."""
    import dataclasses

    import jax
    from flax import nnx

    cfg = dataclasses.replace(model.config, dtype="float64", param_dtype="float64")
    abstract = nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0)))  # nothing computed
    graphdef, want, rest = nnx.split(abstract, nnx.Param, ...)
    assert not jax.tree.leaves(rest), "the twin holds only parameters"
    params = nnx.state(model, nnx.Param)
    shapes = lambda state: {p: v.get_value().shape for p, v in nnx.to_flat_state(state)}
    assert shapes(params) == shapes(want), (
        "float64_twin copies a plain model's parameters; this one has others (LoRA adapters, "
        "int8 weights' scales): build its twin as tests/learner/test_lora.py does"
    )
    return nnx.merge(graphdef, as_float64(params))


def as_float64(tree: Any) -> Any:
    """``tree`` with every floating-point array (JAX or numpy) upcast to float64, exactly;
    other arrays (integer, boolean) kept in their dtype, every array as a JAX array, and
    leaves without a dtype (Python numbers) unchanged. Call it under
    ``jax.enable_x64(True)`` (refused otherwise: JAX would silently keep float32): the
    inputs of the float64 run that `assert_as_accurate` measures float32 programs against."""
    import jax
    import jax.numpy as jnp

    if jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        raise ValueError("as_float64 needs JAX's 64-bit mode: run under jax.enable_x64(True)")

    def up(x: Any) -> Any:
        if not hasattr(x, "dtype"):
            return x
        wide = jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
        return jnp.asarray(np.asarray(jax.device_get(x)), wide)

    return jax.tree.map(up, tree)


def assert_as_accurate(
    got: Any, trusted: Any, exact: Any, *, factor: float = 4.0, trusted_exact: Any = None
) -> float:
    """A float32 program ``got`` is as accurate as the trusted float32 program ``trusted`` of
    the same computation: for every array of the (matching) pytrees,
    ``max|got - exact| <= factor * max|trusted - exact| + eps32 * max|exact|``, ``exact``
    being the same computation in float64 on the same float32 inputs (`float64_twin`,
    ``jax.enable_x64``). Returns the largest ``max|got - exact| / bound``. Where the two
    programs' exact values differ by design (the int8 sampler's ``x W_q s`` against the
    float model's ``x round32(W_q s)``), ``trusted_exact`` is the trusted program's.

    Two float32 programs of one computation (sharded vs unsharded, micro-batched vs whole,
    paged vs dense) round differently, and XLA:CPU fuses and orders sums per instruction
    set, so a fixed tolerance picked on one host fails on another (issue #26). The trusted
    program's distance from the exact result is this host's float32 error at these
    magnitudes; a program doing the same operations in another order errs by the same
    order (``factor`` covers the spread of two orders' worst elements), a bug by far more.
    The eps32 term is one rounding of the largest value (a leaf the trusted program got
    exactly right). A leaf of one number (a loss, a metric, a bias) has one sample of the
    error, not the worst of many, and the trusted program may land on the exact value by
    luck: there the factor is at least 16 and the floor 4 roundings of the value.
    """
    import jax

    trusted_exact = exact if trusted_exact is None else trusted_exact
    trees = (got, trusted, exact, trusted_exact)
    flat = [jax.tree_util.tree_flatten_with_path(a)[0] for a in trees]
    paths = [[jax.tree_util.keystr(p) for p, _ in leaves] for leaves in flat]
    assert all(p == paths[2] for p in paths), f"the pytrees' leaves differ: {paths}"
    for tree in (exact, trusted_exact):  # from a float64 run (counts may stay float32)
        dtypes = {np.asarray(jax.device_get(a)).dtype for a in jax.tree.leaves(tree)}
        assert np.dtype(np.float64) in dtypes, f"no float64 in the exact values: {dtypes}"
    worst = 0.0
    for path, *arrays in zip(paths[2], *([v for _, v in leaves] for leaves in flat)):
        g, t, x, tx = (np.asarray(jax.device_get(a), np.float64) for a in arrays)
        assert g.shape == t.shape == x.shape == tx.shape, (path, g.shape, t.shape, x.shape)
        trusted_err = np.abs(t - tx).max(initial=0)
        # An array this far from its exact value ran on other inputs: a test bug. (Not for
        # one number: a mean of ~0 or a KL of 1e-6 is rounding-dominated by nature.)
        assert x.size == 1 or trusted_err <= 1e-3 * np.abs(tx).max(initial=0), (
            f"{path}: the trusted value is {trusted_err:.3g} from the exact one: not one "
            "computation on the same inputs"
        )
        k, ulps = (factor, 1) if x.size > 1 else (max(factor, 16.0), 4)
        bound = k * trusted_err + ulps * FLOAT32_EPS * np.abs(x).max(initial=0)
        err = np.abs(g - x).max(initial=0)
        assert err <= bound, f"{path}: max|got - exact| = {err:.3g} > {bound:.3g}"
        worst = max(worst, err / bound if bound else 0.0)
    return worst


@functools.cache
def jitted(method: str = "__call__") -> Callable[..., Any]:
    """`model.<method>(*args, **kwargs)` as one jitted program per model graph and argument
    shapes: `jitted("extend")(model, cache, ids, start)`. Tests call models through it, as
    the engine and the steps run them: called eagerly, JAX compiles every operation of a
    forward as its own program (docs/testing.md, "Times"). One function per method, so the
    tests of one process share its compiled programs."""
    from flax import nnx

    return nnx.jit(lambda model, *args, **kwargs: getattr(model, method)(*args, **kwargs))


def randomise_lora_b(model: Any, seed: int = 1) -> None:
    """Non-zero B in every LoRA adapter of `model` (a trained adapter), so the adapter term
    shows in its outputs (fresh adapters have B = 0)."""
    import jax

    from jaxrl_llm.models.lora import adapters

    key = jax.random.key(seed)
    for ad in adapters(model):
        key, sub = jax.random.split(key)
        var = getattr(ad.module, ad.name + "_lora_b")
        var.set_value(0.05 * jax.random.normal(sub, var.shape))


def tiny_config(**overrides: Any):
    """A 2-layer `ModelConfig` (D=32, N=4, K=2, H=8, V=64): fast on 8 simulated devices and
    divisible by a 2x4 mesh."""
    from jaxrl_llm.models import ModelConfig

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4,
                 num_kv_heads=2, head_dim=8)  # fmt: skip
    return ModelConfig(**{**shape, **overrides})


def write_reference_checkpoint(
    path: str | os.PathLike,
    model_type: str = "qwen2",
    *,
    seed: int = 0,
    dtype: str = "float32",
    **overrides: Any,
):
    """Save a randomly initialised HF Qwen2/Qwen3/Llama model to `path`; returns the torch model.

    Weights are perturbed away from HF's init (zero biases, unit norms) so that every
    parameter, biases and norm weights included, affects the logits.
    """
    import torch
    import transformers

    arch = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[model_type]
    config_cls = getattr(transformers, f"{arch}Config")
    model_cls = getattr(transformers, f"{arch}ForCausalLM")
    kwargs = {**TINY_SHAPES, **overrides}
    torch.manual_seed(seed)
    config = config_cls(**kwargs)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(path))
    return model


def write_reward_model(
    path: str | os.PathLike,
    model_type: str = "qwen2",
    *,
    seed: int = 0,
    chat_template: bool = True,
    **overrides: Any,
):
    """Save a random HF `*ForSequenceClassification` reward model (one label, pad id 0) with
    the shipped tiny tokenizer (vocabulary 259) to `path`; returns the torch model. Without
    `chat_template` the tokenizer has none (plain prompt + response)."""
    import shutil

    import torch
    import transformers

    from jaxrl_llm.assets import builtin_checkpoint

    arch = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[model_type]
    config_cls = getattr(transformers, f"{arch}Config")
    model_cls = getattr(transformers, f"{arch}ForSequenceClassification")
    kwargs = {**TINY_SHAPES, "vocab_size": 259, "num_labels": 1, "pad_token_id": 0, **overrides}
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.score.weight.mul_(5.0)  # scores of order 1, not 0.05
    model.save_pretrained(str(path))
    files = ["tokenizer.json", "tokenizer_config.json"]
    files += ["chat_template.jinja"] if chat_template else []
    for name in files:
        shutil.copy(builtin_checkpoint() / name, os.path.join(path, name))
    return model


def digit_fraction_reward(
    response: str, ground_truth: Any = None, *, correct: float = 1.0, incorrect: float = 0.0
) -> float:
    """A dense test reward: the fraction of the response's characters that are digits.

    Even an untrained model's samples differ in it, so RL tests get a learning signal.
    """
    del ground_truth
    if not response:
        return incorrect
    frac = sum(ch.isdigit() for ch in response) / len(response)
    return incorrect + (correct - incorrect) * frac


def register_test_rewards() -> None:
    """Register `digit_fraction` (idempotent): for tests and their subprocesses."""
    from jaxrl_llm.rewards.registry import register_reward

    register_reward("digit_fraction")(digit_fraction_reward)


class ScriptedEngine:
    """The subset of `jaxrl_llm.rollout.Engine` that `RolloutDriver` uses, scripted.

    Every sample emits `turns[0]`; after a turn's text it emits `filler` until the driver
    stops it (so the driver's stop-string cut is exercised), and after the last turn EOS.
    A turn given as several texts is a choice by slot (slot b emits text b mod their count),
    so the samples of a group can differ (one right answer, one wrong: a nonzero advantage).
    `append_tokens` (the driver inserting a tool's output) starts the next turn. Each sampled
    token gets logprob `logprob`. `appended` records (slot, tokens, start) of each append.
    """

    def __init__(self, tokenizer, turns: Sequence[str | Sequence[str]], *, batch: int = 2,
                 cache_length: int = 4096, max_prefill_length: int | None = None,
                 filler: str = "~", logprob: float = -0.25):  # fmt: skip
        self.tokenizer = tokenizer
        self.batch = batch
        self.cache_length = cache_length
        self.max_prefill_length = max_prefill_length or cache_length // 2
        self.eos_ids = np.asarray([tokenizer.eos_token_id], np.int32)
        self.turns = [[self._ids(t)] if isinstance(t, str) else [self._ids(x) for x in t]
                      for t in turns]  # fmt: skip
        self.filler = self._ids(filler)[0]
        self.logprob = logprob
        self.appended: list[tuple[int, list[int], int]] = []
        self.prompt_lengths: dict[int, int] = {}
        self.released: list[int] = []

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def place_params(self, params):
        return params

    def load_params(self):
        return {}

    def prefill_bucket(self, length: int) -> int:
        return length

    def prefill(self, *, params, padded_tokens, true_length):
        return [int(true_length)]

    def prefill_many(self, params, prompts):
        return [len(p) for p in prompts]

    def init_decode_state(self):
        zeros = lambda: np.zeros(self.batch, np.int64)
        return {"turn": zeros(), "pos": zeros(), "left": zeros(), "active": zeros() > 0}

    def insert_slot(self, prefix, state, slot, sampling, max_new, row=0):
        self.prompt_lengths[slot] = prefix[row]
        state["turn"][slot], state["pos"][slot] = 0, 0
        state["left"][slot], state["active"][slot] = max_new, True
        return state

    def can_insert(self, prefix, max_new, row=0, slot=0) -> bool:
        return True

    def release_slot(self, slot) -> None:
        self.released.append(int(slot))

    def release_prompt(self, prefix, row: int = 0) -> None:
        pass  # no pages to return

    def append_tokens(self, params, state, slot, tokens, start, sampling, max_new):
        self.appended.append((slot, [int(t) for t in tokens], int(start)))
        state["turn"][slot] += 1
        state["pos"][slot] = 0
        state["left"][slot], state["active"][slot] = max_new, True
        return state

    def deactivate(self, state, slots):
        state["active"][list(slots)] = False
        return state

    def _next_token(self, state, b: int) -> int:
        texts = self.turns[min(state["turn"][b], len(self.turns) - 1)]
        turn = texts[b % len(texts)]
        if state["pos"][b] < len(turn):
            return turn[state["pos"][b]]
        if state["turn"][b] >= len(self.turns) - 1:
            return int(self.eos_ids[0])
        return self.filler

    def compile_steps_ahead(self, params, num_steps: int) -> None:
        """Nothing to compile: its steps run on the host."""

    def generate_steps(self, params, state, num_steps: int):
        from jaxrl_llm.rollout.records import StepRecords

        shape = (num_steps, self.batch)
        tokens = np.zeros(shape, np.int32)
        valid, done = np.zeros(shape, bool), np.zeros(shape, bool)
        for k in range(num_steps):
            for b in np.flatnonzero(state["active"]):
                token = self._next_token(state, b)
                state["pos"][b] += 1
                state["left"][b] -= 1
                tokens[k, b], valid[k, b] = token, True
                if token == self.eos_ids[0] or state["left"][b] <= 0:
                    done[k, b], state["active"][b] = True, False
        logprobs = np.where(valid, self.logprob, 0.0).astype(np.float32)
        records = StepRecords(
            tokens=tokens, logprobs=logprobs, raw_logprobs=logprobs, valid=valid, done=done
        )
        return state, records


class ReplyingEnv:
    """A chat environment (`agents.Environment`) that answers every turn but the final one
    with the same `reply` messages; `functools.partial(ReplyingEnv, reply)` is its factory."""

    tools = ()

    def __init__(self, reply: Sequence[dict[str, Any]]):
        self.reply = list(reply)

    def reset(self, row: Any) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "q"}]

    def step(self, turn: Any) -> Any:
        from jaxrl_llm.agents import StepResult

        return StepResult(done=True) if turn.final else StepResult(list(self.reply))

    def close(self) -> None:
        pass
