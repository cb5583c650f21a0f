"""`bench.lora_rollout` runs end to end on the shipped tiny model and reports every field."""

import json

import pytest

from jaxrl_llm.bench import lora_rollout


@pytest.mark.slow  # measured: 31 s on 2 loaded cores (three engines compile)
def test_lora_rollout_bench_json(capsys):
    args = "--checkpoint builtin --rank 4 --batch 2 --prompt 8 --new-tokens 8 --repeats 0"
    assert lora_rollout.main([str(a) for a in args.split()]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("plain_ms_per_step", "unmerged_ms_per_step", "merged_ms_per_step", "merge_s"):
        assert out[key] > 0, key
    assert out["rank"] == 4 and out["new"] == 8
