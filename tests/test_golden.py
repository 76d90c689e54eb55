"""What users get from two stored recordings (three demo VMs; LBR records) is byte-identical to the
expected outputs in tests/data/golden/expected, made by tests/data/golden/make.py: a change of
structure must not change any report, steal table or export."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "golden"))
from make import COMMANDS, HERE, ROOT  # noqa: E402

CASES = [(name, out, args) for name, commands in COMMANDS.items() for out, args in commands]


@pytest.mark.parametrize(("name", "out", "args"), CASES, ids=[f"{n}/{o}" for n, o, _ in CASES])
def test_output_is_unchanged(name: str, out: str, args: list[str]) -> None:
    rec = (HERE / f"{name}.vmprof").relative_to(ROOT)
    argv = [str(rec) if a == "REC" else a for a in args]
    res = subprocess.run([sys.executable, "-m", "vmprof_tui", *argv], capture_output=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "COLUMNS": "120"})
    got = res.stdout + f"\n[exit {res.returncode}]\n".encode() + res.stderr
    expected = (HERE / "expected" / name / out).read_bytes()
    assert got == expected, f"vmprof {' '.join(argv)} differs from {HERE / 'expected' / name / out}"
