"""Per-run user ids unique on the host: `claim_slot`.

Run by root, the bwrap backend runs each program as uid `SandboxConfig.uid_base` + slot, so
that RLIMIT_NPROC bounds one run's processes. The kernel counts a uid's processes across the
whole host, so a slot must be free in every process there, not only in this one: two
trainers (or a trainer and an eval) that both ran as uid_base + 0 would share one process
budget, and one's fork bomb would leave the other's runs unable to fork.

A slot is held with an exclusive `flock` on the file `slot-<n>` of a lock directory shared
by the host's processes (`lock_directory`: one per `uid_base` under the system temp
directory, made by and private to this user). A flock belongs to its open file, so it also
keeps concurrent runs of one process apart, and the kernel drops it when its holder exits
or is killed: a crash leaves no stale slot. Processes that see different temp directories
(containers sharing a kernel and uids but not /tmp) do not see each other's claims.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator

# More slots than this means locks that never release (a directory filled by someone else).
MAX_SLOTS = 65_536


def lock_directory(uid_base: int) -> str:
    """The host-wide lock directory of `uid_base`'s slots, made (mode 0700) when missing;
    refuses one this user does not own or others may write to."""
    path = os.path.join(tempfile.gettempdir(), f"jaxrl_llm-sandbox-uids-{os.geteuid()}-{uid_base}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise OSError(
            f"sandbox uid lock directory {path} is not a directory owned by uid "
            f"{os.geteuid()} and writable only by it; remove it"
        )
    return path


@contextlib.contextmanager
def claim_slot(directory: str | os.PathLike) -> Iterator[int]:
    """The smallest slot no process on the host holds in `directory`, held until exit."""
    for slot in range(MAX_SLOTS):
        path = os.path.join(directory, f"slot-{slot}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        try:
            yield slot
        finally:
            os.close(fd)  # releases the lock
        return
    raise OSError(f"no free sandbox uid slot of {MAX_SLOTS} in {directory}")
