"""LoRA exports and runs: the PEFT adapter folder loads with `peft.PeftModel.from_pretrained`
on the HF base and gives our logits; the merged export gives them through plain
transformers; a LoRA RL run checkpoints adapters (+ optimiser) only, syncs adapter bytes
only after the first step, and resumes to the same adapters as an uninterrupted run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.checkpoint import Checkpointer
from jaxrl_llm.learner.export import save_peft_adapter
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.models import from_pretrained, save_pretrained
from jaxrl_llm.models.lora import LoraConfig, apply_lora, merge_adapters
from jaxrl_llm.testing import randomise_lora_b, register_test_rewards, write_reference_checkpoint

from .rl_helpers import TINY_RL_PARAMS

TOL = 1e-4  # float32, whole model (as tests/models/test_parity.py)


def _torch_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits.float().numpy()


@pytest.mark.slow  # measured: 11 s on 2 loaded cores
def test_peft_adapter_and_merged_export_load_in_transformers(tmp_path):
    peft = pytest.importorskip("peft")  # the test extra installs it
    base_dir = tmp_path / "base"
    write_reference_checkpoint(base_dir)
    model = from_pretrained(base_dir)
    apply_lora(model, LoraConfig(rank=4, alpha=8.0), seed=0)
    randomise_lora_b(model)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 16))
    ours = np.asarray(model(jnp.asarray(ids)))
    base_only = _torch_logits(AutoModelForCausalLM.from_pretrained(base_dir), ids)
    assert np.abs(ours - base_only).max() > 100 * TOL  # the adapters change the logits

    save_peft_adapter(model, tmp_path / "adapter", base_model=str(base_dir))
    hf_base = AutoModelForCausalLM.from_pretrained(base_dir)
    with_adapter = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    np.testing.assert_allclose(_torch_logits(with_adapter, ids), ours, rtol=0, atol=TOL)

    save_pretrained(merge_adapters(model), tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    np.testing.assert_allclose(_torch_logits(merged, ids), ours, rtol=0, atol=TOL)


LORA_PARAMS = [
    *TINY_RL_PARAMS,
    "RLConfig.save_every = 2",
    "RLConfig.steps = 4",
    "PolicyConfig.lora = @LoraConfig()",
    "LoraConfig.rank = 4",
    "AlgoConfig.use_kl_loss = True",
]


def _run(run_dir, *, stop_after=None, resume=False):
    parse_gin([], [*LORA_PARAMS, f"RLConfig.run_dir = '{run_dir}'"])
    return run_rl(RLConfig(), resume=resume, stop_after=stop_after)


def _adapters(run_dir, step):
    ckpt = Checkpointer(run_dir / "checkpoints")
    raw = ckpt.restore_raw(step)["policy"]["params"]
    ckpt.close()
    return jax.tree_util.tree_flatten_with_path(raw)[0]


@pytest.mark.slow  # three short runs: 117 s on 2 loaded cores
def test_lora_run_checkpoints_adapters_only_and_resumes(tmp_path):
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS
    whole = _run(tmp_path / "whole")
    _run(tmp_path / "split", stop_after=2)
    resumed = _run(tmp_path / "split", resume=True)
    assert [r["step"] for r in resumed] == [3, 4]
    got, want = _adapters(tmp_path / "split", 4), _adapters(tmp_path / "whole", 4)
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in want]
    assert names and all("_lora_a" in n or "_lora_b" in n for n in names), names
    for (_, a), (_, b) in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # The first step syncs the base once; later steps move the adapters alone.
    adapter_bytes = sum(np.asarray(x).nbytes for _, x in want)
    assert whole[0]["weight_sync/bytes"] > 10 * adapter_bytes
    assert [r["weight_sync/bytes"] for r in whole[1:]] == [adapter_bytes] * 3
    # The engine samples with the trained adapters: its logprobs are the trainer's.
    assert any(np.abs(np.asarray(x)).max() > 0 for n, (_, x) in zip(names, want) if "_b" in n)
    assert max(r["rollout/logprob_diff/max"] for r in whole) < 1e-4
    assert (tmp_path / "whole" / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "whole" / "hf" / "config.json").is_file()


@pytest.mark.slow  # one short run
def test_an_overlapped_lora_run_moves_adapters_only(tmp_path):
    """`max_staleness = 1` with LoRA: the producer copies the adapters of each version and
    shares the frozen base, so the sampler syncs the base once and then adapter bytes only;
    step 1 samples with the trainer's own weights (no mismatch), later steps one update
    behind."""
    register_test_rewards()
    run_dir = f"RLConfig.run_dir = '{tmp_path / 'r'}'"
    parse_gin([], [*LORA_PARAMS, "RLConfig.steps = 3", "RLConfig.save_every = 0",
                   "RLConfig.max_staleness = 1", run_dir])  # fmt: skip
    records = run_rl(RLConfig())
    sync = [r["weight_sync/bytes"] for r in records]
    assert sync[0] > 10 * sync[1] and sync[1] == sync[2] > 0
    assert [r["rollout/staleness/max"] for r in records] == [0.0, 1.0, 1.0]
    assert records[0]["rollout/logprob_diff/max"] < 1e-4
