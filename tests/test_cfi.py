"""Call paths without frame pointers (issue 34): `record --call-graph cfi` copies user stacks at sample time and
unwinds them by call-frame information when reporting.  Real demo VMs running frame-pointer-less programs with
known chains, a frame-pointer-less host program against `perf record --call-graph dwarf`, and bad input: corrupt
and looping tables, stack copies that point nowhere, a fuzzed CFI parser."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, Recorded, fuzz_process, record_scenario, require_root, start_recording, vmprof
from test_stacks import CHAINS, DEPTHS, assert_shares, drive_flame_and_callers

from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.analyse.callgraph import CallGraph
from vmprof_tui.demo import builds
from vmprof_tui.record import recording
from vmprof_tui.record.bpf_records import (
    SAMPLE_GUEST,
    STACK_GUEST_PARTIAL,
    STACK_GUEST_WALKED,
    STACK_USER_COPY,
    stack_rows,
)
from vmprof_tui.record.writer import Writer
from vmprof_tui.resolve import elf
from vmprof_tui.resolve.resolver import KERNEL_MODULE, UNKNOWN
from vmprof_tui.resolve.spaces import AddressSpace, Mapping, ObjectCache
from vmprof_tui.resolve.stacks import ENTRY_FUNCTIONS
from vmprof_tui.resolve.unwind import (
    COMPLETE,
    NO_MAPPING,
    NO_RULE,
    NOT_CLIMBING,
    SHORT_COPY,
    TOO_DEEP,
    Rules,
    unwind_one,
)

COMPUTE = {("_start", "main", "compute_a"): 0.8, ("_start", "main", "compute_b"): 0.2}


@pytest.fixture(scope="module")
def nofp(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    # 4 kHz for 10 s: four programs time-sliced on one vCPU, about 8000 samples each on an idle machine
    return record_scenario(tmp_path_factory.mktemp("nofp"), "stacks-nofp", 10.0, frequency=4000, stacks=True,
                           call_graph="cfi")


@pytest.fixture(scope="module")
def nofp_graph(nofp: Recorded) -> CallGraph:
    return CallGraph(analyse(nofp.rec))


def nofp_frames(graph: CallGraph, process: str) -> Counter:
    return frames_of_vm(graph, "nofp", process)


def frames_of_vm(graph: CallGraph, vm: str, process: str) -> Counter:
    ws = graph.weighted("guest", vm)
    out: Counter = Counter()
    for path, ctx, n in zip(ws.paths, ws.contexts, ws.counts.tolist(), strict=True):
        if path[1] == process:
            out[path[2:ctx] + path[ctx:]] += n
    return out


def test_every_guest_sample_has_a_stack_copy(nofp: Recorded) -> None:
    """Each guest sample has its copy; one whose copy could not be sent (its ring full: counted as lost) is a
    walked leaf-only chain marked partial, never taken for a host sample."""
    rec = nofp.rec
    assert rec.meta["call_graph"] == "cfi" and rec.ustacks is not None
    guest = (rec.samples["flags"] & SAMPLE_GUEST) != 0
    rows = stack_rows(rec.samples, rec.stacks)
    assert (rows[guest] >= 0).all()
    flags, depth = rec.stacks["flags"][rows[guest]], rec.stacks["guest_depth"][rows[guest]]
    copied = (flags & STACK_USER_COPY) != 0
    assert (stack_rows(rec.samples[guest][copied], rec.ustacks) >= 0).all(), "a stack copy missing"
    lost = sum(rec.end["lost"]["ustacks"])
    print(f"{int((~copied).sum())} of {int(guest.sum())} guest samples without a copy; {lost} copies lost")
    assert (~copied).sum() <= lost
    leaf_only = STACK_GUEST_WALKED | STACK_GUEST_PARTIAL
    assert ((flags[~copied] & leaf_only) == leaf_only).all()
    assert (depth[~copied] == 1).all()


def test_chain_without_frame_pointers_yields_the_expected_chains(nofp_graph: CallGraph) -> None:
    got = nofp_frames(nofp_graph, "chain-nofp")
    print(f"other chains: {(got - Counter({c: got[c] for c in CHAINS})).most_common(5)}")
    assert_shares(got, CHAINS, sum(got.values()))


def test_recursion_depths_without_frame_pointers(nofp_graph: CallGraph) -> None:
    got = nofp_frames(nofp_graph, "recurse-nofp")
    depth: Counter = Counter()
    for chain, n in got.items():
        if chain[:2] == ("_start", "main") and len(chain) > 2 and all(f == "descend" for f in chain[2:]):
            depth[len(chain) - 2] += n
    print(f"other chains: {(got - Counter({c: n for c, n in got.items() if c[2:3] == ('descend',)})).most_common(5)}")
    assert_shares(depth, DEPTHS, sum(got.values()))


@pytest.mark.parametrize("program,functions", [("compute", ("compute_a", "compute_b", "mix_result",
                                                             "report_progress")),
                                                ("jacobi", ("jacobi_sweep", "copy_back", "init_grid"))])
def test_compiled_without_frame_pointers_chains_reach_main(nofp_graph: CallGraph, program: str,
                                                            functions: tuple[str, ...]) -> None:
    """compute and jacobi are built -O2 without frame pointers (as Debian builds): >= 99% of their samples
    carry the exact chain _start → main [→ function]; compute's split is 80/20 as by construction."""
    got = nofp_frames(nofp_graph, program)
    total = sum(got.values())
    exact = sum(n for c, n in got.items() if c == ("_start", "main") or (c[:2] == ("_start", "main")
                                                                         and len(c) == 3 and c[2] in functions))
    print(f"{program}: {exact} of {total} exact; others {Counter({c: n for c, n in got.items()}).most_common(6)}")
    assert total > 1000 and exact >= 0.99 * total
    if program == "compute":
        two = {c: got[c] for c in COMPUTE}
        assert_shares(Counter(two), COMPUTE, sum(two.values()))



