"""Chrome Trace Event Format (JSON): the timeline of every vCPU, for Perfetto UI and chrome://tracing.

Tracks:

* one process per VM (``pid`` = the VM's index, ``process_name`` = its name) with one
  thread per vCPU (``thread_name`` "vcpuN", ordered by vCPU id).  The ``tid`` is the
  host thread id of the vCPU thread: unlike the vCPU id it is unique across VMs,
  which Perfetto needs (it names threads by ``tid`` alone and treats ``tid`` 0 as
  the idle task);
* one "host" process (``pid`` = 2^22, above any Linux pid, since Perfetto treats
  pid 0 as the kernel's swapper) with one thread per pCPU showing when it was idle,
  which vCPU ran on it, and when other host tasks ran.

Complete events (``"ph": "X"``, ``ts``/``dur`` in whole microseconds from the
recording's first timestamp) on a vCPU track:

* ``guest``: the guest process/function running, consecutive samples of the same
  process and function merged into one slice;
* ``vmm``: ``[vmm]``, samples of the vCPU thread outside guest mode (the VMM or
  KVM working for the vCPU: steal of type 2);
* ``unsampled``: ``[unsampled]``, an interval on a CPU that no sample landed in
  (shorter than the sampling period, or its samples were lost);
* ``steal``: ``[steal] HOLDER`` while the vCPU was runnable but another task held
  its pCPU, ``[steal] vmm blocked`` while the VMM thread blocked on its behalf;
* ``steal``: ``[steal] wakeup`` from the wake-up of a halted vCPU until it ran (the first part
  of that blank is ``[idle] halt``), ``[steal] throttled`` while its cgroup's cpu.max quota was
  used up;
* ``idle``: ``[idle] halt`` while the guest had halted the vCPU.

The slices of a vCPU track are its segments (analyse.segments.vcpu_segments, the
same the live screen's timeline draws): guest + vmm + unsampled + steal + idle
cover the vCPU's life with no hole.  Slices never overlap on a track (the trace
viewers need strictly nested slices).  A slice's ``args`` are the same for every slice of its name on its
track (no per-slice counts or durations): speedscope keys a frame by name and args, and so adds up all the
``compute_a`` or ``[steal] steal2`` slices of a vCPU.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.exits import exit_category, exit_name
from vmprof_tui.analyse.kinds import BlankKind
from vmprof_tui.analyse.segments import Segment, SegmentKind, vcpu_segments
from vmprof_tui.analyse.shares import Profile, Row
from vmprof_tui.analyse.stream_trace import StreamedTrace, Track
from vmprof_tui.analyse.timeline import VcpuTimeline, task_name
from vmprof_tui.record.bpf_records import cpu_order, next_on_cpu
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.formats import ReportInput

HOST_PID = 1 << 22  # PID_MAX_LIMIT: no Linux process has this id
CAT_GUEST, CAT_VMM, CAT_STEAL, CAT_IDLE, CAT_UNSAMPLED = "guest", "vmm", "steal", "idle", "unsampled"
CAT_VCPU, CAT_HOST = "vcpu", "host"

Event = dict[str, Any]


ONE_PROFILE = True

def _us(ns: np.ndarray | int, t0: int) -> np.ndarray:
    """Nanoseconds on the host clock to whole microseconds from t0 (every boundary rounded once)."""
    return np.rint((np.asarray(ns, dtype=np.int64) - t0) / 1000.0).astype(np.int64)


def _slice(name: str, cat: str, pid: int, tid: int, start_us: int, end_us: int, args: dict) -> Event:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_us, "dur": end_us - start_us,
            "args": args}


def blank_name(seg: Segment) -> tuple[str, str]:
    assert seg.blank is not None
    if seg.blank.kind == BlankKind.IDLE:
        return "[idle] halt", CAT_IDLE
    if seg.blank.kind == BlankKind.BLOCKED:
        return "[steal] vmm blocked", CAT_STEAL
    if seg.blank.kind == BlankKind.THROTTLED:
        return "[steal] throttled", CAT_STEAL
    return f"[steal] {seg.holder}", CAT_STEAL


def guest_label(r: Row, vcpu: int) -> tuple[str, dict]:
    """The name and args of a guest slice whose run starts with a sample of row r."""
    function = demangle(r.function)
    name = f"{r.process}/{function}" if r.process else function
    return name, {"process": r.process, "pid": r.pid, "function": function, "module": r.module, "vcpu": vcpu}


def vmm_args(vcpu: int, func: str, module: str) -> dict:
    """The args of a [vmm] slice whose run starts with a sample of this host function."""
    return {"vcpu": vcpu, "host_function": demangle(func), "module": module}


def blank_slices(backend: str, tl: VcpuTimeline, g: Segment, a: int, z: int,
                 t0: int) -> list[tuple[str, str, int, int, dict]]:
    """The slices (name, category, start, end, args) of a blank segment that runs from a to z (microseconds)."""
    b = g.blank
    assert b is not None
    name, cat = blank_name(g)
    args = {"kind": b.kind, "holder": g.holder, "vcpu": tl.vcpu}
    if b.kind == BlankKind.BLOCKED:  # the exit the VMM is handling; for the other kinds it is history
        args["exit_reason"] = exit_category(backend, b.exit_reason)
        args["exit_name"] = exit_name(backend, b.exit_reason)
    # (args are the same for every slice of one name: speedscope keys frames by name and args)
    # pieces of the segment: until the wake-up; after a wake-up into a throttled group, throttled while
    # the kernel kept it so; then waiting for its pCPU ("wakeup" after a halt)
    thr = b.throttled_after_wakeup()
    if thr is not None:
        w, tz = int(_us(thr[0], t0)), int(_us(thr[1], t0))
    else:
        w = tz = int(_us(b.wakeup_ns, t0)) if b.wakeup_ns is not None else z
    if b.kind == BlankKind.IDLE:
        wait = ("[steal] wakeup", {"kind": "wakeup", "holder": "unknown", "vcpu": tl.vcpu})
    else:
        wait = ("[steal] pCPU wait", {"kind": BlankKind.PREEMPTED, "holder": "unknown", "vcpu": tl.vcpu})
    throttled = ("[steal] throttled", {"kind": BlankKind.THROTTLED, "holder": "unknown", "vcpu": tl.vcpu})
    out = []
    for lo, hi, (n, ar), c in ((a, min(w, z), (name, args), cat), (max(a, w), min(tz, z), throttled, CAT_STEAL),
                               (max(a, tz), z, wait, CAT_STEAL)):
        if lo < hi:
            out.append((n, c, lo, hi, ar))
    return out


def vcpu_events(an: Analysis, tl: VcpuTimeline, pid: int, t0: int) -> list[Event]:
    """The slices of one vCPU track, one per segment that lasts at least a microsecond once rounded."""
    tid = tl.tid
    segments = vcpu_segments(an, tl)
    starts = _us(np.array([g.start_ns for g in segments], np.int64), t0).tolist()
    ends = _us(np.array([g.end_ns for g in segments], np.int64), t0).tolist()
    events: list[Event] = []
    for g, a, z in zip(segments, starts, ends, strict=True):
        if z <= a:
            continue
        if g.kind is SegmentKind.GUEST:
            name, args = guest_label(an.row(g.sample, g.samples), tl.vcpu)
            events.append(_slice(name, CAT_GUEST, pid, tid, a, z, args))
        elif g.kind is SegmentKind.VMM:
            args = vmm_args(tl.vcpu, str(an.func[g.sample]), str(an.module[g.sample]))
            events.append(_slice("[vmm]", CAT_VMM, pid, tid, a, z, args))
        elif g.kind is SegmentKind.UNSAMPLED:
            events.append(_slice("[unsampled]", CAT_UNSAMPLED, pid, tid, a, z, {"vcpu": tl.vcpu}))
        else:
            events += [_slice(n, c, pid, tid, lo, hi, ar) for n, c, lo, hi, ar in blank_slices(an.backend, tl, g, a, z,
                                                                                              t0)]
    return events


HostSlice = tuple[int, int, int, str, str, dict]  # start, end (us), tid, name, category, args


def host_events(an: Analysis, t0: int) -> tuple[list[Event], list[int]]:
    """Per pCPU: idle intervals, vCPU run intervals, and host tasks in between (from the sched events)."""
    slices, cpus = host_slices(an, t0)
    return [_slice(n, c, HOST_PID, tid, a, z, args) for a, z, tid, n, c, args in slices], cpus


def host_slices(an: Analysis, t0: int) -> tuple[Iterator[HostSlice], list[int]]:
    """host_events' slices one at a time (a trace read a piece at a time keeps them as columns), and the CPUs."""
    ev = an.sched
    if not len(ev):
        return iter(()), []
    ev = ev[cpu_order(ev)]
    cpu = ev["cpu"].astype(np.int64)

    def slices() -> Iterator[HostSlice]:
        t = ev["time_ns"].astype(np.int64)
        nxt = ev["next_tid"].astype(np.int64)
        # interval i runs from event i to the next event on the same CPU, with event i's next task on it;
        # it is exact when that event switches the task out (idle and vCPU threads always are)
        until = next_on_cpu(cpu, t, -1)
        exact = (until[:-1] >= 0) & (ev["prev_tid"][1:].astype(np.int64) == nxt[:-1])
        i_idx = np.nonzero(until >= 0)[0]
        a_us, z_us = _us(t[i_idx], t0), _us(until[i_idx], t0)
        for i, a, z in zip(i_idx.tolist(), a_us.tolist(), z_us.tolist(), strict=True):
            if z <= a:
                continue
            c = int(cpu[i])
            task = int(nxt[i])
            tid = HOST_PID + 1 + c
            if task == 0:
                yield a, z, tid, "[idle]", CAT_IDLE, {"cpu": c}
            elif task in an.vcpu_of_tid:
                vpid, vcpu = an.vcpu_of_tid[task]
                vm = an.vm_by_pid.get(vpid, f"vm-{vpid}")
                yield a, z, tid, f"{vm}/vcpu{vcpu}", CAT_VCPU, {"cpu": c, "vm": vm, "vcpu": vcpu, "tid": task}
            else:
                comm = task_name(ev["next_comm"][i]) or str(task)
                name = comm if exact[i] else "[host]"
                yield a, z, tid, name, CAT_HOST, {"cpu": c, "first_task": comm, "tid": task,
                                                  "pid": int(ev["next_pid"][i]), "exact": bool(exact[i])}

    return slices(), sorted(set(cpu.tolist()))


