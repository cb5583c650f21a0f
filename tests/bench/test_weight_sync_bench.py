"""`jaxrl-llm bench weight-sync` moves the trainer's weights to the sampler's own devices and
reports the move against the same run's read bandwidth (not a speed test)."""

import json

import pytest

from jaxrl_llm import cli


def test_bench_weight_sync_json(capsys):
    """The shipped model on 8 simulated devices, 3 for the sampler: the moved arrays sit on
    the sampler's devices only and equal the trainer's; the rates follow from the bytes and
    the medians."""
    assert cli.main(["bench", "weight-sync", "--rollout-devices", "3", "--repeats", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["trainer_devices"], out["sampler_devices"]) == (5, 3)
    assert out["on_sampler_devices"] and out["equal_to_the_trainers"]
    assert out["bytes"] > 0 and out["arrays"] > 0
    assert out["bytes_written"] == 3 * out["bytes"]  # a whole copy on each sampler device
    rate = out["bytes_written"] / out["move_s"]["median"]
    assert out["move_bytes_per_s"] == pytest.approx(rate)
    read = out["ceilings"]["read_bytes_per_s"]
    assert out["fraction_of_read_bandwidth"] == pytest.approx(out["move_bytes_per_s"] / read)
    assert out["ceilings"]["host"]["cpu"]


def test_bench_weight_sync_needs_devices_for_both_sides(capsys):
    with pytest.raises(SystemExit, match="must leave the trainer at least one"):
        cli.main(["bench", "weight-sync", "--rollout-devices", "8"])
