"""One analysis task of the fleet: one VM of one agent window → rows of the Parquet store.

Runs on a Dask worker (or in-process). Everything it needs is in the window file and the spool's
static data, so any node that reads the spool can run it. Its output is written by the task
itself, atomically and under a name fixed by (host, window, VM): a task that runs twice (a worker
died, `analyze` ran again) writes the same file again, never a second one.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vmprof_tui import files
from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.steal import vcpu_steal
from vmprof_tui.record.recording import KALLSYMS_KEY, load
from vmprof_tui.record.records import SAMPLE_GUEST_KERNEL

PROFILE_SCHEMA = pa.schema([
    ("host", pa.string()), ("window", pa.int64()), ("window_start", pa.timestamp("us", tz="UTC")),
    ("window_s", pa.float64()), ("vm", pa.string()), ("vcpu", pa.int32()), ("process", pa.string()),
    ("pid", pa.int64()), ("function", pa.string()), ("module", pa.string()), ("samples", pa.float64()),
    ("seconds", pa.float64()),
])
VCPU_SCHEMA = pa.schema([
    ("host", pa.string()), ("window", pa.int64()), ("window_start", pa.timestamp("us", tz="UTC")),
    ("window_s", pa.float64()), ("vm", pa.string()), ("vcpu", pa.int32()), ("state", pa.string()),
    ("cause", pa.string()), ("seconds", pa.float64()),
])
TABLES = {"profile": PROFILE_SCHEMA, "vcpu": VCPU_SCHEMA}


@dataclass(frozen=True)
class WindowRef:
    """A complete window in a spool: SPOOL/HOST/windows/W<seq>-<unix start>.vmprof."""
    host: str
    seq: int
    start_unix_s: int
    path: str

    @property
    def day(self) -> str:
        return datetime.fromtimestamp(self.start_unix_s, UTC).strftime("%Y-%m-%d")

    def output(self, store: Path, table: str, vm: str) -> Path:
        """Where the task's rows of `table` go: partitioned by host and day (hive style, as DuckDB reads it)."""
        safe_vm = "".join(c if c.isalnum() or c in "-_." else "_" for c in vm)
        return store / table / f"host={self.host}" / f"day={self.day}" / f"w{self.seq:08d}-{safe_vm}.parquet"


def vcpu_seconds(an: Analysis, vm: str) -> list[dict]:
    """Per vCPU of `vm`: seconds of guest user, guest kernel, idle, steal type 1 (by holder, by cause) and type 2
    (by exit reason), co-stop, halt polling, IRQ time while running: the figures the store keeps (not the
    causes, co-stop, polling and IRQ) and the agent's metrics export."""
    kernel = (an.samples["flags"] & SAMPLE_GUEST_KERNEL) != 0
    timelines = {tl.vcpu: tl for tl in an.vm_timelines(vm)}
    out = []
    for v in vcpu_steal(an, vm):
        tl = timelines[v["vcpu"]]
        in_guest = an.thread_mask(tl) & an.is_guest
        guest_kernel_s = float(np.count_nonzero(in_guest & kernel)) * an.sample_ns(tl) / 1e9
        out.append({"vcpu": v["vcpu"], "guest_user": max(v["guest_s"] - guest_kernel_s, 0.0),
                    "guest_kernel": guest_kernel_s, "idle": v["idle_s"], "steal_type1": v["steal_type1_s"],
                    "steal_type2": v["steal_type2_s"], "type1_by_holder": v["type1_by_holder_s"],
                    "type2_by_exit": v["type2_by_exit_s"], "type1_by_cause": v["type1_by_cause_s"],
                    "skew": v["skew_s"], "halt_poll": v["halt_poll_s"], "irq_while_running": v["irq_while_running_s"]})
    return out


def window_vms(path: str) -> tuple[list[str], float]:
    """The VMs of a window (the tasks to make for it), and the seconds it took to find them (part of t2)."""
    t = time.monotonic()
    rec = load(Path(path))
    rec.snapshot.pop(KALLSYMS_KEY, None)
    return Analysis(rec).vm_names(), time.monotonic() - t


def analyse_window_vm(ref: WindowRef, vm: str, store: str) -> dict:
    """The task: analyse one VM of one window, write its rows, return what it did (for t2)."""
    t = time.monotonic()
    rec = load(Path(ref.path))
    rec.snapshot.pop(KALLSYMS_KEY, None)  # the guest level never names host kernel code: skip its parse
    # only this VM's samples are resolved (one task per VM of the window: the others are other tasks'); the
    # sched events all stay, they say who held its pCPUs
    pids = [int(v["pid"]) for v in rec.vms() if v["name"] == vm]
    if not pids and (m := re.fullmatch(r"vm-(\d+)", vm)):  # a VM known only from its guest samples (Analysis)
        pids = [int(m.group(1))]
    an = Analysis(rec, keep=lambda s: np.isin(s["pid"], pids))
    window_s = float(rec.end["duration_s"]) if rec.end else rec.duration_s
    start = datetime.fromtimestamp(float(rec.meta.get("start_unix_s", ref.start_unix_s)), UTC)
    base = {"host": ref.host, "window": ref.seq, "window_start": start, "window_s": window_s, "vm": vm}
    profile = []
    for tl in sorted(an.vm_timelines(vm), key=lambda x: x.vcpu):
        sample_s = an.sample_ns(tl) / 1e9  # the guest profile's samples, real and virtual, at the vCPU's rate
        for r in an.guest_profile(vm, tl.vcpu).rows:
            if r.samples > 0:
                profile.append({**base, "vcpu": tl.vcpu, "process": r.process, "pid": r.pid,
                                "function": r.function, "module": r.module, "samples": float(r.samples),
                                "seconds": float(r.samples) * sample_s})
    states = []
    for v in vcpu_seconds(an, vm):
        for state in ("guest_user", "guest_kernel", "idle", "steal_type1", "steal_type2"):
            states.append({**base, "vcpu": v["vcpu"], "state": state, "cause": "", "seconds": v[state]})
        for key, state in (("type1_by_holder", "steal_type1"), ("type2_by_exit", "steal_type2")):
            states += [{**base, "vcpu": v["vcpu"], "state": state, "cause": cause, "seconds": s}
                       for cause, s in v[key].items()]
    for table, rows in (("profile", profile), ("vcpu", states)):
        write_rows(ref.output(Path(store), table, vm), rows, TABLES[table])
    return {"host": ref.host, "window": ref.seq, "vm": vm, "rows": len(profile), "seconds": time.monotonic() - t,
            "notes": list(an.notes)}


def write_rows(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    """Atomically (a private tmp file renamed): a reader sees the whole file or none of it."""
    files.make_dirs(path.parent)  # 0700, files 0600: the store names guest processes and functions
    buf = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    files.write_file(path, buf.getvalue().to_pybytes())
