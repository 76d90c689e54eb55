"""Call paths without frame pointers (issue 34): `record --call-graph cfi` copies user stacks at sample time and
unwinds them by call-frame information when reporting.  Real demo VMs running frame-pointer-less programs with
known chains, a frame-pointer-less host program against `perf record --call-graph dwarf`, and bad input: corrupt
and looping tables, stack copies that point nowhere, a fuzzed CFI parser."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import Recorded, record_scenario
from test_stacks import CHAINS, DEPTHS, assert_shares

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import CallGraph
from vmprof_tui.record.records import SAMPLE_GUEST, STACK_USER_COPY, stack_rows

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
