"""How the agent stores a window (t0 of the analysis node's continuity condition, docs/fleet.md): its tables in
zstd, in back-to-back stretches of the host clock that a reader takes a piece at a time, read back exactly."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from vmprof_tui.record import recording
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SCHED_DTYPE
from vmprof_tui.record.recording import RecordingError
from vmprof_tui.record.spool import WINDOW_CODEC
from vmprof_tui.record.stream import scan
from vmprof_tui.record.writer import Writer


def tables(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n samples and n/8 sched events of 64 CPUs, drained per CPU (so out of time order overall)."""
    samples = np.zeros(n, SAMPLE_DTYPE)
    samples["cpu"] = rng.integers(0, 64, n)
    samples["time_ns"] = np.sort(rng.integers(0, 60_000_000_000, n).astype(np.uint64))
    samples["pid"] = samples["tid"] = rng.integers(1, 5000, n)
    samples["host_ip"] = rng.integers(0, 1 << 40, n)
    samples = samples[np.argsort(samples["cpu"], kind="stable")]
    sched = np.zeros(n // 8, SCHED_DTYPE)
    sched["time_ns"] = rng.integers(0, 60_000_000_000, len(sched)).astype(np.uint64)
    sched["cpu"] = rng.integers(0, 64, len(sched))
    sched["next_tid"] = rng.integers(1, 5000, len(sched))
    return samples, sched


def by_time(table: np.ndarray) -> np.ndarray:
    return np.sort(table, order=[f for f in table.dtype.names])


def test_a_window_is_stored_in_zstd_pieces_of_time_and_read_back_exactly(tmp_path: Path) -> None:
    samples, sched = tables(600_000, np.random.default_rng(3))
    path = tmp_path / "w.vmprof"
    w = Writer(path, {"frequency": 1000}, codec=WINDOW_CODEC)
    w.add(samples, sched)
    w.close({"duration_s": 60.0, "lost": {"samples": [0], "sched": [0]}})
    rec = recording.load(path)
    assert not rec.problems
    assert np.array_equal(by_time(rec.samples), by_time(samples))
    assert np.array_equal(by_time(rec.sched), by_time(sched))
    scanned = scan(path)
    assert scanned is not None
    kinds = [c.kind for c in scanned.chunks]
    assert kinds == [recording.SAMPLES, recording.SCHED] * 3  # 2^18 samples a piece at most, each with its events
    # each piece's records are all before the next piece's: the stream reads them a piece at a time
    spans = []
    with open(path, "rb") as f:
        for c in scanned.chunks:
            f.seek(c.offset)
            dtype = SAMPLE_DTYPE if c.kind == recording.SAMPLES else SCHED_DTYPE
            t = recording._decode_table(f.read(c.length), dtype)["time_ns"]
            spans.append((int(t.min()), int(t.max())))
    pieces = [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(spans[::2], spans[1::2], strict=True)]
    assert all(one[1] < nxt[0] for one, nxt in zip(pieces, pieces[1:], strict=False))


def test_a_zstd_chunk_stating_more_rows_than_zstd_can_inflate_is_refused() -> None:
    def payload(rows: int) -> bytes:
        header = json.dumps({"rows": rows, "dtype": SAMPLE_DTYPE.descr, "codec": "zstd"}).encode()
        frame = struct.pack("<IBQ", 0xFD2FB528, 0xE0, rows * SAMPLE_DTYPE.itemsize)  # a frame header stating them
        return struct.pack("<I", len(header)) + header + frame.ljust(64, b"\0")

    assert recording._table_rows(payload(1000), SAMPLE_DTYPE) == 1000
    with pytest.raises(RecordingError, match="more than its body can hold"):
        recording._table_rows(payload(1 << 20), SAMPLE_DTYPE)