def _meta(name: str, pid: int, tid: int | None, value: str | int) -> Event:
    arg = "name" if isinstance(value, str) else "sort_index"
    e: Event = {"name": name, "ph": "M", "pid": pid, "args": {arg: value}}
    if tid is not None:
        e["tid"] = tid
    return e


def _vm_meta(name: str, pid: int, timelines: list[VcpuTimeline]) -> list[Event]:
    meta = [_meta("process_name", pid, None, name), _meta("process_sort_index", pid, None, pid)]
    for tl in timelines:
        meta += [_meta("thread_name", pid, tl.tid, f"vcpu{tl.vcpu}"), _meta("thread_sort_index", pid, tl.tid, tl.vcpu)]
    return meta


def _host_meta(vms: int, cpus: list[int]) -> list[Event]:
    meta = [_meta("process_name", HOST_PID, None, "host"), _meta("process_sort_index", HOST_PID, None, vms + 1)]
    for c in cpus:
        meta += [_meta("thread_name", HOST_PID, HOST_PID + 1 + c, f"cpu{c}"),
                 _meta("thread_sort_index", HOST_PID, HOST_PID + 1 + c, c)]
    return meta


def _other(an: Analysis | StreamedTrace, w0: int, vms: list[str], profile: Profile | None) -> dict[str, Any]:
    other: dict[str, Any] = {"tool": "vmprof", "recording": str(an.rec.path), "frequency_hz": an.frequency,
                             "period_ns": an.period_ns, "backend": an.backend, "vms": vms,
                             "start_unix_s": an.rec.meta.get("start_unix_s"), "first_timestamp_ns": w0,
                             "lost_samples": an.rec.lost_samples, "notes": list(an.notes)}
    if profile is not None:
        other["level"] = profile.level
        other["notes"] = list(profile.notes)
    return other


