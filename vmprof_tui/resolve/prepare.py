"""The stage between a recording and its analysis: a recording's samples made ready to analyse.

record → **resolve** → analyse: ``prepare`` puts the samples and sched events in time order, cuts them to the
span asked for, keeps the samples asked for (`report -K/-U`), learns the VMs and their vCPU threads, loads the
guest bundles that name the guests, and resolves every sample once (resolver.py).  The result, ``Prepared``,
is what analyse/analysis.py's ``Analysis`` is made from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.record.bpf_records import SAMPLE_GUEST, SCHED_NOT_SWITCH
from vmprof_tui.record.recording import Recording
from vmprof_tui.record.stream import sort_sched
from vmprof_tui.resolve.memo import ResolveMemo
from vmprof_tui.resolve.resolver import Resolved, Resolver


def recording_span(rec: Recording) -> tuple[int, int]:
    """The span a recording covers on the host clock: from its first record to its end.

    The end is where sampling stopped, not the last record: an idle CPU that takes no sampling interrupts
    (the PVM machines) leaves nothing at the end, and a vCPU halted there is still halted.  The end chunk
    gives it two ways: `end_monotonic_ns`, which the recorder takes after reading kallsyms (so it can be
    late by that), and `duration_s`, counted from the start of sampling, which is about the first record
    (so it is not late); the earlier one is the end.  Without an end time (live windows) the last record ends it.
    """
    times = [a["time_ns"] for a in (rec.samples, rec.sched) if len(a)]
    if not times:
        return 0, 0
    w0, w1 = int(min(t.min() for t in times)), int(max(t.max() for t in times))
    return w0, recording_end(w0, w1, rec.end)


def recording_end(first_ns: int, last_ns: int, end: dict | None) -> int:
    """recording_window's end, of a recording whose records span [first_ns, last_ns] and with this end chunk."""
    end = end or {}
    if "end_monotonic_ns" in end and "duration_s" in end:
        return max(last_ns, min(int(end["end_monotonic_ns"]), first_ns + round(float(end["duration_s"]) * 1e9)))
    return last_ns


@dataclass
class Vms:
    """The VMs of a recording and their vCPU threads (from its VM list, and from the samples that interrupted
    a guest: a VM that started after the list was taken is named vm-PID)."""
    by_pid: dict[int, str]  # VMM pid -> VM name
    index: dict[str, int]  # VM name -> its number (1, 2, ...: the host profile's VM rows)
    vcpu_of_tid: dict[int, tuple[int, int]]  # vCPU thread id -> (VMM pid, vCPU id)


def learn_vms(rec: Recording, samples: np.ndarray, is_guest: np.ndarray) -> Vms:
    vms = Vms({}, {}, {})
    for i, vm in enumerate(sorted(rec.vms(), key=lambda v: (v["name"], v["pid"]))):
        vms.by_pid[int(vm["pid"])] = vm["name"]
        vms.index.setdefault(vm["name"], i + 1)
        for tid, vcpu in vm.get("vcpu_threads", {}).items():
            if vcpu is not None:
                vms.vcpu_of_tid[int(tid)] = (int(vm["pid"]), int(vcpu))
    # Only a thread in KVM_RUN runs guest code: VMM threads that load a vCPU for an ioctl are not vCPUs.
    if is_guest.any():
        s = samples
        # one int per (pid, tid, vcpu): pid and tid fit in 22 bits, vCPU ids in 16; made of every sample, the
        # guest ones picked after (picking each of the record's fields first cost more than the whole)
        packed = s["pid"].astype(np.int64) << 38
        packed |= s["tid"].astype(np.int64) << 16
        packed |= s["vcpu_id"]
        known = np.fromiter((pid << 38 | tid << 16 | vcpu for tid, (pid, vcpu) in vms.vcpu_of_tid.items()),
                            np.int64, len(vms.vcpu_of_tid))
        packed = packed[is_guest & ~arrays.member(packed, known)]  # the VM list names nearly all: one sort of the rest
        for p in np.unique(packed).tolist():
            pid, tid, vcpu = p >> 38, (p >> 16) & 0x3FFFFF, p & 0xFFFF
            vms.vcpu_of_tid[tid] = (pid, vcpu)
            if pid not in vms.by_pid:
                name = f"vm-{pid}"
                vms.by_pid[pid] = name
                vms.index.setdefault(name, len(vms.index) + 1)
    return vms


