"""The fleet's analysis task and its reference: one agent window → rows of the Parquet store.

`analyse_window` is the task: it reads the window once (fleet/one_pass.py) and writes every VM's tables and the
host's.  `analyse_window_vm` and `analyse_window_host`, one VM or the host level of a window read whole, are the
reference the tests compare it with.  A task runs on a Dask worker (or in-process); everything it needs is in the
window file and the spool's static data, so any node that reads the spool can run it.  Its output is written by the
task itself, atomically and under a name fixed by (host, window, VM): a task that runs twice (a worker died,
`analyze` ran again) writes the same file again, never a second one.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vmprof_tui import files
from vmprof_tui.analyse.analysis import Analysis, analyse
from vmprof_tui.analyse.shares import Row
from vmprof_tui.analyse.source import ProfileSource, RecordingSource
from vmprof_tui.analyse.stream import RowColumns, WholeNeeded
from vmprof_tui.fleet.one_pass import WindowPass
from vmprof_tui.record.bpf_records import SAMPLE_GUEST
from vmprof_tui.record.recording import KALLSYMS_KEY, Recording, RecordingError, load
from vmprof_tui.resolve.prepare import learn_vms

# Every table starts with these columns (a window is named `window_id`, not `window`: WINDOW is a reserved word
# in SQL, and a column of that name needs quoting in every query a user writes).
_WINDOW = [("host", pa.string()), ("window_id", pa.int64()), ("window_start", pa.timestamp("us", tz="UTC")),
           ("window_s", pa.float64())]
_FUNCTION = [("process", pa.string()), ("pid", pa.int64()), ("function", pa.string()), ("module", pa.string()),
             ("samples", pa.float64()), ("seconds", pa.float64())]
_VCPU = [("vm", pa.string()), ("vcpu", pa.int32())]
PROFILE_SCHEMA = pa.schema(_WINDOW + _VCPU + _FUNCTION)  # a VM's guest profile, per vCPU
HOST_PROFILE_SCHEMA = pa.schema(_WINDOW + [("vm", pa.string())] + _FUNCTION)  # the host level; vm: rows of VM time
# state totals: guest_user + guest_kernel + idle + steal_type1 + steal_type2 is the vCPU's time, nothing twice
VCPU_SCHEMA = pa.schema(_WINDOW + _VCPU + [("state", pa.string()), ("seconds", pa.float64())])
# steal by cause: type 1 by why it waited (preempted, wakeup, throttled, irq), type 2 by exit reason; they add up
# to steal_type1 + steal_type2 of `vcpu`
STEAL_SCHEMA = pa.schema(_WINDOW + _VCPU + [("type", pa.int32()), ("cause", pa.string()), ("seconds", pa.float64())])
# type-1 steal by who held the pCPU (host process, or another vCPU): adds up to steal_type1
HOLDER_SCHEMA = pa.schema(_WINDOW + _VCPU + [("holder", pa.string()), ("seconds", pa.float64())])
# figures that overlap the states (not to be added to them): costop (part of steal: waiting while a sibling
# vCPU ran), halt_poll (KVM polling a halted vCPU), irq_while_running (IRQ time inside the vCPU's run time)
VCPU_OTHER_SCHEMA = pa.schema(_WINDOW + _VCPU + [("what", pa.string()), ("seconds", pa.float64())])
TABLES = {"profile": PROFILE_SCHEMA, "vcpu": VCPU_SCHEMA, "steal": STEAL_SCHEMA, "steal_holder": HOLDER_SCHEMA,
          "vcpu_other": VCPU_OTHER_SCHEMA, "host_profile": HOST_PROFILE_SCHEMA}
VM_TABLES = ("profile", "vcpu", "steal", "steal_holder", "vcpu_other")  # written by a VM's task
HOST_TASK = ""  # the VM name of a window's host task (the host level's profile), not a VM
STATES = ("guest_user", "guest_kernel", "idle", "steal_type1", "steal_type2")
_NAME_COLUMNS = ("process", "function", "module")  # a profile's names: hundreds of thousands a window
OTHER_FIGURES = (("costop", "skew"), ("halt_poll", "halt_poll"), ("irq_while_running", "irq_while_running"))


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


def vcpu_seconds(source: ProfileSource, vm: str) -> list[dict]:
    """Per vCPU of `vm`: seconds of guest user, guest kernel, idle, steal type 1 (by holder, by cause) and type 2
    (by exit reason), co-stop, halt polling, IRQ time while running: the figures the store keeps and the
    agent's metrics export.  Guest time is split between kernel and user mode as the guest profile's samples are."""
    out = []
    for v in source.vcpu_steal(vm):
        shares = source.guest_ratios(vm, v["vcpu"])
        in_guest = shares["os"] + shares["user"]
        guest_kernel_s = v["guest_s"] * shares["os"] / in_guest if in_guest else 0.0
        out.append({"vcpu": v["vcpu"], "guest_user": max(v["guest_s"] - guest_kernel_s, 0.0),
                    "guest_kernel": guest_kernel_s, "idle": v["idle_s"], "steal_type1": v["steal_type1_s"],
                    "steal_type2": v["steal_type2_s"], "type1_by_holder": v["type1_by_holder_s"],
                    "type2_by_exit": v["type2_by_exit_s"], "type1_by_cause": v["type1_by_cause_s"],
                    "skew": v["skew_s"], "halt_poll": v["halt_poll_s"], "irq_while_running": v["irq_while_running_s"]})
    return out


def window_vms(path: str) -> tuple[list[str], float]:
    """The VMs of a window, as its analysis names them (Analysis.vm_names: the VM list's, and those known only
    from guest samples), without analysing it; and the seconds it took."""
    t = time.monotonic()
    rec = load(Path(path))
    vms = learn_vms(rec, rec.samples, (rec.samples["flags"] & SAMPLE_GUEST) != 0)
    return sorted(set(vms.by_pid.values()), key=lambda n: vms.index.get(n, 0)), time.monotonic() - t


def _window_base(ref: WindowRef, rec: Recording) -> dict:
    window_s = float(rec.end["duration_s"]) if rec.end else rec.duration_s
    start = datetime.fromtimestamp(float(rec.meta.get("start_unix_s", ref.start_unix_s)), UTC)
    return {"host": ref.host, "window_id": ref.seq, "window_start": start, "window_s": window_s}


# rows of a function table: the columns every row shares (host, window, VM, vCPU), and the others, each a
# column (a window's guest profiles have hundreds of thousands of rows: no dict per row)
Block = tuple[dict, dict[str, object]]


def _function_rows(base: dict, rows: list[Row], sample_s: float) -> Block:
    kept = [r for r in rows if r.samples > 0]
    samples = np.array([float(r.samples) for r in kept], float)
    return base, {"process": [r.process for r in kept], "pid": [r.pid for r in kept],
                  "function": [r.function for r in kept], "module": [r.module for r in kept], "samples": samples,
                  "seconds": samples * sample_s, "vm": [r.vm for r in kept]}


def function_columns(base: dict, c: RowColumns | None, sample_s: float, vm: str | None, arrow: dict) -> Block:
    """_function_rows of stream.StreamedAnalysis rows given as columns (their Row: process "" and pid -1 are none).
    arrow: the window's string tables as Arrow arrays, made once (by id; the table is kept so the id stays its own)."""
    if c is None:
        return _function_rows(base, [], sample_s)
    keep = np.flatnonzero(c.samples > 0)
    if id(c.strings) not in arrow:
        arrow[id(c.strings)] = (c.strings, pa.array(c.strings, pa.string()))
    strings = arrow[id(c.strings)][1]
    function, module, process = (strings.take(c.ids[n][keep]) for n in ("func", "module", "process"))
    pid, samples = c.pid[keep], c.samples[keep].astype(float)
    return base, {"process": pc.if_else(pc.equal(process, ""), pa.scalar(None, pa.string()), process),
                  "pid": pa.array(pid, pa.int64(), mask=pid < 0), "function": function, "module": module,
                  "samples": samples, "seconds": samples * sample_s, "vm": [vm] * len(keep)}


