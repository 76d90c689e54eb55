"""numpy views of the records defined in bpf/sample.h (the one definition).

tests/test_records.py compiles sample.h with gcc and proves the sizes and
offsets below are the C ones.
"""

from __future__ import annotations

import numpy as np

SAMPLE_DTYPE = np.dtype([
    ("time_ns", "<u8"), ("host_ip", "<u8"), ("guest_ip", "<u8"), ("guest_cr3", "<u8"),
    ("pid", "<u4"), ("tid", "<u4"), ("exit_reason", "<u4"), ("stack_id", "<i4"),
    ("cpu", "<u2"), ("vcpu_id", "<u2"), ("flags", "<u2"), ("pad", "<u2"),
])

STACK_GUEST_MAX = 64
STACK_DTYPE = np.dtype([
    ("time_ns", "<u8"), ("kernel_stack_id", "<i4"), ("user_stack_id", "<i4"), ("cpu", "<u2"),
    ("guest_depth", "u1"), ("flags", "u1"), ("pad", "<u4"), ("guest", "<u8", STACK_GUEST_MAX),
])

STACK_COPY_BYTES = 8192  # the default user-stack copy of --call-graph cfi (bpf/sample.h)


def ustack_dtype(copy_bytes: int = STACK_COPY_BYTES) -> np.dtype:
    """struct vmprof_ustack with `copy_bytes` of stack (the sampler is compiled with -DSTACK_COPY_BYTES)."""
    return np.dtype([("time_ns", "<u8"), ("cpu", "<u2"), ("flags", "u1"), ("pad", "u1"), ("copied", "<u4"),
                     ("ip", "<u8"), ("sp", "<u8"), ("bp", "<u8"), ("data", "u1", copy_bytes)])


USTACK_DTYPE = ustack_dtype()

# vmprof top --host-counts: the key of a host task's sample counts (the map's value is the count)
HOST_COUNT_KEY_DTYPE = np.dtype([("pid", "<u4"), ("flags", "<u2"), ("pad", "<u2"), ("ip", "<u8")])

SCHED_DTYPE = np.dtype([
    ("time_ns", "<u8"), ("prev_pid", "<u4"), ("prev_tid", "<u4"), ("next_pid", "<u4"), ("next_tid", "<u4"),
    ("prev_exit_reason", "<u4"), ("cpu", "<u2"), ("prev_vcpu_id", "<u2"), ("flags", "u1"), ("pad", "u1", 3),
    ("cpu_irq_ns", "<u4"),
    ("next_comm", "S16"),
])

# The sched-event layout before cpu_irq_ns took 4 of the 7 pad bytes: recordings made with it still load
# (record/recording.py converts them, cpu_irq_ns 0).
SCHED_DTYPE_PAD7 = np.dtype([
    ("time_ns", "<u8"), ("prev_pid", "<u4"), ("prev_tid", "<u4"), ("next_pid", "<u4"), ("next_tid", "<u4"),
    ("prev_exit_reason", "<u4"), ("cpu", "<u2"), ("prev_vcpu_id", "<u2"), ("flags", "u1"), ("pad", "u1", 7),
    ("next_comm", "S16"),
])
OLDER_DTYPES = {SCHED_DTYPE: (SCHED_DTYPE_PAD7,)}

# vmprof_sample.flags
SAMPLE_HOST_KERNEL = 0x0001
SAMPLE_VCPU = 0x0002
SAMPLE_GUEST = 0x0004
SAMPLE_GUEST_KERNEL = 0x0008
SAMPLE_GUEST_UNKNOWN = 0x0010
SAMPLE_HALTED = 0x0020