@dataclass
class Prepared:
    """A recording's records ready to analyse: in time order, cut to the span, resolved."""
    rec: Recording
    samples: np.ndarray  # in time order, those in the span and kept
    sched: np.ndarray  # the context switches, in time order
    wake_events: np.ndarray  # apart: the wake-ups of vCPU threads and the ends of their halts and throttling
    span: tuple[int, int]  # the recording's span on the host clock (recording_span)
    range_ns: tuple[int, int] | None  # the span analysed, when it is not the whole recording
    is_guest: np.ndarray  # the samples that interrupted a guest
    vms: Vms
    resolver: Resolver
    names: Resolved  # the names of each sample
    notes: list[str]  # what the recording and the resolution could not do, for the outputs


def prepare(rec: Recording, guest_bundles: dict[str, Path] | None = None, resolver: Resolver | None = None,
            time_range: tuple[float, float] | None = None, resolved: Resolved | None = None,
            keep: Callable[[np.ndarray], np.ndarray] | None = None,
            span_ns: tuple[int, int] | None = None, sched_in_order: bool = False,
            memo: ResolveMemo | None = None) -> Prepared:
    """resolver: symbol sources kept across analyses (the live screen's windows share one);
    time_range: (from, to) in seconds after the first record; only that span is kept.
    resolved: names of rec.samples already resolved (the live screen resolves each new chunk once).
    keep: a mask of the samples to analyse (`report -K/-U`); the timelines and durations are unchanged.
    span_ns: [lo, hi) on the host clock that timelines, blanks and idle are cut to, with the samples as given
    (a chunk of the live screen, whose sched events begin with what came before it: SwitchContext).
    sched_in_order: rec.sched is in the order given here already (by time, ties by the other fields).
    memo: the keys resolved in the recording's pieces before (memo.py)."""
    t = rec.samples["time_ns"]
    if np.all(t[1:] >= t[:-1]):  # the live screen's window usually is
        samples, given = rec.samples, resolved
    else:
        order = arrays.stable_argsort(t)
        samples = rec.samples[order]
        given = resolved.take(order) if resolved is not None else None
    ts = rec.sched["time_ns"]
    # strictly increasing: a full-record sort would not move anything (the window usually is)
    in_order = sched_in_order or np.all(ts[1:] > ts[:-1])
    sched = rec.sched if in_order else sort_sched(rec.sched)
    not_switch = (sched["flags"] & SCHED_NOT_SWITCH) != 0
    switches, wake_events = (sched[~not_switch], sched[not_switch]) if not_switch.any() else (sched, sched[:0])
    span = recording_span(rec)
    range_ns = span_ns
    if time_range is not None:
        w0, w1 = span
        lo, hi = (w0 + round(x * 1e9) for x in time_range)
        range_ns = (lo, hi)
        t = samples["time_ns"]
        # half-open, as the blanks: adjacent ranges share no sample; a range to the end keeps the last record
        inside = (t >= lo) & ((t < hi) | (hi >= w1))
        samples = samples[inside]
        given = given.take(inside) if given is not None else None
    if keep is not None:
        kept = keep(samples)
        samples = samples[kept]
        given = given.take(kept) if given is not None else None
    notes: list[str] = list(rec.problems)
    is_guest = (samples["flags"] & SAMPLE_GUEST) != 0
    vms = learn_vms(rec, samples, is_guest)
    resolver = resolver or Resolver()
    resolver.objects.add_tables(rec.object_tables)
    notes += resolver.load_guests(vms.by_pid.values(), guest_bundles or {}, rec.bundles)
    if given is None:
        given = resolver.resolve(samples, rec.processes(), vms.by_pid, rec.kallsyms(), notes, memo)
    return Prepared(rec, samples, switches, wake_events, span, range_ns, is_guest, vms, resolver, given, notes)
