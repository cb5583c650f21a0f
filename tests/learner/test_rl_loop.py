"""The RL loop end to end on the shipped tiny model: files, metrics, options, exact resume."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_llm.algorithms import adaptive_kl_coef
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config import parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner import overlap
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.metrics import read_metrics
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.testing import register_test_rewards
from tests.rollout.scripted import script_the_engine

from .rl_helpers import TINY_RL_PARAMS

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _test_rewards():
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS


def _config(run_dir, *extra):
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{run_dir}'", *extra])
    return RLConfig()


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in records]


def _same(x, y) -> bool:
    """Equal, NaN equal to NaN (a metric with nothing to average is NaN in both runs)."""
    return x == y or (x != x and y != y)


def test_grpo_run_writes_everything_and_learns_the_dense_reward(tmp_path, monkeypatch):
    from jaxrl_llm.learner import learn

    # All 8 simulated devices (FSDP over them): the loop's sharded path, end to end.
    cfg = _config(tmp_path / "run", "RLConfig.steps = 6", "RLConfig.eval_every = 6",
                  "MeshConfig.devices = -1")  # fmt: skip
    update, fetch, fetched = learn.update, learn.fetch, []

    def device_only_update(*args):
        policy, critic, out, padding = update(*args)  # metrics stay on the device throughout
        assert all(isinstance(v, jax.Array) for vs in out.values.values() for v in vs)
        return policy, critic, out, padding

    def counted_fetch(*parts):
        fetched.append(sum(len(p.values) for p in parts))
        return fetch(*parts)

    monkeypatch.setattr(learn, "update", device_only_update)
    monkeypatch.setattr(learn, "fetch", counted_fetch)
    records = run_rl(cfg)
    assert len(fetched) == 6 and min(fetched) > 10  # one transfer per step, for all metrics
    run = tmp_path / "run"
    for name in ("config.gin", "metrics.jsonl", "hf/model.safetensors", "samples/step_6.jsonl"):
        assert (run / name).exists(), name
    assert "AlgoConfig.estimator = 'grpo'" in (run / "config.gin").read_text()
    steps = [r["step"] for r in read_metrics(run)]
    assert steps == [0, 1, 2, 3, 4, 5, 6]
    last = records[-1]
    expected = [
        "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy",
        "actor/grad_norm", "critic/score/mean", "critic/rewards/mean",
        "critic/advantages/mean", "response_length/mean", "response_length/max",
        "response_length/clip_ratio", "val/test_score", "rollout/logprob_diff/mean",
        "timing/rollout", "timing/experience", "timing/update", "timing/step",
        "perf/tokens_per_s", "perf/padding_frac", "perf/experience_padding_frac",
        "batch/all_equal_groups_frac",  # GRPO: a group baseline
    ]  # fmt: skip
    for key in expected:
        assert key in last, key
    # Engine and trainer compute the same logprobs (same params, same float32 math).
    assert max(r["rollout/logprob_diff/max"] for r in records[1:]) < 1e-3
    sample = json.loads((run / "samples/step_1.jsonl").read_text().splitlines()[0])
    assert {"prompt_id", "reward"} <= set(sample)
    first = np.mean([r["critic/score/mean"] for r in records[1:3]])
    later = np.mean([r["critic/score/mean"] for r in records[-2:]])
    assert later > first, (first, later)


@pytest.mark.slow  # measured: 85 s on 2 shared cores (two runs, each compiling)
def test_packed_run_equals_unpacked_run(tmp_path):
    """A step with packed forwards has the metrics of one with a sample per row, and packs:
    less padding in its forwards."""
    params = (
        "RLConfig.steps = 1", "AlgoConfig.estimator = 'gae'", "AlgoConfig.ppo_epochs = 2",
        "AlgoConfig.micro_batch_size = 4", "DataConfig.max_prompt_length = 256",
    )  # fmt: skip
    packed = run_rl(_config(tmp_path / "packed", *params))[-1]
    plain = run_rl(_config(tmp_path / "plain", *params, "PolicyConfig.pack_sequences = False"))[-1]
    assert packed["perf/padding_frac"] < plain["perf/padding_frac"]
    assert packed["perf/experience_padding_frac"] < plain["perf/experience_padding_frac"]
    want = _comparable([plain])[0]
    assert want.keys() == _comparable([packed])[0].keys()
    for k, v in want.items():
        np.testing.assert_allclose(packed[k], v, rtol=1e-4, atol=1e-6, err_msg=k)


def test_ppo_with_critic_and_kl_options(tmp_path):
    """PPO with a critic, a KL loss and an adaptive KL in the reward, entropy bonus, TIS,
    the overlong filter, two epochs, bfloat16 rollout weights and remat; stopped after step 1
    and resumed, so step 2's adaptive KL coefficient is the checkpoint's, moved by verl's
    rule."""
    params = [
        "RLConfig.steps = 2",
        "RLConfig.save_every = 1",
        "AlgoConfig.estimator = 'gae'",
        "AlgoConfig.use_kl_loss = True",
        "AlgoConfig.kl_in_reward_coef = 0.01",
        # 8 samples a step over a horizon of 10: each step moves the coefficient by up to 16%.
        "AlgoConfig.kl_in_reward_target = 0.001",
        "AlgoConfig.kl_in_reward_horizon = 10.0",
        "AlgoConfig.entropy_coef = 0.001",
        # Just above 1, so that it engages: bfloat16 rollout weights (rounded by up to 2^-8
        # ~ 4e-3 relative) move the sampler's logprobs off the float32 trainer's by more
        # than 1e-3 on some tokens (rollout/logprob_diff/mean is 1e-3 to 3e-3 here).
        "AlgoConfig.is_cap = 1.001",
        "AlgoConfig.overlong_filter = True",
        # The tiny model's "a + b = c." samples end at the stop, its "Let me compute ..."
        # ones at the length cap: the overlong filter leaves those out, and something is
        # trained (with no stop, every sample was filtered and the step trained nothing).
        "RolloutConfig.stop = ('.',)",
        "AlgoConfig.ppo_epochs = 2",
        "PolicyConfig.rollout_dtype = 'bfloat16'",
        "PolicyConfig.remat = True",
    ]
    records = run_rl(_config(tmp_path / "ppo", *params), stop_after=1)
    records += run_rl(_config(tmp_path / "ppo", *params), resume=True)
    assert [r["step"] for r in records] == [1, 2]
    first, last = records
    # Step 1: policy = reference, KL 0, so the coefficient falls by the most, 1 - 0.2 * 8 / 10.
    assert first["actor/reward_kl_penalty"] == 0.0
    coef = np.float32(0.01)
    assert first["actor/reward_kl_penalty_coeff"] == coef
    want = adaptive_kl_coef(coef, np.float32(0.0), 8, target_kl=0.001, horizon=10.0)
    assert last["actor/reward_kl_penalty_coeff"] == np.float32(want), (want, last)
    assert last["actor/reward_kl_penalty_coeff"] == pytest.approx(0.01 * 0.84, rel=1e-6)
    assert last["actor/reward_kl_penalty"] > 0
    for r in records:
        assert 0 < r["response_length/clip_ratio"] < 1, r["response_length/clip_ratio"]
        assert r["actor/trained_tokens"] > 0
    last = records[-1]
    # bfloat16 rollout weights: the rollout/trainer gap is measured, nonzero and small.
    assert 0 < last["rollout/logprob_diff/mean"] < 0.5
    assert "critic/vf_loss" in last and np.isfinite(last["critic/vf_loss"])
    assert "critic/values/mean" in last
    assert "actor/kl_loss" in last and last["actor/kl_loss"] >= 0
    assert last["actor/lr_step"] == 2 * 2 * 2  # steps x epochs x mini-batches
    # The importance weights reach the cap on some tokens and are truncated there.
    is_seen = {k: last[k] for k in ("is/clipped_frac", "is/weight/max", "is/weight/mean")}
    assert last["is/clipped_frac"] > 0, is_seen
    assert last["is/weight/max"] > 1.001, is_seen


def test_on_policy_step_skips_the_old_forward_and_reports_the_mismatch(tmp_path):
    """One epoch of one mini-batch: no old-logprob forward; the rollout mismatch comes from
    the policy step's own logprobs, and its ratio is exactly 1."""
    cfg = _config(tmp_path / "on", "RLConfig.steps = 2", "AlgoConfig.mini_batches = 1",
                  "AlgoConfig.micro_batch_size = 4")  # fmt: skip
    records = run_rl(cfg)
    assert len(records) == 2
    for r in records:
        assert 0 <= r["rollout/logprob_diff/max"] < 1e-3  # same params, same float32 math
        assert r["actor/ppo_kl"] == 0.0 and r["actor/pg_clipfrac"] == 0.0


