"""`vmprof agent` stores host objects' symbol tables once per build id (issue 12: static data is stored once
per change and referenced): a window names a host process's functions after its object file is gone or
replaced by another build, and a bad stored table costs only that object's names."""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import require_root, start_sampling

from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.record import recording
from vmprof_tui.record.recording import MAX_OBJECT_TABLE, OBJECTS_REF_KEY, object_ref
from vmprof_tui.record.spool import Spool
from vmprof_tui.record.writer import Writer
from vmprof_tui.resolve.elf import read_build_id, read_elf_symbols_uncached
from vmprof_tui.resolve.object_table import decode_object_table, encode_object_table

PROGRAM = """#include <stdint.h>
volatile uint64_t sink;
__attribute__((noinline)) void FIRST(void) { for (uint64_t i = 0; i < 20000000; i++) sink += i; }
__attribute__((noinline)) void SECOND(void) { for (uint64_t i = 0; i < 20000000; i++) sink ^= i; }
int main(void) { for (;;) { FIRST(); SECOND(); } }
"""


def build(source_dir: Path, out: Path, first: str, second: str) -> str:
    """Compile the busy program with these two function names; returns its build id."""
    src = source_dir / f"{first}.c"
    src.write_text(PROGRAM)
    subprocess.run(["gcc", "-O1", f"-DFIRST={first}", f"-DSECOND={second}", "-o", str(out), str(src)], check=True)
    build_id = read_build_id(out)
    assert build_id, "gcc here writes a GNU build id"
    return build_id


