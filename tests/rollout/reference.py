"""Reference computations for the rollout tests: a tiny config and full recomputation."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import ModelConfig
from jaxrl_llm.testing import float64_twin

TINY = ModelConfig(vocab_size=128, num_heads=4, num_kv_heads=4, eos_token_id=5)


@jax.jit(static_argnums=0)
def _forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)


def _right_padded(rows, width=None, multiple=64):
    """int32 [len(rows), width] holding each row from its start, zeros after (causal: the
    pads change no earlier logit); width: the longest row rounded up to `multiple` when not
    given, so rows of many lengths share a few compiled shapes."""
    width = width or -(-max(map(len, rows)) // multiple) * multiple
    padded = np.zeros((len(rows), width), np.int32)
    for b, r in enumerate(rows):
        padded[b, : len(r)] = r
    return jnp.asarray(padded)


def full_logits(model, rows, width=64):
    """float32 logits [len(rows), V] of each row's last token by an uncached forward.

    Rows are right-padded to one width (causal: pads cannot change earlier logits), so one
    compiled shape serves every call.
    """
    graphdef, state = nnx.split(model)
    logits = np.asarray(_forward(graphdef, state, _right_padded(rows, width)))
    return logits[np.arange(len(rows)), [len(r) - 1 for r in rows]]


def teacher_forced_logits(graphdef, params, ids, multiple=64):
    """float32 logits [len(ids) - 1, V] of each next token of the sequence `ids` (1-D) by one
    forward, the row right-padded to a multiple of `multiple` tokens (`_right_padded`)."""
    padded = _right_padded([ids], multiple=multiple)
    return _forward(graphdef, params, padded)[0, : len(ids) - 1]


def naive_greedy(model, prompt, steps, eos=(), width=64):
    """Greedy continuation by recomputing the whole sequence at every step."""
    seq, out = list(prompt), []
    for _ in range(steps):
        tok = int(full_logits(model, [seq], width)[0].argmax())
        out.append(tok)
        seq.append(tok)
        if tok in eos:
            break
    return out


def exact_logprobs(model, samples, temperature=1.0):
    """float64 log-probabilities [sum of lengths] of every sample's tokens, teacher-forced on
    its prompt and tokens, by the model's float64 twin (`testing.float64_twin`): the exact
    values an engine's float32 logprobs round from (`testing.assert_as_accurate`). One
    uncached forward per sample (causal: a token's logits see only what precedes it), the
    rows right-padded to one width, a multiple of 64."""
    seqs = [list(c.prompt_ids) + list(c.token_ids) for c in samples]
    with jax.enable_x64(True):
        graphdef, state = nnx.split(float64_twin(model))
        logits = np.asarray(_forward(graphdef, state, _right_padded(seqs)))
        logp = np.asarray(jax.nn.log_softmax(logits / temperature, -1))
    out = []
    for b, c in enumerate(samples):
        P, T = len(c.prompt_ids), len(c.token_ids)
        out.append(logp[b, np.arange(P - 1, P + T - 1), c.token_ids])
    return np.concatenate(out)
