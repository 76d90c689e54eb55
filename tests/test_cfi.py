"""Call paths without frame pointers (issue 34): `record --call-graph cfi` copies user stacks at sample time and
unwinds them by call-frame information when reporting.  Real demo VMs running frame-pointer-less programs with
known chains, a frame-pointer-less host program against `perf record --call-graph dwarf`, and bad input: corrupt
and looping tables, stack copies that point nowhere, a fuzzed CFI parser."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, Recorded, record_scenario, require_root, start_recording
from test_stacks import CHAINS, DEPTHS, assert_shares

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import CallGraph
from vmprof_tui.demo import programs
from vmprof_tui.record import recording
from vmprof_tui.record.records import SAMPLE_GUEST, STACK_USER_COPY, stack_rows
from vmprof_tui.resolve.resolver import KERNEL_MODULE, UNKNOWN

COMPUTE = {("_start", "main", "compute_a"): 0.8, ("_start", "main", "compute_b"): 0.2}


@pytest.fixture(scope="module")
def nofp(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    # 4 kHz for 10 s: four programs time-sliced on one vCPU, about 8000 samples each on an idle machine
    return record_scenario(tmp_path_factory.mktemp("nofp"), "stacks-nofp", 10.0, frequency=4000, stacks=True,
                           call_graph="cfi")


@pytest.fixture(scope="module")
def nofp_graph(nofp: Recorded) -> CallGraph:
    return CallGraph(Analysis(nofp.rec))


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
    rec = nofp.rec
    assert rec.meta["call_graph"] == "cfi" and rec.ustacks is not None
    guest = (rec.samples["flags"] & SAMPLE_GUEST) != 0
    rows = stack_rows(rec.samples, rec.stacks)
    assert (rows[guest] >= 0).all() and (rec.stacks["flags"][rows[guest]] & STACK_USER_COPY).all()
    assert (stack_rows(rec.samples[guest], rec.ustacks) >= 0).all(), "a guest sample without its stack copy"
    assert sum(rec.end["lost"]["ustacks"]) == 0


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
    graph = CallGraph(Analysis(rec))
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
    ours, theirs = (sum((Counter({tuple(f if f in both else "?" for f in c): n}) for c, n in side.items()),
                        Counter()) for side in (ours, theirs))
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
    src = Path(str(programs._source_dir()))
    native = tmp_path / "chain-native-nofp"
    flags = ["-O2", *programs.NO_FRAME_POINTER_FLAGS]
    subprocess.run(["gcc", *flags, "-c", "-DVMPROF_NATIVE", "-Dmain=guest_main", f"-I{src}", "-o",
                    str(tmp_path / "chain.o"), str(src / "chain.c")], check=True)
    subprocess.run(["gcc", *flags, "-o", str(native), str(tmp_path / "chain.o"), str(ROOT / "tests/native/harness.c")],
                   check=True)
    assert "rbp" not in subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(native)], capture_output=True,
                                       text=True, check=True).stdout.split("<kernel_a>:")[1].split("\n\n")[0]
    rec, perf_data, pid = record_beside_perf(tmp_path, [str(native), "400"])
    ours, theirs = vmprof_chains(rec, pid), perf_chains(perf_data, pid)
    assert_top_chains_agree(ours, theirs)
    assert sum(n for c, n in ours.items() if c[:1] == ("_start",)) >= 0.98 * sum(ours.values())


def test_debian_python_matches_perf_dwarf(tmp_path: Path) -> None:
    """Debian's python3 (built without frame pointers) running a small script: the top 10 chains."""
    script = tmp_path / "work.py"
    script.write_text(PY_SCRIPT)
    rec, perf_data, pid = record_beside_perf(tmp_path, ["/usr/bin/python3", str(script), "8"])
    assert_top_chains_agree(vmprof_chains(rec, pid), perf_chains(perf_data, pid))
