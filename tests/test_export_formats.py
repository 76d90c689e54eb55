"""pprof and Chrome trace output of `vmprof report`.

The pprof bytes are decoded with the independent `protobuf` package, from message
classes built at run time out of a descriptor with profile.proto's field numbers.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import Recorded, record_scenario, vmprof
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from vmprof_tui.analyse import segments
from vmprof_tui.analyse.analysis import Analysis, analyse
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import Profile, Row
from vmprof_tui.show.formats import ReportInput, chrome, pprof

VM = "twoprocs"

# -- an independent decoder: profile.proto as a runtime descriptor ----------------------

F = descriptor_pb2.FieldDescriptorProto
INT64, UINT64, STRING, BOOL, MESSAGE = F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_MESSAGE
ONE, MANY = F.LABEL_OPTIONAL, F.LABEL_REPEATED
PACKAGE = "vmprof.test.perftools.profiles"

PROFILE_PROTO = {  # message -> (field name, number, type, label, message type)
    "Profile": [("sample_type", 1, MESSAGE, MANY, "ValueType"), ("sample", 2, MESSAGE, MANY, "Sample"),
                ("mapping", 3, MESSAGE, MANY, "Mapping"), ("location", 4, MESSAGE, MANY, "Location"),
                ("function", 5, MESSAGE, MANY, "Function"), ("string_table", 6, STRING, MANY, None),
                ("drop_frames", 7, INT64, ONE, None), ("keep_frames", 8, INT64, ONE, None),
                ("time_nanos", 9, INT64, ONE, None), ("duration_nanos", 10, INT64, ONE, None),
                ("period_type", 11, MESSAGE, ONE, "ValueType"), ("period", 12, INT64, ONE, None),
                ("comment", 13, INT64, MANY, None), ("default_sample_type", 14, INT64, ONE, None)],
    "ValueType": [("type", 1, INT64, ONE, None), ("unit", 2, INT64, ONE, None)],
    "Sample": [("location_id", 1, UINT64, MANY, None), ("value", 2, INT64, MANY, None),
               ("label", 3, MESSAGE, MANY, "Label")],
    "Label": [("key", 1, INT64, ONE, None), ("str", 2, INT64, ONE, None), ("num", 3, INT64, ONE, None),
              ("num_unit", 4, INT64, ONE, None)],
    "Mapping": [("id", 1, UINT64, ONE, None), ("memory_start", 2, UINT64, ONE, None),
                ("memory_limit", 3, UINT64, ONE, None), ("file_offset", 4, UINT64, ONE, None),
                ("filename", 5, INT64, ONE, None), ("build_id", 6, INT64, ONE, None),
                ("has_functions", 7, BOOL, ONE, None), ("has_filenames", 8, BOOL, ONE, None),
                ("has_line_numbers", 9, BOOL, ONE, None), ("has_inline_frames", 10, BOOL, ONE, None)],
    "Location": [("id", 1, UINT64, ONE, None), ("mapping_id", 2, UINT64, ONE, None), ("address", 3, UINT64, ONE, None),
                 ("line", 4, MESSAGE, MANY, "Line"), ("is_folded", 5, BOOL, ONE, None)],
    "Line": [("function_id", 1, UINT64, ONE, None), ("line", 2, INT64, ONE, None)],
    "Function": [("id", 1, UINT64, ONE, None), ("name", 2, INT64, ONE, None), ("system_name", 3, INT64, ONE, None),
                 ("filename", 4, INT64, ONE, None), ("start_line", 5, INT64, ONE, None)],
}


def _profile_class() -> type:
    fdp = descriptor_pb2.FileDescriptorProto(name="vmprof_test_profile.proto", package=PACKAGE, syntax="proto3")
    for name, fields in PROFILE_PROTO.items():
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, mtype in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if mtype:
                f.type_name = f".{PACKAGE}.{mtype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.Profile"))


ProfileMessage = _profile_class()


class Decoded:
    """A decoded pprof profile with its stacks as frame names, leaf first."""

    def __init__(self, data: bytes) -> None:
        assert data[:2] == b"\x1f\x8b", "pprof output must be gzipped"
        self.p = p = ProfileMessage()
        p.ParseFromString(gzip.decompress(data))
        self.s = list(p.string_table)
        funcs = {f.id: f for f in p.function}
        locs = {loc.id: loc for loc in p.location}
        self.stacks: list[list[str]] = []
        self.files: list[str] = []
        self.values: list[tuple[int, int]] = []
        self.labels: list[dict[str, str | int]] = []
        for sample in p.sample:
            frames = [funcs[locs[i].line[0].function_id] for i in sample.location_id]
            self.stacks.append([self.s[f.name] for f in frames])
            self.files.append(self.s[frames[0].filename])
            self.values.append(tuple(sample.value))
            self.labels.append({self.s[lb.key]: self.s[lb.str] if lb.str else lb.num for lb in sample.label})

    def total(self, i: int = 0) -> int:
        return sum(v[i] for v in self.values)


def check_wellformed(d: Decoded) -> None:
    p, s = d.p, d.s
    assert s[0] == "" and len(set(s)) == len(s), "string table: index 0 empty, no duplicates"
    assert [(s[t.type], s[t.unit]) for t in p.sample_type] == [("samples", "count"), ("cpu", "nanoseconds")]
    assert (s[p.period_type.type], s[p.period_type.unit]) == ("cpu", "nanoseconds")
    ids = [f.id for f in p.function]
    assert all(ids) and len(set(ids)) == len(ids)
    ids = [loc.id for loc in p.location]
    assert all(ids) and len(set(ids)) == len(ids)
    assert all(len(v) == 2 and v[0] >= 0 and v[1] >= 0 for v in d.values)


# -- the encoders on hand-made profiles (no KVM needed) -------------------------------

def test_varint_wire_format() -> None:
    assert pprof.varint(0) == b"\x00" and pprof.varint(1) == b"\x01" and pprof.varint(300) == b"\xac\x02"
    assert pprof.varint(-1) == b"\xff" * 9 + b"\x01"
    assert pprof.field_varint(2, 0) == b"" and pprof.field_varint(2, 150) == b"\x10\x96\x01"
    assert pprof.field_packed(1, [3, 270]) == b"\x0a\x03\x03\x8e\x02"
    t = pprof.StringTable()
    assert (t(""), t("a"), t("b"), t("a")) == (0, 1, 2, 1) and t.strings == ["", "a", "b"]


def test_pprof_hand_made_profile() -> None:
    rows = [Row(500, "compute_a", "compute", "compute(1)", 1, "vm1"),
            Row(120, "compute_b", "compute", "compute(1)", 1, "vm1"),
            Row(33.4, "[steal]", "(outside)", None, None, "vm1", RowKind.STEAL_OUTSIDE),
            Row(33.4, "[steal]", "(vmm)", None, None, "vm1", RowKind.STEAL_VMM),
            Row(0.2, "[idle]", "(halt_exit)", None, None, "vm1", RowKind.IDLE),
            Row(0, "never", "none", None, None, "vm1")]
    profile = Profile("guest", "vm1", None, sum(r.samples for r in rows), 0.75, 3,
                      {"os": 0.0, "user": 90.0, "idle": 0.0, "steal": 10.0}, rows, notes=["a note"])
    d = Decoded(pprof.render_profile(profile, 1e6, time_nanos=1_700_000_000 * 10**9))
    check_wellformed(d)
    assert d.total(0) == round(profile.total_samples) == 687  # cumulative rounding keeps the total
    assert d.total(1) == pytest.approx(687 * 1e6, abs=1e6)
    assert d.p.period == 1_000_000 and d.p.duration_nanos == 750_000_000 and d.p.time_nanos == 1_700_000_000 * 10**9
    assert d.stacks[0] == ["compute_a", "vm1/compute(1) [1]", "[vm1]"] and d.files[0] == "compute"
    assert d.values[0] == (500, 500_000_000)
    assert d.labels[0] == {"module": "compute", "vm": "vm1", "process": "compute(1)", "pid": 1}
    assert {tuple(d.stacks[2]), tuple(d.stacks[3])} == {("[steal] (outside)", "[vm1]"), ("[steal] (vmm)", "[vm1]")}
    assert len(d.stacks) == 4, "rows without samples (and the 0.2-sample idle row) are left out"
    assert all(cpu == n * 1_000_000 for n, cpu in d.values), "cpu is the count times the period"
    comments = [d.s[c] for c in d.p.comment]
    assert any("guest vm1" in c for c in comments) and "note: a note" in comments


def test_pprof_host_rows_without_process() -> None:
    rows = [Row(10, "schedule", "[kernel.kallsyms]", "kworker", 7),
            Row(5, "[idle]", "(cpu idle)", kind=RowKind.CPU_IDLE),
            Row(20, "[vm1]", "(VM1)", None, 4242, "vm1", RowKind.VM)]
    profile = Profile("host", None, None, 35, 1.0, 0, {}, rows)
    d = Decoded(pprof.render_profile(profile, 1e6))
    check_wellformed(d)
    assert sorted(d.stacks) == [["[idle] (cpu idle)"], ["[vm1]"], ["schedule", "kworker [7]"]]


def test_sample_runs_tile_on_cpu_segments() -> None:
    p = 1_000_000
    times = np.array([1, 2, 3, 4, 5, 9, 10, 11], np.int64) * p
    codes = np.array([7, 7, 8, 8, 8, 8, 8, -1])
    seg = np.array([0, 0, 0, 0, 0, 1, 1, 1])  # a blank from 5.6 ms to 8.5 ms
    lo, hi = np.array([200_000, 8_500_000]), np.array([5_600_000, 12 * p])
    first, count, start, end = segments.sample_runs(times, codes, seg, lo, hi)
    assert first.tolist() == [0, 2, 5, 7] and count.tolist() == [2, 3, 2, 1]
    assert start.tolist() == [200_000, 2_500_000, 8_500_000, 10_500_000]
    assert end.tolist() == [2_500_000, 5_600_000, 10_500_000, 12_000_000]
    assert segments.sample_runs(np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64), lo, hi)[0].size == 0


# -- a real recording ------------------------------------------------------------------

@pytest.fixture(scope="module")
def twoprocs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recorded, Analysis]:
    r = record_scenario(tmp_path_factory.mktemp("fmt"), "two-procs", 2.0)
    return r, analyse(r.rec)




def test_pprof_guest_level(twoprocs: tuple[Recorded, Analysis]) -> None:
    _, an = twoprocs
    g = an.guest_profile(VM)
    d = Decoded(pprof.render(ReportInput(an, [g], vm=VM)))
    check_wellformed(d)
    assert d.total(0) == round(g.total_samples)
    assert abs(d.total(1) - g.total_samples * an.period_ns) <= len(d.values) * an.period_ns
    assert d.p.period == round(an.period_ns) and d.p.duration_nanos == round(an.rec.duration_s * 1e9)
    assert d.p.time_nanos > 1_600_000_000 * 10**9  # wall clock of the recording's start
    leaves = {st[0] for st in d.stacks}
    assert {"compute_a", "compute_b"} <= leaves
    for st in d.stacks:  # leaf first: function, process, VM
        assert st[-1] == f"[{VM}]"
        if st[0] in ("compute_a", "compute_b"):
            assert st[1] in (f"{VM}/compute(1) [1]", f"{VM}/compute(2) [2]") and len(st) == 3
    # the profile's virtual rows (steal by cause, idle: whatever this run had; a quiet pCPU may give no steal),
    # each a leaf of its own; a row under 1.5 samples may round to none (cumulative rounding)
    virtual = {f"{r.function} {r.module}" for r in g.rows if r.kind != RowKind.FUNCTION and r.samples >= 1.5}
    assert virtual <= leaves


def test_pprof_host_level_splits_vms(twoprocs: tuple[Recorded, Analysis]) -> None:
    _, an = twoprocs
    h = an.host_profile()
    d = Decoded(pprof.render(ReportInput(an, [h])))
    check_wellformed(d)
    assert d.total(0) == round(h.total_samples)
    vm_row = next(r for r in h.rows if r.function == f"[{VM}]")
    under_vm = sum(v[0] for st, v in zip(d.stacks, d.values, strict=True) if st[-1] == f"[{VM}]")
    assert under_vm == vm_row.samples
    assert any(st[0] == "compute_a" and st[-1] == f"[{VM}]" for st in d.stacks)


def test_chrome_trace(twoprocs: tuple[Recorded, Analysis]) -> None:
    recorded, an = twoprocs
    doc = json.loads(chrome.render(ReportInput(an, [an.guest_profile(VM)])))
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    slices = [e for e in events if e["ph"] == "X"]
    vm_pid = next(e["pid"] for e in meta if e["name"] == "process_name" and e["args"]["name"] == VM)
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name" and e["pid"] == vm_pid}
    assert "vcpu0" in threads.values()
    assert any(e["args"]["name"] == "host" for e in meta if e["name"] == "process_name")
    assert all(isinstance(e["ts"], int) and e["ts"] >= 0 and e["dur"] > 0 for e in slices)
    assert [e["ts"] for e in slices] == sorted(e["ts"] for e in slices)
    guest = [e for e in slices if e["cat"] == "guest" and e["pid"] == vm_pid]
    assert any(e["args"]["function"] == "compute_a" and "compute_a" in e["name"] for e in guest)
    assert {e["args"]["process"] for e in guest} >= {"compute(1)", "compute(2)"}
    vm_guest_samples = int(np.count_nonzero(an.is_guest & (an.vm_name_of_code[an.vm_code] == VM)))
    assert len(guest) < vm_guest_samples, "consecutive samples are merged"
    # speedscope keys a frame by name and args: one args per name on a track, or it cannot add slices up
    args_of: dict[tuple[int, str], set[str]] = defaultdict(set)
    for e in slices:
        if e["pid"] == vm_pid and e["cat"] in ("guest", "steal", "idle") and e["name"] != "[steal] vmm blocked":
            args_of[(e["tid"], e["name"])].add(json.dumps(e["args"], sort_keys=True))
    assert args_of and all(len(v) == 1 for v in args_of.values())
    steal = [e for e in slices if e["cat"] == "steal" and e["pid"] == vm_pid]
    assert steal and all("holder" in e["args"] and "held_by_ns" not in e["args"] for e in steal)
    assert all(isinstance(e["args"]["exit_reason"], str) for e in steal if "exit_reason" in e["args"])
    by_track: dict[int, list[dict]] = defaultdict(list)
    for e in slices:
        if e["pid"] == vm_pid:
            assert e["cat"] in ("guest", "vmm", "unsampled", "steal", "idle")
            by_track[e["tid"]].append(e)
    # the slices cover the vCPU's life in the recording: from the first time its thread is
    # seen (a sample or a switch) to the end of its timeline
    truth = {v["tid"]: v["wall_ns"] for v in recorded.truth[VM]["vcpus"]}
    assert set(by_track) == set(truth) == set(threads)
    s, ev = an.samples["time_ns"], an.sched
    for tl in an.vm_timelines(VM):
        track = by_track[tl.tid]
        for a, b in zip(track, track[1:], strict=False):  # no overlaps on a track
            assert b["ts"] >= a["ts"] + a["dur"], (a, b)
        seen = np.concatenate([s[an.samples["tid"] == tl.tid],
                               ev["time_ns"][(ev["prev_tid"] == tl.tid) | (ev["next_tid"] == tl.tid)]])
        wall = tl.end_ns - int(seen.min())
        covered = sum(e["dur"] for e in track) * 1000
        unsampled = sum(e["dur"] for e in track if e["cat"] == "unsampled") * 1000
        print(f"{threads[tl.tid]}: slices cover {covered / 1e9:.3f} s of {wall / 1e9:.3f} s, unsampled "
              f"{unsampled / 1e9:.3f} s (timeline {tl.wall_ns / 1e9:.3f} s, VMM's measure {truth[tl.tid] / 1e9:.3f} s)")
        assert abs(covered - wall) <= 0.05 * wall
        assert unsampled < sum(e["dur"] for e in track if e["cat"] == "guest") * 1000


def test_report_cli_pprof_and_chrome(twoprocs: tuple[Recorded, Analysis], tmp_path: Path) -> None:
    recorded, _ = twoprocs
    out = tmp_path / "out.pb.gz"
    res = vmprof("report", str(recorded.rec.path), "--vm", VM, "--format", "pprof", "-o", str(out))
    assert res.returncode == 0, res.stderr
    d = Decoded(out.read_bytes())
    assert "compute_a" in {st[0] for st in d.stacks}
    res = vmprof("report", str(recorded.rec.path), "--vm", VM, "--format", "chrome")
    assert res.returncode == 0, res.stderr
    names = {e["args"]["name"] for e in json.loads(res.stdout)["traceEvents"] if e["name"] == "process_name"}
    assert VM in names
