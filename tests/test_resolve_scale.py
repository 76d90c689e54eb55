"""The scale-minded parts of resolution (issue 14) give what the plain ones gave: name codes kept across
calls in numpy, symbol tables cached across runs, a replay window resolved stretch by stretch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from vmprof_tui import arrays
from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.analyse.window import ReplayWindow, _window_recording
from vmprof_tui.arrays import first_and_counts
from vmprof_tui.resolve import cache
from vmprof_tui.resolve.elf import read_elf_symbols
from vmprof_tui.resolve.resolver import NameCodes, Resolver, RowNames, StringTable
from vmprof_tui.resolve.symtab import SymbolTable, parse_kallsyms

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"


def test_name_codes_number_names_as_a_walk_over_the_samples_would(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    codes = NameCodes()
    monkeypatch.setattr(NameCodes, "RECENT_MIN", 64)  # the recent names are merged into the others several times
    codes.procs = {("a", 1): 0, ("b", 2): 1, ("c", 3): 2}
    walk: dict[tuple, int] = {}
    merges = 0
    # later calls meet old and new names; the last ones have a function id past ID_BITS (then a dict codes them)
    for size, names in ((1000, 50), (700, 90), (1, 3), (0, 1), (900, 400), (900, 800), (500, 2 << NameCodes.ID_BITS),
                        (300, 900)):
        proc, func, module = rng.integers(0, 3, size), rng.integers(0, names, size), rng.integers(0, 4, size)
        before = len(codes.keys)
        got = codes.encode(proc, func, module)
        merges += len(codes.keys) > before
        want = [walk.setdefault(k, len(walk)) for k in zip(proc.tolist(), func.tolist(), module.tolist(), strict=True)]
        assert got.tolist() == want
        assert len(codes) == len(walk)
    assert merges >= 2 and codes._fallback


@pytest.mark.parametrize("own_pages_bytes", [1 << 40, 1], ids=["on the heap", "in own pages"])
def test_row_names_keep_each_codes_names_by_code_and_by_process(own_pages_bytes: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Also past the ids a uint16 column by code holds (func ids up to 50,000, then past 65,535)."""
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", own_pages_bytes)
    rng = np.random.default_rng(11)
    names = RowNames(StringTable())
    want: dict[int, dict[str, int]] = {}
    of_proc = {p: {"process": 100 + p % 7, "process_name_code": p % 7, "pid": 1000 + p} for p in range(300)}
    top = 0
    # codes come a chunk at a time, new and repeated, past the first capacities (1024 codes, 64 processes)
    for size in (10, 900, 1, 5000, 3000):
        codes = np.concatenate([np.arange(top, top + size), rng.integers(0, top + size, size // 2)])
        top += size
        proc = np.array([want[c]["proc_code"] if c in want else int(rng.integers(0, 300)) for c in codes.tolist()])
        func, module = rng.integers(0, 50_000 if size < 3000 else 90_000, len(codes)), rng.integers(0, 900, len(codes))
        for c, p, f, m in zip(codes.tolist(), proc.tolist(), func.tolist(), module.tolist(), strict=True):
            want.setdefault(c, {"func": f, "module": m, "proc_code": p, **of_proc[p]})
        first = [want[c] for c in codes.tolist()]  # a repeated code comes with the names it had
        names.add(codes, **{f: np.array([w[f] for w in first]) for f in RowNames.FIELDS})
        every = np.arange(top)
        for f in RowNames.FIELDS:
            assert names.ids(every, f).tolist() == [want[c][f] for c in range(top)], f
            assert names.ids(every, f).dtype == np.int32
        wide = max(w["func"] for w in want.values()) > 65_535
        assert names._columns["func"].dtype == (np.int32 if wide else np.uint16)
        assert names._columns["module"].dtype == np.uint16
    assert len(names._columns["func"]) < 1.5 * top  # grown by a quarter, not doubled


def test_grouping_by_counting_gives_what_sorting_gave() -> None:
    rng = np.random.default_rng(3)
    for size, keys in ((5000, 40), (3, 1000), (0, 1)):
        k = rng.integers(0, keys, size).astype(np.int32)
        got = first_and_counts(k, keys)
        want = np.unique(k, return_index=True, return_counts=True)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    names = np.array(["f", "g", "h", "[unknown]"], dtype=object)
    strings = StringTable()
    ids = strings.ids(names, np.array([2, -1, 2, 0, -1]))  # -1: the last name, as symbol lookups give it
    assert [strings.strings[i] for i in ids.tolist()] == ["h", "[unknown]", "h", "f", "[unknown]"]
    assert "g" not in strings.strings  # only the names hit are interned


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VMPROF_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "_made", {})
    return tmp_path / "symbols"


def test_kallsyms_parsed_once_and_loaded_alike(fresh_cache: Path) -> None:
    text = b"ffffffff81000000 T _text\nffffffff81001000 t helper\t[kvm]\nffffffff81000800 W weak_one\n" \
           b"ffffffff81002000 D data_not_text\n"
    first = parse_kallsyms(text)
    assert len(list(fresh_cache.glob("kallsyms-*.npz"))) == 1
    cache._made.clear()  # as a new run would
    again = parse_kallsyms(text)
    assert again is not first
    for name in ("starts", "ends", "names", "modules"):
        assert getattr(again, name).tolist() == getattr(first, name).tolist()
    assert first.names.tolist() == ["_text", "weak_one", "helper"] and first.modules.tolist() == ["", "", "kvm"]


def test_elf_symbols_parsed_once_and_loaded_alike(fresh_cache: Path) -> None:
    path = Path(os.path.realpath(sys.executable))
    first = read_elf_symbols(path)
    cache._made.clear()
    again = read_elf_symbols(path)
    assert len(list(fresh_cache.glob("elf*.npz"))) == 1
    assert again.starts.tolist() == first.starts.tolist() and again.ends.tolist() == first.ends.tolist()
    assert again.names.tolist() == first.names.tolist() and len(first.names)
    assert again.segments == first.segments and (again.elf_type, again.build_id) == (first.elf_type, first.build_id)


def test_host_objects_are_cached_by_identity_guest_objects_by_content(fresh_cache: Path, tmp_path: Path) -> None:
    """A file a host process maps is known by its path, inode, size and mtime (no read and hash of every library on
    every report); the same bytes reached otherwise (an extracted guest object) are known by their content."""
    from vmprof_tui.mapping import Mapping
    from vmprof_tui.resolve.spaces import ObjectCache

    exe = Path(os.path.realpath(sys.executable))
    objects = ObjectCache()
    space = objects.host_space("python", 1, f"00400000-00500000 r-xp 00000000 08:01 1 {exe}\n")
    assert objects.symbols(space.maps[0]) is not None
    assert [p.name.split("-v")[0] for p in fresh_cache.glob("*.npz")] == ["elf-file"]
    copy = tmp_path / "extracted"
    copy.write_bytes(exe.read_bytes())
    assert len(objects.symbols(Mapping(0x400000, 0x500000, 0, "/usr/bin/python3", copy)).names)
    assert sorted(p.name.split("-v")[0] for p in fresh_cache.glob("*.npz")) == ["elf", "elf-file"]


def test_cache_evicts_the_least_recently_used_entry(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table every report loads (the host's kallsyms) outlives newer tables used once: on a host whose reports
    meet ever new processes, evicting by age alone would parse it again and again."""
    monkeypatch.setattr(cache, "MAX_ENTRIES", 2)
    table = {"a": np.arange(3)}
    cache.store("hot", table)
    cache.store("cold", table)
    old = fresh_cache.stat().st_mtime - 60  # both written a minute ago, the hot one first
    os.utime(fresh_cache / "hot.npz", (old - 1, old - 1))
    os.utime(fresh_cache / "cold.npz", (old, old))
    assert cache.load("hot") is not None  # used now
    cache.store("new", table)
    assert sorted(p.stem for p in fresh_cache.glob("*.npz")) == ["hot", "new"]


def test_unwritable_cache_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("VMPROF_CACHE", str(blocker))
    monkeypatch.setattr(cache, "_made", {})
    assert parse_kallsyms(b"ffffffff81000000 T _text\n").names.tolist() == ["_text"]


def test_replay_window_resolved_by_stretches_reads_as_the_whole_window() -> None:
    window = ReplayWindow(GOLDEN, window_s=2.0)
    window.start()
    for _ in range(4):  # the window slides: later polls add a stretch and forget the oldest
        an = window.poll(step_s=0.7).analysis  # the window joined, as its screens that need more read it
        whole = analyse(_window_recording(an.rec.path, an.rec.meta, an.rec.samples, an.rec.sched,
                                           window.snapshot, window.rec.bundles, an.rec.duration_s),
                         resolver=Resolver(kallsyms=window.resolver.kallsyms), span_ns=an.span())
        for vm in [None, *an.vm_names()]:
            got = an.host_profile() if vm is None else an.guest_profile(vm)
            want = whole.host_profile() if vm is None else whole.guest_profile(vm)
            assert sorted(map(json.dumps, got.to_json()["rows"])) == sorted(map(json.dumps, want.to_json()["rows"]))


def test_processes_past_one_search_resolve_through_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """More address spaces than one search keys (spaces.MAX_SPACES) are resolved space by space, to the same names."""
    from vmprof_tui.record.recording import load
    from vmprof_tui.resolve import resolver, spaces

    together = analyse(load(GOLDEN))
    monkeypatch.setattr(resolver, "MAX_SPACES", 0)
    monkeypatch.setattr(spaces, "MAX_SPACES", 0)
    one_by_one = analyse(load(GOLDEN))
    assert (together.func == one_by_one.func).all() and (together.module == one_by_one.module).all()


@pytest.mark.parametrize("count, distinct", [(100, 100), (5_000, 20), (50_000, 10_000), (50_000, 50_000)])
def test_symbol_lookup_of_many_addresses(count: int, distinct: int) -> None:
    """Many addresses are searched once per distinct address, in order: the same symbols as a search of each
    (addresses before, inside, between and after the symbols; more distinct ones than the threshold too)."""
    rng = np.random.default_rng(count + distinct)
    starts = np.sort(rng.choice(1 << 30, 20_000, replace=False)).astype(np.uint64) + np.uint64(1 << 20)
    ends = starts + rng.integers(1, 64, len(starts)).astype(np.uint64)  # gaps between symbols
    table = SymbolTable(starts, ends, np.array([f"f{i}" for i in range(len(starts))], object))
    pool = rng.integers(0, (1 << 30) + (1 << 21), distinct).astype(np.uint64)
    addrs = pool[rng.integers(0, distinct, count)]
    idx = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    inside = (idx >= 0) & (addrs < ends[idx.clip(0)])
    assert np.array_equal(table.lookup(addrs), np.where(inside, idx, -1))


def test_cached_names_decoded_when_asked_read_as_the_unpacked_ones(fresh_cache: Path) -> None:
    """A table loaded from the cache keeps its names packed (cache.PackedNames) and decodes those asked for: by an
    index, an array of them, a mask, -1 (names_or_unknown's "[unknown]"), all of them, the same strings as
    unpack_strings; names that are not the stated count, or not UTF-8, are a damaged entry (ValueError)."""
    names = ["main", "", "caf\u00e9", "\udcff_surrogate", "x" * 300, "_ZN3foo3barEv"]
    packed = cache.pack_strings(names)
    lazy, eager = cache.packed_names(packed, len(names)), cache.unpack_strings(packed, len(names))
    assert isinstance(lazy, cache.PackedNames) and len(lazy) == len(names)
    assert lazy.tolist() == list(lazy) == eager.tolist() == names
    for i in range(-len(names), len(names)):
        assert lazy[i] == eager[i] and lazy[np.int64(i)] == eager[i]
    index = np.array([[5, 0], [2, 2]])
    assert lazy[index].tolist() == eager[index].tolist() and lazy[index].dtype == object
    mask = np.array([True, False, True, True, False, True])
    assert lazy[mask].tolist() == eager[mask].tolist() and lazy[np.empty(0, np.int64)].tolist() == []
    with_unknown = lazy.appended("[unknown]")
    assert with_unknown[np.array([-1, 2, 6])].tolist() == ["[unknown]", "caf\u00e9", "[unknown]"]
    assert with_unknown.tolist() == [*names, "[unknown]"] and with_unknown[-1] == with_unknown[6] == "[unknown]"
    for out_of_bounds in (7, -8, np.array([0, 7])):
        with pytest.raises(IndexError):
            with_unknown[out_of_bounds]
    assert isinstance(cache.packed_names(np.empty(0, np.uint8), 0), np.ndarray)
    for bad, count in [(packed, len(names) + 1), (np.frombuffer(b"ok\0\xff\xfe", np.uint8), 2)]:
        with pytest.raises(ValueError):
            cache.packed_names(bad, count)
    path = Path(os.path.realpath(sys.executable))
    first = read_elf_symbols(path)
    cache._made.clear()
    again = read_elf_symbols(path)
    assert isinstance(again.names, cache.PackedNames) and again.names.tolist() == first.names.tolist()
    hit = np.array([-1, 0, len(first.names) - 1, -1])
    assert again.names_or_unknown[hit].tolist() == first.names_or_unknown[hit].tolist()
    assert again.names_or_unknown[-1] == "[unknown]"


def test_content_keys_of_equal_large_contents_are_found_without_hashing_again(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    """VMs of one image carry the same kallsyms and libraries: a large content met again is compared byte for byte
    with the one remembered, and only an equal one gets its key without SHA-256; one that differs in a single byte,
    or only in its middle, gets its own key; what is remembered stays within SAME_BYTES_HELD."""
    monkeypatch.setattr(cache, "_recent", cache.SameBytes(3 << 20))
    data = bytes(np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8))
    key = cache.content_key("kallsyms", data)
    hashed: list[int] = []
    real = cache.hashlib.sha256
    monkeypatch.setattr(cache.hashlib, "sha256", lambda d: hashed.append(len(d)) or real(d))
    assert cache.content_key("kallsyms", bytes(bytearray(data))) == key and cache.content_key(
        "kallsyms", memoryview(bytearray(data))) == key and not hashed
    middle = bytearray(data)
    middle[len(data) // 2] ^= 1
    assert cache.content_key("kallsyms", bytes(middle)) == f"kallsyms-v{cache.VERSION}-" + real(
        bytes(middle)).hexdigest()[:32] != key
    assert cache.content_key("elf", data) != key and len(hashed) == 2
    for n in range(4):
        cache.content_key("elf", bytes([n]) + data[1:])
    assert 0 < cache._recent.held_bytes() <= 3 << 20


def test_a_bundle_stored_twice_is_extracted_once_and_resolves_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """VMs of one image store the same bundle: bytes equal to a bundle loaded before give that bundle (one
    extraction, its objects read once), with each VM's own name; other bytes, or a rejected bundle, are loaded (and
    noted) on their own; what is remembered stays within BUNDLE_BYTES_HELD."""
    from vmprof_tui.record import recording
    from vmprof_tui.resolve import spaces

    monkeypatch.setattr(spaces, "_bundles", cache.SameBytes(spaces.BUNDLE_BYTES_HELD))
    stored = recording.load(GOLDEN).bundles
    data = stored["steal1"]
    first, again = spaces.guest_symbols("vm-a", data), spaces.guest_symbols("vm-b", bytes(bytearray(data)))
    assert first.bundle is not None and again.bundle is first.bundle and (first.vm, again.vm) == ("vm-a", "vm-b")
    assert {c: (s.name, s.pid) for c, s in again.processes.items()} == {
        c: (s.name, s.pid) for c, s in first.processes.items()} and again.kernel is first.kernel
    other = spaces.guest_symbols("vm-c", stored["steal2"])
    assert other.bundle is not first.bundle
    other.bundle.close()  # its folder gone: the same bytes are extracted again
    assert spaces.guest_symbols("vm-c", stored["steal2"]).bundle is not other.bundle
    for vm in ("vm-d", "vm-e"):
        rejected = spaces.guest_symbols(vm, data[:100])
        assert rejected.bundle is None and rejected.note is not None and rejected.note.startswith(
            f"guest bundle of {vm} rejected")
    monkeypatch.setattr(spaces, "_bundles", cache.SameBytes(len(data) + 10))
    spaces.guest_symbols("vm-f", stored["steal3"])
    assert 0 < spaces._bundles.held_bytes() <= len(data) + 10


def test_threads_hammering_the_remembered_contents_keep_them_whole_and_bounded(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    """The content keys and bundles remembered (cache.SameBytes) are shared by the TUI's workers and `vmprof
    analyze`'s threads: threads putting, finding and evicting at once never break the dict (no "dictionary changed
    size"), each finds only what equals its bytes, and the running total stays the bytes held, within the bound."""
    import threading

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    held = cache.SameBytes[bytes](64 * 40)
    contents = [bytes([n]) * (64 + n) for n in range(100)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def hammer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            start.wait()
            for n in rng.integers(0, len(contents), 4000).tolist():
                found = held.get("k", contents[n])
                assert found is None or found == contents[n]
                held.put("k", contents[n], contents[n])
        except BaseException as e:  # noqa: BLE001 (handed to the main thread)
            errors.append(e)

    try:
        threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]
    assert held.held_bytes() == sum(len(d) for d, _v in held._items.values()) <= 64 * 40
    monkeypatch.setattr(cache, "_recent", cache.SameBytes(3 << 20))
    big = [bytes([n]) * (1 << 20) for n in range(5)]
    want = [cache.content_key("elf", b) for b in big]
    got: list[list[str]] = [[] for _ in range(4)]
    workers = [threading.Thread(target=lambda out: out.extend(cache.content_key("elf", b) for b in big * 4),
                                args=(got[i],)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert got == [want * 4] * 4 and cache._recent.held_bytes() <= 3 << 20
    # the tables made in this process (parsed), 64 at most: evicted by several threads at once
    monkeypatch.setattr(cache, "_made", {})
    monkeypatch.setattr(cache, "load", lambda key: None)
    monkeypatch.setattr(cache, "store", lambda key, arrays: None)
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        try:
            out.extend(cache.parsed(f"k{n}", lambda n=n: f"v{n}", lambda v: {}, lambda a: "") for n in range(300))
        except BaseException as e:  # noqa: BLE001 (handed to the main thread)
            errors.append(e)

    workers = [threading.Thread(target=make, args=(made[i],)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors and made == [[f"v{n}" for n in range(300)]] * 4 and len(cache._made) <= 64


def test_a_remembered_bundle_whose_files_were_removed_is_extracted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tmp cleaner may remove a remembered bundle's extracted files and leave its folder: the bundle is not given
    again (its samples would turn [unknown] with no note) but extracted again, with every object file there."""
    from vmprof_tui.record import recording
    from vmprof_tui.resolve import spaces

    monkeypatch.setattr(spaces, "_bundles", cache.SameBytes(spaces.BUNDLE_BYTES_HELD))
    data = recording.load(GOLDEN).bundles["steal1"]
    first = spaces.guest_symbols("vm-a", data).bundle
    assert first is not None and spaces.guest_symbols("vm-b", data).bundle is first
    objects = [m.object_path for p in first.processes for m in p.maps if m.object_path is not None]
    assert objects, "the golden bundle holds object files"
    objects[0].unlink()
    assert first.root.is_dir()
    again = spaces.guest_symbols("vm-c", data).bundle
    assert again is not None and again is not first and spaces._extracted_whole(again)
    assert spaces.guest_symbols("vm-d", data).bundle is again


def test_extracted_bundle_folders_are_removed_at_exit(tmp_path: Path) -> None:
    """Bundles remembered for the process's life still leave no extraction folder behind it."""
    import subprocess

    script = ("import sys\nfrom vmprof_tui.record import recording\nfrom vmprof_tui.resolve import spaces\n"
              "b = spaces.guest_symbols('vm', recording.load(sys.argv[1]).bundles['steal1']).bundle\n"
              "print(b.root, b.root.is_dir())")
    out = subprocess.run([sys.executable, "-c", script, str(GOLDEN)], capture_output=True, text=True, check=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)}).stdout.split()
    assert out[1] == "True" and out[0].startswith(str(tmp_path)) and not Path(out[0]).exists()


def test_name_codes_stay_whole_when_a_merge_cannot_get_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The room for both sorted tables is taken before either is changed: a merge that fails for memory leaves
    the codes as they were, and the next call codes names as before."""
    monkeypatch.setattr(arrays, "OWN_PAGES_BYTES", 1)
    monkeypatch.setattr(NameCodes, "RECENT_MIN", 64)
    codes = NameCodes()
    codes.procs = {("a", 1): 0}
    walk: dict[tuple, int] = {}

    def coded(func: np.ndarray) -> list[int]:
        proc, module = np.zeros(len(func), np.int64), np.zeros(len(func), np.int64)
        return codes.encode(proc, func, module).tolist()

    def walked(func: np.ndarray) -> list[int]:
        return [walk.setdefault((0, f, 0), len(walk)) for f in func.tolist()]

    first = np.arange(500)
    assert coded(first) == walked(first)
    real = arrays.own_pages
    calls = {"n": 0}

    def fails_on_the_second(*args: object, **kwargs: object) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError
        return real(*args, **kwargs)

    monkeypatch.setattr(arrays, "own_pages", fails_on_the_second)
    more = np.arange(500, 1200)
    with pytest.raises(MemoryError):
        coded(more)
    monkeypatch.setattr(arrays, "own_pages", real)
    assert len(codes.keys) == len(codes.codes) == 500 and np.all(np.diff(codes.keys) > 0)
    fresh = NameCodes()
    fresh.procs = {("a", 1): 0}
    again = np.concatenate([first, more, np.arange(100)])
    assert coded(again) == fresh.encode(np.zeros(len(again), np.int64), again, np.zeros(len(again), np.int64)).tolist()
