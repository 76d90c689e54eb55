"""Sorting and grouping of integer arrays: np.unique and a stable argsort through one sort of packed keys.

Written by hand because numpy sorts values with its vectorised sort but sorts indices (argsort, and np.unique
with an index or inverse) with a generic, several times slower one.  Where a key's range and its position fit in
63 bits together, `key << bits | position` sorted as values gives the keys in order and, in the low bits, their
positions, ties by position: a stable argsort at a fraction of the cost.  Keys that do not fit go to numpy's own
functions, so results are the same.  The measured costs, and why not pandas' factorize: docs/analysis.md, "Cost
at scale".

Below them, the grouping every stage shares: by key (group_by), dense ranks, membership among few keys, and
counts of small keys (the dense ranks an analysis groups its samples by).  Last, tables that grow through a long
recording in pages of their own (own_pages, longer, insert_in_place: docs/scale.md).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np


def _packed(keys: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(keys in ascending order with their positions in the low bits, how many bits those take), or None where the
    keys' range and the positions do not fit in 63 bits (or the keys are not integers)."""
    n = len(keys)
    if not n or keys.dtype.kind not in "iu" or keys.ndim != 1:
        return None
    lo, hi = keys.min(), keys.max()
    bits = max((n - 1).bit_length(), 1)
    if (int(hi) - int(lo)).bit_length() + bits > 63:
        return None
    # each key's distance from the least, which fits an int64 (uint64 keys: above 2**63 for kernel addresses)
    wide = keys.dtype == np.uint64
    offset = (keys - lo).astype(np.int64) if wide else np.subtract(keys, lo, dtype=np.int64)
    offset <<= bits
    offset |= np.arange(n, dtype=np.int64)
    offset.sort()
    return offset, bits


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") for a 1-d integer array."""
    packed = _packed(keys)
    if packed is None:
        return np.argsort(keys, kind="stable")
    order, bits = packed
    order &= (1 << bits) - 1
    return order