def test_every_stack_output_shows_the_unwound_chains(nofp: Recorded, tmp_path: Path) -> None:
    """collapsed, pprof, speedscope, svg, --children and --callers of a cfi recording: the chains as unwound."""
    import json

    from test_export_formats import Decoded

    path = str(nofp.rec.path)
    res = vmprof("report", path, "--vm", "nofp", "--callers", "copy")
    assert res.returncode == 0, res.stderr
    assert [line for line in res.stdout.splitlines() if "→" in line][0].endswith(
        "nofp → chain-nofp → _start → main → solve → copy")
    res = vmprof("report", path, "--vm", "nofp", "--children")
    rows = {line.split()[-1]: [int(v) for v in line.split()[:2]] for line in res.stdout.splitlines()
            if line.split()[:1] and line.split()[0].isdigit()}
    assert res.returncode == 0 and rows["solve"][0] > rows["sweep"][0] >= rows["kernel_a"][0] > 0
    assert rows["main"][0] >= 0.99 * sum(n for f, (_t, n) in rows.items() if f not in ("_start", "main"))
    res = vmprof("report", path, "--vm", "nofp", "--format", "collapsed")
    assert res.returncode == 0 and "chain-nofp [3];_start;main;solve;sweep;kernel_a " in res.stdout, res.stdout[:500]
    for fmt, name in (("pprof", "s.pb.gz"), ("speedscope", "s.json"), ("svg", "s.svg")):
        res = vmprof("report", path, "--vm", "nofp", "--format", fmt, "-o", str(tmp_path / name))
        assert res.returncode == 0, res.stderr
    d = Decoded((tmp_path / "s.pb.gz").read_bytes())
    assert ["kernel_a", "sweep", "solve", "main", "_start", "nofp/chain-nofp [3]", "[nofp]"] in d.stacks
    doc = json.loads((tmp_path / "s.json").read_text())
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert ("[nofp]", "nofp/recurse-nofp [4]", "_start", "main", "descend", "descend") in {
        tuple(names[i] for i in s) for p in doc["profiles"] for s in p["samples"]}
    assert "kernel_a" in (tmp_path / "s.svg").read_text()


