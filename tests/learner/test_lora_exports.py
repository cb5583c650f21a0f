"""What a LoRA run exports: an int8-base run (`quantize_base='int8'`) puts its adapters on the
original float weights, as QLoRA's are (the merged run_dir/hf and `jaxrl-llm export` both
equal W + (alpha / r) B A of the checkpoint's own weights, which is what PEFT computes from
the run's adapter folder); a PEFT folder of adapters on some layers only names exactly those
modules in `target_modules`."""

import json

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.learner.checkpoint import Checkpointer, base_identity
from jaxrl_llm.learner.export import export_final, export_policy, save_peft_adapter
from jaxrl_llm.learner.lora import split_trainable
from jaxrl_llm.learner.rl_config import PolicyConfig
from jaxrl_llm.models import from_pretrained
from jaxrl_llm.models.lora import LoraConfig, adapters, apply_lora, int8_weights
from jaxrl_llm.testing import randomise_lora_b

INT8 = LoraConfig(rank=4, alpha=8.0, quantize_base="int8")
U32 = 2.0**-24  # float32's unit roundoff


def _trained_int8_model():
    """The shipped model loaded as an int8 run loads it, with non-zero (trained) adapters."""
    src = builtin_checkpoint()
    model = from_pretrained(src, quantize=int8_weights(INT8))
    split_trainable(model, INT8, seed=0, reference=False)
    randomise_lora_b(model)
    assert any(hasattr(ad.module, ad.name + "_qscale") for ad in adapters(model))
    return src, model


def _assert_merged_onto_float_weights(merged_dir, adapter_dir) -> None:
    """Each merged tensor is W + s B A of the base checkpoint's float32 W and the adapter
    folder's A [r, in], B [out, r] (s = lora_alpha / r); others are the base's, unchanged.

    Bound, per element: the merge computes fl(W + fl(fl(s) fl(A B))) in float32, the product
    summed in any order: |merged - exact| <= u |exact| + (1 + u) gamma_{r+2} s sum_k |B||A|
    (u = 2^-24, gamma_n = n u / (1 - n u); Higham, Accuracy and Stability, 3.1). The int8
    base's rounding, up to half a step of max|W| / 127 per row, exceeds it many times over."""
    base = load_file(str(builtin_checkpoint() / "model.safetensors"))
    merged = load_file(str(merged_dir / "model.safetensors"))
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    r = config["r"]
    s = config["lora_alpha"] / r
    gamma = (r + 2) * U32 / (1 - (r + 2) * U32)
    assert set(merged) == set(base)
    adapted = 0
    for key, w in base.items():
        prefix = "base_model.model." + key.removesuffix(".weight")
        if prefix + ".lora_A.weight" not in tensors:
            np.testing.assert_array_equal(merged[key], w, err_msg=key)
            continue
        adapted += 1
        a = tensors[prefix + ".lora_A.weight"].astype(np.float64)
        b = tensors[prefix + ".lora_B.weight"].astype(np.float64)
        exact = w.astype(np.float64) + s * b @ a
        bound = U32 * np.abs(exact) + (1 + U32) * gamma * s * (np.abs(b) @ np.abs(a))
        err = np.abs(merged[key].astype(np.float64) - exact)
        assert merged[key].dtype == np.float32, (key, merged[key].dtype)
        assert (err <= bound).all(), (
            f"{key}: max |merged - (W + s B A)| = {err.max():.3g}, bound {bound.max():.3g}"
        )
    layers = json.loads((builtin_checkpoint() / "config.json").read_text())["num_hidden_layers"]
    assert adapted == 7 * layers  # every projection of every layer


@pytest.mark.slow  # measured: 8.2 s (fast tier, AMD EPYC, 2026-12-06)
def test_a_finished_int8_run_merges_onto_the_float_weights(tmp_path):
    src, model = _trained_int8_model()
    export_final(model, tmp_path, str(src))
    _assert_merged_onto_float_weights(tmp_path / "hf", tmp_path / "adapter")
    # The trainer's model is left as it is: still int8, still with its adapters.
    assert any(hasattr(ad.module, ad.name + "_qscale") for ad in adapters(model))


