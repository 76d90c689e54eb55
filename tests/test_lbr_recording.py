"""`vmprof record --lbr` and `vmprof blocks REC` (issue 7): on these machines (no PMU) the command
says so in one line; the storage path is exercised with the collector's software stand-in events."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from conftest import require_root, vmprof

from vmprof_tui.collect.bpf import pmu_available
from vmprof_tui.collect.session import CollectionSession
from vmprof_tui.lbr.collector import LbrCollector, LbrConfig
from vmprof_tui.lbr.recording import samples_of_recording
from vmprof_tui.record import recording
from vmprof_tui.record.recorder import Recorder


def test_record_lbr_says_why_not(tmp_path: Path) -> None:
    out = vmprof("record", "-o", str(tmp_path / "l.vmprof"), "-d", "1", "--lbr")
    if pmu_available():  # a PMU host: the real thing must work
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vmprof: --lbr: ") and "PMU" in lines[0], lines
    assert not (tmp_path / "l.vmprof").exists()


def test_lbr_records_are_stored_and_read_back(tmp_path: Path) -> None:
    require_root()
    out = tmp_path / "standin.vmprof"
    stop = threading.Event()
    collector = LbrCollector(LbrConfig.named("type4", standin=True, period=1_000_000))
    rec = Recorder(out, CollectionSession(100, lbr=collector))
    t = threading.Thread(target=rec.run, args=(None, stop.is_set))
    t.start()
    assert rec.attached.wait(30)
    time.sleep(1.5)
    stop.set()
    t.join(30)
    loaded = recording.load(out)
    assert loaded.lbr is not None and len(loaded.lbr) > 100
    assert loaded.meta["lbr"] == {"pattern": "type4", "standin": True}
    samples, _resolve, resolve_pid, _code = samples_of_recording(str(out), None, None)
    assert len(samples) == len(loaded.lbr)
    # stand-in events count nanoseconds on both counters: "CPI" is about 1
    cpis = [s.cycles / s.instructions for s in samples if s.cycles and s.instructions]
    assert cpis and abs(sorted(cpis)[len(cpis) // 2] - 1.0) < 0.1
    blocks = vmprof("blocks", str(out), "--function", "main")
    assert blocks.returncode in (0, 1), blocks.stderr


def test_blocks_on_a_recording_without_lbr(tmp_path: Path) -> None:
    res = vmprof("record", "-o", str(tmp_path / "plain.vmprof"), "-d", "1", "-q")
    assert res.returncode == 0, res.stderr
    out = vmprof("blocks", str(tmp_path / "plain.vmprof"), "--function", "x")
    assert out.returncode == 1 and "has no branch records" in out.stderr