def test_live_screen_flame_of_a_cfi_recording(nofp: Recorded) -> None:
    """vmprof top --replay of a cfi recording: the flame view and the callers view show the unwound chains."""
    from vmprof_tui.analyse.window import ReplayWindow

    drive_flame_and_callers(ReplayWindow(nofp.rec.path), "nofp", "chain-nofp", ("descend", "solve"),
                            "nofp → chain-nofp → _start → main → solve → sweep → kernel_a")


def test_live_screen_flame_with_cfi() -> None:
    """vmprof top --call-graph cfi on a running stacks-nofp demo: the live window unwinds its copies."""
    import os
    import time

    from vmprof_tui.analyse.window import LiveWindow
    from vmprof_tui.collect import discover
    from vmprof_tui.collect.session import CollectionSession
    from vmprof_tui.demo import runner

    require_root()
    os.sched_setaffinity(0, {0})
    # the recorded fixture's VM of the same name may still be exiting: two would be told apart as "nofp [PID]"
    deadline = time.monotonic() + 60
    while any(vm.name == "nofp" for vm in discover.discover_vms()) and time.monotonic() < deadline:
        time.sleep(0.2)
    with runner.DemoRun(runner.scenario_specs("stacks-nofp"), duration_s=180):  # stopped when the test ends
        window = LiveWindow(CollectionSession(1000, build_ids=False, stacks=True, call_graph="cfi"), 10.0)
        window.start()
        try:
            drive_flame_and_callers(window, "nofp", "chain-nofp", ("descend", "solve"),
                                    "nofp → chain-nofp → _start → main → solve → sweep → kernel_a")
        finally:
            window.close()

@pytest.mark.parametrize("value", ["lbr", "fp,8192", "cfi,1000", "dwarf,x", "cfi,131072"])
def test_call_graph_bad_usage_is_one_line(value: str, tmp_path: Path) -> None:
    res = vmprof("record", "-o", str(tmp_path / "r.vmprof"), "-d", "1", "--call-graph", value)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "--call-graph" in res.stderr
    assert not (tmp_path / "r.vmprof").exists()


def test_call_graph_dwarf_with_a_size_is_cfi(tmp_path: Path) -> None:
    """perf's spelling: --call-graph dwarf,4096 records 4 KiB copies (and implies -g)."""
    res = vmprof("record", "-o", str(tmp_path / "r.vmprof"), "-d", "1", "-q", "--call-graph", "dwarf,4096")
    assert res.returncode == 0, res.stderr
    rec = recording.load(tmp_path / "r.vmprof")
    assert rec.meta["call_graph"] == "cfi" and rec.meta["stack_copy_bytes"] == 4096 and rec.stacks is not None
    assert rec.ustacks is not None and len(rec.ustacks) and rec.ustacks.dtype["data"].shape == (4096,)

@pytest.mark.parametrize("args,mode", [(["-g"], "cfi"), (["-g", "--call-graph", "fp"], "fp")])
def test_g_alone_is_cfi_and_fp_stays_on_request(args: list[str], mode: str, tmp_path: Path) -> None:
    """record -g copies user stacks (each object unwound by its call-frame information where it has some, by
    frame pointers where not); --call-graph fp still walks frame pointers only, with no copies."""
    require_root()
    res = vmprof("record", "-o", str(tmp_path / "r.vmprof"), "-d", "1", "-q", *args)
    assert res.returncode == 0, res.stderr
    rec = recording.load(tmp_path / "r.vmprof")
    assert rec.meta["call_graph"] == mode and rec.stacks is not None
    assert (rec.ustacks is not None and len(rec.ustacks) > 0) == (mode == "cfi")


