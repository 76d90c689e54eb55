"""The memo of streamed reports (resolve/memo.py, its table compiled from resolve/_keytable.c) resolves samples as the
numpy path does, and its table takes hostile arguments without crashing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from synth import busy_recording

from vmprof_tui.analyse import stream
from vmprof_tui.cli import doctor, main
from vmprof_tui.record.bpf_records import (
    SAMPLE_DTYPE,
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_GUEST_UNKNOWN,
    SAMPLE_HOST_KERNEL,
)
from vmprof_tui.record.recording import load
from vmprof_tui.resolve import _keytable, memo
from vmprof_tui.resolve.prepare import learn_vms
from vmprof_tui.resolve.resolver import Resolved, Resolver

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"
COLUMNS = ("func", "module", "process", "proc_pid", "proc_code", "process_name_code")
SEED = bytes(range(_keytable.SEED_BYTES))  # a fixed seed, for tests that pick keys colliding under it


def every_kind_of_sample(rng: np.random.Generator) -> tuple:
    """The golden recording's samples (host user and kernel, guest user) and copies made of every other kind: guest
    kernel, guest RIP unknown, a VMM the VM list does not name, a host pid the snapshot does not have, in random
    order."""
    rec = load(GOLDEN)
    s = rec.samples
    guest = np.flatnonzero((s["flags"] & SAMPLE_GUEST) != 0)
    host = np.flatnonzero((s["flags"] & SAMPLE_GUEST) == 0)
    kernel, unknown, stranger, gone = (s[rng.choice(idx, 500)] for idx in (guest, guest, guest, host))
    kernel["flags"] |= SAMPLE_GUEST_KERNEL
    kernel["guest_ip"] = np.uint64(0xFFFFFFFF81000000) + rng.integers(0, 1 << 20, 500).astype(np.uint64)
    unknown["flags"] |= SAMPLE_GUEST_UNKNOWN
    stranger["pid"] = 999_999
    gone["pid"] = 888_888
    gone["flags"] ^= rng.integers(0, 2, 500).astype(np.uint16) * SAMPLE_HOST_KERNEL
    samples = np.concatenate([s, kernel, unknown, stranger, gone])
    return rec, samples[rng.permutation(len(samples))]


def resolved_in_pieces(rec, samples: np.ndarray, cuts: list[int], with_memo: bool,
                       seed: bytes | None = None) -> tuple[memo.ResolveMemo | None, list[Resolved]]:
    resolver = Resolver()
    table = memo.ResolveMemo(seed) if with_memo else None
    vms = learn_vms(rec, samples, (samples["flags"] & SAMPLE_GUEST) != 0)
    resolver.load_guests(vms.by_pid.values(), {}, rec.bundles)
    parts = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(samples)], strict=True)):
        parts.append(resolver.resolve(samples[a:b], rec.processes(), vms.by_pid, rec.kallsyms() if i == 0 else None,
                                      [], table))
    return table, parts


def test_memo_resolves_every_kind_of_sample_as_the_numpy_path() -> None:
    rec, samples = every_kind_of_sample(np.random.default_rng(5))
    cuts = [1, 900, 901, 3000, 3000, 7000]  # pieces of one sample and of none among them
    _none, plain = resolved_in_pieces(rec, samples, cuts, with_memo=False)
    table, parts = resolved_in_pieces(rec, samples, cuts, with_memo=True)
    for mine, want in zip(parts, plain, strict=True):
        assert np.array_equal(mine.name_code, want.name_code)  # new names numbered as by the numpy path
        for column in COLUMNS:
            assert np.array_equal(getattr(mine, column), getattr(want, column)), column
    whole = Resolved.concatenate(plain)
    assert len(set(whole.func.tolist())) > 20 and "(guest RIP unknown)" in whole.module.tolist()
    # the memo holds each distinct key once, and knows them all now
    assert table is not None and len(table.table) == np.unique(np.stack(memo.sample_keys(samples)), axis=1).shape[1]

    def resolve(_samples: np.ndarray) -> np.ndarray:
        raise AssertionError("a key resolved twice")

    assert np.array_equal(table.codes(samples[::-1], resolve), whole.name_code[::-1])


def test_keys_made_from_the_records_are_sample_keys() -> None:
    """lookup_samples makes each record's key in C: the same words as sample_keys (numpy, the reference) makes,
    and it gives back the words of the keys it missed, in order."""
    _rec, samples = every_kind_of_sample(np.random.default_rng(9))
    keys = memo.sample_keys(samples)
    table = _keytable.KeyTable(SEED)
    half = np.arange(0, len(samples), 2)
    table.insert(*(k[half] for k in keys), ((keys[0] ^ keys[1] ^ keys[2])[half] >> np.uint64(1)).astype(np.int64))
    by_records, by_keys = np.empty(len(samples), np.int64), np.empty(len(samples), np.int64)
    words = np.empty((3, len(samples)), np.uint64)
    missed = table.lookup_samples(samples.view(np.uint8), memo.record_layout(samples.dtype), by_records, *words)
    assert missed == table.lookup(*keys, by_keys) > 0
    assert np.array_equal(by_records, by_keys)
    assert np.array_equal(words[:, :missed], np.stack(keys)[:, by_keys < 0])


@pytest.mark.parametrize("level", [[], ["--vm", "web"]], ids=["host", "vm"])
def test_streamed_report_with_the_memo_is_the_report_without_it(tmp_path: Path, level: list[str],
                                                                capsys: pytest.CaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthetic recording in pieces of 1,000 samples (synth.busy_recording: host and guest samples, VMs whose
    vCPUs run, halt and are preempted), reported with the memo and by the numpy path alone."""
    rec = busy_recording(tmp_path / "busy.vmprof", 6.0)
    monkeypatch.setattr(stream, "PIECE_ROWS", 1000)
    memos: list = []
    monkeypatch.setattr(stream, "new_memo", lambda: memos.append(memo.new_memo()) or memos[-1])
    outputs = []
    for _with_memo in (True, False):
        assert main(["report", str(rec), "--format", "json", *level]) == 0
        outputs.append(capsys.readouterr().out)
        monkeypatch.setattr(stream, "new_memo", lambda: None)
    assert outputs[0] == outputs[1] and len(outputs[0]) > 1000
    assert len(memos) == 1 and len(memos[0].table) >= 10  # the first report went through the memo


