"""Make the stored recordings and the outputs expected of them (tests/test_golden.py).

Run once as root on a KVM host, from the repository root:
    .venv/bin/python tests/data/golden/make.py            # recordings + expected outputs
    .venv/bin/python tests/data/golden/make.py --outputs  # expected outputs only (same recordings)
The expected outputs are what the code produced when they were made: the golden test proves that a
change of structure changes no byte of what users get.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests"))

# (output file, vmprof arguments); REC is replaced by the recording's path
COMMANDS = {
    "steal3": [
        ("report-host.txt", ["report", "REC"]),
        ("report-host.json", ["report", "REC", "--format", "json"]),
        ("report-host.csv", ["report", "REC", "--format", "csv"]),
        ("report-host.folded", ["report", "REC", "--format", "collapsed"]),
        ("report-host.pb.gz", ["report", "REC", "--format", "pprof"]),
        ("report-host-cpu1.txt", ["report", "REC", "--cpu", "1"]),
        ("report-guest.txt", ["report", "REC", "--level", "guest"]),
        ("report-guest.csv", ["report", "REC", "--level", "guest", "--format", "csv"]),
        ("report-guest.folded", ["report", "REC", "--level", "guest", "--format", "collapsed"]),
        ("report-host.speedscope.json", ["report", "REC", "--format", "speedscope"]),
        ("report-host.svg", ["report", "REC", "--format", "svg"]),
        ("report-vm1.json", ["report", "REC", "--vm", "steal1", "--format", "json"]),
        ("report-vm1.folded", ["report", "REC", "--vm", "steal1", "--format", "collapsed"]),
        ("report-vm1.pb.gz", ["report", "REC", "--vm", "steal1", "--format", "pprof"]),
        ("report-vm1.chrome.json", ["report", "REC", "--vm", "steal1", "--format", "chrome"]),
        ("report-host.chrome.json", ["report", "REC", "--format", "chrome"]),
        ("report-vm2-range.txt", ["report", "REC", "--vm", "steal2", "--time-range", "0.5:1.5"]),
        ("steal.txt", ["steal", "REC"]),
        ("steal.json", ["steal", "REC", "--format", "json"]),
    ],
    "lbr": [
        ("report-host.txt", ["report", "REC"]),
        ("report-host.folded", ["report", "REC", "--format", "collapsed"]),
        ("blocks.txt", ["blocks", "REC", "--function", "main"]),
    ],
}


def record() -> None:
    from conftest import record_scenario

    from vmprof_tui.collect.session import CollectionSession
    from vmprof_tui.lbr.collector import LbrCollector, LbrConfig
    from vmprof_tui.record.recorder import Recorder

    rec = record_scenario(HERE, "steal3", 2.0)
    Path(rec.rec.path).rename(HERE / "steal3.vmprof")
    stop = threading.Event()
    r = Recorder(HERE / "lbr.vmprof", CollectionSession(100, lbr=LbrCollector(LbrConfig.named(
        "type4", standin=True, period=1_000_000))))
    t = threading.Thread(target=r.run, args=(0.6, stop.is_set))
    t.start()
    t.join(60)
    for name in COMMANDS:
        keep_system_objects(HERE / f"{name}.vmprof")


def keep_system_objects(path: Path) -> None:
    """Keep only maps lines of files under /usr and /lib in the process snapshots: host user code in
    files elsewhere (the venv, a clone's build tree) is not on another machine, so it stays unresolved
    in the expected outputs instead of depending on where the tests run."""
    import json
    import zlib

    from vmprof_tui.record import recording as r

    data = path.read_bytes()
    out = bytearray(data[:len(r.MAGIC) + 2])
    pos = len(out)
    while pos < len(data):
        magic, kind, res, length, _crc = r.CHUNK_HEADER.unpack_from(data, pos)
        payload = data[pos + r.CHUNK_HEADER.size:pos + r.CHUNK_HEADER.size + length]
        pos += r.CHUNK_HEADER.size + length
        if kind == r.SNAPSHOT:
            snap = json.loads(zlib.decompress(payload))
            for key, proc in snap.items():
                if r.is_process_key(key):
                    proc["maps"] = "\n".join(line for line in proc["maps"].splitlines()
                                             if re.search(r" /(usr|lib)/", line))
                    proc["build_ids"] = {k: v for k, v in proc["build_ids"].items() if re.match("/(usr|lib)/", k)}
                    proc["cmdline"] = proc["cmdline"][:1]
            payload = zlib.compress(json.dumps(snap).encode(), 6)
        out += r.CHUNK_HEADER.pack(magic, kind, res, len(payload), zlib.crc32(payload)) + payload
    path.write_bytes(bytes(out))


def outputs() -> None:
    for name, commands in COMMANDS.items():
        rec = HERE / f"{name}.vmprof"
        for out, args in commands:
            args = [str(rec.relative_to(ROOT)) if a == "REC" else a for a in args]
            res = subprocess.run([sys.executable, "-m", "vmprof_tui", *args], capture_output=True, cwd=ROOT,
                                 env={**os.environ, "COLUMNS": "120"})
            (HERE / "expected" / name).mkdir(parents=True, exist_ok=True)
            (HERE / "expected" / name / out).write_bytes(res.stdout + f"\n[exit {res.returncode}]\n".encode()
                                                         + res.stderr)


if __name__ == "__main__":
    if "--outputs" not in sys.argv:
        record()
    outputs()