@dataclass
class Run:
    spool: Spool
    program: Path  # where the sampled program was (replaced by another build after the run)
    build_id: str  # of the program that ran
    windows: list[Path]  # windows in which it was sampled


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The agent (1 s windows) while a host program of ours runs, until two windows referencing its table."""
    require_root()
    tmp = tmp_path_factory.mktemp("objects")
    program = tmp / "bin" / "hostbusy"
    program.parent.mkdir()
    build_id = build(tmp, program, "spin_alpha", "spin_beta")
    spool = Spool(tmp / "spool", "h1")
    agent = start_sampling("agent", "--spool", str(tmp / "spool"), "--host", "h1", "--window", "1s")
    busy = subprocess.Popen([str(program)])
    try:
        seen: list[Path] = []
        while len(seen) < 2:
            for w in spool.complete_windows():
                if w not in seen and build_id in (recording.load(w).snapshot.get(OBJECTS_REF_KEY) or {}):
                    seen.append(w)
            with pytest.raises(subprocess.TimeoutExpired):  # readiness: the next window, the agent still runs
                agent.wait(timeout=0.2)
    finally:
        busy.kill()
        busy.wait()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0, "".join(agent.lines)
    # another build at the same path: on this machine as on an analysis node with a different build
    assert build(tmp, program, "gamma_other", "delta_other") != build_id
    return Run(spool, program, build_id, seen)


def busy_functions(rec: recording.Recording) -> tuple[dict[str, float], list[str]]:
    an = analyse(rec)
    return {r.function: r.samples for r in an.host_profile().rows if r.process == "hostbusy"}, an.notes


def test_windows_name_host_code_from_the_spool_after_the_file_changed(run: Run) -> None:
    for w in run.windows:
        functions, notes = busy_functions(recording.load(w))
        print(w.name, functions, notes)
        assert {"spin_alpha", "spin_beta"} <= set(functions), (functions, notes)
        assert not {"gamma_other", "delta_other"} & set(functions), "the replaced file's names are never used"
    run.program.unlink()  # gone altogether
    functions, _ = busy_functions(recording.load(run.windows[-1]))
    assert {"spin_alpha", "spin_beta"} <= set(functions)


def test_a_local_file_of_another_build_is_not_used(run: Run) -> None:
    """Without the stored table (a window of an older agent), the local file of another build would name the
    wrong functions: its samples are [unknown], with a note saying why."""
    build(run.program.parent.parent, run.program, "gamma_other", "delta_other")  # the other test removed it
    rec = recording.load(run.windows[0])
    rec.object_tables.clear()
    functions, notes = busy_functions(rec)
    assert not {"spin_alpha", "spin_beta", "gamma_other", "delta_other"} & set(functions), functions
    assert functions.get("[unknown]", 0) > 0
    assert any("not the sampled build" in n and run.build_id in n for n in notes), notes


def test_tables_are_stored_once_and_referenced(run: Run) -> None:
    refs = [recording.load(w).snapshot[OBJECTS_REF_KEY] for w in run.windows]
    assert refs[0][run.build_id] == refs[1][run.build_id] == object_ref(run.build_id)
    tables = sorted(run.spool.static.glob("elf-*.txt.gz"))
    log = run.spool.read_log()
    assert len(tables) == sum(w["objects_stored"] for w in log), "each build id's table stored once"
    print(f"{len(tables)} tables, {sum(p.stat().st_size for p in tables)} bytes, "
          f"{sum(w['objects_cpu_s'] for w in log):.3f} s writer CPU over {len(log)} windows")
    text = gzip.decompress((run.spool.static / f"elf-{run.build_id}.txt.gz").read_bytes()).decode()
    assert json.loads(text.splitlines()[0])["build_id"] == run.build_id and "spin_alpha" in text


@pytest.mark.parametrize("damage", ["garbage", "cut", "oversized", "wrong build", "symlink"])
def test_a_bad_stored_table_costs_only_its_names(run: Run, damage: str, tmp_path: Path) -> None:
    """A corrupt, cut, oversized or mismatched table, or one that is a link: that object's samples are
    [unknown] with a note, the window is analysed."""
    spool = tmp_path / "h1"  # a copy: the other tests read the good one
    shutil.copytree(run.spool.dir, spool)
    table = spool / "static" / f"elf-{run.build_id}.txt.gz"
    good = gzip.decompress(table.read_bytes())
    if damage == "garbage":
        table.write_bytes(gzip.compress(good.split(b"\n", 1)[0] + b"\nnot an address line\n"))
    elif damage == "cut":
        table.write_bytes(table.read_bytes()[:40])
    elif damage == "oversized":
        table.write_bytes(gzip.compress(good + b"\0" * MAX_OBJECT_TABLE))
    elif damage == "wrong build":
        table.write_bytes(gzip.compress(good.replace(run.build_id.encode(), b"0" * len(run.build_id), 1)))
    else:
        table.unlink()
        table.symlink_to("/dev/zero")
    rec = recording.load(spool / "windows" / run.windows[0].name)
    functions, notes = busy_functions(rec)
    assert not {"spin_alpha", "spin_beta", "gamma_other", "delta_other"} & set(functions), functions
    assert functions.get("[unknown]", 0) > 0
    assert any(run.build_id in n for n in notes), notes
    print(damage, [n for n in notes if run.build_id in n])


def test_a_reference_outside_the_static_folder_is_refused(run: Run, tmp_path: Path) -> None:
    """A window's references are checked: a table is found by its build id in static/, nowhere else."""
    window = tmp_path / "h1" / "windows" / "W00000001-0.vmprof"
    window.parent.mkdir(parents=True)
    w = Writer(window, {})
    w.add_snapshot({OBJECTS_REF_KEY: {run.build_id: "../../../../etc/passwd", "../x": object_ref("../x")}})
    w.close({})
    rec = recording.load(window)
    assert not rec.object_tables
    assert len([p for p in rec.problems if "not its spool static file" in p]) == 1, rec.problems
    assert len([p for p in rec.problems if "not a spool static file" in p]) == 1, rec.problems


def test_a_stored_table_is_the_elf_files_table() -> None:
    """encode/decode keep every symbol, its range, the segments and the ELF type (this process's libc)."""
    libc = next(line.split()[5] for line in Path("/proc/self/maps").read_text().splitlines()
                if line.split()[-1].endswith("/libc.so.6"))
    sym = read_elf_symbols_uncached(Path(libc))
    back = decode_object_table(encode_object_table(sym), sym.build_id)
    assert np.array_equal(back.starts, sym.starts) and np.array_equal(back.ends, sym.ends)
    assert back.names.tolist() == sym.names.tolist() and len(sym) > 1000
    assert back.segments == sym.segments and back.elf_type == sym.elf_type and back.build_id == sym.build_id