# -- host: frame-pointer-less programs against perf record --call-graph dwarf on the same run ----------------------

PY_SCRIPT = """
import sys, time
def squares(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def text(n):
    return len(",".join(str(i) for i in range(n)))
def order(n):
    return sorted(range(n, 0, -1))[0]
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    squares(20000); text(6000); order(20000)
"""


def _name(function: str) -> str:
    """A frame's function as both tools name it: perf's `@@GLIBC_2.34` versions and either's unnamed frames
    (perf `[unknown]`, vmprof `[module]`) made alike."""
    function = function.split("@@")[0]
    return "?" if function.startswith("[") else function


def perf_chains(perf_data: Path, pid: int) -> Counter:
    """User chains (outermost first) of one process in a perf recording; kernel frames left out."""
    script = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "pid,ip,sym", "--no-inline"],
                            check=True, capture_output=True, text=True).stdout
    out: Counter = Counter()
    for block in script.strip().split("\n\n"):
        head, *frames = block.strip().splitlines()
        if int(head.split()[0]) != pid:
            continue
        user = [f.split(None, 1) for f in frames if not f.split()[0].startswith("ffffffff")]
        out[tuple(_name(f[1].split("+")[0]) if len(f) > 1 else "?" for f in reversed(user))] += 1
    return out


def vmprof_chains(rec: recording.Recording, pid: int) -> Counter:
    """The same from a vmprof recording: each host stack's user frames, outermost first."""
    graph = CallGraph(analyse(rec))
    ws = graph.weighted("host")
    an = graph.an
    out: Counter = Counter()
    for stack, n, first in zip(ws.stacks, ws.counts.tolist(), ws.first, strict=True):
        if stack is None or int(an.samples["pid"][first]) != pid:
            continue
        out[tuple(_name(f.function if f.function != UNKNOWN else f"[{f.module}]") for f in stack.frames
                  if f.module != KERNEL_MODULE)] += n
    return out


def record_beside_perf(tmp_path: Path, command: list[str]) -> tuple[recording.Recording, Path, int]:
    """`vmprof record --call-graph cfi` of the whole host while `perf record --call-graph dwarf` runs COMMAND."""
    require_root()
    out, perf_data = tmp_path / "host.vmprof", tmp_path / "perf.data"
    # 4 kHz: the two sample independently (perf per task, vmprof per CPU), so their shares differ by sampling
    # noise; ~10 000 samples keep that under half a point for a 10% chain
    rec = start_recording(out, "--call-graph", "cfi", "-F", "4000")
    try:
        subprocess.run(["perf", "record", "-q", "--call-graph", "dwarf", "-e", "cpu-clock", "-F", "4000", "-o",
                        str(perf_data), "--", *command], check=True, capture_output=True, timeout=300)
    finally:
        rec.send_signal(signal.SIGINT)
        assert rec.wait(timeout=120) == 0
    pids = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "pid"], check=True, capture_output=True,
                          text=True).stdout.split()
    return recording.load(out), perf_data, int(Counter(pids).most_common(1)[0][0])


def assert_top_chains_agree(ours: Counter, theirs: Counter, top: int = 10, points: float = 2.0) -> None:
    """perf's `top` most frequent chains have the same share (within `points`) in vmprof's samples.  A function
    only one tool can name (perf reads glibc's separate debug symbols: __libc_start_call_main) is unnamed in both."""
    both = {f for c in ours for f in c} & {f for c in theirs for f in c}

    def named(chain: tuple[str, ...]) -> tuple[str, ...]:
        """A run of unnamed frames as one "?": vmprof shows such a run as one frame, `[object ×N]` (issue 36.13)."""
        out = [f if f in both else "?" for f in chain]
        return tuple(f for i, f in enumerate(out) if not (f == "?" and i and out[i - 1] == "?"))

    ours, theirs = (sum((Counter({named(c): n}) for c, n in side.items()), Counter()) for side in (ours, theirs))
    n_ours, n_theirs = sum(ours.values()), sum(theirs.values())
    print(f"samples: vmprof {n_ours}, perf {n_theirs}")
    assert n_ours > 1000 and n_theirs > 1000
    worst = 0.0
    for chain, n in theirs.most_common(top):
        mine, perf = 100 * ours[chain] / n_ours, 100 * n / n_theirs
        worst = max(worst, abs(mine - perf))
        print(f"  vmprof {mine:5.2f}%  perf {perf:5.2f}%  {' → '.join(chain[-6:])}")
    print(f"largest difference {worst:.2f} points; vmprof's most frequent: {ours.most_common(4)}")
    assert worst <= points


