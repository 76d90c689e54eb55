"""`vmprof record`'s tables (codec auto): zlib for a recording's first samples, zstd past ZSTD_AFTER_SAMPLES, read
back as written, whole and a piece at a time."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
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
    pyarrow's bytes, and neither writes past the size a header states: a frame larger than it, or not zstd, is an
    error of both; a frame smaller than it is a table chunk shorter than its header says."""
    import pyarrow as pa

    from vmprof_tui.record import recording, zstd

    assert zstd._libzstd() is not None, "libzstd.so.1 is on this host: the ctypes path is what is tested"
    body = np.random.default_rng(3).integers(0, 7, 300_000, dtype=np.uint8).tobytes()
    frame = pa.compress(body, codec="zstd", asbytes=True)
    assert zstd.decompress(frame, len(body)) == body == zstd.decompress(frame, len(body), use_libzstd=False)
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
    with pytest.raises(recording.RecordingError, match="shorter than its header says"):
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
