"""Parity with an independent torch re-implementation of verl's core_algos formulas.

The torch functions below are written from the formulas in verl's docstrings and code
(``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``), in verl's style:
Python loops over groups and reversed time, float64.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrl_llm.algorithms as alg  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


def t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def verl_masked_mean(x, m):
    return (x * m).sum() / m.sum()


def verl_masked_whiten(x, m):
    mean = verl_masked_mean(x, m)
    var = verl_masked_mean((x - mean) ** 2, m) * (m.sum() / (m.sum() - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8)


def verl_gae(r, v, m, gamma, lam):
    nextv, last, out = 0, 0, []
    for i in reversed(range(r.shape[1])):
        delta = r[:, i] + gamma * nextv - v[:, i]
        last_ = delta + gamma * lam * last
        nextv = v[:, i] * m[:, i] + (1 - m[:, i]) * nextv
        last = last_ * m[:, i] + (1 - m[:, i]) * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    return verl_masked_whiten(adv, m), adv + v


def verl_grpo(scores, index, eps=1e-6):
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(scores[i])
    out = scores.clone()
    for i, g in enumerate(index):
        s = torch.stack(groups[g])
        out[i] = (scores[i] - s.mean()) / (s.std() + eps)
    return out


def verl_vanilla(old, logp, adv, m, lo, hi, c):
    neg_kl = torch.clamp(logp - old, -20, 20)
    ratio = torch.exp(neg_kl)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
    clip1 = torch.maximum(l1, l2)
    l3 = -adv * c
    clip2 = torch.min(l3, clip1)
    losses = torch.where(adv < 0, clip2, clip1)
    return (
        verl_masked_mean(losses, m),
        verl_masked_mean((l2 > l1).double(), m),
        verl_masked_mean(-neg_kl, m),
        verl_masked_mean(((clip1 > l3) & (adv < 0)).double(), m),
    )


def verl_k3(logp, ref):
    kl = torch.clamp(ref - logp, -20, 20)
    return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)


def verl_value_loss(vpred, ret, old, m, clip):
    vclip = torch.max(torch.min(vpred, old + clip), old - clip)
    l1, l2 = (vpred - ret) ** 2, (vclip - ret) ** 2
    return 0.5 * verl_masked_mean(torch.max(l1, l2), m), verl_masked_mean((l2 > l1).double(), m)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    b, n = 8, 12
    mask = (rng.random((b, n)) < 0.75).astype(np.float32)
    mask[:, 0] = 1
    old = -np.abs(rng.normal(size=(b, n))).astype(np.float32)
    return dict(
        mask=mask,
        rewards=rng.normal(size=(b, n)).astype(np.float32),
        values=rng.normal(size=(b, n)).astype(np.float32),
        old=old,
        logp=(old + 0.4 * rng.normal(size=(b, n))).astype(np.float32),
        ref=(old + 3.0 * rng.normal(size=(b, n))).astype(np.float32),
        adv=rng.normal(size=(b, n)).astype(np.float32),
        scores=rng.integers(0, 3, size=b).astype(np.float32),
    )


def test_gae(data):
    d = data
    adv, ret = jax.jit(alg.gae_advantages)(
        jnp.asarray(d["rewards"]),
        jnp.asarray(d["values"]),
        jnp.asarray(d["mask"]),
        gamma=0.97,
        lam=0.9,
    )
    ref_adv, ref_ret = verl_gae(t(d["rewards"]), t(d["values"]), t(d["mask"]), 0.97, 0.9)
    m = d["mask"] > 0  # we zero masked positions; verl leaves carried values there
    np.testing.assert_allclose(np.asarray(adv)[m], ref_adv.numpy()[m], **TOL)
    np.testing.assert_allclose(np.asarray(ret)[m], ref_ret.numpy()[m], **TOL)


def test_grpo(data):
    scores = data["scores"]
    index = [i // 4 for i in range(len(scores))]
    np.testing.assert_allclose(
        alg.grpo_advantages(jnp.asarray(scores), 4), verl_grpo(t(scores), index).numpy(), **TOL
    )


def test_vanilla_policy_loss_with_dual_clip(data):
    d = data
    loss, m = alg.policy_loss(
        *(jnp.asarray(d[k]) for k in ("logp", "old", "adv", "mask")),
        clip_low=0.2,
        clip_high=0.28,
        dual_clip_c=3.0,
    )
    ref = verl_vanilla(*(t(d[k]) for k in ("old", "logp", "adv", "mask")), 0.2, 0.28, 3.0)
    got = (loss, m["pg_clipfrac"], m["ppo_kl"], m["pg_clipfrac_lower"])
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b.item(), **TOL)


def test_k3(data):
    got = alg.kl_penalty(jnp.asarray(data["logp"]), jnp.asarray(data["ref"]), "low_var_kl")
    np.testing.assert_allclose(got, verl_k3(t(data["logp"]), t(data["ref"])).numpy(), **TOL)


def test_value_loss(data):
    d = data
    loss, m = alg.value_loss(
        *(jnp.asarray(d[k]) for k in ("values", "old", "rewards", "mask")), clip=0.5
    )
    ref_loss, ref_frac = verl_value_loss(
        t(d["values"]), t(d["rewards"]), t(d["old"]), t(d["mask"]), 0.5
    )
    np.testing.assert_allclose(loss, ref_loss.item(), **TOL)
    np.testing.assert_allclose(m["vf_clipfrac"], ref_frac.item(), **TOL)


def test_logprobs_and_entropy():
    rng = np.random.default_rng(2)
    logits = (rng.normal(size=(3, 5, 13)) * 5).astype(np.float32)
    tokens = rng.integers(0, 13, size=(3, 5))
    lsm = torch.log_softmax(t(logits) / 0.6, dim=-1)
    ref_lp = torch.gather(lsm, -1, torch.as_tensor(tokens)[..., None])[..., 0]
    ref_ent = -(lsm.exp() * lsm).sum(-1)
    got = alg.token_logprobs(jnp.asarray(logits), jnp.asarray(tokens), temperature=0.6)
    np.testing.assert_allclose(got, ref_lp.numpy(), **TOL)
    got = alg.entropy(jnp.asarray(logits), temperature=0.6)
    np.testing.assert_allclose(got, ref_ent.numpy(), **TOL)
