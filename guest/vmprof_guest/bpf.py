"""BPF programs of the guest agent (bcc, used only when it is importable).

The C below uses no kernel header: every structure offset comes from the running
kernel's BTF (vmprof_guest.btf) and is passed as a -D define, so any headers
tree that lets bcc compile satisfies it.  Programs:

  vg_trigger      raw tracepoint sys_enter, acts only on a request from this process:
                  op 1 walks the task list (chained with tail calls to vg_walk_chunk),
                  op 2 reads up to KREAD_BATCH × 32 bytes of kernel memory
  vg_switch       raw tracepoint sched_switch: mm->pgd of each task that runs
  vg_exec/exit/fork  raw tracepoints sched_process_*: events for `watch`
  bpf_iter__task  a BPF task iterator (BPF_PROG_TYPE_TRACING), tried first; many
                  kernels (and sandboxes) refuse tracing programs with EPERM
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmprof_guest.btf import Btf, BtfError

CHUNK = 1024  # tasks per program run (the verifier's jump-sequence limit is 8192)
MAX_TASKS = 32768  # 1 + 33 tail calls of CHUNK tasks
KREAD_BATCH = 32

_OFFSETS = {
    "TASKS": ("task_struct", "tasks"), "MM": ("task_struct", "mm"), "TGID": ("task_struct", "tgid"),
    "PID": ("task_struct", "pid"), "COMM": ("task_struct", "comm"), "FLAGS": ("task_struct", "flags"),
    "LEADER": ("task_struct", "group_leader"), "PARENT": ("task_struct", "real_parent"),
    "PGD": ("mm_struct", "pgd"),
}

_COMMON = r"""
struct rec_t { u32 tgid; u32 pid; u32 flags; u32 pad; u64 mm; u64 pgd; char comm[16]; };
static __always_inline void fill(struct rec_t *r, void *task) {
    u64 mm = 0, pgd = 0;
    bpf_probe_read_kernel(&r->tgid, 4, task + TGID_OFF);
    bpf_probe_read_kernel(&r->pid, 4, task + PID_OFF);
    bpf_probe_read_kernel(&r->flags, 4, task + FLAGS_OFF);
    bpf_probe_read_kernel(&r->comm, 16, task + COMM_OFF);
    bpf_probe_read_kernel(&mm, 8, task + MM_OFF);
    if (mm)
        bpf_probe_read_kernel(&pgd, 8, (void *)mm + PGD_OFF);
    r->mm = mm;
    r->pgd = pgd;
}
"""

_MAIN = _COMMON + r"""
struct ctl_t { u32 tgid; u32 op; u32 n; u32 done; u64 head; u64 pos; u32 nread; u32 pad; };
struct kread_t { u64 addr[KREAD_BATCH]; u32 ok[KREAD_BATCH]; u64 data[KREAD_BATCH * 4]; };
struct ev_t { u32 kind; u32 tgid; u32 pid; u32 ptgid; u64 pgd; u64 ts; char comm[16]; };
BPF_ARRAY(ctl, struct ctl_t, 1);
BPF_ARRAY(kread, struct kread_t, 1);
BPF_ARRAY(tasks, struct rec_t, MAX_TASKS);
BPF_PROG_ARRAY(chain, 1);
BPF_HASH(seen, u32, struct rec_t, MAX_TASKS);
BPF_RINGBUF_OUTPUT(events, 256);

int vg_walk_chunk(struct bpf_raw_tracepoint_args *ctx) {
    u32 zero = 0;
    struct ctl_t *c = ctl.lookup(&zero);
    if (!c)
        return 0;
    void *head = (void *)c->head, *pos = (void *)c->pos;
    u32 n = c->n, done = 0;
    for (u32 i = 0; i < CHUNK; i++) {
        void *next = 0;
        if (bpf_probe_read_kernel(&next, sizeof(next), pos) || !next) { done = 2; break; }
        if (next == head) { done = 1; break; }
        if (n >= MAX_TASKS) { done = 3; break; }
        u32 idx = n;
        struct rec_t *r = tasks.lookup(&idx);
        if (!r) { done = 3; break; }
        fill(r, next - TASKS_OFF);
        n++;
        pos = next;
    }
    c->n = n;
    c->pos = (u64)pos;
    c->done = done;
    if (!done)
        chain.call(ctx, 0);
    return 0;
}