def test_native_chain_without_frame_pointers_matches_perf_dwarf(tmp_path: Path) -> None:
    """chain.c built natively with -fomit-frame-pointer: the three chains as perf --call-graph dwarf sees them."""
    src = Path(str(builds._source_dir()))
    native = tmp_path / "chain-native-nofp"
    flags = ["-O2", *builds.NO_FRAME_POINTER_FLAGS]
    subprocess.run(["gcc", *flags, "-c", "-DVMPROF_NATIVE", "-Dmain=guest_main", f"-I{src}", "-o",
                    str(tmp_path / "chain.o"), str(src / "chain.c")], check=True)
    subprocess.run(["gcc", *flags, "-o", str(native), str(tmp_path / "chain.o"), str(ROOT / "tests/native/harness.c")],
                   check=True)
    assert "rbp" not in subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(native)], capture_output=True,
                                       text=True, check=True).stdout.split("<kernel_a>:")[1].split("\n\n")[0]
    rec, perf_data, pid = record_beside_perf(tmp_path, [str(native), "400"])
    ours, theirs = vmprof_chains(rec, pid), perf_chains(perf_data, pid)
    assert_top_chains_agree(ours, theirs)
    # chains to _start: all but those whose copy was lost (a loaded machine) and counted so
    lost = sum(rec.end["lost"]["ustacks"])
    complete = sum(n for c, n in ours.items() if c[:1] == ("_start",))
    print(f"{complete} of {sum(ours.values())} chains reach _start; {lost} copies lost on the whole host")
    assert complete + lost >= 0.98 * sum(ours.values())


# The signal comes from a CLOCK_MONOTONIC timer re-armed at a random delay: ITIMER_PROF fires at the kernel's tick
# (250 Hz here), and both tools sample on hrtimers whose 250 us period divides the tick, so with it the handler
# started at the same phase of every sampling period and each run's handler share was 2/16 or 3/16 of the samples
# by phase alone (aliasing: 12.50% against perf's 13.68% in one run, 4.24 points apart in another).
SIGNALS_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <time.h>
volatile unsigned long x;
static timer_t timer;
static unsigned long seed = 34;
__attribute__((noinline)) void in_handler(void) { for (long i = 0; i < 500000; i++) x = x * 6364136223846793005UL + 1; }
static void arm(void)
{
	seed = seed * 6364136223846793005UL + 1442695040888963407UL;
	struct itimerspec t = {{0, 0}, {0, 1500000 + (long)((seed >> 33) % 1000000)}};
	timer_settime(timer, 0, &t, 0);
}
void handler(int s) { (void)s; in_handler(); arm(); }
__attribute__((noinline)) void work(void) { for (long i = 0; i < 1000000; i++) x = x * 6364136223846793005UL + 1; }
int main(int argc, char **argv)
{
	struct sigevent ev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGPROF};
	signal(SIGPROF, handler);
	timer_create(CLOCK_MONOTONIC, &ev, &timer);
	arm();
	time_t end = time(0) + (argc > 1 ? atoi(argv[1]) : 5);
	while (time(0) < end)
		work();
	return 0;
}
"""


def test_chains_through_a_signal_handler_match_perf_dwarf(tmp_path: Path) -> None:
    """A frame-pointer-less program that spends part of its time in a signal handler: the chains cross glibc's
    signal frame (__restore_rt: a CFA read from the frame, registers at RSP + n, the interrupted pc exact)
    back to _start, as perf --call-graph dwarf shows them."""
    src = tmp_path / "signals.c"
    src.write_text(SIGNALS_C)
    exe = tmp_path / "signals"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(exe), str(src)], check=True)
    rec, perf_data, pid = record_beside_perf(tmp_path, [str(exe), "6"])
    ours, theirs = vmprof_chains(rec, pid), perf_chains(perf_data, pid)
    handler = sum(n for c, n in ours.items() if "in_handler" in c)
    through = sum(n for c, n in ours.items() if "in_handler" in c and c[:1] == ("_start",) and "work" in c)
    print(f"in the handler: {handler} samples, {through} with the chain through the signal frame to _start")
    assert handler > 0.05 * sum(ours.values()) and through >= 0.95 * handler
    assert_top_chains_agree(ours, theirs)


def test_debian_python_matches_perf_dwarf(tmp_path: Path) -> None:
    """Debian's python3 (built without frame pointers) running a small script: the top 10 chains."""
    script = tmp_path / "work.py"
    script.write_text(PY_SCRIPT)
    rec, perf_data, pid = record_beside_perf(tmp_path, ["/usr/bin/python3", str(script), "8"])
    assert_top_chains_agree(vmprof_chains(rec, pid), perf_chains(perf_data, pid))


