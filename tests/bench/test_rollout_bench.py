"""`jaxrl-llm bench rollout` prints one JSON object with ratios and ceilings."""

import json

from jaxrl_llm import cli


def test_bench_rollout_json(capsys):
    argv = ["bench", "rollout", "--checkpoint", "builtin", "--batch", "2", "--prompt-len", "8",
            "--new-tokens", "4", "--steps-per-call", "4", "--repeats", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"]["decode_tokens_per_s"] > 0
    assert out["hf_generate"]["tokens_per_s"] > 0 and out["speedup_vs_hf"] > 0
    assert out["decode_bandwidth_roofline_fraction"] > 0
    assert out["ceilings"]["matmul_flops"] > 0
