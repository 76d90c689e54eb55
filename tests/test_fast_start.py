"""`vmprof report` of a small recording imports what it uses only: not the live screen's, the fleet's or the
disassembler's libraries (docs/scale.md: the start of a command is most of a small report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synth import busy_recording

HEAVY = ("textual", "dask", "distributed", "pyarrow", "duckdb", "scipy", "capstone", "cxxfilt", "prometheus_client",
         "google.protobuf", "bcc")
PROBE = """
import json, sys
from vmprof_tui.analyse import stream
from vmprof_tui.cli import main
stream.PIECE_ROWS = int(sys.argv[1])
code = main(sys.argv[2:])
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if m.split(".")[0] in %r
                                                  or m == "google.protobuf")}), file=sys.stderr)
"""


def modules_of(argv: list[str], piece_rows: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE % (HEAVY,), str(piece_rows), *argv], capture_output=True,
                         text=True, timeout=120)
    return json.loads(out.stderr.strip().splitlines()[-1])


def test_report_of_a_small_recording_imports_no_heavy_library(tmp_path: Path) -> None:
    rec = busy_recording(tmp_path / "small.vmprof", 1.0)
    for argv in (["report", str(rec)], ["report", str(rec), "--vm", "web", "--format", "json"]):
        for piece_rows in (1 << 20, 500):  # loaded whole, and read a piece at a time (analyse/stream.py)
            got = modules_of(argv, piece_rows)
            assert got == {"code": 0, "modules": []}, (argv, piece_rows)


def test_version_imports_no_command() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, json; from vmprof_tui.cli import main, COMMANDS; "
                          "main(['--version']); print(json.dumps(sorted(set(sys.modules) & ({'numpy'} | "
                          "{f'vmprof_tui.cli.{c}' for c in COMMANDS}))))"], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("vmprof ")
    assert json.loads(out.stdout.splitlines()[-1]) == []