# -- the CFI reader and the unwinder on bad input ------------------------------------------------------------------


def _section(data: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of an ELF section."""
    import io

    from elftools.elf.elffile import ELFFile

    sec = ELFFile(io.BytesIO(data)).get_section_by_name(name)
    return int(sec["sh_offset"]), int(sec["sh_size"])


def test_cfi_tables_of_real_objects() -> None:
    """glibc's .eh_frame (with the PLT's expression rule), python3's, and a demo program's .debug_frame."""
    from vmprof_tui.resolve.cfi import CFA_PLT, CFA_REG, RSP, read_cfi

    libc = read_cfi(Path("/lib/x86_64-linux-gnu/libc.so.6"))
    assert libc.source == ".eh_frame" and len(libc) > 10_000 and (libc.cfa_kind == CFA_PLT).any()
    assert bool((libc.start[1:] >= libc.start[:-1]).all()) and bool((libc.end > libc.start).all())
    program = builds.program_path("chain-nofp")
    table = read_cfi(program)
    assert table.source == ".debug_frame"
    syms = elf.read_elf_symbols(program)
    entry = int(syms.starts[list(syms.names).index("kernel_a")])
    row = table.row(entry)  # at a function's first instruction the CFA is the caller's RSP: rsp + 8, RA at CFA - 8
    assert row >= 0 and table.cfa_kind[row] == CFA_REG and table.cfa_reg[row] == RSP and table.cfa_off[row] == 8
    assert table.ra[row] == -8


def test_corrupt_eh_frame_is_a_table_or_one_line(tmp_path: Path) -> None:
    """Random bytes over .eh_frame: every file gives a table or one ElfError line, fast (no hang)."""
    import random
    import time

    from vmprof_tui.resolve.cfi import cfi_from_bytes

    data = Path("/usr/bin/true").read_bytes()
    off, size = _section(data, ".eh_frame")
    rng = random.Random(34)
    t0, tables, errors = time.monotonic(), 0, 0
    for _ in range(300):
        b = bytearray(data)
        for _ in range(rng.randint(1, 16)):
            at = off + rng.randrange(size)
            b[at:at + 4] = rng.randbytes(4)
        try:
            cfi_from_bytes(bytes(b))
            tables += 1
        except elf.ElfError as e:
            assert "\n" not in str(e) and len(str(e)) < 400
            errors += 1
    print(f"{tables} tables, {errors} rejections in {time.monotonic() - t0:.1f} s")
    assert time.monotonic() - t0 < 120


@pytest.fixture
def space() -> tuple[AddressSpace, Rules, int]:
    """chain-nofp mapped at its link address, the unwinder's rules for it, and kernel_a's address."""
    program = builds.program_path("chain-nofp")
    syms = elf.read_elf_symbols(program)
    text = next(s for s in syms.segments if s.flags & 1)
    m = Mapping(text.vaddr, text.vaddr + text.memsz, text.offset, str(program), program)
    kernel_a = int(syms.starts[list(syms.names).index("kernel_a")])
    return AddressSpace("chain-nofp", 1, [m]), Rules(ObjectCache(), ENTRY_FUNCTIONS), kernel_a


def _fake_table(rules: Rules, sp: AddressSpace, cfa_off: int, ra: int) -> None:
    """Every address of the program's mapping gets one row: CFA = rsp + cfa_off, return address at CFA + ra."""
    from vmprof_tui.resolve.cfi import CFA_REG, RSP, SAME, CfiTable

    m = sp.maps[0]
    one = lambda v, t: np.array([v], t)  # noqa: E731
    table = CfiTable(one(m.start, np.uint64), one(m.end, np.uint64), one(CFA_REG, np.uint8), one(RSP, np.int8),
                     one(cfa_off, np.int64), one(ra, np.int32), one(SAME, np.int32), one(0, np.uint8), one(0, np.uint8),
                     ".eh_frame")
    rules._tables[str(m.object_path)] = (table, table.start.tolist())


