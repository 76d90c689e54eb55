"""`vmprof record`'s tables (codec auto): zlib for a recording's first samples, zstd past ZSTD_AFTER_SAMPLES, read
back as written, whole and a piece at a time."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from vmprof_tui.record import writer
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SCHED_DTYPE
from vmprof_tui.record.recording import SAMPLES, load
from vmprof_tui.record.stream import pieces, scan


def test_auto_codec_writes_zlib_then_zstd_and_reads_back_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "ZSTD_AFTER_SAMPLES", 250)
    path = tmp_path / "r.vmprof"
    w = writer.Writer(path, {"frequency": 1000, "backend": "none"}, codec="auto")
    rng = np.random.default_rng(2)
    written = []
    for flush in range(6):  # 100 samples a flush: the first three flushes (under 250 before them) in zlib
        s = np.zeros(100, SAMPLE_DTYPE)
        s["time_ns"] = np.sort(rng.integers(0, 10**6, 100)) + flush * 10**6
        s["pid"], s["host_ip"] = rng.integers(1, 50, 100), rng.integers(0, 1 << 40, 100)
        w.add(s, np.zeros(0, SCHED_DTYPE))
        w.flush()
        written.append(s)
    w.close({"duration_s": 0.006})
    scanned = scan(path)
    assert scanned is not None
    codecs = []
    with open(path, "rb") as f:
        for c in scanned.chunks:
            if c.kind == SAMPLES:
                (hlen,) = struct.unpack("<I", os.pread(f.fileno(), 4, c.offset))
                codecs.append(json.loads(os.pread(f.fileno(), hlen, c.offset + 4)).get("codec", "zlib"))
    assert codecs == ["zlib"] * 3 + ["zstd"] * 3
    whole = np.concatenate(written)
    assert np.array_equal(load(path).samples, whole)
    streamed = np.concatenate([p.samples for p in pieces(scanned, 150, lambda first, last: last)])
    assert np.array_equal(streamed, whole)


@pytest.mark.parametrize("codec", ["auto", "zstd"])
def test_writer_that_will_write_zstd_imports_it_when_made(tmp_path: Path, codec: str) -> None:
    """pyarrow (zstd) is imported when such a Writer is made, before sampling starts, not by the recorder's drain
    loop at its first zstd flush; a zlib Writer does not import it.  In a fresh interpreter: this one may have it."""
    script = ("import sys\nfrom vmprof_tui.record.writer import Writer\n"
              "Writer(sys.argv[1], {}, codec='zlib').abandon(keep=False)\nbefore = 'pyarrow' in sys.modules\n"
              "Writer(sys.argv[2], {}, codec=sys.argv[3]).abandon(keep=False)\nprint(before, 'pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), str(tmp_path / "b"), codec],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


def test_zstd_through_libzstd_inflates_as_pyarrow_and_refuses_what_it_refuses() -> None:
    """The reader's zstd (record/zstd.py: the system's libzstd through ctypes, so a report imports no pyarrow) gives
    pyarrow's bytes, and neither writes past the size a header states: a frame larger or smaller than it, or not
    zstd, is an error of both, and a table chunk whose header states other rows than its frame holds is refused."""
    import pyarrow as pa

    from vmprof_tui.record import recording, zstd

    assert zstd._libzstd() is not None, "libzstd.so.1 is on this host: the ctypes path is what is tested"
    body = np.random.default_rng(3).integers(0, 7, 300_000, dtype=np.uint8).tobytes()
    frame = pa.compress(body, codec="zstd", asbytes=True)
    assert bytes(zstd.decompress(frame, len(body))) == body == zstd.decompress(frame, len(body), use_libzstd=False)
    for bad, size in [(frame, len(body) - 1), (bytes(40), 100), (frame[:100], len(body))]:
        for use_libzstd in (True, False):
            with pytest.raises(zstd.ZstdError):
                zstd.decompress(bad, size, use_libzstd)
    s = np.zeros(10, SAMPLE_DTYPE)
    s["pid"] = np.arange(10)
    payload = recording.encode_table(s, codec="zstd")
    assert np.array_equal(recording._decode_table(payload, SAMPLE_DTYPE), s)
    (hlen,) = struct.unpack_from("<I", payload)
    header = json.dumps({**json.loads(payload[4:4 + hlen]), "rows": 11}).encode()
    with pytest.raises(recording.RecordingError, match="its zstd frame 560"):
        recording._decode_table(struct.pack("<I", len(header)) + header + payload[4 + hlen:], SAMPLE_DTYPE)


def test_a_report_of_zstd_tables_imports_no_pyarrow(tmp_path: Path) -> None:
    """Reading zstd tables (a recording past ZSTD_AFTER_SAMPLES) does not import pyarrow, whose import holds the
    interpreter's lock in the read-ahead thread (docs/scale.md); the rows are the same as written."""
    path = tmp_path / "z.vmprof"
    w = writer.Writer(path, {"frequency": 1000, "backend": "none"}, codec="zstd")
    s = np.zeros(500, SAMPLE_DTYPE)
    s["time_ns"], s["pid"] = np.arange(500) * 1000, 7
    w.add(s, np.zeros(0, SCHED_DTYPE))
    w.close({"duration_s": 0.001})
    script = ("import sys\nfrom vmprof_tui.record.recording import load\n"
              "print(len(load(sys.argv[1]).samples), 'pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["500", "False"]


def _frame_stating(size: int, body_len: int) -> bytes:
    """A zstd frame whose header states `size` bytes (single segment, 8-byte content size) and whose one block is of
    the reserved type, so nothing inflates; padded with zeros to body_len bytes."""
    header = struct.pack("<IBQ", 0xFD2FB528, 0xE0, size)
    return (header + (3 << 1 | 1).to_bytes(3, "little")).ljust(body_len, b"\0")


def _rows_payload(header: dict, body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<I", len(h)) + h + body


def _recording_with(path: Path, *chunks: tuple[int, bytes]) -> np.ndarray:
    """A finished recording of 100 good samples (zstd) followed by `chunks` (kind, payload); the good samples."""
    w = writer.Writer(path, {"frequency": 1000, "backend": "none"}, codec="zstd")
    s = np.zeros(100, SAMPLE_DTYPE)
    s["time_ns"], s["pid"] = np.arange(100) * 1000, 9
    w.add(s, np.zeros(0, SCHED_DTYPE))
    w.flush()
    for kind, payload in chunks:
        w.chunk(kind, payload)
    w.close({"duration_s": 0.001})
    return s


def test_a_zstd_chunk_lying_about_its_size_commits_no_memory_for_it(tmp_path: Path) -> None:
    """A 32 KiB samples chunk whose header and frame both state 1 GiB but whose frame holds nothing: loading it
    commits none of that gibibyte (peak RSS, in a fresh interpreter), the chunk is noted as unreadable and the
    good samples before it are kept."""
    from vmprof_tui.record.recording import SAMPLES as KIND

    rows = (1 << 30) // SAMPLE_DTYPE.itemsize
    lie = _rows_payload({"rows": rows, "dtype": SAMPLE_DTYPE.descr, "codec": "zstd"},
                        _frame_stating(rows * SAMPLE_DTYPE.itemsize, 32 << 10))
    path = tmp_path / "lie.vmprof"
    good = _recording_with(path, (KIND, lie))
    script = ("import resource, sys\nfrom vmprof_tui.record.recording import load\n"
              "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\nrec = load(sys.argv[1])\n"
              "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
              "print(len(rec.samples), grew // 1024, repr(rec.problems))")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True).stdout
    n, grew_mb, problems = out.split(maxsplit=2)
    assert int(n) == len(good) and int(grew_mb) < 64, out
    assert "unreadable samples chunk skipped: a table chunk does not decompress" in problems
    assert np.array_equal(load(path).samples, good)


def test_chunks_stating_more_rows_than_memory_holds_cost_only_themselves(tmp_path: Path) -> None:
    """64 chunks each stating 1 GiB (each within its bounds, together more than this host's memory): their table
    cannot be one array; each fails on its own, with one note each, and the good samples are kept."""
    from vmprof_tui.record.recording import SAMPLES as KIND

    rows = (1 << 30) // SAMPLE_DTYPE.itemsize
    lie = _rows_payload({"rows": rows, "dtype": SAMPLE_DTYPE.descr, "codec": "zstd"},
                        _frame_stating(rows * SAMPLE_DTYPE.itemsize, 32 << 10))
    path = tmp_path / "lies.vmprof"
    good = _recording_with(path, *[(KIND, lie)] * 64)
    rec = load(path)
    assert np.array_equal(rec.samples, good)
    assert sum("unreadable samples chunk skipped" in p for p in rec.problems) == 64


@pytest.mark.parametrize(("kind", "header", "body", "message"), [
    (9, {"rows": 1, "addresses": 2**25, "codec": "zstd"}, b"", "more than its body can hold"),
    (9, {"rows": 1, "addresses": 2**40, "codec": "zstd"}, b"", "more than its body can hold"),
    (9, {"rows": 1, "addresses": 2**40}, b"", "more than its body can hold"),
    (9, {"rows": 4, "addresses": -1, "codec": "zstd"}, b"", "no valid addresses count"),
    (9, {"rows": -1, "addresses": 0, "codec": "zstd"}, b"", "no valid rows count"),
    (7, {"rows": 2**40, "nr": 16, "fields": 3, "codec": "zstd"}, b"", "more than its body can hold"),
    (7, {"rows": -3, "nr": 16, "fields": 3, "codec": "zstd"}, b"", "no valid rows count"),
    (7, {"rows": 2, "nr": 16, "fields": 3, "codec": "zstd"}, _frame_stating(5, 40), "its zstd frame 5"),
    (2, {"rows": -1, "dtype": SAMPLE_DTYPE.descr, "codec": "zstd"}, b"", "no valid rows count"),
], ids=["stacks-2^25", "stacks-2^40", "stacks-2^40-zlib", "stacks-negative-addresses", "stacks-negative-rows",
        "lbr-2^40", "lbr-negative-rows", "lbr-frame-states-other", "samples-negative-rows"])
def test_every_row_chunk_kind_refuses_a_size_its_body_cannot_hold(tmp_path: Path, kind: int, header: dict,
                                                                   body: bytes, message: str) -> None:
    """LBR and host-stacks chunks get the bounds table chunks get (zstd or zlib): a stated size over what the body
    can inflate to, a negative count, or one the zstd frame does not state, is refused before anything is
    allocated; load() notes one line and keeps the rest."""
    payload = _rows_payload(header, body.ljust(30, b"\0"))
    path = tmp_path / "r.vmprof"
    good = _recording_with(path, (kind, payload))
    rec = load(path)
    assert np.array_equal(rec.samples, good)
    bad = [p for p in rec.problems if "unreadable" in p]
    assert len(bad) == 1 and message in bad[0], rec.problems


def test_lbr_and_host_stacks_chunks_in_zstd_read_back_exactly() -> None:
    """Every row chunk kind reads zstd (its header says so) through the one checked path."""
    from vmprof_tui.lbr.records import record_dtype
    from vmprof_tui.record import recording

    chains = {3: np.array([1, 2, 3], "<u8"), -7: np.array([9], "<u8")}
    zlib_payload = recording.encode_host_stacks(chains)
    (hlen,) = struct.unpack_from("<I", zlib_payload)
    header = json.loads(zlib_payload[4:4 + hlen])
    body = zlib.decompress(zlib_payload[4 + hlen:])
    got = recording._decode_host_stacks(recording.pack_rows(header, body, codec="zstd"))
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in chains.items()}
    lbr = np.zeros(5, record_dtype(16, 3))
    lbr["from"] = np.arange(80).reshape(5, 16)
    payload = recording.pack_rows({"rows": 5, "nr": 16, "fields": 3}, lbr.tobytes(), codec="zstd")
    assert np.array_equal(recording._decode_lbr(payload), lbr)


