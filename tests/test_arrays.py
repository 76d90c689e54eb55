"""vmprof_tui.arrays against numpy's own np.unique and stable argsort, on the kinds of keys the analysis sorts."""

from __future__ import annotations

import numpy as np
import pytest

from vmprof_tui import arrays

RNG = np.random.default_rng(3)
CASES = {
    "pids": RNG.integers(0, 4_000, 50_000).astype(np.uint32),
    "kernel addresses": np.uint64(0xFFFFFFFF81000000) + RNG.integers(0, 1 << 25, 20_000).astype(np.uint64),
    "negative int32": RNG.integers(-1_000, 1_000, 10_000).astype(np.int32),
    "int32 over its whole range": RNG.integers(-(1 << 31), (1 << 31) - 1, 10_000).astype(np.int32),
    "wide: numpy's path": RNG.integers(-(1 << 62), 1 << 62, 10_000),
    "wide uint64: numpy's path": RNG.integers(0, 1 << 63, 10_000).astype(np.uint64) * np.uint64(2),
    "one key": np.full(1_000, 7, np.int64),
    "one element": np.array([5], np.int64),
    "empty": np.empty(0, np.int64),
}


@pytest.mark.parametrize("name", list(CASES))
def test_unique_is_numpys(name: str) -> None:
    keys = CASES[name]
    want = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    got = arrays.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w.reshape(-1), g), name
    assert got[0].dtype == keys.dtype
    assert np.array_equal(arrays.unique(keys), want[0])
    inverse = arrays.unique(keys, return_inverse=True)[1]
    assert np.array_equal(want[0][inverse], keys)


@pytest.mark.parametrize("name", list(CASES))
def test_stable_argsort_is_numpys(name: str) -> None:
    keys = CASES[name]
    assert np.array_equal(arrays.stable_argsort(keys), np.argsort(keys, kind="stable")), name


def test_thread_keys_tell_threads_apart_and_unique_gives_numpys_first_switches() -> None:
    """(pid, tid) keys: one per thread, with ids of Linux's 22 bits and wider (then 32 bits each), and
    arrays.unique's first positions of them are np.unique's."""
    rng = np.random.default_rng(3)
    for top in (1 << 22, 1 << 32):
        pid = rng.integers(0, top, 5000, dtype=np.int64).astype(np.uint32)
        tid = rng.integers(0, top, 5000, dtype=np.int64).astype(np.uint32)
        pid[2500:], tid[2500:] = pid[:2500], tid[:2500]  # each thread twice
        keys = arrays.thread_keys(pid, tid)
        assert len(np.unique(keys)) == len(set(zip(pid.tolist(), tid.tolist(), strict=True)))
        for got, want in zip(arrays.unique(keys, return_index=True), np.unique(keys, return_index=True), strict=True):
            assert np.array_equal(got, want)