def build_trace(an: Analysis, vm: str | None = None, vcpu: int | None = None, profile: Profile | None = None,
                host: bool = True) -> dict:
    w0, _ = an.span()
    meta: list[Event] = []
    events: list[Event] = []
    vms = [vm] if vm else an.vm_names()
    for name in vms:
        pid = an.vm_index.get(name, 0) or len(an.vm_index) + 1
        timelines = sorted(an.vm_timelines(name, vcpu), key=lambda x: x.vcpu)
        meta += _vm_meta(name, pid, timelines)
        for tl in timelines:
            events += vcpu_events(an, tl, pid, w0)
    if host:
        hev, cpus = host_events(an, w0)
        if hev:
            meta += _host_meta(len(an.vm_index), cpus)
            events += hev
    events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": _other(an, w0, vms, profile)}


def render(inp: ReportInput) -> str:
    trace = build_trace(inp.analysis, inp.vm, inp.vcpu, inp.profiles[0])
    return _json(trace) + "\n"


def render_parts(inp: ReportInput) -> Iterator[str]:
    """render's text, in parts: of a recording read a piece at a time (StreamedTrace), its slices written from
    columns (start, duration, track, label), as build_trace would write their events, in its order."""
    an = inp.analysis
    if not isinstance(an, StreamedTrace):
        yield render(inp)
        return
    w0 = an.span_ns[0]
    vms = [inp.vm] if inp.vm else an.vm_names()
    meta: list[Event] = []
    columns: list[tuple[np.ndarray, ...]] = []  # ts, end, pid, tid, label
    for name in vms:
        pid = an.vms.index.get(name, 0) or len(an.vms.index) + 1
        timelines = sorted((tl for tl in an.timelines.values() if tl.vm == name and inp.vcpu in (None, tl.vcpu)),
                           key=lambda x: x.vcpu)
        meta += _vm_meta(name, pid, timelines)
        columns += [_track_columns(an, an.tracks[tl.tid], w0) for tl in timelines if tl.tid in an.tracks]
    host = _host_columns(an, *host_slices(an.host_view(), w0))
    if len(host[0]):
        meta += _host_meta(len(an.vms.index), host[5])
        columns.append(host[:5])
    ts, end, pid_, tid, label = (np.concatenate([c[k] for c in columns]) if columns else np.empty(0, np.int64)
                                 for k in range(5))
    del columns  # (each track's, now in the five columns)
    order = np.lexsort((tid, pid_, ts))
    labels = [(json.dumps(n), json.dumps(c), a) for n, c, a in an.label_ids]
    yield '{"traceEvents":['
    yield ",".join(_json(e) for e in meta)
    step = 1 << 16
    for at in range(0, len(order), step):
        o = order[at:at + step]
        text = [f'{{"name":{labels[k][0]},"cat":{labels[k][1]},"ph":"X","pid":{p},"tid":{t},"ts":{a},'
                f'"dur":{z - a},"args":{labels[k][2]}}}'
                for a, z, p, t, k in zip(ts[o].tolist(), end[o].tolist(), pid_[o].tolist(), tid[o].tolist(),
                                         label[o].tolist(), strict=True)]
        yield ("," if meta or at else "") + ",".join(text)
    yield '],"displayTimeUnit":"ms","otherData":' + _json(_other(an, w0, vms, inp.profiles[0])) + "}\n"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def slice_label(an: Analysis, tl: VcpuTimeline, i: int, guest: bool) -> tuple[str, str, dict]:
    """The name, category and args of a guest or [vmm] slice whose run starts with sample i (StreamedTrace's)."""
    if guest:
        name, args = guest_label(an.row(i, 0.0), tl.vcpu)
        return name, CAT_GUEST, args
    return "[vmm]", CAT_VMM, vmm_args(tl.vcpu, str(an.func[i]), str(an.module[i]))