def test_zstd_frame_sizes_are_read_as_libzstd_reads_them_and_both_paths_refuse_alike() -> None:
    """stated_size (read for libzstd and pyarrow alike) gives what libzstd's ZSTD_getFrameContentSize gives, for
    frames pyarrow writes and for random frame headers (legacy frames, which libzstd may read, are refused); a frame
    stating another size than the header is refused with the same message on both paths, before either allocates."""
    import ctypes

    import pyarrow as pa

    from vmprof_tui.record import zstd

    lib = zstd._libzstd()
    assert lib is not None
    unknown, error = ctypes.c_ulonglong(-1).value, ctypes.c_ulonglong(-2).value
    rng = np.random.default_rng(8)
    samples = [pa.compress(bytes(n), codec="zstd", asbytes=True) for n in (0, 1, 255, 256, 65791, 70000, 1 << 20)]
    for _ in range(3000):
        head = struct.pack("<I", int(rng.choice([0xFD2FB528, 0x184D2A53, 0xFD2FB527]))) + rng.integers(
            0, 256, int(rng.integers(0, 16)), dtype=np.uint8).tobytes()
        samples.append(head)
    for body in samples:
        want = lib.ZSTD_getFrameContentSize(body, len(body))
        try:
            got = zstd.stated_size(body)
        except zstd.ZstdError:
            got = error
        if body[:4] == struct.pack("<I", 0xFD2FB527):  # a legacy (v0.7) frame, which vmprof never wrote: refused
            assert got == error
        else:
            assert (unknown if got is None else got) == want, body.hex()
    frame = pa.compress(bytes(1000), codec="zstd", asbytes=True)
    messages = set()
    for use_libzstd in (True, False):
        with pytest.raises(zstd.ZstdError) as e:
            zstd.decompress(frame, 1 << 40, use_libzstd)
        messages.add(str(e.value))
    assert messages == {f"the frame holds 1000 bytes, not the {1 << 40} the header states"}
    lie = _frame_stating(1 << 20, 64)  # the size stated alike, the content corrupt: libzstd's error name on both
    assert {str(pytest.raises(zstd.ZstdError, zstd.decompress, lie, 1 << 20, use).value)
            for use in (True, False)} == {"Data corruption detected"}


def test_a_recording_of_damaged_zstd_chunks_reads_alike_through_pyarrow(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libzstd does not load (pyarrow inflates), load() keeps the same rows and notes the same lines for chunks
    whose frame states another size, whose content is corrupt, or whose stated size the body cannot hold."""
    from vmprof_tui.record import zstd
    from vmprof_tui.record.recording import SAMPLES as KIND

    def lying(rows: int, frame_size: int, body_len: int) -> tuple[int, bytes]:
        header = {"rows": rows, "dtype": SAMPLE_DTYPE.descr, "codec": "zstd"}
        return KIND, _rows_payload(header, _frame_stating(frame_size, body_len))

    path = tmp_path / "d.vmprof"
    size = 1000 * SAMPLE_DTYPE.itemsize
    good = _recording_with(path, lying(1000, size + 1, 64), lying(1000, size, 64), lying(10**6, 10**6 * 56, 64))
    seen = []
    for use_libzstd in (True, False):
        if not use_libzstd:
            monkeypatch.setattr(zstd, "_libzstd", lambda: None)
        rec = load(path)
        assert np.array_equal(rec.samples, good)
        seen.append(rec.problems)
    assert seen[0] == seen[1] and len([p for p in seen[0] if "unreadable" in p]) == 3, seen
