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