# vmprof_stack.flags
STACK_GUEST_WALKED = 0x01
STACK_GUEST_PARTIAL = 0x02
STACK_HOST_USER_INLINE = 0x04  # a host user chain that lost its stack-map bucket, stored in guest[]
STACK_USER_COPY = 0x08  # a vmprof_ustack record (same cpu, time_ns) holds the user stack (--call-graph cfi)
USTACK_GUEST = 0x01  # vmprof_ustack.flags: a guest's stack
USTACK_GUEST_KERNEL = 0x02  # ... a guest-kernel sample: data[] ends with its kernel stack (KSTACK_TAIL bytes)
KSTACK_COPY_BYTES = 512  # of the guest kernel's stack, from its RSP up (bpf/sample.h)
KSTACK_TAIL = 16 + KSTACK_COPY_BYTES  # its RSP, its RBP, then the bytes

# vmprof_sched_event.flags
SCHED_PREV_VCPU = 0x01
SCHED_NEXT_VCPU = 0x02
SCHED_PREV_LOADED = 0x04
SCHED_PREV_HALTED = 0x08
SCHED_PREV_RUNNABLE = 0x10
SCHED_PREV_THROTTLED = 0x20
SCHED_WAKEUP = 0x40  # not a switch: a vCPU thread woke up
SCHED_HALT_END = 0x80  # not a switch: a vCPU's halt ended (kvm_vcpu_wakeup)
SCHED_NOT_SWITCH = SCHED_WAKEUP | SCHED_HALT_END
SCHED_THROTTLE_END = SCHED_NOT_SWITCH  # both bits: the throttled time of a vCPU thread that takes a CPU again

C_STRUCTS = {"vmprof_sample": SAMPLE_DTYPE, "vmprof_sched_event": SCHED_DTYPE, "vmprof_stack": STACK_DTYPE,
             "vmprof_ustack": USTACK_DTYPE,
             "vmprof_host_count_key": HOST_COUNT_KEY_DTYPE}


def context_switches(sched: np.ndarray) -> np.ndarray:
    """The sched records that are context switches: the ring also carries wake-ups, halt ends and throttle
    ends of vCPU threads (SCHED_NOT_SWITCH), whose prev_* fields name the thread but switch nothing."""
    return sched[(sched["flags"] & SCHED_NOT_SWITCH) == 0]


def cpu_order(sched: np.ndarray) -> np.ndarray:
    """The indices of sched records by CPU, then time (records of one time keep their order): how each CPU passed
    from task to task.  The one ordering of switches per CPU (the timelines' holders and idle time, exports)."""
    return np.lexsort((sched["time_ns"], sched["cpu"]))


def next_on_cpu(cpu: np.ndarray, time: np.ndarray, last: int) -> np.ndarray:
    """For switches in cpu_order (their CPUs and times): when the CPU switched next, which is when the task each
    switch put on the CPU left it; `last` for each CPU's last switch."""
    until = np.append(time[1:], last).astype(np.int64)
    until[:-1][cpu[1:] != cpu[:-1]] = last
    return until


def stack_rows(samples: np.ndarray, stacks: np.ndarray) -> np.ndarray:
    """For each sample, the row of its vmprof_stack record in `stacks` (same cpu and time_ns), or -1.

    A sample with stack_id -1 has none; one whose record was lost (its ring buffer was full) or
    filtered away has none either."""
    out = np.full(len(samples), -1, np.int64)
    if not len(stacks) or not len(samples):
        return out
    for cpu in np.unique(samples["cpu"][samples["stack_id"] >= 0]).tolist():
        rows = np.nonzero(stacks["cpu"] == cpu)[0]
        if not len(rows):
            continue
        times = stacks["time_ns"][rows]
        order = np.argsort(times, kind="stable")
        times, rows = times[order], rows[order]
        mine = np.nonzero((samples["cpu"] == cpu) & (samples["stack_id"] >= 0))[0]
        at = np.minimum(np.searchsorted(times, samples["time_ns"][mine]), len(times) - 1)
        hit = times[at] == samples["time_ns"][mine]
        out[mine[hit]] = rows[at[hit]]
    return out