def test_memo_is_used_when_the_table_is_built() -> None:
    assert memo.new_memo() is not None  # tools/bootstrap.sh builds it (CI too): else streamed reports run slower


def test_key_table_stores_and_finds_keys_as_a_dict_does() -> None:
    rng = np.random.default_rng(11)
    table, model = _keytable.KeyTable(SEED), {}
    for size in (0, 1, 50, 5000, 20000):  # the table grows several times
        a, b, c = (rng.integers(0, 40, size).astype(np.uint64) << np.uint64(60) for _ in range(3))
        b |= rng.integers(0, 300, size).astype(np.uint64)
        out = np.empty(size, np.int64)
        missing = table.lookup(a, b, c, out)
        want = [model.get(k, -1) for k in zip(a.tolist(), b.tolist(), c.tolist(), strict=True)]
        assert out.tolist() == want and missing == want.count(-1)
        values = (a ^ b ^ c).astype(np.int64) & 0x7FFFFFFF
        table.insert(a, b, c, values)
        model.update(zip(zip(a.tolist(), b.tolist(), c.tolist(), strict=True), values.tolist(), strict=True))
        assert len(table) == len(model)
        first = np.empty(size, np.int64)
        distinct = _keytable.first(SEED, a, b, c, first)
        seen: dict = {}
        keys = zip(a.tolist(), b.tolist(), c.tolist(), strict=True)
        assert first.tolist() == [seen.setdefault(k, i) for i, k in enumerate(keys)]
        assert distinct == len(seen)