int vg_trigger(struct bpf_raw_tracepoint_args *ctx) {
    u32 zero = 0;
    struct ctl_t *c = ctl.lookup(&zero);
    if (!c || !c->op || (bpf_get_current_pid_tgid() >> 32) != c->tgid)
        return 0;
    u32 op = c->op;
    c->op = 0;
    if (op == 2) {
        struct kread_t *k = kread.lookup(&zero);
        if (!k)
            return 0;
        for (u32 i = 0; i < KREAD_BATCH; i++) {
            if (i >= c->nread)
                break;
            k->ok[i] = bpf_probe_read_kernel(&k->data[i * 4], 32, (void *)k->addr[i]) == 0;
        }
        c->done = 1;
        return 0;
    }
    void *leader = 0;
    bpf_probe_read_kernel(&leader, 8, (void *)bpf_get_current_task() + LEADER_OFF);
    struct rec_t *r = tasks.lookup(&zero);
    if (!r || !leader)
        return 0;
    fill(r, leader);
    c->n = 1;
    c->head = (u64)leader + TASKS_OFF;
    c->pos = c->head;
    c->done = 0;
    chain.call(ctx, 0);
    c->done = 4;  /* the tail call failed */
    return 0;
}

int vg_switch(struct bpf_raw_tracepoint_args *ctx) {
    struct rec_t r = {};
    fill(&r, (void *)ctx->args[2]);
    if (r.pgd)
        seen.update(&r.tgid, &r);
    return 0;
}

static __always_inline void emit(u32 kind, void *task, void *parent) {
    struct ev_t e = {};
    struct rec_t r = {};
    fill(&r, task);
    e.kind = kind;
    e.tgid = r.tgid;
    e.pid = r.pid;
    e.pgd = r.pgd;
    e.ts = bpf_ktime_get_boot_ns();
    __builtin_memcpy(e.comm, r.comm, 16);
    if (parent)
        bpf_probe_read_kernel(&e.ptgid, 4, parent + TGID_OFF);
    events.ringbuf_output(&e, sizeof(e), 0);
}

