"""The LBR collection path on these machines (issue 7).

There is no PMU here (docs/backends.md), so live collection cannot run.  What is
checked: bpf/lbr.bpf.c compiles with bcc and passes the running kernel's verifier as a
perf_event program for the patterns' variants; the capability probe reports the missing
PMU in one clear line, consistent with independent evidence; the collector refuses to
start with that same message."""

from __future__ import annotations

import os

import pytest
from conftest import require_root

from vmprof_tui.collect import perf_event
from vmprof_tui.lbr import capability, patterns
from vmprof_tui.lbr import collector as collect


@pytest.mark.parametrize(("name", "nr", "info"), [("type4", 32, True), ("type3", 16, False)])
def test_bpf_compiles_and_loads(name: str, nr: int, info: bool) -> None:
    require_root()
    pat = patterns.get(name).with_options(info=info)
    b = collect.compile_bpf(nr, pat, ring_pages=8, load=True)
    try:
        kinds = {n: type(b[n]).__name__ for n in  # type: ignore[index]
                 ("lbr_instructions", "lbr_events", "lbr_stats", "lbr_target", "lbr_scratch")}
        assert kinds == {"lbr_instructions": "PerfEventArray", "lbr_events": "RingBuf", "lbr_stats": "PerCpuArray",
                         "lbr_target": "Array", "lbr_scratch": "PerCpuArray"}
    finally:
        b.cleanup()  # type: ignore[attr-defined]


def test_perf_event_open_wrapper_works() -> None:
    """The probe's syscall wrapper opens a software event here, so a failing hardware event is the
    host's answer, not a bug of the wrapper."""
    require_root()
    a = perf_event.make_attr(0)
    a.type = 1  # PERF_TYPE_SOFTWARE
    a.config = 0  # PERF_COUNT_SW_CPU_CLOCK
    fd = perf_event.perf_event_open(a, -1, 0)
    os.close(fd)


def test_capability_message_matches_host() -> None:
    require_root()
    caps = capability.detect()
    core_pmu = os.path.isdir("/sys/bus/event_source/devices/cpu") or os.path.isdir(
        "/sys/bus/event_source/devices/cpu_core")
    assert caps.pmu == core_pmu, caps.message
    if not caps.pmu:  # these machines
        assert caps.message.startswith("no hardware PMU: perf_event_open(PERF_TYPE_HARDWARE cycles) failed with")
        assert "vmprof blocks --perf-script" in caps.message
        assert not caps.ok
    else:  # a PMU host: the message names the depth or says why the branch stack is missing
        assert caps.message.startswith(("LBR collection available", "branch stack unsupported"))


def test_collector_refuses_without_pmu_or_collects() -> None:
    require_root()
    caps = capability.detect()
    col = collect.LbrCollector(collect.LbrConfig.named("type4"))
    if not caps.ok:
        with pytest.raises(collect.LbrUnsupported) as e:
            col.start()
        assert str(e.value) == caps.message
        return
    # PMU hosts only (never run on the development machines): a short live collection
    col.start()
    try:
        x = 0
        for i in range(3_000_000):
            x += i
        recs = col.poll(200)
    finally:
        col.stop()
    assert recs.size > 0


def test_attr_layout() -> None:
    assert perf_event.PerfEventAttr.branch_sample_type.offset == 72
    assert perf_event.PerfEventAttr.config3.offset == 128
    bst = perf_event.branch_sample_type(patterns.get("type4").branch_filter)
    assert bst == perf_event.PERF_SAMPLE_BRANCH_USER | perf_event.PERF_SAMPLE_BRANCH_ANY_CALL | \
        perf_event.PERF_SAMPLE_BRANCH_ANY_RETURN


def test_collector_plumbing_with_software_standin() -> None:
    """Everything of the live path but the hardware: the real BPF program on a perf-event group per
    CPU (software cpu-clock standing in for cycles and for instructions), PERF_EVENT_IOC_SET_BPF, the
    member read through the PERF_EVENT_ARRAY, the ring buffer, record decoding and per-CPU deltas."""
    require_root()
    import errno
    import time

    import numpy as np

    from vmprof_tui.lbr.records import to_samples

    period = 1_000_000  # ns of cpu-clock between samples
    col = collect.LbrCollector(collect.LbrConfig.named("type4", standin=True, period=period, pid=os.getpid()))
    col.start()
    parts = []
    try:
        end = time.monotonic() + 0.6
        x = 0
        while time.monotonic() < end:
            for i in range(20_000):
                x += i
            parts.append(col.poll(0))
        col.disable()  # stats() read counter by counter; a sample between two reads would skew them
        parts.append(col.poll(10))
        stats = col.stats()
    finally:
        col.stop()
    recs = np.concatenate(parts)
    h = recs["hdr"]
    assert len(recs) >= 150, stats
    assert stats["dropped"] == 0 and stats["counter_errors"] == 0
    assert stats["samples"] >= len(recs) and stats["lbr_errors"] == stats["samples"]
    assert (h["pid"] == os.getpid()).all()  # the target filter
    assert (h["lbr_bytes"] == -errno.ENOENT).all() and (h["nr"] == 0).all()  # no branch stack on this event
    assert (h["cycles_err"] == 0).all() and (h["instructions_err"] == 0).all()
    assert (h["fields"] == 7).all() and (h["filter"] == 3).all()
    samples = to_samples(recs)
    later = [s for s in samples[1:] if s.cpu == samples[0].cpu]
    cpi = np.array([s.cpi for s in later])
    assert np.all(np.abs(cpi - 1) < 0.05), (cpi.min(), cpi.max(), stats)  # both count the same nanoseconds
    median = np.median([s.cycles for s in later])
    assert abs(median / period - 1) < 0.1, (median, stats)  # one sample per period
