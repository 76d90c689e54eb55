"""Row kinds, the steal split and the vCPU segments on a stored recording (three 1-vCPU VMs sharing a pCPU);
no KVM needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vmprof_tui.analyse.analysis import Analysis, analyse
from vmprof_tui.analyse.blanks import steal_of_type
from vmprof_tui.analyse.kinds import BlankKind, RowKind
from vmprof_tui.analyse.segments import SegmentKind, vcpu_segments
from vmprof_tui.analyse.steal import vcpu_steal
from vmprof_tui.record import recording

STEAL3 = Path(__file__).resolve().parent / "data" / "golden" / "steal3.vmprof"


@pytest.fixture(scope="module")
def an() -> Analysis:
    return analyse(recording.load(STEAL3))  # a stored recording (tests/data/golden/make.py made it)


def test_labels_are_made_from_kinds(an: Analysis) -> None:
    host = an.host_profile()
    kinds = {r.kind for r in host.rows}
    assert RowKind.VM in kinds and kinds <= {RowKind.FUNCTION, RowKind.UNKNOWN, RowKind.VM, RowKind.CPU_IDLE}
    for r in host.rows:
        if r.kind is RowKind.VM:
            assert (r.function, r.module) == r.kind.label(vm=r.vm, vm_index=an.vm_index[r.vm])
        elif r.kind is RowKind.CPU_IDLE:
            assert (r.function, r.module) == ("[idle]", "(cpu idle)")
    for vm in an.vm_names():
        g = an.guest_profile(vm)
        assert any(r.kind is RowKind.STEAL_OUTSIDE for r in g.rows)
        for r in g.rows:
            if r.kind is RowKind.FUNCTION:
                assert not r.function.startswith("[")
            elif r.kind is RowKind.UNKNOWN:
                assert r.function == "[unknown]"
            elif r.kind is not RowKind.STEAL_SIBLING:
                assert (r.function, r.module) == r.kind.label()
        steal = sum(r.samples for r in g.rows if r.kind.is_steal)
        assert 100 * steal / g.total_samples == pytest.approx(g.ratios["steal"])


def test_steal_split_is_what_the_profile_and_the_steal_table_show(an: Analysis) -> None:
    for vm in an.vm_names():
        for v in vcpu_steal(an, vm):
            tl = an.vm_timelines(vm, v["vcpu"])[0]
            split = an.blank_split(tl, in_ns=True)
            assert v["steal_type1_s"] == pytest.approx(steal_of_type(split, 1) / 1e9)
            assert v["idle_s"] == pytest.approx(sum(b.duration_ns for b in tl.blanks if b.kind == BlankKind.IDLE)
                                                / 1e9)
            g = an.guest_profile(vm, v["vcpu"])
            type1 = sum(r.samples for r in g.rows if r.kind.steal_type == 1)
            assert type1 == pytest.approx(steal_of_type(split, 1) / an.vcpus.sample_ns(tl))


def test_segments_tile_each_vcpu(an: Analysis) -> None:
    for tl in an.timelines.values():
        segs = sorted(vcpu_segments(an, tl), key=lambda s: s.start_ns)
        assert segs[0].start_ns == tl.start_ns and segs[-1].end_ns == tl.end_ns
        assert all(a.end_ns == b.start_ns for a, b in zip(segs, segs[1:], strict=False)), "no hole, no overlap"
        runs = [s for s in segs if s.kind in (SegmentKind.GUEST, SegmentKind.VMM)]
        assert all((s.kind is SegmentKind.GUEST) == bool(an.is_guest[s.sample]) for s in runs)
        on_cpu = sum(s.end_ns - s.start_ns for s in segs if s.kind is not SegmentKind.BLANK)
        assert on_cpu == tl.on_cpu_ns
        blanks = [s for s in segs if s.kind is SegmentKind.BLANK]
        assert [s.blank for s in blanks] == sorted(tl.blanks, key=lambda b: b.start_ns)
        preempted = [s for s in blanks if s.blank.kind == BlankKind.PREEMPTED]
        assert all(s.holder in s.blank.holders() or s.holder == s.blank.first_holder for s in preempted)
        assert int(np.count_nonzero(an.vcpus.thread_mask(tl))) >= sum(s.samples for s in runs)
