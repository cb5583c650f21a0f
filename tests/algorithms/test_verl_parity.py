"""Parity with an independent torch re-implementation of verl's core_algos formulas.

The torch functions below are written from the formulas in verl's docstrings and code
(``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``), in verl's style:
Python loops over groups and reversed time, float64. Our float32 results are within their
float32 rounding bound of those float64 values (derived per test, first order in eps32): a
formula that differs from verl's misses by far more.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrl_llm.algorithms as alg  # noqa: E402
from jaxrl_llm.testing import FLOAT32_EPS, float32_sum_tolerance  # noqa: E402
from tests.algorithms.test_advantages import (  # noqa: E402
    gae_returns_tolerance,
    gae_tolerance,
    np_gae,
    whiten_tolerance,
)
from tests.algorithms.test_logprobs import _assert_within, _exact_and_bounds  # noqa: E402


def mean_tolerance(x, e_x, m):
    """A masked mean of values ``x`` (float64) each within ``e_x``: their errors, the sum's
    roundings and the division's."""
    on = np.asarray(m) > 0
    x, n = np.asarray(x, np.float64)[on], on.sum()
    return (np.asarray(e_x)[on].sum() + float32_sum_tolerance(x)) / n + FLOAT32_EPS * abs(x.mean())


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
    r64, v64, mask = d["rewards"].astype(np.float64), d["values"].astype(np.float64), d["mask"]
    raw, _ = np_gae(r64, v64, mask, 0.97, 0.9)
    e_raw = gae_tolerance(r64, v64, mask, 0.97, 0.9)
    e_adv = whiten_tolerance(raw, e_raw, mask, ref_adv.numpy() * mask)
    e_ret = gae_returns_tolerance(r64, v64, mask, 0.97, 0.9)
    _assert_within(((np.asarray(adv)[m], ref_adv.numpy()[m]),), e_adv[m], "advantages")
    _assert_within(((np.asarray(ret)[m], ref_ret.numpy()[m]),), e_ret[m], "returns")


