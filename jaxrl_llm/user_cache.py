"""This user's cache folder for the project: `$XDG_CACHE_HOME/jaxrl-llm/<name>`, else
`~/.cache/jaxrl-llm/<name>`. The XLA compilation cache (`cli.compile_cache`), the int8
CPU kernel's builds (`models.int8_cpu`) and the fast test tier's programs (`tests/conftest.py`,
bounded by `prune_cache`) live there."""

import os
from collections.abc import Mapping


def user_cache_dir(name: str, env: Mapping[str, str] = os.environ) -> str:
    """The folder `name` of the project's cache (not created here)."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxrl-llm", name)


def prune_cache(folder: str, cap: int) -> int:
    """Past `cap` bytes in `folder`'s files, the least recently read (by the file system's
    access time; their age where it keeps none) removed until at most half of `cap` is left;
    returns the bytes left. For a cache whose every write should stay cheap: JAX's own bound
    (`JAX_COMPILATION_CACHE_MAX_SIZE`) lists and reads the whole folder under a lock at each
    write, which made the fast tier's first run with a kept cache 4 min 45 s against 3 min
    13 s unbounded (docs/testing.md)."""
    entries = []
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            entries.append((st.st_atime, st.st_size, entry.path))
    left = sum(size for _, size, _ in entries)
    if left <= cap:
        return left
    for _, size, path in sorted(entries):
        if left <= cap // 2:
            break
        try:
            os.remove(path)
        except FileNotFoundError:
            pass  # another process removed it first: gone all the same
        except OSError:
            continue  # still there (not ours to remove)
        left -= size
    return left
