"""bpf/lbr_record.h and vmprof_tui/lbr/record.py are one definition (issue 7): every size
and offset of every variant agrees, and raw records turn into samples with counter deltas."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from vmprof_tui.lbr.model import BranchFilter, Fields
from vmprof_tui.lbr.records import HEADER_DTYPE, record_dtype, to_samples

VARIANTS = [(16, Fields.FROM | Fields.TO), (16, Fields.FROM), (16, Fields.TO),
            (32, Fields.FROM | Fields.TO | Fields.INFO), (8, Fields.TO | Fields.INFO)]


def c_layout(tmp: Path, nr: int, fields: Fields) -> dict[str, tuple[int, int]]:
    exe = tmp / f"lbr_offsets_{nr}_{int(fields)}"
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{ROOT / 'bpf'}", f"-DLBR_NR={nr}", f"-DLBR_FIELDS={int(fields)}",
                    "-o", str(exe), str(ROOT / "tests/native/lbr_offsets.c")], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {name: (int(off), int(size)) for name, off, size in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize(("nr", "fields"), VARIANTS)
def test_c_struct_matches_dtype(tmp_path: Path, nr: int, fields: Fields) -> None:
    c = c_layout(tmp_path, nr, fields)
    dt = record_dtype(nr, fields)
    assert c["record"][1] == dt.itemsize
    assert c["header"][1] == HEADER_DTYPE.itemsize
    assert c["raw_entry"][1] == 24  # struct perf_branch_entry
    for name in HEADER_DTYPE.names or ():
        sub, off = HEADER_DTYPE.fields[name][:2]  # type: ignore[index]
        assert c[f"hdr.{name}"] == (off, sub.itemsize), name
    for name in dt.names or ():
        sub, off = dt.fields[name][:2]  # type: ignore[index]
        assert c[name] == (off, sub.itemsize), name
    expected = {"hdr"} | {n for f, n in ((Fields.FROM, "from"), (Fields.TO, "to"), (Fields.INFO, "info"))
                          if fields & f}
    assert set(dt.names or ()) == expected
    assert {k for k in c if "." not in k} - {"record", "header", "raw_entry"} == expected


def make_records(nr: int = 4) -> np.ndarray:
    fields = Fields.FROM | Fields.TO | Fields.INFO
    r = np.zeros(4, dtype=record_dtype(nr, fields))
    h = r["hdr"]
    # two CPUs, interleaved in time, given out of order
    h["time_ns"] = [300, 100, 200, 400]
    h["cpu"] = [0, 0, 1, 1]
    h["cycles"] = [5000, 1000, 700, 1700]
    h["instructions"] = [6000, 2000, 1400, 2400]
    h["instructions_err"] = [0, 0, 0, -2]
    h["nr"] = [3, 2, 0, 1]
    h["fields"] = int(fields)
    h["filter"] = int(BranchFilter.CALL | BranchFilter.RETURN)
    h["pid"] = 42
    h["ip"] = 0x401000
    r["from"][0, :3] = [0x30, 0x20, 0x10]  # newest first, as the kernel hands them over
    r["to"][0, :3] = [0x31, 0x21, 0x11]
    r["info"][0, :3] = [(7 << 4) | 2, (5 << 4) | 1, 0]  # cycles 7, 5, none
    return r


def test_records_to_samples() -> None:
    s = to_samples(make_records())
    assert [x.time_ns for x in s] == [100, 200, 300, 400]
    by_time = {x.time_ns: x for x in s}
    a = by_time[300]  # cpu 0, after the sample at t=100 (cycles 1000, instructions 2000)
    assert (a.cycles, a.instructions) == (4000, 4000)
    assert a.cpi == 1.0
    assert list(a.from_) == [0x10, 0x20, 0x30]  # oldest first inside vmprof
    assert list(a.to) == [0x11, 0x21, 0x31]
    assert list(a.lbr_cycles) == [0, 5, 7]
    assert by_time[100].cycles == 1000 and by_time[100].instructions == 2000  # first on its CPU: since enable
    assert by_time[200].nr == 0
    assert by_time[400].cycles == 1000 and by_time[400].instructions is None  # read error -> unknown
    assert by_time[400].cpi is None
    assert a.branch_filter == BranchFilter.CALL | BranchFilter.RETURN and a.pid == 42