@pytest.mark.slow  # transformers and peft, float32 and float64: about 10 s
def test_an_int8_runs_merged_export_is_peft_on_the_float_base(tmp_path):
    """run_dir/hf through transformers computes what PEFT computes with run_dir/adapter on
    the original base: as accurate as PEFT's float32 run against its float64 run."""
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from jaxrl_llm.testing import assert_as_accurate

    src, model = _trained_int8_model()
    export_final(model, tmp_path, str(src))
    ids = torch.tensor(np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 16)))

    def logits(m):
        with torch.no_grad():
            return m.eval()(input_ids=ids).logits.numpy()

    def with_adapter():
        return peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(src),
                                              tmp_path / "adapter")  # fmt: skip

    merged = logits(AutoModelForCausalLM.from_pretrained(tmp_path / "hf"))
    trusted = logits(with_adapter())
    exact = logits(with_adapter().double())  # float32 weights upcast exactly
    assert np.abs(trusted - logits(AutoModelForCausalLM.from_pretrained(src))).max() > 1e-2
    # trusted: PEFT on the float base, float32; exact: the same in float64
    assert_as_accurate(merged, trusted, exact)


def _int8_run_dir(tmp_path, model):
    """A run directory as an int8 LoRA run leaves it: config.gin and a checkpoint (step 1)
    of `model`'s adapters, recording its base."""
    run = tmp_path / "run"
    run.mkdir()
    lines = ["PolicyConfig.lora = @LoraConfig()", "LoraConfig.rank = 4", "LoraConfig.alpha = 8.0",
             "LoraConfig.quantize_base = 'int8'"]  # fmt: skip
    (run / "config.gin").write_text("\n".join(lines) + "\n")
    ckpt = Checkpointer(run / "checkpoints")
    ckpt.base = base_identity(builtin_checkpoint(), PolicyConfig(lora=INT8))
    ckpt.save(1, {"policy": {"params": nnx.state(model, nnx.LoRAParam)}}, {})
    ckpt.close()
    return run


@pytest.mark.slow  # measured: 8.2 s (fast tier, AMD EPYC, 2026-12-06)
def test_export_of_an_int8_run_merges_onto_the_float_weights(tmp_path):
    _, model = _trained_int8_model()
    run = _int8_run_dir(tmp_path, model)
    assert export_policy(run, tmp_path / "merged") == 1
    assert export_policy(run, tmp_path / "adapter", fmt="peft") == 1
    _assert_merged_onto_float_weights(tmp_path / "merged", tmp_path / "adapter")


def _peft_targets(tmp_path, targets: tuple[str, ...]) -> str | list[str]:
    model = from_pretrained(builtin_checkpoint())
    apply_lora(model, LoraConfig(rank=2, targets=targets), seed=0)
    save_peft_adapter(model, tmp_path / "a", base_model="base")
    return json.loads((tmp_path / "a" / "adapter_config.json").read_text())["target_modules"]


def test_peft_target_modules_name_the_projections_of_every_layer(tmp_path):
    assert _peft_targets(tmp_path, ("q_proj", r"model/layers/\d+/mlp/up_proj")) == [
        "q_proj",
        "up_proj",
    ]


def test_peft_target_modules_of_some_layers_name_exactly_those_modules(tmp_path):
    """PEFT matches a str `target_modules` with `re.fullmatch` on each module name of the
    HF model (`peft.tuners.tuners_utils.check_target_module_exists`), a list by name in
    every layer: adapters on layer 0's q_proj and layer 1's down_proj only must be a
    pattern that matches those two names and no other module of the model."""
    import re

    from transformers import AutoModelForCausalLM

    targets = ("model/layers/0/self_attn/q_proj", "model/layers/1/mlp/down_proj")
    pattern = _peft_targets(tmp_path, targets)
    assert isinstance(pattern, str), pattern
    hf = AutoModelForCausalLM.from_pretrained(builtin_checkpoint())
    matched = [n for n, _ in hf.named_modules() if re.fullmatch(pattern, n)]
    assert matched == [t.replace("/", ".") for t in targets]
    peft = pytest.importorskip("peft")
    loaded = peft.PeftModel.from_pretrained(hf, tmp_path / "a")
    with_adapter = [n for n, _ in loaded.named_modules() if n.endswith(".lora_A")]
    assert len(with_adapter) == 2, with_adapter