def test_dynamic_sampling_reports_tries(tmp_path):
    # A reward that pays 0 for right and wrong alike: every group is all-equal.
    cfg = _config(
        tmp_path / "dapo",
        "RLConfig.steps = 1",
        "AlgoConfig.dynamic_sampling = True",
        "AlgoConfig.max_sampling_tries = 2",
        "RewardConfig.name = 'math'",
        "RewardConfig.correct = 0.0",
        "RewardConfig.incorrect = 0.0",
    )
    records = run_rl(cfg)
    assert records[-1]["dynamic_sampling/tries"] == 2
    assert records[-1]["dynamic_sampling/dropped_groups"] == 4


@pytest.fixture(scope="module")
def three_step_run(tmp_path_factory):
    """One 3-step run (checkpoint at step 3) that the tests below read; a test that changes
    it works on a copy."""
    register_test_rewards()
    run_dir = tmp_path_factory.mktemp("three_step") / "run"
    run_rl(_config(run_dir, "RLConfig.steps = 3", "RLConfig.save_every = 3"), stop_after=3)
    return run_dir


def test_existing_run_dir_needs_resume(three_step_run):
    # A configuration error (one line from the CLI, exit 2), before any model is built.
    with pytest.raises(ConfigError, match=r"already has checkpoints .*--resume"):
        run_rl(_config(three_step_run, "RLConfig.steps = 3"))


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_a_resume_takes_the_configured_kl_coefficient_unless_adaptive_saved_one(
    tmp_path, three_step_run, adaptive
):
    """A fixed KL-in-the-reward coefficient is the config's on resume (a changed one is
    taken: the run keeps no weight of its own), and an adaptive controller resumed from a
    checkpoint that holds no value of its own (this run had no KL in the reward) starts at
    the configured coefficient, not at 0, from which it could never move. (Resuming an
    adaptive run's own value: the PPO test.)"""
    from jaxrl_llm.learner.rl_loop import build_run, close_run

    run_dir = tmp_path / "c"
    shutil.copytree(three_step_run, run_dir)
    extra = ["RLConfig.steps = 4", "AlgoConfig.kl_in_reward_coef = 0.05"]
    if adaptive:
        extra.append("AlgoConfig.kl_in_reward_target = 0.1")
    run = build_run(_config(run_dir, *extra), resume=True)
    try:
        assert run.learner.state.step == 3
        assert run.learner.state.kl_coef == (0.05 if adaptive else None)
    finally:
        close_run(run)


