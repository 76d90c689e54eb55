"""Collection: load the BPF programs with bcc, attach them, drain the ring buffers.

sample → **record**: this module produces numpy arrays of the records in
bpf/sample.h; vmprof_tui.record.recording writes them to disk.
"""

from __future__ import annotations

import ctypes
import importlib.resources
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.collect.backends import Backend
from vmprof_tui.record.bpf_records import (
    HOST_COUNT_KEY_DTYPE,
    KSTACK_TAIL,
    SAMPLE_DTYPE,
    SCHED_DTYPE,
    STACK_COPY_BYTES,
    STACK_DTYPE,
    USTACK_GUEST_KERNEL,
    ustack_dtype,
)

# The BPF C as package data, the one place every loader finds it (docs/architecture.md): the top-level bpf/
# (with the helper's two ABI headers linked in) seen through the link vmprof_tui/bpf, copied into a wheel.
# bcc compiles from files (-I), so an install must leave the package as files, as pip does.
BPF_DIR = Path(str(importlib.resources.files("vmprof_tui") / "bpf"))


class CollectError(RuntimeError):
    pass


def bpf_source() -> str:
    """sched.bpf.c + sampler.bpf.c as one text (the sampler calls seen_running), with vcpu.h and
    stacks.h inlined.

    bcc rewrites its map helpers (``map.lookup()``) only in the main source
    text, not in #included files, so files that use them are pasted in."""
    texts = [(BPF_DIR / name).read_text() for name in ("sched.bpf.c", "sampler.bpf.c")]
    for header in ("vcpu.h", "stacks.h"):  # include guards: pasting one twice is harmless
        body = (BPF_DIR / header).read_text()
        texts = [t.replace(f'#include "{header}"', body) for t in texts]
    return "\n".join(texts)


def kernel_build_dir() -> Path:
    """Where bcc looks for the running kernel's headers."""
    return Path(f"/lib/modules/{os.uname().release}/build")


def pmu_available() -> bool:
    """True when a hardware PMU exists (perf's core PMU device is registered)."""
    devices = Path("/sys/bus/event_source/devices")
    return any((devices / name).exists() for name in ("cpu", "cpu_core", "cpu_atom"))


def check_privileges() -> None:
    """Root, or CAP_BPF + CAP_PERFMON (bits 39 and 38 of the effective set)."""
    if os.geteuid() == 0:
        return
    try:
        caps = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff"))
        eff = int(caps.split()[1], 16)
    except (OSError, StopIteration, ValueError):
        eff = 0
    if not (eff >> 39 & 1 and eff >> 38 & 1) and not eff >> 21 & 1:
        raise CollectError("not enough privileges to load BPF and open perf events: run as root "
                           "(or grant CAP_BPF and CAP_PERFMON)")


def _import_bcc():  # noqa: ANN202 - bcc has no type information
    try:
        import bcc
    except ImportError:
        raise CollectError("bcc's Python module is missing: apt-get install python3-bpfcc, and use a venv "
                           "with --system-site-packages (tools/bootstrap.sh does both)") from None
    return bcc


