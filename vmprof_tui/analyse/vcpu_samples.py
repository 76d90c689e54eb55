"""The samples of each vCPU thread of an analysis, and what one of them stands for: the thread's exact on-CPU
time over its samples (so a guest's run, idle, steal and halt-polling shares are its exact times), and which of
them caught KVM polling the halted vCPU."""

from __future__ import annotations

import functools

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse.timeline import VcpuTimeline
from vmprof_tui.record.bpf_records import SAMPLE_HALTED, SAMPLE_VCPU

MIN_SAMPLES_FOR_RATE = 200  # fewer samples of a vCPU thread measure its sampling rate no better than the period


def inside(times: np.ndarray, intervals: np.ndarray) -> np.ndarray:
    """Which times fall in one of the [start, end) intervals (disjoint, in time order)."""
    if not len(intervals):
        return np.zeros(len(times), bool)
    t = times.astype(np.int64)
    k = np.searchsorted(intervals[:, 0], t, side="right") - 1
    return (k >= 0) & (t < intervals[k.clip(0), 1])



class VcpuSamples:
    """Per vCPU thread: its samples (indices into the analysis' samples) and their price."""

    def __init__(self, samples: np.ndarray, is_guest: np.ndarray, vcpu_of_tid: dict[int, tuple[int, int]],
                 period_ns: float) -> None:
        self.samples, self.is_guest, self.vcpu_of_tid, self.period_ns = samples, is_guest, vcpu_of_tid, period_ns
        self._polling: dict[int, np.ndarray] = {}  # vCPU thread (pid << 32 | tid) -> its polling samples

    def keys(self) -> np.ndarray:
        """pid << 32 | tid of every vCPU thread."""
        return np.fromiter((pid << 32 | tid for tid, (pid, _v) in self.vcpu_of_tid.items()), np.int64,
                           len(self.vcpu_of_tid))

    @functools.cached_property
    def positions(self) -> dict[int, np.ndarray]:
        """pid << 32 | tid of a vCPU thread -> the indices of its samples (ascending): one sort for all threads,
        8 bytes per sample of a vCPU thread (a mask per thread would be 1 byte per sample per thread)."""
        s = self.samples
        return arrays.positions_by_key(s["pid"].astype(np.int64) << 32 | s["tid"], self.keys())

    def thread_samples(self, tl: VcpuTimeline) -> np.ndarray:
        """The indices of the samples of one vCPU thread, ascending (callers do not change them)."""
        return self.positions.get(tl.pid << 32 | tl.tid, np.empty(0, np.int64))

    def sample_ns(self, tl: VcpuTimeline) -> float:
        """The on-CPU time one sample of a vCPU thread stands for: its exact on-CPU time over its samples.

        Blank time is exact (sched events) and on-CPU time is sampled; priced at the nominal period the two
        do not add up, because a thread's cpu-clock samples stray from its on-CPU time (steal3 at 10 kHz:
        one per 100.0-100.9 us) or alias with a guest's timer-driven cycle (a 30 ms halt cycle at 1 kHz:
        +-15%).  Priced at this rate, a guest's run, idle, steal and halt-polling shares are its exact times;
        samples only split the on-CPU time.  Too few samples to measure a rate: the nominal period.
        """
        return thread_sample_ns(len(self.thread_samples(tl)), tl.on_cpu_ns, len(self.polling_samples(tl)),
                                self.exact_poll_ns(tl), self.period_ns)

    def polling_samples(self, tl: VcpuTimeline) -> np.ndarray:
        """The indices of a vCPU thread's samples that caught KVM polling its halted vCPU: KVM with the vCPU
        halted, and inside a stretch KVM polled when the recording has them.  Kept per thread: the rate, the
        polling time and the profile of each vCPU all ask for them."""
        key = tl.pid << 32 | tl.tid
        if key not in self._polling:
            idx = self.thread_samples(tl)
            s = self.samples
            self._polling[key] = idx[polled(s["time_ns"][idx], s["flags"][idx], self.is_guest[idx], tl)]
        return self._polling[key]

    def poll_ns(self, tl: VcpuTimeline) -> float:
        """How long KVM polled the vCPU's halts within its life here: exact from kvm_vcpu_wakeup records (sampled,
        it aliases with a guest's timer), else its polling samples at the thread's rate."""
        exact = self.exact_poll_ns(tl)
        return float(len(self.polling_samples(tl))) * self.sample_ns(tl) if exact is None else float(exact)

    def exact_poll_ns(self, tl: VcpuTimeline) -> int | None:
        """How long KVM polled the vCPU's halts by its kvm_vcpu_wakeup records (None: the recording has none)."""
        return exact_poll_ns(tl)

    def thread_mask(self, tl: VcpuTimeline) -> np.ndarray:
        """The samples of one vCPU thread as a mask (made on each call: masks of many threads would take
        a byte per sample each)."""
        mask = np.zeros(len(self.samples), bool)
        mask[self.thread_samples(tl)] = True
        return mask


def exact_poll_ns(tl: VcpuTimeline) -> int | None:
    """VcpuSamples.exact_poll_ns: of the timeline alone."""
    if tl.poll_intervals is None:
        return None
    clipped = np.clip(tl.poll_intervals, tl.start_ns, tl.end_ns)
    return int((clipped[:, 1] - clipped[:, 0]).sum())


def polled(times: np.ndarray, flags: np.ndarray, is_guest: np.ndarray, tl: VcpuTimeline) -> np.ndarray:
    """Which of a vCPU thread's samples (their times, flags, guest mode) caught KVM polling its halted vCPU
    (VcpuSamples.polling_samples)."""
    out = maybe_polled(flags, is_guest)
    if tl.poll_intervals is not None:
        out &= inside(times, tl.poll_intervals)
    return out


def maybe_polled(flags: np.ndarray, is_guest: np.ndarray) -> np.ndarray:
    """Which samples of a vCPU thread are of KVM with the vCPU halted: polling if inside a stretch KVM polled (or
    when the recording has no such stretches)."""
    return ~is_guest & ((flags & (SAMPLE_VCPU | SAMPLE_HALTED)) == (SAMPLE_VCPU | SAMPLE_HALTED))


def thread_sample_ns(samples: int, on_cpu_ns: float, polling: int, exact_poll_ns: int | None,
                     period_ns: float) -> float:
    """VcpuSamples.sample_ns from its counts (which add across spans: analyse/stream.py prices a recording's vCPUs
    once, from the sums of its pieces)."""
    if exact_poll_ns is not None:  # priced exactly too: the rate is of the rest
        samples -= polling
        on_cpu_ns -= exact_poll_ns
    return on_cpu_ns / samples if samples >= MIN_SAMPLES_FOR_RATE and on_cpu_ns > 0 else period_ns