def _train_cmd(run_dir, *extra, resume=False):
    params = [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{run_dir}'", *extra]
    cmd = [sys.executable, "-c", "import sys, jaxrl_llm.testing as t; t.register_test_rewards(); "
           "from jaxrl_llm.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "train"]  # fmt: skip
    for p in params:
        cmd += ["--gin_param", p]
    return [*cmd, "--resume"] if resume else cmd


def _kill_after_checkpoint(cmd, run_dir, env, step):
    """Start `cmd`, SIGKILL it as soon as its checkpoint `step` is complete."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    try:
        while time.time() < deadline and not (run_dir / "checkpoints" / str(step)).is_dir():
            if proc.poll() is not None:
                pytest.fail("training ended before it could be killed")
            time.sleep(0.05)
        assert proc.poll() is None, "training ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_and_resume_matches_uninterrupted_run(tmp_path):
    """Killed after checkpoint 3 and resumed: the metrics of the uninterrupted run. With the
    rollout overlapped two steps ahead (`max_staleness = 2`: steps 4 and 5 were being sampled
    at the kill), the resumed run trains every prompt of the data order once, in order."""
    # Long enough (24 steps, checkpoints every 3) that the kill lands mid-run however late
    # this process sees step 3's checkpoint on a loaded machine: a 6-step run once ended
    # in the ~0.3 s between its checkpoint 3 and its exit, before it could be killed.
    # One device; other XLA flags kept (`--xla_cpu_max_isa=AVX2` reaches the training runs).
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]  # fmt: skip
    env = {
        **os.environ,
        "XLA_FLAGS": " ".join([*flags, "--xla_force_host_platform_device_count=1"]),
    }
    steps = "RLConfig.steps = 24"
    straight = tmp_path / "straight"
    subprocess.run(_train_cmd(straight, steps), env=env, check=True, capture_output=True,
                   timeout=600)  # fmt: skip

    killed = tmp_path / "killed"
    _kill_after_checkpoint(_train_cmd(killed, steps), killed, env, 3)
    assert not (killed / "checkpoints" / "24").exists()
    assert len(read_metrics(killed)) < 24
    subprocess.run(_train_cmd(killed, steps, resume=True), env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    a, b = _comparable(read_metrics(straight)), _comparable(read_metrics(killed))
    assert [r["step"] for r in b] == [r["step"] for r in a] == list(range(1, 25))
    # Bit-identical (README: `--resume` continues bit-for-bit), so every metric but the
    # timings is equal, not close: every differing (step, metric) is named at once.
    assert [r.keys() for r in b] == [r.keys() for r in a]
    differ = [(ra["step"], k, ra[k], rb[k]) for ra, rb in zip(a, b) for k in ra
              if not _same(ra[k], rb[k])]  # fmt: skip
    assert not differ, f"resumed != uninterrupted at (step, metric, straight, resumed): {differ}"

    ahead = tmp_path / "ahead"
    overlapped = [steps, "RLConfig.max_staleness = 2"]
    _kill_after_checkpoint(_train_cmd(ahead, *overlapped), ahead, env, 3)
    subprocess.run(_train_cmd(ahead, *overlapped, resume=True), env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    assert [r["step"] for r in read_metrics(ahead)] == list(range(1, 25))
    for step in range(1, 25):
        assert _trained_prompts(ahead, step) == _trained_prompts(straight, step), step


def test_interrupted_checkpoint_is_never_loaded(tmp_path, three_step_run):
    shutil.copytree(three_step_run, tmp_path / "c")
    ckpts = tmp_path / "c" / "checkpoints"
    # A half-written step as Orbax leaves it when killed mid-save.
    (ckpts / "6.orbax-checkpoint-tmp").mkdir()
    (ckpts / "6.orbax-checkpoint-tmp" / "junk").write_text("partial")
    from jaxrl_llm.learner.checkpoint import Checkpointer

    ckpt = Checkpointer(ckpts)
    assert ckpt.latest_step() == 3
    assert 6 not in ckpt.all_steps()
    # Orbax removes leftovers in the background and waits for that before its next save.
    ckpt.save(4, {"x": np.zeros(2, np.float32)}, {"note": "after"})
    assert not Path(ckpts / "6.orbax-checkpoint-tmp").exists()
    assert ckpt.latest_step() == 4
    ckpt.close()


def test_export_writes_the_checkpointed_policy(tmp_path, three_step_run):
    from flax import nnx

    from jaxrl_llm.assets import builtin_checkpoint
    from jaxrl_llm.learner.checkpoint import Checkpointer
    from jaxrl_llm.learner.export import export_policy
    from jaxrl_llm.models import from_pretrained

    run = three_step_run
    # The trainer's save in progress, as a live run has it: export reads beside it and leaves
    # it alone (a writer's checkpoint manager would delete it, failing the trainer's save).
    in_flight = run / "checkpoints" / "4.orbax-checkpoint-tmp"
    (in_flight / "state").mkdir(parents=True)
    try:
        assert export_policy(run, tmp_path / "hf") == 3
        assert (in_flight / "state").is_dir()
    finally:
        shutil.rmtree(in_flight)
    exported = nnx.state(from_pretrained(tmp_path / "hf"))
    saved = Checkpointer(run / "checkpoints").restore_raw(3)["policy"]["params"]
    for path, var in nnx.to_flat_state(exported):
        leaf = saved
        for key in path:
            leaf = leaf[str(key)] if str(key) in leaf else leaf[key]
        np.testing.assert_array_equal(np.asarray(var.get_value()), np.asarray(leaf["value"]))
    builtin = nnx.state(from_pretrained(builtin_checkpoint()))
    changed = [
        not np.array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
        for (_, a), (_, b) in zip(nnx.to_flat_state(exported), nnx.to_flat_state(builtin))
    ]
    assert any(changed)  # training moved the weights


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_search_r1_tool_turns_in_the_loop(tmp_path, monkeypatch, masked):
    """A scripted policy (`ScriptedEngine`: it searches, then answers) through the real loop,
    search tool and update: every sample makes one search, and the retrieved passages are in
    the trained rows but masked from the loss (the default), while every model-written token
    is trained. With `mask_tool_output = False` (the ablation) the passages are trained too,
    with old logprobs of their own, and the rollout mismatch still reads model tokens only."""
    from jaxrl_llm.learner import learn

    turns = ["<search> capital of a country </search>", "<answer> Paris </answer>"]
    make_experience, seen = learn.make_experience, []

    def recorded_experience(*args):
        seen.append(make_experience(*args))
        return seen[-1]

    script_the_engine(monkeypatch, turns)
    monkeypatch.setattr(learn, "make_experience", recorded_experience)
    cfg = _config(
        tmp_path / "s",
        "RLConfig.steps = 1",
        "DataConfig.builtin_task = 'retrieval'",
        "DataConfig.template = 'search_r1'",
        "DataConfig.max_prompt_length = 768",
        "RolloutConfig.tool = 'search'",
        "SearchConfig.k = 1",
        "RolloutConfig.max_new_tokens = 256",  # 768 + 256: the model's 1,024 positions
        "RewardConfig.name = 'exact_match'",
        f"AlgoConfig.mask_tool_output = {masked}",
    )
    records = run_rl(cfg)
    assert (tmp_path / "s" / "data" / "corpus.jsonl").is_file()
    assert records[-1]["env/tool_calls/mean"] == 1.0
    assert records[-1]["env/ratio_of_valid_action"] == 1.0
    tok = load_tokenizer(builtin_checkpoint())
    ((exp, _, _, _),) = seen  # (experience, its device metrics, padding share, plan)
    assert exp.rollout.policy_version == 1 and exp.rollout.group_size == cfg.rollout.n
    assert [c.tool_calls for c in exp.rollout.completions] == [1] * len(exp.rollout.completions)
    batch, model_masks = exp.batch, exp.model_mask
    rows = zip(np.asarray(batch.input_ids), np.asarray(batch.loss_mask), model_masks, strict=True)
    for ids, loss_mask, model_mask in rows:
        if masked:
            np.testing.assert_array_equal(loss_mask, model_mask)
        start = np.flatnonzero(model_mask)[0]  # first response token
        end = np.flatnonzero(model_mask)[-1] + 1
        assert tok.decode(ids[model_mask > 0]) == "".join(turns)
        passages = tok.decode(ids[start:end][model_mask[start:end] == 0])
        assert passages.startswith("\n\n<information>Doc 1(Title: ") and passages.endswith(
            "</information>\n\n"
        ), passages
        trained = tok.decode(ids[loss_mask > 0])
        assert trained == ("".join(turns) if masked else tok.decode(ids[start:end])), trained
    tool_tokens = (np.asarray(batch.loss_mask) > 0) & (model_masks == 0)
    assert tool_tokens.any() != masked
    old = np.asarray(batch.old_logprobs)
    assert np.all(old[tool_tokens] < 0)  # the trainer's own logprobs on the passages
    np.testing.assert_array_equal(np.asarray(batch.rollout_logprobs)[tool_tokens], old[tool_tokens])


def _trained_prompts(run_dir, step):
    path = Path(run_dir) / "samples" / f"step_{step}.jsonl"
    return [json.loads(line)["prompt_id"] for line in path.read_text().splitlines()]


def test_overlapped_run_lags_exactly_k_and_trains_every_prompt_once(tmp_path, three_step_run):
    """`RLConfig.max_staleness = 1`: step 1 samples with the initial weights as the
    synchronous run does (its metrics equal to the digit); steps 2-3 sample with the weights
    one update behind (staleness 1, reported). Every step trains the same prompts as the
    synchronous run (none dropped, none repeated), also after a stop and resume from a
    checkpoint taken while the next batch was already being sampled, which then equals the
    uninterrupted run."""
    sync = read_metrics(three_step_run)
    k1 = tmp_path / "k1"
    ahead = run_rl(_config(k1, "RLConfig.steps = 3", "RLConfig.save_every = 3",
                           "RLConfig.max_staleness = 1"))  # fmt: skip
    assert [r["rollout/staleness/max"] for r in ahead] == [0.0, 1.0, 1.0]
    assert [r["rollout/staleness/max"] for r in sync] == [0.0, 0.0, 0.0]
    assert _comparable(ahead)[0] == _comparable(sync)[0]
    assert _comparable(ahead)[1] != _comparable(sync)[1]  # sampled with older weights
    assert all(r["timing/rollout_wait"] >= 0 for r in ahead)
    for step in (1, 2, 3):
        assert _trained_prompts(k1, step) == _trained_prompts(three_step_run, step)

    # Stopped after step 1 (its checkpoint taken while step 2 was sampled ahead), resumed.
    stopped = tmp_path / "stopped"
    cfg = lambda: _config(stopped, "RLConfig.steps = 3", "RLConfig.save_every = 1",
                          "RLConfig.max_staleness = 1")  # fmt: skip
    run_rl(cfg(), stop_after=1)
    resumed = run_rl(cfg(), resume=True)
    assert [r["step"] for r in resumed] == [2, 3]
    # Step 2 samples with the initial weights, which checkpoint 1 does not hold: the
    # checkpoint waited for its batch and saved it, and the resumed run trained it, so the
    # resumed run is the uninterrupted one to the digit.
    assert _comparable(resumed) == _comparable(ahead)[1:]
    for step in (1, 2, 3):
        assert _trained_prompts(stopped, step) == _trained_prompts(three_step_run, step)


def _swap_mid_sample(monkeypatch, at_ask: int, wait_s: float = 300.0) -> None:
    """Partial rollouts with every swap that can happen made certain, at a fixed point.

    Step s's newest possible weights are those after update s - 1 (the trainer's update s - 1
    needs only batch s - 1, already sampled; update s needs batch s). Two holds pin where
    they reach it: the trainer publishes update u (first <= u < last) only once the
    producer has begun step u + 1, so that step starts with older weights and update u is
    certain to come while it samples; and that step's sampler is handed nothing newer
    before its `at_ask`-th ask (the driver asks before each device call while samples are
    left to decode, the first before any), where it waits for update u's copy to be
    computed and continues with it through the real refresh. A step no newer weights can
    reach (the first) never waits. The waits end on what they wait for; `wait_s` only
    bounds a hang, which fails the run loudly."""
    cls = overlap.RolloutProducer
    wait_for_weights, refresher, publish = cls._wait_for_weights, cls._refresher, cls.publish
    begun: dict[int, int] = {}  # step -> the updates the producer began it with

    def recorded_wait(self, step):  # (holding self._cond)
        updates = wait_for_weights(self, step)
        if updates is not None:
            begun[step] = updates
            self._cond.notify_all()  # a publish held for this step goes ahead
        return updates

    def held_publish(self, updates, trained, frozen):
        if self._first <= updates < self._last:  # step updates + 1 is still to sample
            with self._cond:
                began = lambda: updates + 1 in begun or self._error is not None
                assert self._cond.wait_for(began, wait_s), f"step {updates + 1} never began"
        publish(self, updates, trained, frozen)

    def pinned_refresher(self, updates):
        inner, step = refresher(self, updates), max(begun)  # the step it is called for
        if updates >= step - 1:  # nothing newer can reach this step
            return inner
        asks = 0

        def refresh():
            nonlocal asks
            asks += 1
            if asks < at_ask:
                return None  # as if the newer weights were not yet computed
            if asks == at_ask:
                with self._cond:
                    there = lambda: step - 1 in self._weights or self._stopping
                    assert self._cond.wait_for(there, wait_s), f"update {step - 1} never came"
                    newer = self._weights.get(step - 1)
                if newer is None:  # the run is stopping
                    return None
                jax.block_until_ready(newer.params)  # computed: the real refresh hands it over
                got = inner()
                assert got is not None and got.version == step, (step, got)
                return got
            return inner()

        return refresh

    monkeypatch.setattr(cls, "_wait_for_weights", recorded_wait)
    monkeypatch.setattr(cls, "publish", held_publish)
    monkeypatch.setattr(cls, "_refresher", pinned_refresher)


def test_partial_rollouts_keep_the_bound_and_train_every_prompt_once(
    tmp_path, three_step_run, monkeypatch
):
    """`RLConfig.partial_rollouts` with k = 1, each swap pinned (`_swap_mid_sample`): steps 2
    and 3 start with the weights one update behind (the bound) and, from the sampler's
    fourth device call, continue with the newest (the synchronous run's). Their samples then
    mix two versions (`rollout/partial_frac` > 0) and their tokens' mean lag lies strictly
    between 0 and 1; no token lags more than one version (none at step 1, which nothing
    newer can reach); and every step trains the synchronous run's prompts."""
    _swap_mid_sample(monkeypatch, at_ask=4)
    run_dir = tmp_path / "partial"
    records = run_rl(_config(run_dir, "RLConfig.steps = 3", "RLConfig.save_every = 0",
                             "RLConfig.max_staleness = 1", "RLConfig.partial_rollouts = True",
                             "RolloutConfig.steps_per_call = 1"))  # fmt: skip
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["rollout/staleness/max"] == 0.0
    assert records[0]["rollout/partial_frac"] == 0.0
    for r in records:
        assert 0 <= r["rollout/staleness/mean"] <= r["rollout/staleness/max"] <= 1
        assert 0 <= r["rollout/partial_frac"] <= 1
    for r in records[1:]:  # each swapped mid-sample: some tokens newer, some older
        assert r["rollout/partial_frac"] > 0, r
        assert 0 < r["rollout/staleness/mean"] < 1, r
        assert r["rollout/staleness/max"] == 1, r
    for step in (1, 2, 3):
        assert _trained_prompts(run_dir, step) == _trained_prompts(three_step_run, step)


def test_a_split_mesh_samples_on_its_own_devices(tmp_path):
    """`MeshConfig.rollout_devices = 4` of the 8 simulated devices: the trainer's mesh holds
    the other 4 and the engine's weights live on its own 4 only; they arrive whole (step 1's
    sampler logprobs are the trainer's), with the rollout overlapped as well."""
    from jaxrl_llm.learner.rl_loop import train
    from jaxrl_llm.learner.run import build_run

    cfg = _config(tmp_path / "split", "RLConfig.steps = 2", "RLConfig.save_every = 0",
                  "MeshConfig.rollout_devices = 4", "RLConfig.max_staleness = 1",
                  "MeshConfig.devices = -1")  # fmt: skip
    run = build_run(cfg)
    assert run.learner.sampling_mesh is not None
    trainer = set(run.learner.mesh.devices.flat)
    sampler = set(run.learner.sampling_mesh.devices.flat)
    assert len(trainer) == len(sampler) == 4 and not trainer & sampler
    engine = run.rollout.sampler.engine  # pyright: ignore[reportAttributeAccessIssue]
    assert {d for s in jax.tree.leaves(engine.param_shardings) for d in s.device_set} == sampler
    records = train(run)
    assert records[0]["rollout/logprob_diff/max"] < 1e-4
    assert [r["rollout/staleness/max"] for r in records] == [0.0, 1.0]
    params = sum(np.asarray(x).nbytes for x in jax.tree.leaves(run.learner.policy_params()))
    assert [r["weight_sync/bytes"] for r in records] == [params, params]