def test_a_cfi_loop_ends_partial(space: tuple[AddressSpace, Rules, int]) -> None:
    """A table whose CFA does not climb (CFA = rsp) ends at once; one that climbs forever stops at the depth
    limit or the end of the copy: bounded, and every frame read from the copy."""
    sp_, rules, pc = space
    _fake_table(rules, sp_, 0, 0)
    stack = (pc + 5).to_bytes(8, "little") * 1024
    chain, why = unwind_one(pc, 0x7000_0000, None, stack, sp_, rules)
    assert chain == [pc] and why == NOT_CLIMBING
    rules = Rules(ObjectCache(), ENTRY_FUNCTIONS)
    _fake_table(rules, sp_, 8, -8)  # each frame's return address is pc + 5 again, 8 bytes higher
    chain, why = unwind_one(pc, 0x7000_0000, None, stack, sp_, rules)
    assert why == TOO_DEEP and len(chain) == 64 and set(chain[1:]) == {pc + 5}
    chain, why = unwind_one(pc, 0x7000_0000, None, stack[:80], sp_, rules)
    assert why == SHORT_COPY and len(chain) == 11  # the leaf and one frame per word of the copy


def test_stack_slices_outside_memory_end_partial(space: tuple[AddressSpace, Rules, int]) -> None:
    """A copy too short for the frame, an empty copy, a pc in no mapping, an unknown process: partial, no frame
    beyond the leaf."""
    sp_, rules, pc = space
    assert unwind_one(pc, 0x7000_0000, None, b"", sp_, rules) == ([pc], SHORT_COPY)
    assert unwind_one(pc, 0x7000_0000, None, b"\0" * 4, sp_, rules) == ([pc], SHORT_COPY)
    assert unwind_one(0x10, 0x7000_0000, None, b"\0" * 64, sp_, rules) == ([0x10], NO_MAPPING)
    assert unwind_one(pc, 0x7000_0000, None, b"\0" * 64, None, rules) == ([pc], NO_MAPPING)
    # a return address that is 0 is the outermost frame (complete); one into no mapping ends partial
    chain, why = unwind_one(pc, 0x7000_0000, None, (0).to_bytes(8, "little") * 4, sp_, rules)
    assert chain == [pc] and why == COMPLETE
    chain, why = unwind_one(pc, 0x7000_0000, None, (0x10).to_bytes(8, "little") * 4, sp_, rules)
    assert chain == [pc, 0x10] and why == NO_MAPPING


