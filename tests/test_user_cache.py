"""`user_cache.prune_cache`: the bound of the fast test tier's kept compile cache."""

import os

from jaxrl_llm.user_cache import prune_cache


def _files(folder, size_and_read_time: dict[str, tuple[int, int]]):
    for name, (size, atime) in size_and_read_time.items():
        path = folder / name
        path.write_bytes(b"x" * size)
        os.utime(path, (atime, 1_000))


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_under_the_cap_nothing_is_removed(tmp_path):
    _files(tmp_path, {"a": (40, 10), "b": (60, 20)})
    assert prune_cache(str(tmp_path), cap=100) == 100
    assert _names(tmp_path) == ["a", "b"]


def test_past_the_cap_the_least_recently_read_go_until_half_is_left(tmp_path):
    # read order: c (oldest), a, d, b (newest); 130 bytes against a cap of 100
    _files(tmp_path, {"a": (30, 20), "b": (40, 40), "c": (20, 10), "d": (40, 30)})
    (tmp_path / "sub").mkdir()  # not a file: left alone
    assert prune_cache(str(tmp_path), cap=100) == 40  # c, a, d removed: 40 <= 50 left
    assert _names(tmp_path) == ["b", "sub"]


def test_a_file_another_process_removed_counts_as_gone_and_one_it_cannot_stays(
    tmp_path, monkeypatch
):
    # 180 bytes against a cap of 100; read order a, b, c, d
    _files(tmp_path, {"a": (80, 10), "b": (20, 20), "c": (30, 30), "d": (50, 40)})
    real_remove = os.remove

    def remove(path):
        if path.endswith("a"):
            real_remove(path)  # the other process's removal; ours then finds nothing
        if path.endswith("b"):
            raise PermissionError(path)
        real_remove(path)

    monkeypatch.setattr(os, "remove", remove)
    # a gone (100 left), b kept, c removed (70 left), d removed (20 left <= 50)
    assert prune_cache(str(tmp_path), cap=100) == 20
    assert _names(tmp_path) == ["b"]
