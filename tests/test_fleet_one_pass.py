"""The analysis node's one pass over a window (fleet/one_pass.py, tasks.analyse_window) against the per-VM tasks
that read the whole window once per VM and once for the host (tasks.analyse_window_vm, the reference): the same
Parquet tables, row for row, with the same figures up to float rounding.  The window is synthetic (tests/synth.py)
and read in many pieces: vCPUs run, halt, are preempted by host tasks and each other, and exit to KVM across
piece boundaries."""

from __future__ import annotations

import math
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from synth import MS, VMX_IO, SynthRecording, busy_recording

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.fleet import one_pass
from vmprof_tui.fleet.analyse import find_windows
from vmprof_tui.fleet.tasks import HOST_TASK, TABLES, WindowRef, analyse_window, analyse_window_vm, window_vms
from vmprof_tui.record.bpf_records import SCHED_NOT_SWITCH
from vmprof_tui.record.recording import load
from vmprof_tui.resolve.prepare import prepare, recording_span


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> WindowRef:
    folder = tmp_path_factory.mktemp("spool") / "h1" / "windows"
    folder.mkdir(parents=True)
    busy_recording(folder / "W00000001-1800000000.vmprof", 6.0)
    return find_windows([folder.parent.parent])[0]


def tables(store: Path) -> dict[str, dict[tuple, list[dict]]]:
    """Each table's rows by their key (every column but the figures: a VM's name reused by a second VM in the window
    gives two threads of one vCPU), from every file of the store."""
    out: dict[str, dict[tuple, list[dict]]] = {}
    for name in TABLES:
        keyed: dict[tuple, list[dict]] = defaultdict(list)
        for f in sorted((store / name).rglob("*.parquet")):
            for r in pq.read_table(f).to_pylist():
                keyed[tuple(v for k, v in r.items() if k not in ("samples", "seconds"))].append(r)
        out[name] = {k: sorted(rows, key=lambda r: r.get("samples", r["seconds"])) for k, rows in keyed.items()}
    return out


def test_window_vms_names_the_vms_without_analysing(window: WindowRef) -> None:
    vms, seconds = window_vms(window.path)
    assert vms == ["db", "web"] and seconds >= 0