def test_a_hostile_guest_table_is_one_note(space: tuple[AddressSpace, Rules, int], tmp_path: Path) -> None:
    """A guest object whose .debug_frame is garbage: one note line, and its frames unwind by frame pointers
    (none here: the chain ends at the leaf, partial), never a crash."""
    sp_, _rules, pc = space
    data = bytearray(sp_.maps[0].object_path.read_bytes())
    off, size = _section(bytes(data), ".debug_frame")
    data[off:off + size] = b"\xff" * size
    bad = tmp_path / "chain-nofp"
    bad.write_bytes(bytes(data))
    m = sp_.maps[0]
    hostile = AddressSpace("chain-nofp", 1, [Mapping(m.start, m.end, m.offset, str(bad), bad)])
    rules = Rules(ObjectCache(), ENTRY_FUNCTIONS)
    chain, why = unwind_one(pc, 0x7000_0000, None, b"\0" * 256, hostile, rules)
    assert chain == [pc] and why == NO_RULE
    assert len(rules.notes) == 1 and "\n" not in rules.notes[0] and "frame pointers" in rules.notes[0]
    print(rules.notes[0])


def test_fuzz_cfi_parser(tmp_path: Path) -> None:
    """The atheris target `cfi` (tests/fuzz/fuzz_bundle.py) for a bounded time: no crash, hang or OOM."""
    proc = fuzz_process("cfi", 8, tmp_path)
    _, err = proc.communicate(timeout=180)
    done = [line for line in err.splitlines() if line.startswith("Done ")]
    crashes = [c.name for c in tmp_path.iterdir() if c.name.startswith(("crash-", "timeout-", "oom-"))]
    print(done[-1] if done else err[-2000:])
    assert proc.returncode == 0 and done and not crashes, err[-3000:]


def test_stack_copies_round_trip_and_a_corrupt_chunk_is_one_problem(tmp_path: Path) -> None:
    """Kind 10 (zstd) written and read back exactly, at the copy size the meta chunk states; a chunk whose zstd
    body is garbage is skipped with one problem line, the rest of the recording loads."""
    from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SCHED_DTYPE, ustack_dtype

    u = np.zeros(3, ustack_dtype(4096))
    u["time_ns"], u["cpu"], u["copied"], u["sp"] = [10, 20, 30], [0, 1, 0], [16, 4096, 0], 0x7FFF0000
    u["data"][0, :16] = np.arange(16)
    u["data"][1] = np.arange(4096) % 251
    path = tmp_path / "u.vmprof"
    w = Writer(path, {"stacks": True, "call_graph": "cfi", "stack_copy_bytes": 4096})
    w.add(np.zeros(1, SAMPLE_DTYPE), np.empty(0, SCHED_DTYPE), ustacks=u)
    w.flush()
    w.close({})
    rec = recording.load(path)
    assert rec.ustacks is not None and np.array_equal(rec.ustacks, u) and not rec.problems
    data = bytearray(path.read_bytes())
    at = data.index(b'"codec": "zstd"}') + len(b'"codec": "zstd"}')
    data[at:at + 40] = b"\x00" * 40  # the frame's magic and header: not zstd any more
    import struct
    import zlib

    # keep the chunk's checksum right: the body itself is what is bad
    start = data.rfind(recording.CHUNK_MAGIC, 0, at)
    _magic, kind, _r, length, _crc = recording.CHUNK_HEADER.unpack_from(data, start)
    body = bytes(data[start + recording.CHUNK_HEADER.size:start + recording.CHUNK_HEADER.size + length])
    struct.pack_into("<I", data, start + 12, zlib.crc32(body))
    path.write_bytes(bytes(data))
    rec = recording.load(path)
    assert kind == recording.USTACKS and len(rec.samples) == 1
    assert len(rec.problems) == 1 and "user stack copies" in rec.problems[0] and "\n" not in rec.problems[0]
    print(rec.problems[0])