@pytest.mark.parametrize("seed", range(4))
def test_key_table_never_crashes_on_hostile_arguments(seed: int) -> None:
    """Wrong types, dtypes, shapes, lengths, strides, read-only outputs, negative or conflicting values: each raises
    one TypeError, ValueError or BufferError, and the table still works after."""
    rng = np.random.default_rng(seed)
    table = _keytable.KeyTable(SEED)
    n = 64
    ok = [np.arange(n, dtype=np.uint64) for _ in range(3)]
    table.insert(*ok, np.arange(n, dtype=np.int64))
    bad_args = [
        (), (ok[0],), (*ok, np.empty(n, np.int64), 5), (1, 2, 3, 4), ("abc", *ok), (None, *ok),
        (*ok[:2], ok[2][:-1], np.empty(n, np.int64)), (*ok, np.empty(n, np.int32)), (*ok, np.empty(n, np.float64)),
        (*ok, np.empty((n, 1), np.int64)), (ok[0][::2], ok[1][::2], ok[2][::2], np.empty(n // 2, np.int64)),
        (*ok, b"\0" * 8 * n), (*ok, np.empty(n, "S8")), (np.empty(n, "M8[ns]"), *ok[1:], np.empty(n, np.int64)),
        (*ok, np.empty(0, np.int64)), (np.empty(n, object), *ok[1:], np.empty(n, np.int64)),
    ]
    readonly = np.empty(n, np.int64)
    readonly.flags.writeable = False
    bad_args.append((*ok, readonly))
    for _ in range(40):  # random junk of every length and dtype
        dtype = rng.choice(["u1", "i2", "u4", "i8", "u8", "f8", "c16", "S3"])
        size = int(rng.integers(0, 3 * n))
        bad_args.append(tuple(np.zeros(size if i else n, dtype) for i in range(4)))
    for args in bad_args:
        for call in (table.lookup, table.insert, lambda *a: _keytable.first(SEED, *a),
                     lambda *a: _keytable.hashes(SEED, *a)):
            with contextlib.suppress(TypeError, ValueError, BufferError):
                call(*args)
    for bad_seed in (None, b"", b"x" * (_keytable.SEED_BYTES - 1), b"x" * (_keytable.SEED_BYTES + 1),
                     "x" * _keytable.SEED_BYTES, bytearray(_keytable.SEED_BYTES), 5):
        with contextlib.suppress(TypeError, ValueError):
            _keytable.KeyTable(bad_seed)
        with contextlib.suppress(TypeError, ValueError):
            _keytable.first(bad_seed, *ok, np.empty(n, np.int64))
    records = np.zeros(n, SAMPLE_DTYPE)
    layout = memo.record_layout(records.dtype)
    raw = records.view(np.uint8)
    words = [np.empty(n, np.uint64) for _ in range(3)]
    for bad_layout in [(0, *layout[1:]), (-8, *layout[1:]), (7, *layout[1:]), (*layout[:2], 10**6, *layout[3:]),
                       (layout[0], -1, *layout[2:]), (*layout[:5], layout[0] - 7, *layout[6:]), layout[:3],
                       (*layout[:6], -1, *layout[7:]), ("x", *layout[1:])]:
        for out in (np.empty(n, np.int64), np.empty(n - 1, np.int64), readonly):
            with contextlib.suppress(TypeError, ValueError, BufferError, OverflowError):
                table.lookup_samples(raw, bad_layout, out, *words)
    for junk in (raw[:-3], raw[::2], b"", "abc", None, np.empty(n, np.int64)):
        with contextlib.suppress(TypeError, ValueError, BufferError):
            table.lookup_samples(junk, layout, np.empty(n, np.int64), *words)
    for bad_words in (words[:2], [*words[:2], np.empty(n - 1, np.uint64)], [*words[:2], words[0]],
                      [*words[:2], raw[:8 * n]], [*words[:2], None], [*words[:2], readonly]):
        with contextlib.suppress(TypeError, ValueError, BufferError):
            table.lookup_samples(raw, layout, np.empty(n, np.int64), *bad_words)
    with pytest.raises(ValueError, match="negative"):
        table.insert(*ok, np.full(n, -5, np.int64))
    with pytest.raises(ValueError, match="two values"):
        table.insert(*ok, np.arange(n, dtype=np.int64) + 1)
    with pytest.raises(TypeError):
        _keytable.KeyTable()
    out = np.empty(n, np.int64)
    assert table.lookup(*ok, out) == 0 and out.tolist() == list(range(n))
    # keys of every bit pattern; the same array as a key and the output
    wild = rng.integers(-(1 << 63), (1 << 63) - 1, n, dtype=np.int64)
    table.insert(wild, wild, wild, np.arange(n, dtype=np.int64))
    assert table.lookup(wild, wild, wild, wild) == 0 and wild.tolist() == list(range(n))


def test_key_table_is_bounded() -> None:
    """Past its size it stores no more keys (they miss, and the numpy path resolves them), and never fails."""
    table = _keytable.KeyTable(SEED)
    size = _keytable.MAX_ENTRIES + 5000
    keys = np.arange(size, dtype=np.uint64)
    zeros = np.zeros(size, np.uint64)
    table.insert(keys, zeros, zeros, np.arange(size, dtype=np.int64))
    assert len(table) == _keytable.MAX_ENTRIES
    out = np.empty(size, np.int64)
    assert table.lookup(keys, zeros, zeros, out) == 5000
    assert out[:10].tolist() == list(range(10)) and (out[_keytable.MAX_ENTRIES:] == -1).all()


U64 = (1 << 64) - 1


def old_hash(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The table's first hash: fixed, unseeded (numpy's uint64 arithmetic wraps as C's)."""
    with np.errstate(over="ignore"):
        h = a * np.uint64(0x9E3779B97F4A7C15) ^ b * np.uint64(0xC2B2AE3D27D4EB4F) ^ c * np.uint64(0x165667B19E3779F9)
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        return h ^ h >> np.uint64(29)


def keys_colliding_in_the_old_hash(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n guest addresses of one process and CR3 whose old hashes share their low 20 bits (one slot in any table of
    up to 2^20): each hash chosen, then the steps of the old hash undone (xor-shifts and odd multipliers invert)."""
    def undo_shift(h: int, s: int) -> int:
        x = h
        for _ in range(64 // s + 1):
            x = h ^ (x >> s)
        return x & U64

    a, c = (GUEST_USER_KIND << 32) | 1234, 0x1000
    out = []
    for i in range(n):
        h = undo_shift((undo_shift((i << 20) | 0x12345, 29) * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & U64, 31)
        out.append(((h ^ (a * 0x9E3779B97F4A7C15 & U64) ^ (c * 0x165667B19E3779F9 & U64))
                    * pow(0xC2B2AE3D27D4EB4F, -1, 1 << 64)) & U64)
    return np.full(n, a, np.uint64), np.array(out, np.uint64), np.full(n, c, np.uint64)


GUEST_USER_KIND = memo.GUEST_USER


def test_keys_crafted_to_collide_in_the_old_hash_walk_few_slots() -> None:
    """20,000 keys that all took one slot of the old hash (each insert and lookup walked all before it): with the
    seeded hash they walk a few slots each, counted by the module's probe counter, in the table and in first()."""
    n = 20_000
    a, b, c = keys_colliding_in_the_old_hash(n)
    assert len(np.unique(old_hash(a, b, c) & np.uint64((1 << 20) - 1))) == 1 and len(np.unique(b)) == n
    for seed in (SEED, bytes(_keytable.SEED_BYTES)):
        table, out = _keytable.KeyTable(seed), np.empty(n, np.int64)
        before = _keytable.probes()
        table.insert(a, b, c, np.arange(n, dtype=np.int64))
        assert table.lookup(a, b, c, out) == 0 and out.tolist() == list(range(n))
        assert _keytable.first(seed, a, b, c, out) == n and out.tolist() == list(range(n))
        walked = _keytable.probes() - before
        assert walked < 3 * 3 * n  # insert, lookup, first: about one slot past the first each (the old: n^2 / 2)


def keys_sharing_a_slot(seed: bytes, n: int, low_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n keys of one guest process and CR3 whose seeded hashes share their low bits: found by hashing many."""
    rng = np.random.default_rng(3)
    a, c = np.uint64((GUEST_USER_KIND << 32) | 1234), np.uint64(0x1000)
    found: list[np.ndarray] = []
    while sum(map(len, found)) < n:
        b = rng.integers(0, 1 << 47, 1 << 22, dtype=np.uint64)
        h = np.empty(len(b), np.int64)
        _keytable.hashes(seed, np.full(len(b), a), b, np.full(len(b), c), h)
        found.append(b[(h & ((1 << low_bits) - 1)) == 0])
    b = np.unique(np.concatenate(found))[:n]
    return np.full(n, a), b, np.full(n, c)


def test_probe_cap_bounds_the_walk_of_keys_that_share_a_slot() -> None:
    """Keys that share one slot under the table's own seed (as if a guest had found its seed): no operation walks
    more than MAX_PROBES slots; those past them are not stored and miss, and first() counts them as new."""
    n, cap = 600, _keytable.MAX_PROBES
    a, b, c = keys_sharing_a_slot(SEED, n, 12)  # one slot of tables up to 4,096 (the table's first is 1,024)
    table, out = _keytable.KeyTable(SEED), np.empty(n, np.int64)
    before = _keytable.probes()
    table.insert(a, b, c, np.arange(n, dtype=np.int64))
    assert len(table) == cap + 1  # the slot's own, and as many after it as MAX_PROBES lets a key walk
    assert table.lookup(a, b, c, out) == n - cap - 1
    assert out[:cap + 1].tolist() == list(range(cap + 1)) and (out[cap + 1:] == -1).all()
    assert _keytable.probes() - before <= 2 * n * cap
    twice = [np.concatenate([k, k]) for k in (a, b, c)]  # 1,200 keys: first()'s table has 4,096 slots
    at = np.empty(2 * n, np.int64)
    before = _keytable.probes()
    assert _keytable.first(SEED, *twice, at) == n + (n - cap - 1)  # the repeats of those past the cap: new again
    assert _keytable.probes() - before <= 2 * n * cap
    assert at[:n].tolist() == list(range(n))
    assert at[n:n + cap + 1].tolist() == list(range(cap + 1)) and at[n + cap + 1:].tolist() == list(
        range(n + cap + 1, 2 * n))


def test_memo_resolves_keys_that_share_a_slot_as_the_numpy_path() -> None:
    """Guest samples whose keys all share a slot under the memo's seed (twice each, among the golden recording's):
    the keys past the probe cap are resolved by the numpy path in every piece, to the same names."""
    rec, samples = every_kind_of_sample(np.random.default_rng(6))
    guest = samples[(samples["flags"] & (SAMPLE_GUEST | SAMPLE_GUEST_UNKNOWN | SAMPLE_GUEST_KERNEL)) == SAMPLE_GUEST]
    template = guest[:1].copy()
    a, _b, c = memo.sample_keys(template)
    rng = np.random.default_rng(4)
    colliding: list[np.ndarray] = []
    while sum(map(len, colliding)) < 400:
        b = rng.integers(0, 1 << 47, 1 << 22, dtype=np.uint64)
        h = np.empty(len(b), np.int64)
        _keytable.hashes(SEED, np.full(len(b), a[0]), b, np.full(len(b), c[0]), h)
        colliding.append(b[(h & 4095) == 0])
    crafted = np.repeat(template, 800)
    crafted["guest_ip"] = np.tile(np.concatenate(colliding)[:400], 2)
    samples = np.concatenate([samples, crafted])[rng.permutation(len(samples) + 800)]
    cuts = [2000, 5000]
    _none, plain = resolved_in_pieces(rec, samples, cuts, with_memo=False)
    table, parts = resolved_in_pieces(rec, samples, cuts, with_memo=True, seed=SEED)
    for mine, want in zip(parts, plain, strict=True):
        assert np.array_equal(mine.name_code, want.name_code)
        for column in COLUMNS:
            assert np.array_equal(getattr(mine, column), getattr(want, column)), column
    distinct = np.unique(np.stack(memo.sample_keys(samples)), axis=1).shape[1]
    assert table is not None and len(table.table) < distinct  # some were past the cap, and not kept


def test_seed_decides_which_keys_share_a_slot() -> None:
    a, b, c = keys_sharing_a_slot(SEED, 50, 12)
    other = np.empty(len(b), np.int64)
    _keytable.hashes(bytes(_keytable.SEED_BYTES), a, b, c, other)
    assert len(np.unique(other & 4095)) > 40  # under another seed they scatter


def test_first_refuses_an_output_that_shares_memory_with_a_key() -> None:
    """first() reads keys back at positions it has written: an output over a key array (whole or in part) is refused,
    as are outputs of lookup_samples over the records or each other."""
    memory = np.arange(300, dtype=np.uint64)
    a, b, c = (np.arange(100, dtype=np.uint64) for _ in range(3))
    for keys, out in [((a, b, c), a.view(np.int64)), ((a, b, c), c.view(np.int64)),
                      ((memory[:100], b, c), memory[50:150].view(np.int64)),
                      ((a, memory[200:], c), memory[101:201].view(np.int64))]:
        with pytest.raises(ValueError, match="share memory"):
            _keytable.first(SEED, *keys, out)
    assert _keytable.first(SEED, memory[:100], b, c, memory[100:200].view(np.int64)) == 100  # side by side: fine
    records = np.zeros(100, SAMPLE_DTYPE)
    table, raw = _keytable.KeyTable(SEED), records.view(np.uint8)
    words = [np.empty(100, np.uint64) for _ in range(3)]
    for out, w in [(raw[:800].view(np.int64), words), (np.empty(100, np.int64), [words[0], words[0], words[2]]),
                   (words[1].view(np.int64), words)]:
        with pytest.raises(ValueError, match="share memory"):
            table.lookup_samples(raw, memo.record_layout(records.dtype), out, *w)


def test_key_table_of_another_version_is_not_used_and_the_report_is_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .so built from an older _keytable.c (another VERSION, or none): memo.py does not call it, the streamed
    report runs the numpy path to the same output, and keytable_problem says what `vmprof doctor` shows."""
    rec = busy_recording(tmp_path / "busy.vmprof", 4.0)
    monkeypatch.setattr(stream, "PIECE_ROWS", 1000)
    assert main(["report", str(rec), "--format", "json"]) == 0
    fresh = capsys.readouterr().out

    def stale_call(*_args: object) -> None:
        raise AssertionError("a stale key table was called")

    for version in ({"VERSION": memo.KEYTABLE_VERSION - 1}, {}):
        stale = SimpleNamespace(KeyTable=stale_call, first=stale_call, SEED_BYTES=16, **version)
        monkeypatch.setattr(memo, "_keytable", stale)
        assert memo.new_memo() is None and "another _keytable.c" in memo.keytable_problem()
        check = doctor.key_table()
        assert not check.ok and "another _keytable.c" in check.detail and "bootstrap.sh" in check.fix
        assert main(["report", str(rec), "--format", "json"]) == 0
        assert capsys.readouterr().out == fresh
    monkeypatch.setattr(memo, "_keytable", None)
    assert memo.new_memo() is None and memo.keytable_problem() == "not built"
    assert "not built" in doctor.key_table().detail
    monkeypatch.undo()
    assert doctor.key_table().ok