class RingReader:
    """Consumer side of a BPF ring buffer, read straight from its memory mapping.

    bcc's consumer calls back into Python once per record; at 10 kHz on every CPU that
    is tens of thousands of calls a second, on CPUs the guests want.  Every record in
    our rings has one fixed size, so the bytes between the consumer and producer
    positions are an array of equal slots (the data area is mapped twice, so a wrap is
    contiguous too) that numpy reads in one go.  Layout per the kernel's
    kernel/bpf/ringbuf.c: a consumer page, a producer page, then the data pages; each
    record has an 8-byte header whose length word carries BUSY (bit 31) and DISCARD
    (bit 30).
    """

    BUSY, DISCARD = 1 << 31, 1 << 30

    def __init__(self, map_fd: int, size: int, record: np.dtype) -> None:
        page = mmap.PAGESIZE
        self.mask = size - 1
        self.consumer = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self.data = mmap.mmap(map_fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self.page = page
        slot = (record.itemsize + 8 + 7) // 8 * 8
        self.slot = np.dtype({"names": ["len", "pg_off", "rec"], "formats": ["<u4", "<u4", record],
                              "offsets": [0, 4, 8], "itemsize": slot})
        self.record = record

    def read(self) -> np.ndarray:
        cons = int.from_bytes(self.consumer[0:8], "little")
        prod = int.from_bytes(self.data[0:8], "little")
        n = (prod - cons) // self.slot.itemsize
        if n <= 0:
            return np.empty(0, self.record)
        slots = np.frombuffer(self.data, self.slot, count=n, offset=self.page + (cons & self.mask))
        busy = np.nonzero(slots["len"] & self.BUSY)[0]
        if len(busy):  # a record still being written: stop before it
            slots = slots[:busy[0]]
        out = slots["rec"][(slots["len"] & self.DISCARD) == 0].copy()
        self.consumer[0:8] = (cons + len(slots) * self.slot.itemsize).to_bytes(8, "little")
        return out

    def close(self) -> None:
        self.consumer.close()
        self.data.close()


@dataclass
class Drained:
    samples: np.ndarray
    sched: np.ndarray
    stacks: np.ndarray | None = None  # STACK_DTYPE rows (-g)
    host_stacks: dict[int, np.ndarray] = field(default_factory=dict)  # stack-map ids first seen now -> addresses
    host_counts: np.ndarray | None = None  # HOST_COUNTS_DTYPE: host tasks' samples counted since the last drain
    ustacks: np.ndarray | None = None  # ustack_dtype rows: user-stack copies (--call-graph cfi)


# Host stack-map entries (ids of kernel and user chains).  The map is a hash table of buckets that are
# never replaced: a chain whose bucket another chain holds gets no id (never a wrong one).  A host user
# chain then goes into its stack record (STACK_HOST_USER_INLINE); a kernel chain is left out.
HOST_STACK_ENTRIES = 16384
USTACK_RING_S, USTACK_RING_MAX = 4, 512 << 20  # the user-stack copies' ring: seconds of copies it holds, bytes
HOST_COUNT_ENTRIES = 65536  # distinct (process, privilege, IP) of host tasks between two drains
HOST_COUNTS_DTYPE = np.dtype(HOST_COUNT_KEY_DTYPE.descr + [("count", "<u8")])  # a map entry: its key, its count


@dataclass
class Collector:
    """The loaded BPF programs on every CPU."""
    backend: Backend
    frequency: int = 1000
    event: str = ""  # "cycles" or "cpu-clock"; empty: cycles where a hardware PMU exists
    ring_pages: int = 1024  # per ring buffer, a power of two
    stacks: bool = False  # record -g: host and guest call stacks
    stack_map_entries: int = HOST_STACK_ENTRIES  # host chains kept by id (more: fewer bucket collisions)
    call_graph: str = "fp"  # with stacks: "fp" walks frame pointers at sample time, "cfi" copies user stacks
    stack_copy_bytes: int = STACK_COPY_BYTES  # cfi: bytes of user stack copied per sample (a power of two)
    host_counts: bool = False  # host tasks' samples counted in a BPF map, not sent one by one (top --host-counts)
    _bpf: object = None
    _rings: list[RingReader] = field(default_factory=list)
    _known_stacks: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.event = self.event or ("cycles" if pmu_available() else "cpu-clock")

    def start(self) -> None:
        check_privileges()
        bcc = _import_bcc()
        if self.event == "cycles" and not pmu_available():
            raise CollectError("the cycles event needs a hardware PMU and this host has none; "
                               "use the default cpu-clock event")
        cflags = [f"-I{BPF_DIR}", f"-DSAMPLE_RING_PAGES={self.ring_pages}",
                  f"-DSCHED_RING_PAGES={max(self.ring_pages // 4, 16)}", "-Wno-macro-redefined",
                  f"-DEXPECTED_HANDLING={2 if self.event == 'cycles' else 1}",
                  f"-DSAMPLE_PERIOD_NS={10**9 // self.frequency}",
                  *self.backend.cflags()]
        if self.stacks:
            # a stack record is 14x a sample: its ring gets 4x the pages (drained on the same timer)
            cflags += ["-DWITH_STACKS", f"-DSTACK_RING_PAGES={self.ring_pages * 4}",
                       f"-DHOST_STACK_ENTRIES={self.stack_map_entries}"]
            if self.call_graph == "cfi":
                # 8 KiB a sample: room for USTACK_RING_S of copies on every CPU (a flush of the recording, on
                # a loaded machine, holds up draining for that long), a power of two of pages as rings need
                want = USTACK_RING_S * self.frequency * (os.cpu_count() or 1) * self.ustack_dtype.itemsize
                pages = 1 << max(4, (min(want, USTACK_RING_MAX) // mmap.PAGESIZE - 1).bit_length())
                cflags += ["-DSTACK_COPY", f"-DSTACK_COPY_BYTES={self.stack_copy_bytes}",
                           f"-DUSTACK_RING_PAGES={pages}"]
        if self.host_counts:
            cflags += ["-DHOST_COUNTS", f"-DHOST_COUNT_ENTRIES={HOST_COUNT_ENTRIES}"]
        if os.environ.get("VMPROF_STEAL_CAUSES") == "0":  # benchmarks/overhead.py: the cost of these programs
            cflags.append("-DNO_STEAL_CAUSES")
        text = bpf_source()
        build = kernel_build_dir()
        if not build.exists():
            raise CollectError(f"bcc needs a kernel headers tree at {build}: run tools/bootstrap.sh "
                               "(it links Debian's linux-headers there)")
        try:
            self._bpf = bcc.BPF(text=text, cflags=cflags)
        except Exception as e:  # noqa: BLE001 - bcc raises bare Exception on compile/load errors
            raise CollectError(f"loading the BPF programs failed: {str(e).splitlines()[0]}") from None
        b = self._bpf
        self._rings = [RingReader(b[name].map_fd, b[name].max_entries, dtype)
                       for name, dtype in (("samples", SAMPLE_DTYPE), ("sched_events", SCHED_DTYPE),
                                           *((("stacks", STACK_DTYPE),) if self.stacks else ()),
                                           *((("ustacks", self.ustack_dtype),) if self.copies else ()))]
        if self.event == "cycles":
            ev_type, ev_config = bcc.PerfType.HARDWARE, bcc.PerfHWConfig.CPU_CYCLES
        else:
            ev_type, ev_config = bcc.PerfType.SOFTWARE, bcc.PerfSWConfig.CPU_CLOCK
        try:
            b.attach_perf_event(ev_type=ev_type, ev_config=ev_config, fn_name="on_sample",
                                sample_freq=self.frequency, cpu=-1)
        except Exception as e:  # noqa: BLE001
            raise CollectError(f"cannot open the {self.event} perf event at {self.frequency} Hz: {e}") from None

    def add_vcpu_threads(self, tids: dict[int, int]) -> None:
        """Tell the sched program about vCPU threads found by discovery (tid -> VMM pid)."""
        table = self._bpf["vcpu_tids"]
        for tid, pid in tids.items():
            table[ctypes.c_uint32(tid)] = ctypes.c_uint32(pid)

    def process_names(self, pids: set[int]) -> dict[int, str]:
        """The comm the sampler saw for each of these processes (those it has not seen are left out)."""
        table = self._bpf["process_comms"]
        names = {}
        for pid in pids:
            try:
                value = table[ctypes.c_uint32(pid)]
            except KeyError:
                continue
            names[pid] = bytes(value.comm).split(b"\0", 1)[0].decode(errors="replace")
        return names

    def drain(self) -> Drained:
        """Everything recorded since the last call (records are submitted without
        wake-ups, so the caller drains on its own timer: no feedback from wake-ups)."""
        samples, sched, *stacks = (ring.read() for ring in self._rings)
        counts = self._take_host_counts() if self.host_counts else None
        if not stacks:
            return Drained(samples, sched, host_counts=counts)
        ustacks = stacks[1] if self.copies else None
        if ustacks is not None and len(ustacks):
            # the sampler's scratch buffer is reused: bytes past what this copy read are an older stack's
            # (a guest-kernel sample's kernel stack at the end excepted)
            tail = np.where(ustacks["flags"] & USTACK_GUEST_KERNEL, KSTACK_TAIL, 0)
            for i in np.flatnonzero(ustacks["copied"] < self.stack_copy_bytes - tail).tolist():
                ustacks["data"][i, ustacks["copied"][i]:self.stack_copy_bytes - int(tail[i])] = 0
        return Drained(samples, sched, stacks[0], self._new_host_stacks(stacks[0]), counts, ustacks)

    def _take_host_counts(self) -> np.ndarray:
        """The host tasks' sample counts, taken out of the map (it starts again from empty): one batched
        lookup-and-delete straight into numpy arrays, not a Python object per entry."""
        from bcc.libbcc import lib

        table = self._bpf["host_counts"]
        keys = np.zeros(table.max_entries, HOST_COUNT_KEY_DTYPE)
        values = np.zeros(table.max_entries, np.uint64)
        batch, count, total = ctypes.c_uint32(0), ctypes.c_uint32(0), 0
        while total < len(keys):
            count.value = len(keys) - total
            res = lib.bpf_lookup_and_delete_batch(table.map_fd, ctypes.byref(batch) if total else None,
                                                  ctypes.byref(batch), keys[total:].ctypes.data,
                                                  values[total:].ctypes.data, ctypes.byref(count))
            errno = ctypes.get_errno()
            total += count.value
            if res != 0 and errno != 2:  # ENOENT: the map is done
                raise CollectError(f"reading the host sample counts failed: {os.strerror(errno)}")
            if res != 0 or count.value == 0:
                break
        out = np.zeros(total, HOST_COUNTS_DTYPE)
        for name in HOST_COUNT_KEY_DTYPE.names:
            out[name] = keys[name][:total]
        out["count"] = values[:total]
        return out

    def _new_host_stacks(self, stacks: np.ndarray) -> dict[int, np.ndarray]:
        """Addresses of the stack-map ids these stacks use that earlier drains did not return
        (an id names one chain for the life of the map: ids are never reused)."""
        ids = np.unique(np.concatenate([stacks["kernel_stack_id"], stacks["user_stack_id"]]))
        table = self._bpf["host_stacks"]
        new = {}
        for sid in ids[ids >= 0].tolist():
            if sid in self._known_stacks:
                continue
            try:
                ips = np.ctypeslib.as_array(table[ctypes.c_int(sid)].ip)
            except KeyError:
                continue
            n = int(np.argmax(ips == 0)) if (ips == 0).any() else len(ips)
            new[sid] = ips[:n].astype(np.uint64)
            self._known_stacks.add(sid)
        return new

    def vmm_exits(self) -> dict[str, dict[str, int]]:
        """Returns of KVM_RUN to the VMM so far: thread id -> kvm_run exit reason (a number) -> count."""
        out: dict[str, dict[str, int]] = {}
        if self._bpf is not None:
            for key, value in self._bpf["vmm_exits"].items():
                out.setdefault(str(key.tid), {})[str(key.reason)] = int(value.value)
        return out

    def lost(self) -> dict[str, list[int]]:
        """Records dropped because a ring buffer was full, per CPU."""
        return {name: [int(v) for v in self._bpf[f"{name}_lost"][ctypes.c_int(0)]]
                for name in ("samples", "sched", *(("stacks",) if self.stacks else ()),
                             *(("ustacks",) if self.copies else ()),
                             *(("host_counts",) if self.host_counts else ()))}

    @property
    def copies(self) -> bool:
        """User stacks are copied for unwinding afterwards (-g with --call-graph cfi)."""
        return self.stacks and self.call_graph == "cfi"

    @property
    def ustack_dtype(self) -> np.dtype:
        return ustack_dtype(self.stack_copy_bytes)

    @property
    def started(self) -> bool:
        return self._bpf is not None

    def close(self) -> None:
        for ring in self._rings:
            ring.close()
        self._rings = []
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
