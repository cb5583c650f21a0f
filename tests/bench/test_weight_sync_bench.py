"""`jaxrl-llm bench weight-sync` moves the trainer's weights to the sampler's own devices and
reports the move against the read bandwidth measured beside it (not a speed test)."""

import json
import statistics

import pytest

from jaxrl_llm import cli


def test_bench_weight_sync_json(capsys):
    """The shipped model on 8 simulated devices, 3 for the sampler: the moved arrays sit on
    the sampler's devices only and equal the trainer's; the rates and fractions follow from
    the bytes and the timed pairs."""
    assert cli.main(["bench", "weight-sync", "--rollout-devices", "3", "--repeats", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["trainer_devices"], out["sampler_devices"]) == (5, 3)
    assert out["on_sampler_devices"] and out["equal_to_the_trainers"]
    assert out["bytes"] > 0 and out["arrays"] > 0
    assert out["bytes_delivered"] == 3 * out["bytes"]  # a whole copy on each sampler device
    assert out["bytes_written"] == out["bytes"]  # on CPU devices they share one host copy
    rate = out["bytes_written"] / out["move_s"]["median"]
    assert out["move_bytes_per_s"] == pytest.approx(rate)
    read = out["ceilings"]["read_bytes_per_s"]
    assert out["fraction_vs_best_read"] == pytest.approx(out["move_bytes_per_s"] / read)
    # Each move is held against the read timed right after it; the median of those ratios.
    moves, reads = out["move_s"]["each"], out["read_bytes_per_s"]["each"]
    assert len(moves) == len(reads) == 2 and all(r > 0 for r in reads)
    ratios = [out["bytes_written"] / t / r for t, r in zip(moves, reads, strict=True)]
    assert out["fraction_of_read_bandwidth"] == pytest.approx(statistics.median(ratios))
    traffic = (out["bytes_written"] + out["bytes"]) / out["bytes_written"]  # 2 here
    assert out["traffic_fraction"] == pytest.approx(traffic * out["fraction_of_read_bandwidth"])
    assert out["ceilings"]["host"]["cpu"]


def test_bench_weight_sync_needs_devices_for_both_sides(capsys):
    with pytest.raises(SystemExit, match="must leave the trainer at least one"):
        cli.main(["bench", "weight-sync", "--rollout-devices", "8"])


def test_bench_weight_sync_times_the_device_to_device_path(capsys):
    """`--transfer devices` (the accelerators' path, `transfer.copy_between_devices`) on CPU
    devices: the same arrays on the sampler's devices, a copy of its own on each of them."""
    args = ["bench", "weight-sync", "--rollout-devices", "3", "--repeats", "1"]
    assert cli.main([*args, "--transfer", "devices"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["transfer"] == "devices"
    assert out["on_sampler_devices"] and out["equal_to_the_trainers"]
    assert out["bytes_written"] == out["bytes_delivered"] == 3 * out["bytes"]


def test_bench_weight_sync_refuses_a_device_path_the_host_memory_cannot_hold(monkeypatch):
    from jaxrl_llm.bench import weight_sync

    monkeypatch.setattr(weight_sync, "free_bytes", lambda: 1 << 20)
    with pytest.raises(SystemExit, match="use --transfer host, fewer --rollout-devices"):
        cli.main(["bench", "weight-sync", "--rollout-devices", "3", "--transfer", "devices"])
