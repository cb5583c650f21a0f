"""Host-side page accounting for the engine's paged KV cache (`models.paged`).

`PageAllocator`: a free list and reference counts over the pool's pages (thread-safe: the
JetStream server inserts from its own threads, and a prefix may be released by the garbage
collector in any thread).

`SlotPages`: which pages each decode slot and each prompt prefix hold.
- A prompt's full pages are written once and shared by every sample inserted from the same
  prefix (reference counted: the prefix holds one reference until it is garbage collected,
  each slot one until it is released). The partly filled last page is per sample (copy on
  write, done at insert: each sample writes its own copy from the prefix).
- A sample reserves, at admission, the pages its token budget can reach (prompt + max_new,
  capped at the cache length), so decoding never allocates and never fails; admission
  follows free pages, and a request that does not fit waits in the caller's queue.
- Page-table entries past a slot's reservation hold `num_pages` (out of range), so a write
  there is dropped rather than landing in another sequence's page.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from typing import Any

import numpy as np


class PageAllocator:
    """Reference-counted pages 0..num_pages-1."""

    def __init__(self, num_pages: int):
        self.num_pages = int(num_pages)
        self._free = collections.deque(range(self.num_pages))
        self._refs = np.zeros(self.num_pages, np.int64)
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """n fresh pages (reference count 1); ValueError when fewer are free."""
        with self._lock:
            if n > len(self._free):
                raise ValueError(f"{n} pages requested, {len(self._free)} free")
            pages = [self._free.popleft() for _ in range(n)]
            self._refs[pages] = 1
            return pages

    def retain(self, pages: list[int]) -> None:
        with self._lock:
            if pages and (self._refs[pages] <= 0).any():
                raise ValueError("retaining a free page")
            np.add.at(self._refs, pages, 1)

    def release(self, pages: list[int]) -> None:
        with self._lock:
            if pages and (self._refs[pages] <= 0).any():
                raise ValueError("releasing a free page")
            np.add.at(self._refs, pages, -1)
            self._free.extend(p for p in dict.fromkeys(pages) if self._refs[p] == 0)

    def refs(self) -> np.ndarray:
        with self._lock:
            return self._refs.copy()


@dataclasses.dataclass
class _Prompt:
    length: int
    shared: list[int] | None = None  # full prompt pages, once the first sample took them


class SlotPages:
    """Page tables of `batch` slots over a pool of `num_pages` pages of `page_size` tokens;
    a sequence spans at most `pages_per_seq` pages."""

    def __init__(self, batch: int, num_pages: int, page_size: int, pages_per_seq: int):
        self.page_size = int(page_size)
        self.pages_per_seq = int(pages_per_seq)
        self.allocator = PageAllocator(num_pages)
        self._slots: list[list[int]] = [[] for _ in range(batch)]
        self._prompts: dict[tuple[int, int], _Prompt] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------- prompts
    # A prompt is (prefix, row): a prefix object holds one or more prefilled prompts.
    def register(self, prefix: Any, lengths: list[int], rows: list[int] | None = None) -> None:
        """Remember the host-side lengths of a prefix's prompts (rows 0.. by default);
        their shared pages go when the prefix object is collected."""
        rows = list(range(len(lengths))) if rows is None else rows
        keys = [(id(prefix), r) for r in rows]
        with self._lock:
            for key, length in zip(keys, lengths, strict=True):
                self._prompts[key] = _Prompt(int(length))
        weakref.finalize(prefix, self._forget, keys)

    def known_length(self, prompt: tuple[Any, int]) -> int | None:
        found = self._prompts.get(_key(prompt))
        return None if found is None else found.length

    def _forget(self, keys: list[tuple[int, int]]) -> None:
        with self._lock:
            prompts = [self._prompts.pop(key, None) for key in keys]
        for prompt in prompts:
            if prompt is not None and prompt.shared:
                self.allocator.release(prompt.shared)

    # -------------------------------------------------------------- slots
    def needed(self, prompt: tuple[Any, int], length: int, max_new: int) -> int:
        """Fresh pages one more sample of `prompt` (of `length` tokens) would take."""
        ps = self.page_size
        end = min(length + max_new, self.pages_per_seq * ps)
        total = -(-end // ps)
        found = self._prompts.get(_key(prompt))
        shared = found is not None and found.shared is not None
        return total - (length // ps if shared else 0)

    def fits(self, prompt: tuple[Any, int], length: int, max_new: int) -> bool:
        return self.needed(prompt, length, max_new) <= self.allocator.num_free

    def admit(
        self, slot: int, prompt: tuple[Any, int], length: int, max_new: int, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reserve pages for a sample of `prompt` = (prefix, row) in `slot` (releasing what
        the slot held).

        Returns the slot's page-table row [pages_per_seq] and, for the prefix's `width`
        padded tokens, the flat slot each is written to ([width]; `num_pages * page_size`:
        not written, because padding or already in a shared page).
        """
        self.release(slot)
        ps, n_full = self.page_size, length // self.page_size
        end = min(length + max_new, self.pages_per_seq * ps)
        if _key(prompt) not in self._prompts:
            self.register(prompt[0], [length], rows=[prompt[1]])
        found = self._prompts[_key(prompt)]
        shared, fresh_shared = found.shared, found.shared is None
        if shared is None:
            shared = found.shared = self.allocator.alloc(n_full)  # the prefix's own reference
        own = self.allocator.alloc(-(-end // ps) - n_full)
        self.allocator.retain(shared)
        pages = shared + own
        self._slots[slot] = pages
        oob_page = self.allocator.num_pages
        row = np.full(self.pages_per_seq, oob_page, np.int32)
        row[: len(pages)] = pages
        t = np.arange(width)
        dest = row[np.minimum(t // ps, self.pages_per_seq - 1)] * ps + t % ps
        write = (t < length) & ((t >= n_full * ps) | fresh_shared)
        return row, np.where(write, dest, oob_page * ps).astype(np.int32)

    def unshare(self, prompt: tuple[Any, int]) -> None:
        """Drop the prefix's own hold on a prompt's full pages now (a prompt inserted once,
        as JetStream's server does, need not keep them until the prefix is collected)."""
        found = self._prompts.get(_key(prompt))
        if found is not None and found.shared is not None:
            shared, found.shared = found.shared, None
            self.allocator.release(shared)

    def release(self, slot: int) -> None:
        """Return the slot's pages (shared prompt pages only when no one else holds them)."""
        pages, self._slots[slot] = self._slots[slot], []
        if pages:
            self.allocator.release(pages)

    def held(self, slot: int) -> int:
        return len(self._slots[slot])


def _key(prompt: tuple[Any, int]) -> tuple[int, int]:
    return id(prompt[0]), int(prompt[1])