def _track_columns(an: StreamedTrace, track: Track, w0: int) -> tuple[np.ndarray, ...]:
    """A vCPU track's slices as columns: its runs (closed piece by piece), unsampled on-CPU time and blanks, as
    vcpu_events makes them of the segments."""
    tl = track.tl
    a = _us(np.concatenate([*track.starts, np.empty(0, np.int64)]), w0)
    z = _us(np.concatenate([*track.ends, np.empty(0, np.int64)]), w0)
    label = np.concatenate([*track.labels, np.empty(0, np.int64)])
    unsampled = ~track.sampled & (track.seg_hi > track.seg_lo)
    ua, uz = _us(track.seg_lo[unsampled], w0), _us(track.seg_hi[unsampled], w0)
    unsampled_label = an.label_ids.setdefault(("[unsampled]", CAT_UNSAMPLED, _json({"vcpu": tl.vcpu})),
                                              len(an.label_ids))
    blanks = sorted(tl.blanks, key=lambda b: b.start_ns)
    ba = _us(np.array([b.start_ns for b in blanks], np.int64), w0).tolist()
    bz = _us(np.array([b.end_ns for b in blanks], np.int64), w0).tolist()
    rows = []
    for b, lo, hi in zip(blanks, ba, bz, strict=True):
        if hi > lo:
            g = Segment(b.start_ns, b.end_ns, SegmentKind.BLANK, blank=b)
            for n, c, s_, e_, args in blank_slices(an.backend, tl, g, lo, hi, w0):
                key = (n, c, _json(args))
                rows.append((s_, e_, an.label_ids.setdefault(key, len(an.label_ids))))
    tl.forget_blanks()
    bcol = np.array(rows, np.int64).reshape(-1, 3)
    ts = np.concatenate([a, ua, bcol[:, 0]])
    end = np.concatenate([z, uz, bcol[:, 1]])
    lab = np.concatenate([label, np.full(len(ua), unsampled_label, np.int64), bcol[:, 2]])
    keep = end > ts
    n = int(np.count_nonzero(keep))
    return ts[keep], end[keep], np.full(n, track.pid, np.int64), np.full(n, tl.tid, np.int64), lab[keep]


def _host_columns(an: StreamedTrace, slices: Iterator[HostSlice], cpus: list[int]) -> tuple:
    """host_slices as columns (start, end, pid, tid, label), their name, category and args as labels; and the
    CPUs."""
    ts, end, tid, label = (array("q") for _ in range(4))
    for a, z, t, name, cat, args in slices:
        ts.append(a)
        end.append(z)
        tid.append(t)
        label.append(an.label_ids.setdefault((name, cat, _json(args)), len(an.label_ids)))
    n = len(ts)
    return (*(np.frombuffer(c, np.int64) if n else np.empty(0, np.int64) for c in (ts, end)),
            np.full(n, HOST_PID, np.int64), *(np.frombuffer(c, np.int64) if n else np.empty(0, np.int64)
                                              for c in (tid, label)), cpus)