int vg_exec(struct bpf_raw_tracepoint_args *ctx) { emit(1, (void *)ctx->args[0], 0); return 0; }
int vg_exit(struct bpf_raw_tracepoint_args *ctx) { emit(2, (void *)ctx->args[0], 0); return 0; }
int vg_fork(struct bpf_raw_tracepoint_args *ctx) {
    emit(3, (void *)ctx->args[1], (void *)ctx->args[0]);
    return 0;
}
"""

_ITER = _COMMON + r"""
struct seq_file;
struct bpf_iter_meta { struct seq_file *seq; u64 session_id; u64 seq_num; };
struct bpf_iter__task { struct bpf_iter_meta *meta; void *task; };
BPF_ITER(task) {
    struct seq_file *seq = ctx->meta->seq;
    void *task = ctx->task;
    if (!task)
        return 0;
    struct rec_t r = {};
    fill(&r, task);
    bpf_seq_write(seq, &r, sizeof(r));
    return 0;
}
"""


class BpfUnavailable(RuntimeError):
    """A BPF method cannot run here; the message says what is missing."""


class _Rec(ctypes.Structure):
    _fields_ = [("tgid", ctypes.c_uint32), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("pad", ctypes.c_uint32), ("mm", ctypes.c_uint64), ("pgd", ctypes.c_uint64),
                ("comm", ctypes.c_char * 16)]


class _Ev(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("tgid", ctypes.c_uint32), ("pid", ctypes.c_uint32),
                ("ptgid", ctypes.c_uint32), ("pgd", ctypes.c_uint64), ("ts", ctypes.c_uint64),
                ("comm", ctypes.c_char * 16)]


@dataclass
class TaskRec:
    tgid: int
    pid: int
    flags: int
    comm: str
    mm: int
    pgd: int


@dataclass
class Event:
    kind: str  # exec | exit | fork
    tgid: int
    pid: int
    ptgid: int
    pgd: int
    boot_ns: int
    comm: str


_EVENT_KINDS = {1: "exec", 2: "exit", 3: "fork"}


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__


def headers_hint() -> str:
    build = Path(f"/lib/modules/{os.uname().release}/build")
    if not (build / "include/uapi/linux/bpf.h").exists() and not Path("/sys/kernel/kheaders.tar.xz").exists():
        return (f" (bcc needs a kernel-headers tree at {build}; any distro linux-headers package "
                "linked there works, the programs use UAPI headers only)")
    return ""


class Session:
    """One compiled set of programs; methods load and attach what they need."""

    KREAD_BATCH = KREAD_BATCH

    def __init__(self, bcc_module: Any, offsets: dict[str, int]) -> None:
        self.bcc = bcc_module
        self.offsets = offsets
        self.cflags = [f"-D{k}_OFF={v}" for k, v in offsets.items()] + [
            f"-DCHUNK={CHUNK}", f"-DMAX_TASKS={MAX_TASKS}", f"-DKREAD_BATCH={KREAD_BATCH}"]
        self._trigger_ready = False
        self._switch_attached = False
        try:
            self.b = bcc_module.BPF(text=_MAIN, cflags=self.cflags)
        except Exception as e:  # noqa: BLE001 - bcc raises bare Exception
            raise BpfUnavailable(f"bcc could not compile the agent's BPF programs: {_short(e)}"
                                 + headers_hint()) from None

    @classmethod
    def open(cls) -> Session:
        if os.geteuid() != 0:
            raise BpfUnavailable("BPF needs root (or CAP_BPF + CAP_PERFMON)")
        try:
            import bcc  # optional: only where python3-bpfcc is installed
        except ImportError:
            raise BpfUnavailable("bcc is not installed (Debian/Ubuntu: apt-get install python3-bpfcc; "
                                 "Fedora: dnf install python3-bcc); without it mm->pgd cannot be read") from None
        try:
            btf = Btf.load()
            offsets = {k: btf.member_offset(s, m) for k, (s, m) in _OFFSETS.items()}
        except BtfError as e:
            raise BpfUnavailable(f"kernel BTF: {e}") from None
        return cls(bcc, offsets)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # noqa: BLE001 - best-effort teardown of bcc state
            self.b.cleanup()

    # -- programs ------------------------------------------------------------------
    def _load(self, name: str) -> Any:
        try:
            return self.b.load_func(name, self.bcc.BPF.RAW_TRACEPOINT)
        except Exception as e:  # noqa: BLE001
            raise BpfUnavailable(f"the kernel refused raw tracepoint program {name}: {_short(e)}") from None

    def _attach(self, tp: str, name: str) -> None:
        self._load(name)
        try:
            self.b.attach_raw_tracepoint(tp=tp.encode(), fn_name=name.encode())
        except Exception as e:  # noqa: BLE001
            raise BpfUnavailable(f"cannot attach to raw tracepoint {tp}: {_short(e)}") from None

    def _ensure_trigger(self) -> None:
        if self._trigger_ready:
            return
        chunk = self._load("vg_walk_chunk")
        self.b["chain"][ctypes.c_int(0)] = ctypes.c_int(chunk.fd)
        self._attach("sys_enter", "vg_trigger")
        self._trigger_ready = True

    def detach_trigger(self) -> None:
        """Stop running vg_trigger on every system call (watch mode keeps only the process hooks)."""
        if self._trigger_ready:
            with contextlib.suppress(Exception):  # noqa: BLE001 - bcc raises bare Exception
                self.b.detach_raw_tracepoint(tp=b"sys_enter")
            self._trigger_ready = False

    def _request(self, op: int, nread: int = 0) -> object:
        ctl = self.b["ctl"]
        c = ctl[ctypes.c_int(0)]
        c.tgid, c.op, c.done, c.nread = os.getpid(), op, 0, nread
        ctl[ctypes.c_int(0)] = c
        os.getppid()  # any system call of ours runs the request
        return ctl[ctypes.c_int(0)]

    def leader_pgds(self, method: str) -> dict[int, tuple[int, str]]:
        """tgid -> (mm->pgd, comm) of every process with an mm, by `method` ("bpf-iter" or the task walk)."""
        tasks = self.iter_tasks() if method == "bpf-iter" else self.walk_tasks()
        return {t.tgid: (t.pgd, t.comm) for t in tasks if t.pgd and t.tgid == t.pid}

    def walk_tasks(self) -> list[TaskRec]:
        """Every process (thread-group leaders) and its mm->pgd, walking the task list in BPF."""
        self._ensure_trigger()
        c = self._request(1)
        if c.done == 4 or c.done == 0 and c.n == 0:
            raise BpfUnavailable("the task-list walk did not run (tail call refused)")
        if c.done == 2:
            raise BpfUnavailable("the task list could not be read (bpf_probe_read_kernel failed)")
        table = self.b["tasks"]
        out = []
        for i in range(c.n):
            r = table[ctypes.c_int(i)]
            out.append(TaskRec(r.tgid, r.pid, r.flags, _comm(r.comm), r.mm, r.pgd))
        return out

    def iter_tasks(self) -> list[TaskRec]:
        """The same through a BPF task iterator (needs BPF_PROG_TYPE_TRACING)."""
        try:
            b = self.bcc.BPF(text=_ITER, cflags=self.cflags)
        except Exception as e:  # noqa: BLE001
            raise BpfUnavailable(f"bcc could not compile the task iterator: {_short(e)}") from None
        try:
            try:
                fn = b.load_func("bpf_iter__task", self.bcc.BPF.TRACING)
            except Exception as e:  # noqa: BLE001
                raise BpfUnavailable(f"the kernel refused the BPF task iterator (tracing program): "
                                     f"{_short(e)}") from None
            lib = self.bcc.libbcc.lib
            lib.bcc_iter_attach.restype = ctypes.c_int
            lib.bcc_iter_attach.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
            lib.bcc_iter_create.restype = ctypes.c_int
            lib.bcc_iter_create.argtypes = [ctypes.c_int]
            link = lib.bcc_iter_attach(fn.fd, None, 0)
            if link < 0:
                raise BpfUnavailable(f"cannot attach the task iterator: {os.strerror(-link or 1)}")
            try:
                fd = lib.bcc_iter_create(link)
                if fd < 0:
                    raise BpfUnavailable(f"cannot create the task iterator: {os.strerror(-fd or 1)}")
                data = bytearray()
                with os.fdopen(fd, "rb") as f:
                    while chunk := f.read(1 << 20):
                        data += chunk
                        if len(data) > MAX_TASKS * 64 * ctypes.sizeof(_Rec):
                            break
            finally:
                os.close(link)
        finally:
            with contextlib.suppress(Exception):  # noqa: BLE001
                b.cleanup()
        size = ctypes.sizeof(_Rec)
        out = []
        for pos in range(0, len(data) - size + 1, size):
            r = _Rec.from_buffer_copy(bytes(data[pos:pos + size]))
            out.append(TaskRec(r.tgid, r.pid, r.flags, _comm(r.comm), r.mm, r.pgd))
        return out

    def kread(self, addrs: list[int]) -> list[bytes | None]:
        """32 bytes of kernel memory at each address (None where the read faulted)."""
        self._ensure_trigger()
        out: list[bytes | None] = []
        for i in range(0, len(addrs), KREAD_BATCH):
            batch = addrs[i:i + KREAD_BATCH]
            table = self.b["kread"]
            k = table[ctypes.c_int(0)]
            for j, a in enumerate(batch):
                k.addr[j] = a
                k.ok[j] = 0
            table[ctypes.c_int(0)] = k
            c = self._request(2, len(batch))
            if c.done != 1:
                raise BpfUnavailable("the kernel-memory read request did not run")
            k = table[ctypes.c_int(0)]
            for j in range(len(batch)):
                out.append(struct.pack("<4Q", *k.data[j * 4:j * 4 + 4]) if k.ok[j] else None)
        return out

    # -- scheduling and process events -----------------------------------------
    def attach_switch(self) -> None:
        if not self._switch_attached:
            self._attach("sched_switch", "vg_switch")
            self._switch_attached = True

    def detach_switch(self) -> None:
        if self._switch_attached:
            with contextlib.suppress(Exception):  # noqa: BLE001 - bcc raises bare Exception
                self.b.detach_raw_tracepoint(tp=b"sched_switch")
            self._switch_attached = False

    def seen(self) -> dict[int, tuple[int, str]]:
        return {k.value: (v.pgd, _comm(v.comm)) for k, v in self.b["seen"].items() if v.pid == v.tgid}

    def sched_window(self, seconds: float) -> dict[int, tuple[int, str]]:
        self.attach_switch()
        time.sleep(seconds)
        return self.seen()

    def start_events(self, callback: Callable[[Event], None]) -> None:

        def handle(_ctx: Any, data: Any, _size: int) -> None:
            e = ctypes.cast(data, ctypes.POINTER(_Ev)).contents
            callback(Event(_EVENT_KINDS.get(e.kind, "?"), e.tgid, e.pid, e.ptgid, e.pgd, e.ts, _comm(e.comm)))

        self.b["events"].open_ring_buffer(handle)
        for tp, fn in (("sched_process_exec", "vg_exec"), ("sched_process_exit", "vg_exit"),
                       ("sched_process_fork", "vg_fork")):
            self._attach(tp, fn)

    def poll_events(self, timeout_ms: int) -> None:
        self.b.ring_buffer_poll(timeout_ms)