@pytest.mark.parametrize("piece_rows", [1000, 1 << 30])
def test_one_pass_writes_the_tables_the_per_vm_tasks_write(window: WindowRef, piece_rows: int, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for vm in [*window_vms(window.path)[0], HOST_TASK]:
        analyse_window_vm(window, vm, str(tmp_path / "reference"))
    made: list[one_pass.WindowPass] = []
    init = one_pass.WindowPass.__init__

    def counted(self: one_pass.WindowPass, path: Path, rows: int = piece_rows) -> None:
        init(self, path, piece_rows)
        made.append(self)

    monkeypatch.setattr(one_pass.WindowPass, "__init__", counted)
    out = analyse_window(window, str(tmp_path / "one"))
    assert out["vms"] == ["db", "web"]
    assert made[0].pieces == (12 if piece_rows == 1000 else 1)
    assert_same_tables(tmp_path / "one", tmp_path / "reference")


def assert_same_tables(store: Path, reference_store: Path) -> None:
    """The same files, of the same schema, with the same rows (in an order of the resolver's name codes, which differ
    as the samples resolved differ: compared sorted), the same figures up to float rounding."""
    files = sorted(p.relative_to(reference_store) for p in reference_store.rglob("*.parquet"))
    assert files == sorted(p.relative_to(store) for p in store.rglob("*.parquet"))
    for f in files:
        ref, mine_ = (pq.read_table(root / f) for root in (reference_store, store))
        assert ref.schema == mine_.schema
        names = [n for n in ref.column_names if n not in ("samples", "seconds")]
        ref, mine_ = (t.select(names).sort_by([(n, "ascending") for n in names]) for t in (ref, mine_))
        assert ref.equals(mine_), f"{f}: other rows"
    reference, mine = tables(reference_store), tables(store)
    for name in TABLES:
        assert mine[name].keys() == reference[name].keys(), f"the {name} table has other rows"
        assert reference[name], f"no rows in {name} to compare"
        for key, rows in reference[name].items():
            assert len(mine[name][key]) == len(rows), (name, key)
            for row, other in zip(rows, mine[name][key], strict=True):
                for figure in ("samples", "seconds"):
                    if figure in row:
                        assert math.isclose(other[figure], row[figure], rel_tol=1e-9, abs_tol=1e-12), \
                            (name, key, figure, other[figure], row[figure])


def test_one_pass_sums_its_pieces_rows_by_name_code_without_row_keys(window: WindowRef, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece's rows are summed by the resolver's name codes (Analysis.row_counts_of): the per-sample keys of a
    whole analysis' rows are CPU time the window's task never reads."""
    for vm in [*window_vms(window.path)[0], HOST_TASK]:
        analyse_window_vm(window, vm, str(tmp_path / "reference"))

    def no_keys(an: Analysis) -> None:
        raise AssertionError("a piece of the one pass made the per-sample row keys")

    monkeypatch.setattr(Analysis, "_encode_keys", no_keys)
    analyse_window(window, str(tmp_path / "one"))
    assert_same_tables(tmp_path / "one", tmp_path / "reference")


def test_analyser_workers_keep_glibc_malloc_thresholds(tmp_path: Path) -> None:
    """Dask's nanny sets MALLOC_TRIM_THRESHOLD_, which fixes glibc's thresholds: every large array is then mapped
    anew, and a window's analysis takes twice the CPU time.  The embedded cluster's workers run without it."""
    import os

    from vmprof_tui.fleet.analyse import Analyser

    with Analyser(tmp_path / "store", workers=1) as an:
        seen = an._client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert list(seen.values()) == [None]


def test_analyser_workers_run_without_dasks_statistical_profiler(tmp_path: Path) -> None:
    """Dask's workers sample the running task's stack every 10 ms: CPU time a window's analysis pays for."""
    import dask

    from vmprof_tui.fleet.analyse import Analyser

    with Analyser(tmp_path / "store", workers=1) as an:
        seen = an._client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
    assert list(seen.values()) == [False]


def test_one_pass_of_a_vm_name_two_vms_had_writes_what_the_per_vm_tasks_write(tmp_path: Path) -> None:
    """A VM stopped and another of its name started within the window: two threads of one vCPU, each priced at
    its own rate (the streamed sums are kept by thread)."""
    b = SynthRecording(frequency=1000, cpus=2)
    first, second = b.vm("web", pid=100, vcpus={0: 101}), b.vm("web", pid=300, vcpus={0: 301})
    slot = 10 * MS
    for k in range(200):
        t0 = k * slot
        b.host_task(500, "app", cpu=0, start_ns=t0, end_ns=t0 + slot)
        vm = first if k < 100 else second
        if k % 3 or k in (99, 199):  # each VM's last slot a run: a preemption ends where it runs again
            b.run(vm, 0, cpu=1, start_ns=t0, end_ns=t0 + slot - 2 * MS)
            b.vmm_work(vm, 0, cpu=1, start_ns=t0 + slot - 2 * MS, end_ns=t0 + slot, exit_reason=VMX_IO)
        else:
            b.preempt(vm, 0, start_ns=t0, end_ns=t0 + slot)
            b.host_task(600, "worker", cpu=1, start_ns=t0, end_ns=t0 + slot)
    folder = tmp_path / "spool" / "h1" / "windows"
    folder.mkdir(parents=True)
    b.write(folder / "W00000001-1800000000.vmprof")
    ref = find_windows([tmp_path / "spool"])[0]
    for vm in [*window_vms(ref.path)[0], HOST_TASK]:
        analyse_window_vm(ref, vm, str(tmp_path / "reference"))
    analyse_window(ref, str(tmp_path / "one"))
    assert_same_tables(tmp_path / "one", tmp_path / "reference")
    assert len(tables(tmp_path / "one")["vcpu"]) == 5 and all(
        len(rows) == 2 for rows in tables(tmp_path / "one")["vcpu"].values())  # two threads of vCPU 0, each state


def test_on_cpu_time_of_a_time_range_is_of_its_runs_as_in_the_whole_recording(window: WindowRef) -> None:
    """A switch-out that went unrecorded (a switch-in after a switch-in): the stretch between is neither a run nor
    a blank, in a time range (a piece, a live chunk) as in the whole recording."""
    rec = load(Path(window.path))
    tid = 101
    outs = np.flatnonzero((rec.sched["prev_tid"] == tid) & ((rec.sched["flags"] & SCHED_NOT_SWITCH) == 0))
    rec.sched = np.delete(rec.sched, outs[len(outs) // 2])
    whole = Analysis(prepare(rec)).timelines
    ranged = Analysis(prepare(rec, span_ns=recording_span(rec))).timelines
    assert {t: tl.on_cpu_ns for t, tl in ranged.items()} == {t: tl.on_cpu_ns for t, tl in whole.items()}
    assert whole[tid].on_cpu_ns + sum(b.duration_ns for b in whole[tid].blanks) < whole[tid].wall_ns


def _window_with_bundles(path: Path, kernel_fn: str) -> None:
    """Two VMs running guest kernel code named by their bundles (db's function named `kernel_fn`)."""
    b = SynthRecording(frequency=1000, cpus=2)
    web, db = b.vm("web", pid=100, vcpus={0: 101}), b.vm("db", pid=200, vcpus={0: 201})
    b.guest_kernel_symbols(web, {"web_fn": 0xFFFFFFFF81000000})
    b.guest_kernel_symbols(db, {kernel_fn: 0xFFFFFFFF81000000})
    for k in range(100):
        t0 = k * 10 * MS
        b.run(web, 0, cpu=0, start_ns=t0, end_ns=t0 + 10 * MS, guest_ip=0xFFFFFFFF81000100, kernel=True)
        b.run(db, 0, cpu=1, start_ns=t0, end_ns=t0 + 8 * MS, guest_ip=0xFFFFFFFF81000100, kernel=True)
        b.host_task(500, "app", cpu=1, start_ns=t0 + 8 * MS, end_ns=t0 + 10 * MS)
    b.write(path)


def test_a_worker_parses_each_guest_bundle_and_kallsyms_once_by_content(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows after the first reuse the bundles and kallsyms a worker parsed (fleet/warm.py), a bundle whose
    content changed is parsed anew, and every window's tables are those of the per-VM tasks."""
    from vmprof_tui.fleet import warm

    monkeypatch.setattr(one_pass, "WARM", warm.WarmSymbols())
    parsed: list[str] = []
    guest_symbols, kallsyms_table = warm.guest_symbols, warm.kallsyms_table
    monkeypatch.setattr(warm, "guest_symbols", lambda vm, data: parsed.append(vm) or guest_symbols(vm, data))
    monkeypatch.setattr(warm, "kallsyms_table", lambda *a: parsed.append("kallsyms") or kallsyms_table(*a))
    folder = tmp_path / "spool" / "h1" / "windows"
    folder.mkdir(parents=True)
    _window_with_bundles(folder / "W00000001-1800000060.vmprof", "db_fn")
    shutil.copy(folder / "W00000001-1800000060.vmprof", folder / "W00000002-1800000120.vmprof")  # the same bundles
    _window_with_bundles(folder / "W00000003-1800000180.vmprof", "db_fn_v2")
    seen = []
    for ref in find_windows([tmp_path / "spool"]):
        for vm in [*window_vms(ref.path)[0], HOST_TASK]:
            analyse_window_vm(ref, vm, str(tmp_path / f"reference{ref.seq}"))
        analyse_window(ref, str(tmp_path / f"one{ref.seq}"))
        assert_same_tables(tmp_path / f"one{ref.seq}", tmp_path / f"reference{ref.seq}")
        seen.append(sorted(parsed))
        parsed.clear()
    # window 3's bundles are written anew (their tar headers' times differ too): new content, parsed again
    assert seen == [["db", "kallsyms", "web"], [], ["db", "web"]]
    functions = {r["function"] for rows in tables(tmp_path / "one3")["profile"].values() for r in rows}
    assert {"web_fn", "db_fn_v2"} <= functions and "db_fn" not in functions