def unique(keys: np.ndarray, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False) -> np.ndarray | tuple[np.ndarray, ...]:
    """np.unique of a 1-d integer array, with the same optional outputs (the index of each distinct key's first
    occurrence, the inverse as a 1-d intp array, the counts)."""
    packed = _packed(keys)
    if packed is None:
        return np.unique(keys, return_index=return_index, return_inverse=return_inverse, return_counts=return_counts)
    order, bits = packed
    n = len(keys)
    sorted_keys = order >> bits
    first = np.empty(n, bool)
    first[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    order &= (1 << bits) - 1  # the positions, ascending within each key
    at = np.flatnonzero(first)
    result: list[np.ndarray] = [keys[order[at]]]
    if return_index:
        result.append(order[at])
    if return_inverse:
        inverse = np.empty(n, np.intp)
        inverse[order] = np.cumsum(first) - 1
        result.append(inverse)
    if return_counts:
        result.append(np.diff(np.append(at, n)))
    return result[0] if len(result) == 1 else tuple(result)


def group_by(keys: np.ndarray, pos: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(key, the positions `pos` with that key, in their order) for each distinct keys[pos], with one sort."""
    if not len(pos):
        return
    k = keys[pos]
    order = np.argsort(_small_ranks(k), kind="stable")
    k, pos = k[order], pos[order]
    cuts = np.flatnonzero(k[1:] != k[:-1]) + 1
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(k)].tolist(), strict=True):
        yield int(k[lo]), pos[lo:hi]


def _small_ranks(k: np.ndarray) -> np.ndarray:
    """Keys that sort as `k` does, as uint16 where they fit (pids, mapping indices: numpy sorts those by radix,
    faster than 64-bit keys), else `k` itself."""
    lo, hi = int(k.min()), int(k.max())
    if hi - lo < 1 << 16:
        return (k - lo).astype(np.uint16)
    ranks = dense_ranks(k)
    return ranks.astype(np.uint16) if ranks is not None and ranks.max() < 1 << 16 else k


def dense_ranks(keys: np.ndarray) -> np.ndarray | None:
    """The rank of each key among the distinct keys (np.unique's inverse, int32) by a table over their range,
    without a sort; None where the range is too wide for a table (then sort)."""
    if not len(keys):
        return np.empty(0, np.int32)
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo > 4 * len(keys) + (1 << 20):
        return None
    present = np.zeros(hi - lo + 1, bool)
    present[keys - lo] = True
    return (np.cumsum(present, dtype=np.int32) - 1)[keys - lo]


def thread_keys(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One int64 per (pid, tid), as few bits as Linux's ids take (22) where they fit: unique's packed sort of
    them, with their positions, fits 63 bits."""
    shift = 22 if not len(tid) or int(tid.max()) < 1 << 22 else 32
    return pid.astype(np.int64) << shift | tid


def rank_among(keys: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the distinct wanted keys sorted, each key's rank among them, whether it is one of them): a binary search
    each, where np.isin would sort both.  `wanted` must not be empty."""
    wanted = np.unique(wanted)
    rank = np.searchsorted(wanted, keys).clip(0, len(wanted) - 1)
    return wanted, rank, wanted[rank] == keys


def member(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """keys that are in `wanted` (few)."""
    return rank_among(keys, wanted)[2] if len(wanted) else np.zeros(len(keys), bool)


def _few(keys: np.ndarray, size: int) -> bool:
    """Keys few beside their range `size` (one vCPU's samples in one second): a sort costs less than a table."""
    return len(keys) * 8 < size


def counts_of(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(keys, return_counts=True) for small non-negative keys (below `size`): by counting where they are
    many (a table instead of unique's sort)."""
    if _few(keys, size):
        return unique(keys, return_counts=True)
    counts = np.bincount(keys, minlength=size)
    present = np.flatnonzero(counts)
    return present, counts[present]


def first_and_counts(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """np.unique(keys, return_index=True, return_counts=True) for small non-negative keys (below `size`, as
    the dense ranks of analysis keys are), by counting as counts_of does."""
    if _few(keys, size):
        return unique(keys, return_index=True, return_counts=True)
    present, counts = counts_of(keys, size)
    first = np.full(size, len(keys), np.int64)
    np.minimum.at(first, keys, np.arange(len(keys)))
    return present, first[present], counts


def positions_by_key(keys: np.ndarray, wanted: np.ndarray) -> dict[int, np.ndarray]:
    """key -> the positions (ascending) where `keys` holds it, for the keys in `wanted`: one binary search
    each and one sort of their ranks among the wanted (small integers: sorted by radix, not 64-bit keys)."""
    if not len(wanted) or not len(keys):
        return {}
    wanted, rank, found = rank_among(keys, wanted)
    return {int(wanted[r]): at for r, at in group_by(rank, np.flatnonzero(found))}


OWN_PAGES_BYTES = 1 << 20  # a long-lived array that grows gets pages of its own from this size on
MOVE_BLOCK = 1 << 16  # items moved at once by insert_in_place (numpy copies what overlaps: a block, not the table)


def own_pages(size: int, dtype: np.dtype | type, room: int = 0) -> np.ndarray:
    """An array of `size` zeros in pages of its own (an anonymous mmap, unmapped when the array goes) with room for
    `room` items in all, when that is OWN_PAGES_BYTES or more, else on the heap.  For the tables and sums that grow
    through a long recording: each larger copy placed on the heap left the last one a hole that the pieces' arrays
    did not fill (docs/scale.md), and pages never written (the room) cost no memory."""
    dtype = np.dtype(dtype)
    nbytes = max(size, room) * dtype.itemsize
    if nbytes < OWN_PAGES_BYTES:
        return np.zeros(size, dtype)
    try:  # private: a forked process gets its own copy on write, as of the heap (an anonymous map is shared)
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    except OSError:  # no room for the map (vm.max_map_count, ulimit -v, strict overcommit): the heap will do
        return np.zeros(size, dtype)
    return np.frombuffer(pages, dtype, count=size)


def _own_pages_of(a: np.ndarray) -> mmap.mmap | None:
    """The pages own_pages made `a` at the start of, if it was (not a view at an offset into them)."""
    base = a.base
    if not (isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)):
        return None
    start = np.frombuffer(base.obj, np.uint8, count=1).ctypes.data
    return base.obj if a.ctypes.data == start else None


def longer(a: np.ndarray, size: int) -> np.ndarray:
    """`a` made `size` long, its items then zeros: in its own pages when they have room (no copy: the result shares
    them, `a` is to be dropped), else copied into own_pages with room for twice as many."""
    if size <= len(a):
        return a
    pages = _own_pages_of(a)
    if pages is not None and len(pages) >= size * a.itemsize:
        return np.frombuffer(pages, a.dtype, count=size)
    out = own_pages(size, a.dtype, room=2 * size)
    out[:len(a)] = a
    return out


def with_room(a: np.ndarray, size: int) -> np.ndarray:
    """`a`, or when it is large and its pages have no room for `size` items, its items copied into own_pages with
    that room: growing it to `size` (longer, insert_in_place) then allocates nothing large, so cannot fail."""
    if size * a.itemsize < OWN_PAGES_BYTES:
        return a
    pages = _own_pages_of(a)
    if pages is not None and len(pages) >= size * a.itemsize:
        return a
    out = own_pages(len(a), a.dtype, room=2 * size)
    out[:] = a
    return out


def widened(a: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """`a` as `dtype` (wider), in own_pages with room for twice as many."""
    wide = own_pages(len(a), dtype, room=2 * len(a))
    wide[:] = a
    return wide


def insert_in_place(a: np.ndarray, at: np.ndarray, values: np.ndarray) -> np.ndarray:
    """np.insert(a, at, values) for ascending `at` (values[i] before a[at[i]], ties in the order of values), in a's
    pages when they have room (longer; `a` is to be dropped): a sorted table that grows through a long recording is
    not copied whole each time, nor held twice."""
    n, m = len(a), len(at)
    if not m:
        return a
    out = longer(a, n + m)
    # each item moves right by the values inserted before it: from the back, a block at a time, no block's places
    # reach the items not moved yet (before it); those before the first value stay
    for hi in range(n, int(at[0]), -MOVE_BLOCK):
        lo = max(hi - MOVE_BLOCK, int(at[0]))
        first, last = np.searchsorted(at, [lo, hi])  # the values inserted among these items
        shift = np.bincount(at[first:last] - lo, minlength=hi - lo).cumsum()
        shift += first + np.arange(lo, hi)  # where each item goes
        out[shift] = out[lo:hi]
    out[at + np.arange(m)] = values
    return out
