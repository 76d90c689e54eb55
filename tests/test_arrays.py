"""vmprof_tui.arrays against numpy's own np.unique and stable argsort, on the kinds of keys the analysis sorts."""

from __future__ import annotations

import os

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


@pytest.mark.parametrize("own_pages_bytes", [1 << 40, 1], ids=["on the heap", "in own pages"])
def test_insert_in_place_is_numpys_insert(own_pages_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", own_pages_bytes)
    monkeypatch.setattr(arrays, "MOVE_BLOCK", 1000)  # many blocks moved
    rng = np.random.default_rng(9)
    table = np.empty(0, np.int64)
    want = table.copy()
    for size in (0, 7, 3000, 1, 5000, 20_000, 0, 4):
        values = np.sort(rng.integers(0, 50_000, size))  # repeats, and values equal to those in the table
        at = np.searchsorted(want, values)
        want = np.insert(want, at, values)
        table = arrays.insert_in_place(table, at, values)
        assert table.tolist() == want.tolist()


def test_longer_keeps_the_items_and_grows_in_the_room_of_its_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", 1)
    a = arrays.own_pages(3, np.int32, room=100)
    a[:] = [4, 5, 6]
    b = arrays.longer(a, 50)  # in the same pages: no copy
    assert b.tolist() == [4, 5, 6] + [0] * 47 and np.shares_memory(a, b)
    c = arrays.longer(b, 101)  # past the room: copied, with room for twice as many
    assert c.tolist() == b.tolist() + [0] * 51 and not np.shares_memory(b, c)
    assert np.shares_memory(arrays.longer(c, 202), c)


def test_own_pages_are_private_to_a_forked_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table in own pages written by a forked child (the analysis node's workers) stays as it was in the parent."""
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", 1)
    a = arrays.own_pages(1000, np.int64)
    a[:] = 7
    pid = os.fork()
    if pid == 0:  # the child writes and leaves at once
        a[:] = 9
        os._exit(0 if a[0] == 9 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert a.tolist() == [7] * 1000


def test_own_pages_fall_back_to_the_heap_when_no_map_can_be_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """No room for another map (vm.max_map_count, ulimit -v, strict overcommit): the table goes on the heap,
    nothing fails."""
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", 1)

    def no_map(*_args: object, **_kwargs: object) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(arrays.mmap, "mmap", no_map)
    a = arrays.own_pages(5, np.int64, room=1 << 40)
    assert a.tolist() == [0] * 5
    a[:] = 3
    assert arrays.longer(a, 7).tolist() == [3] * 5 + [0] * 2


def test_longer_copies_a_view_into_pages_at_an_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an array at the start of its own pages grows in them: one further in is copied, its items kept."""
    import mmap

    c = np.frombuffer(mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE), np.int64, count=4, offset=64)
    c[:] = [5, 6, 7, 8]
    assert arrays.longer(c, 6).tolist() == [5, 6, 7, 8, 0, 0]