def test_grpo(data):
    scores = data["scores"]
    index = [i // 4 for i in range(len(scores))]
    want = verl_grpo(t(scores), index).numpy()
    # Integer scores, groups of 4: the mean and the centred scores are exact in float32, the
    # rest rounds at most 6 times (tests/learner/test_experience.py's overlong test).
    tol = 4 * FLOAT32_EPS * np.abs(want)
    _assert_within(((alg.grpo_advantages(jnp.asarray(scores), 4), want),), tol, "grpo")


def test_vanilla_policy_loss_with_dual_clip(data):
    d = data
    loss, m = alg.policy_loss(
        *(jnp.asarray(d[k]) for k in ("logp", "old", "adv", "mask")),
        clip_low=0.2,
        clip_high=0.28,
        dual_clip_c=3.0,
    )
    ref = verl_vanilla(*(t(d[k]) for k in ("old", "logp", "adv", "mask")), 0.2, 0.28, 3.0)
    # Per token: the log ratio rounds once, exp adds 2 eps, the product with -A (or -A times
    # a clip bound, itself rounded) one more; |L| <= |A| max(rho, 1.28). No ratio sits
    # within its rounding of a bound, so float32 takes float64's branches and the fractions
    # are exact counts but for their division.
    lr = d["logp"].astype(np.float64) - d["old"].astype(np.float64)
    rho, a = np.exp(lr), np.abs(d["adv"].astype(np.float64))
    e_rho = rho * FLOAT32_EPS * (np.abs(lr) + 2)
    for bound in (0.8, 1.28, 3.0):
        assert np.all(np.abs(rho - bound) > e_rho + FLOAT32_EPS * bound)
    size = a * np.maximum(rho, 1.28)
    e_loss = a * e_rho + 2 * FLOAT32_EPS * size
    tols = (
        mean_tolerance(size, e_loss, d["mask"]),
        FLOAT32_EPS * ref[1].item(),
        mean_tolerance(lr, FLOAT32_EPS * np.abs(lr), d["mask"]),
        FLOAT32_EPS * ref[3].item(),
    )
    got = (loss, m["pg_clipfrac"], m["ppo_kl"], m["pg_clipfrac_lower"])
    names = ("loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")
    for g, b, tol, name in zip(got, ref, tols, names, strict=True):
        assert abs(float(g) - b.item()) <= tol, (name, float(g), b.item(), tol)


def test_k3(data):
    got = alg.kl_penalty(jnp.asarray(data["logp"]), jnp.asarray(data["ref"]), "low_var_kl")
    want = verl_k3(t(data["logp"]), t(data["ref"])).numpy()
    # kl = ref - logp rounds once, exp adds 2 eps (and carries kl's error), - kl - 1 rounds
    # twice; a value clamped to +-10 is exact unless it sits within that of the clamp.
    kl = np.clip(data["ref"].astype(np.float64) - data["logp"].astype(np.float64), -20, 20)
    e = np.exp(kl) * FLOAT32_EPS * (np.abs(kl) + 2) + FLOAT32_EPS * np.abs(kl)
    e += FLOAT32_EPS * (np.abs(np.exp(kl) - kl) + np.abs(np.exp(kl) - kl - 1))
    clamped = np.abs(want) == 10  # k3 >= 0: only the upper clamp can bite
    assert np.all(np.abs(np.exp(kl) - kl - 1 - 10) > e)  # float32 clamps what float64 does
    _assert_within(((got, want),), np.where(clamped, 0.0, e), "k3")


def test_value_loss(data):
    d = data
    loss, m = alg.value_loss(
        *(jnp.asarray(d[k]) for k in ("values", "old", "rewards", "mask")), clip=0.5
    )
    ref_loss, ref_frac = verl_value_loss(
        t(d["values"]), t(d["rewards"]), t(d["old"]), t(d["mask"]), 0.5
    )
    # Per token, each branch's difference x - R rounds once (and old +- 0.5 once before it
    # when clipped), the square doubles that and rounds once more. No token sits within
    # that of the other branch, so float32 picks float64's branch and the fraction is an
    # exact count but for its division.
    v, old, ret = (d[k].astype(np.float64) for k in ("values", "old", "rewards"))
    vclip = np.clip(v, old - 0.5, old + 0.5)
    branch = {}
    for name, x in (("plain", v), ("clipped", vclip)):
        diff = x - ret
        e_diff = FLOAT32_EPS * (np.abs(x) + np.abs(diff))
        branch[name] = (diff**2, 2 * np.abs(diff) * e_diff + FLOAT32_EPS * diff**2)
    (l1, e1), (l2, e2) = branch["plain"], branch["clipped"]
    assert np.all(np.abs(l1 - l2)[l1 != l2] > (e1 + e2)[l1 != l2])
    e_tok = np.where(l2 > l1, e2, e1)
    tol = 0.5 * mean_tolerance(np.maximum(l1, l2), e_tok, d["mask"])  # the 0.5: exact
    assert abs(float(loss) - ref_loss.item()) <= tol, (float(loss), ref_loss.item(), tol)
    assert abs(float(m["vf_clipfrac"]) - ref_frac.item()) <= FLOAT32_EPS * ref_frac.item()


def test_logprobs_and_entropy():
    rng = np.random.default_rng(2)
    logits = (rng.normal(size=(3, 5, 13)) * 5).astype(np.float32)
    tokens = rng.integers(0, 13, size=(3, 5))
    lsm = torch.log_softmax(t(logits) / 0.6, dim=-1)
    ref_lp = torch.gather(lsm, -1, torch.as_tensor(tokens)[..., None])[..., 0]
    ref_ent = -(lsm.exp() * lsm).sum(-1)
    (_, _, _), (e_lp, e_ent, _) = _exact_and_bounds(logits, tokens, 0.6)  # float32 bounds
    got = alg.token_logprobs(jnp.asarray(logits), jnp.asarray(tokens), temperature=0.6)
    _assert_within(((got, ref_lp.numpy()),), e_lp, "logp")
    got = alg.entropy(jnp.asarray(logits), temperature=0.6)
    _assert_within(((got, ref_ent.numpy()),), e_ent, "entropy")