def _profile_blocks(arrow: dict, base: dict, columns: RowColumns | None, virtual: list[Row], sample_s: float
                    ) -> list[Block]:
    """One vCPU's profile rows (of the one pass): its functions, then its virtual rows."""
    return [function_columns(base, columns, sample_s, base["vm"], arrow), _function_rows(base, virtual, sample_s)]


def table_of(blocks: list[Block], schema: pa.Schema) -> pa.Table:
    """The blocks' rows one after the other, as a table of `schema`."""
    columns = []
    for f in schema:
        parts = []
        for base, cols in blocks:
            n = len(cols["samples"])  # type: ignore[arg-type]
            if f.name in cols and not (f.name == "vm" and "vm" in base):
                parts.append(pa.array(cols[f.name], f.type))
            else:
                parts.append(pa.repeat(pa.scalar(base[f.name], f.type), n))
        columns.append(pa.concat_arrays(parts) if parts else pa.array([], f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def analyse_window_vm(ref: WindowRef, vm: str, store: str) -> dict:
    """One VM of one window (or, for HOST_TASK, the window's host level) analysed whole, its rows written: the
    reference the one-pass task (analyse_window) is tested against."""
    if vm == HOST_TASK:
        return analyse_window_host(ref, store)
    t = time.monotonic()
    rec = load(Path(ref.path))
    rec.snapshot.pop(KALLSYMS_KEY, None)  # the guest level never names host kernel code: skip its parse
    # only this VM's samples are resolved; the sched events all stay, they say who held its pCPUs
    pids = [int(v["pid"]) for v in rec.vms() if v["name"] == vm]
    if not pids and (m := re.fullmatch(r"vm-(\d+)", vm)):  # a VM known only from its guest samples (Analysis)
        pids = [int(m.group(1))]
    an = analyse(rec, keep=lambda s: np.isin(s["pid"], pids))
    tables = _whole_vm_tables(an, {**_window_base(ref, rec), "vm": vm}, vm)
    for name, table in tables.items():
        write_table(ref.output(Path(store), name, vm), table)
    return {"host": ref.host, "window": ref.seq, "vm": vm, "rows": tables["profile"].num_rows,
            "seconds": time.monotonic() - t, "notes": list(an.notes)}


def _whole_vm_tables(an: Analysis, base: dict, vm: str) -> dict[str, pa.Table]:
    timelines = sorted(an.vm_timelines(vm), key=lambda x: x.vcpu)
    profiles = [_function_rows({**base, "vcpu": tl.vcpu}, an.guest_profile(vm, tl.vcpu).rows,
                               an.vcpus.sample_ns(tl) / 1e9) for tl in timelines]
    return vm_tables(base, profiles, vcpu_seconds(RecordingSource(an), vm))


def vm_tables(base: dict, profiles: list[Block], seconds: list[dict]) -> dict[str, pa.Table]:
    """A VM's table of each of VM_TABLES: its guest profile per vCPU (blocks: real and virtual samples at the
    vCPU's rate), and its vcpu_seconds."""
    tables: dict[str, list[dict]] = {name: [] for name in VM_TABLES[1:]}
    for v in seconds:
        at = {**base, "vcpu": v["vcpu"]}
        tables["vcpu"] += [{**at, "state": state, "seconds": v[state]} for state in STATES]
        tables["steal"] += [{**at, "type": 1, "cause": c, "seconds": s} for c, s in v["type1_by_cause"].items()]
        tables["steal"] += [{**at, "type": 2, "cause": c, "seconds": s} for c, s in v["type2_by_exit"].items()]
        tables["steal_holder"] += [{**at, "holder": h, "seconds": s} for h, s in v["type1_by_holder"].items()]
        tables["vcpu_other"] += [{**at, "what": what, "seconds": v[key]} for what, key in OTHER_FIGURES]
    return {"profile": table_of(profiles, PROFILE_SCHEMA),
            **{name: pa.Table.from_pylist(rows, schema=TABLES[name]) for name, rows in tables.items()}}


def host_table(base: dict, rows: list[Row], period_s: float, columns: Block | None = None) -> pa.Table:
    """The host_profile rows of a window's host profile (its function rows as columns, when given so: `rows`
    are the rest of them)."""
    return table_of([b for b in (columns, _function_rows(base, rows, period_s)) if b is not None],
                    HOST_PROFILE_SCHEMA)


def analyse_window_host(ref: WindowRef, store: str) -> dict:
    """The host level of one window (every host process, the kernel, each VM's time, CPU idle) into
    host_profile: what `vmprof report WINDOW` shows."""
    t = time.monotonic()
    rec = load(Path(ref.path))
    an = analyse(rec)
    table = host_table(_window_base(ref, rec), an.host_profile().rows, an.period_ns / 1e9)
    write_table(ref.output(Path(store), "host_profile", "host"), table)
    return {"host": ref.host, "window": ref.seq, "vm": HOST_TASK, "rows": table.num_rows,
            "seconds": time.monotonic() - t, "notes": list(an.notes)}


def check_window(path: str) -> tuple[str | None, Recording | None]:
    """(None, the window loaded) when it is usable, else (why not, None): a corrupt or cut window (the agent renames
    only complete ones, so any damage came later) is skipped with this note, never analysed as a window with rows
    missing; lesser problems (static data missing) only leave notes in the analysis."""
    if not Path(path).exists():  # retention on the agent deleted it since it was found: not corrupt
        return "gone: deleted from the spool before it was analysed", None
    try:
        rec = load(Path(path))
    except RecordingError as e:
        return f"corrupt: {e}", None
    if (damage := rec.damage()) is not None:
        return f"{damage} (first: {rec.problems[0].split(': skipped')[0]})", None
    return (None, rec) if rec.end is not None else ("corrupt: " + "; ".join(rec.problems), None)


def analyse_window(ref: WindowRef, store: str) -> dict:
    """The analysis node's task: one window read once (a piece at a time, one_pass.py; whole when it cannot be),
    every VM's rows and the host's written as analyse_window_vm writes them; what it did (for t2), with the
    error of a window skipped as corrupt or gone (check_window)."""
    t, cpu = time.monotonic(), time.process_time()
    try:
        one = WindowPass(Path(ref.path))  # its scan checks every chunk: an intact window
    except WholeNeeded:
        why, rec = check_window(ref.path)  # loaded once: checked, then analysed whole
        if rec is None:
            return {"host": ref.host, "window": ref.seq, "vms": [], "rows": 0, "seconds": time.monotonic() - t,
                    "cpu_seconds": time.process_time() - cpu, "notes": [], "error": why}
        an = analyse(rec)
        base = _window_base(ref, rec)
        vms = an.vm_names()
        per_vm = {vm: _whole_vm_tables(an, {**base, "vm": vm}, vm) for vm in vms}
        host, notes = host_table(base, an.host_profile().rows, an.period_ns / 1e9), list(an.notes)
    else:
        base = _window_base(ref, one.rec)
        vms = one.vm_names()
        per_vm = {}
        arrow: dict = {}  # of this window only (a worker may run two windows at once)
        for vm in vms:
            blocks = [b for v, tid in one.vcpu_threads(vm)
                      for b in _profile_blocks(arrow, {**base, "vm": vm, "vcpu": v}, *one.profile_parts(vm, v, tid))]
            per_vm[vm] = vm_tables({**base, "vm": vm}, blocks, one.vcpu_seconds(vm))
        host = host_table(base, one.other_rows(), one.period_ns / 1e9,
                          function_columns(base, one.row_columns(one.host_rows), one.period_ns / 1e9, None, arrow))
        notes = list(one.notes)
    for vm, tables in per_vm.items():
        for name, table in tables.items():
            write_table(ref.output(Path(store), name, vm), table)
    write_table(ref.output(Path(store), "host_profile", "host"), host)
    # cpu_seconds: the worker process's CPU time meanwhile (the reader thread's too): t2 on a node of its own
    return {"host": ref.host, "window": ref.seq, "vms": vms, "seconds": time.monotonic() - t, "notes": notes,
            "cpu_seconds": time.process_time() - cpu, "rows": sum(t["profile"].num_rows for t in per_vm.values())}


def write_table(path: Path, table: pa.Table) -> None:
    """Atomically (a private tmp file renamed): a reader sees the whole file or none of it."""
    files.make_dirs(path.parent)  # 0700, files 0600: the store names guest processes and functions
    buf = pa.BufferOutputStream()
    # no min/max statistics of the names (a tenth of the writing): a query filters by host, window, VM, vCPU
    pq.write_table(table, buf, write_statistics=[n for n in table.column_names if n not in _NAME_COLUMNS])
    files.write_file(path, buf.getvalue().to_pybytes())
