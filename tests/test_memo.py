"""The memo of streamed reports (resolve/memo.py, its table compiled from resolve/_keytable.c) resolves samples as the
numpy path does, and its table takes hostile arguments without crashing."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
from synth import busy_recording

from vmprof_tui.analyse import stream
from vmprof_tui.cli import main
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


def resolved_in_pieces(rec, samples: np.ndarray, cuts: list[int],
                       with_memo: bool) -> tuple[memo.ResolveMemo | None, list[Resolved]]:
    resolver = Resolver()
    table = memo.ResolveMemo() if with_memo else None
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
    """lookup_samples makes each record's key in C: the same words as sample_keys (numpy) makes."""
    _rec, samples = every_kind_of_sample(np.random.default_rng(9))
    keys = memo.sample_keys(samples)
    table = _keytable.KeyTable()
    half = np.arange(0, len(samples), 2)
    table.insert(*(k[half] for k in keys), ((keys[0] ^ keys[1] ^ keys[2])[half] >> np.uint64(1)).astype(np.int64))
    by_records, by_keys = np.empty(len(samples), np.int64), np.empty(len(samples), np.int64)
    missed = table.lookup_samples(samples.view(np.uint8), memo.record_layout(samples.dtype), by_records)
    assert missed == table.lookup(*keys, by_keys) > 0
    assert np.array_equal(by_records, by_keys)


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
    table, model = _keytable.KeyTable(), {}
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
        distinct = _keytable.first(a, b, c, first)
        seen: dict = {}
        keys = zip(a.tolist(), b.tolist(), c.tolist(), strict=True)
        assert first.tolist() == [seen.setdefault(k, i) for i, k in enumerate(keys)]
        assert distinct == len(seen)


@pytest.mark.parametrize("seed", range(4))
def test_key_table_never_crashes_on_hostile_arguments(seed: int) -> None:
    """Wrong types, dtypes, shapes, lengths, strides, read-only outputs, negative or conflicting values: each raises
    one TypeError, ValueError or BufferError, and the table still works after."""
    rng = np.random.default_rng(seed)
    table = _keytable.KeyTable()
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
        for call in (table.lookup, table.insert, _keytable.first):
            with contextlib.suppress(TypeError, ValueError, BufferError):
                call(*args)
    records = np.zeros(n, SAMPLE_DTYPE)
    layout = memo.record_layout(records.dtype)
    raw = records.view(np.uint8)
    for bad_layout in [(0, *layout[1:]), (-8, *layout[1:]), (7, *layout[1:]), (*layout[:2], 10**6, *layout[3:]),
                       (layout[0], -1, *layout[2:]), (*layout[:5], layout[0] - 7, *layout[6:]), layout[:3],
                       (*layout[:6], -1, *layout[7:]), ("x", *layout[1:])]:
        for out in (np.empty(n, np.int64), np.empty(n - 1, np.int64), readonly):
            with contextlib.suppress(TypeError, ValueError, BufferError, OverflowError):
                table.lookup_samples(raw, bad_layout, out)
    for junk in (raw[:-3], raw[::2], b"", "abc", None, np.empty(n, np.int64)):
        with contextlib.suppress(TypeError, ValueError, BufferError):
            table.lookup_samples(junk, layout, np.empty(n, np.int64))
    with pytest.raises(ValueError, match="negative"):
        table.insert(*ok, np.full(n, -5, np.int64))
    with pytest.raises(ValueError, match="two values"):
        table.insert(*ok, np.arange(n, dtype=np.int64) + 1)
    with pytest.raises(TypeError):
        _keytable.KeyTable(5)
    out = np.empty(n, np.int64)
    assert table.lookup(*ok, out) == 0 and out.tolist() == list(range(n))
    # keys of every bit pattern; the same array as a key and the output
    wild = rng.integers(-(1 << 63), (1 << 63) - 1, n, dtype=np.int64)
    table.insert(wild, wild, wild, np.arange(n, dtype=np.int64))
    assert table.lookup(wild, wild, wild, wild) == 0 and wild.tolist() == list(range(n))


def test_key_table_is_bounded() -> None:
    """Past its size it stores no more keys (they miss, and the numpy path resolves them), and never fails."""
    table = _keytable.KeyTable()
    size = _keytable.MAX_ENTRIES + 5000
    keys = np.arange(size, dtype=np.uint64)
    zeros = np.zeros(size, np.uint64)
    table.insert(keys, zeros, zeros, np.arange(size, dtype=np.int64))
    assert len(table) == _keytable.MAX_ENTRIES
    out = np.empty(size, np.int64)
    assert table.lookup(keys, zeros, zeros, out) == 5000
    assert out[:10].tolist() == list(range(10)) and (out[_keytable.MAX_ENTRIES:] == -1).all()
