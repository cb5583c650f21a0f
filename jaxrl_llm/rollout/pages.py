"""Host-side page accounting for the engine's paged KV cache (`models.paged`).

`PageAllocator`: a free list and reference counts over a range of the pool's pages
(thread-safe: the JetStream server inserts from its own threads, and a prefix may be
released by the garbage collector in any thread).

`SlotPages`: which pages each decode slot and each prompt prefix hold.
- Shards: when the decode slots split over D devices (the sampling mesh's batch axes), so
  does the pool: slot b lives on shard b // (B / D) and takes pages only from that shard's
  range, so a decode step never reads another device's pages (`models.paged`).
- A prompt's full pages are written once per shard and shared by every sample inserted
  there from the same prefix (reference counted: the prefix holds one reference until it
  is garbage collected, each slot one until it is released). The partly filled last page
  is per sample (copy on write, done at insert: each sample writes its own copy).
- A sample reserves, at admission, the pages its token budget can reach (prompt + max_new,
  capped at the cache length), so decoding never allocates and never fails; admission
  follows free pages, and a request that does not fit waits in the caller's queue.
- Page-table entries past a slot's reservation hold `num_pages` (out of range), so a write
  there is dropped rather than landing in another sequence's page.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import numpy as np


class PageAllocator:
    """Reference-counted pages first .. first + num_pages - 1."""

    def __init__(self, num_pages: int, first: int = 0):
        self.num_pages, self.first = int(num_pages), int(first)
        self._free = collections.deque(range(self.first, self.first + self.num_pages))
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
            self._refs[np.asarray(pages, np.int64) - self.first] = 1
            return pages

    def retain(self, pages: list[int]) -> None:
        with self._lock:
            at = np.asarray(pages, np.int64) - self.first
            if len(at) and (self._refs[at] <= 0).any():
                raise ValueError("retaining a free page")
            np.add.at(self._refs, at, 1)

    def release(self, pages: list[int]) -> None:
        with self._lock:
            at = np.asarray(pages, np.int64) - self.first
            if len(at) and (self._refs[at] <= 0).any():
                raise ValueError("releasing a free page")
            np.add.at(self._refs, at, -1)
            self._free.extend(p for p in dict.fromkeys(pages) if self._refs[p - self.first] == 0)

    def refs(self) -> np.ndarray:
        with self._lock:
            return self._refs.copy()


Prompt = tuple[Any, int]  # (prefix object, row): a prefix holds one or more prompts


class SlotPages:
    """Page tables of `batch` slots over a pool of `num_pages` pages of `page_size` tokens,
    split into `shards` equal ranges; a sequence spans at most `pages_per_seq` pages."""

    def __init__(self, batch: int, num_pages: int, page_size: int, pages_per_seq: int,
                 shards: int = 1):  # fmt: skip
        if batch % shards or num_pages % shards:
            raise ValueError(f"{batch} slots and {num_pages} pages must split into {shards}")
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self.pages_per_seq, self.shards = int(pages_per_seq), int(shards)
        per = num_pages // shards
        self.allocators = [PageAllocator(per, first=s * per) for s in range(shards)]
        self._slots_per_shard = batch // shards
        self._slots: list[list[int]] = [[] for _ in range(batch)]
        self._lengths: dict[tuple[int, int], int] = {}
        self._shared: dict[tuple[int, int, int], list[int]] = {}  # (prefix, row, shard)
        self._lock = threading.Lock()

    # ------------------------------------------------------------- prompts
    def register(self, prefix: Any, lengths: list[int], rows: list[int] | None = None) -> None:
        """Remember the host-side lengths of a prefix's prompts (rows 0.. by default);
        their shared pages go when the prefix object is collected."""
        rows = list(range(len(lengths))) if rows is None else rows
        with self._lock:
            for row, length in zip(rows, lengths, strict=True):
                self._lengths[(id(prefix), row)] = int(length)
        weakref.finalize(prefix, self._forget, id(prefix))

    def known_length(self, prompt: Prompt) -> int | None:
        return self._lengths.get(_key(prompt))

    def _forget(self, pid: int) -> None:
        with self._lock:
            for key in [k for k in self._lengths if k[0] == pid]:
                del self._lengths[key]
            shared = {k: self._shared.pop(k) for k in list(self._shared) if k[0] == pid}
        for (_, _, shard), pages in shared.items():
            self.allocators[shard].release(pages)

    def unshare(self, prompt: Prompt) -> None:
        """Drop the prefix's own hold on a prompt's full pages now, when no more samples
        will be inserted from it (JetStream's server inserts a prompt once; the driver after
        its last sample, or when a weight swap makes it prefill the prompt again): the pages
        then go back with the last slot that uses them, not when the prefix is collected,
        which a prefix of several prompts is only after its last prompt's last insert."""
        with self._lock:  # popped here, `_forget` cannot release them again
            held = {s: self._shared.pop((*_key(prompt), s), None) for s in range(self.shards)}
        for shard, pages in held.items():
            if pages is not None:
                self.allocators[shard].release(pages)

    # -------------------------------------------------------------- slots
    def shard_of(self, slot: int) -> int:
        return int(slot) // self._slots_per_shard

    def needed(self, prompt: Prompt, length: int, max_new: int, slot: int = 0) -> int:
        """Fresh pages one more sample of `prompt` (of `length` tokens) would take in `slot`."""
        ps = self.page_size
        end = min(length + max_new, self.pages_per_seq * ps)
        shared = (*_key(prompt), self.shard_of(slot)) in self._shared
        return -(-end // ps) - (length // ps if shared else 0)

    def fits(self, prompt: Prompt, length: int, max_new: int, slot: int = 0) -> bool:
        free = self.allocators[self.shard_of(slot)].num_free
        return self.needed(prompt, length, max_new, slot) <= free

    def admit(
        self, slot: int, prompt: Prompt, length: int, max_new: int, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reserve pages for a sample of `prompt` in `slot` (releasing what the slot held).

        Returns the slot's page-table row [pages_per_seq] and, for the prefix's `width`
        padded tokens, the flat slot each is written to ([width]; `num_pages * page_size`:
        not written, because padding or already in a shared page).
        """
        self.release(slot)
        ps, n_full = self.page_size, length // self.page_size
        end = min(length + max_new, self.pages_per_seq * ps)
        if _key(prompt) not in self._lengths:
            self.register(prompt[0], [length], rows=[prompt[1]])
        shard = self.shard_of(slot)
        allocator, key = self.allocators[shard], (*_key(prompt), shard)
        shared = self._shared.get(key)
        fresh_shared = shared is None
        if shared is None:
            shared = self._shared[key] = allocator.alloc(n_full)  # the prefix's reference
        own = allocator.alloc(-(-end // ps) - n_full)
        allocator.retain(shared)
        pages = shared + own
        self._slots[slot] = pages
        row = np.full(self.pages_per_seq, self.num_pages, np.int32)
        row[: len(pages)] = pages
        t = np.arange(width)
        dest = row[np.minimum(t // ps, self.pages_per_seq - 1)] * ps + t % ps
        write = (t < length) & ((t >= n_full * ps) | fresh_shared)
        return row, np.where(write, dest, self.num_pages * ps).astype(np.int32)

    def release(self, slot: int) -> None:
        """Return the slot's pages (shared prompt pages only when no one else holds them)."""
        pages, self._slots[slot] = self._slots[slot], []
        if pages:
            self.allocators[self.shard_of(slot)].release(pages)

    def held(self, slot: int) -> int:
        return len(self._slots[slot])

    @property
    def num_free(self) -> int:
        return sum(a.num_free for a in self.allocators)

    def refs(self) -> np.ndarray:
        """Reference counts of every page, in page order."""
        return np.concatenate([a.refs() for a in self.allocators])


def _key(prompt: Prompt) -> tuple[int, int]:
    return id(prompt[0]), int(prompt[1])
