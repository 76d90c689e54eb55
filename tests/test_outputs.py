"""What a new user meets (issue 16): every output of `vmprof report` loaded by the tool users already have, and
the defects each had, on the two stored recordings (three demo VMs; a host running clang's C++)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import jsonschema
import pandas as pd
import pytest

from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import Profile, Row

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
STEAL3, CLANG = GOLDEN / "steal3.vmprof", GOLDEN / "lbr.vmprof"
VMS = ("steal1", "steal2", "steal3")
SCHEMA = ROOT / ".cache" / "npm" / "node_modules" / "speedscope" / "dist" / "release" / "file-format-schema.json"
MANGLED = "_ZN5clang10ASTContext12getDeclAttrsEPKNS_4DeclE"
DEMANGLED = "clang::ASTContext::getDeclAttrs(clang::Decl const*)"


def vmprof(*args: str | Path, columns: int = 80) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmprof_tui", *map(str, args)], capture_output=True, cwd=ROOT,
                          timeout=120, env={**os.environ, "COLUMNS": str(columns)})


def out(*args: str | Path, columns: int = 80) -> str:
    res = vmprof(*args, columns=columns)
    assert res.returncode == 0, res.stderr
    return res.stdout.decode()


# -- table -------------------------------------------------------------------------------

@pytest.mark.parametrize("columns", [80, 160])
@pytest.mark.parametrize("args", [[CLANG], [STEAL3], [STEAL3, "--level", "guest"]])
def test_report_fits_the_terminal(args: list, columns: int) -> None:
    text = out("report", *args, columns=columns)
    assert max(len(line) for line in text.splitlines()) <= columns, text
    header = next(line for line in text.splitlines() if line.startswith("Samples"))
    assert header.split()[-1] == "Function", "the long column is the last"


LONG = "clang::Sema::DiagnoseUseOfDecl(clang::NamedDecl*, llvm::ArrayRef<clang::SourceLocation>, " \
       "clang::ObjCInterfaceDecl const*, bool, bool, clang::ObjCInterfaceDecl*)"


def test_report_to_a_pipe_or_file_prints_whole_names(tmp_path: Path) -> None:
    """Issue 36.10: as perf --stdio, a table to a pipe or -o FILE is not cut (without --width or COLUMNS)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(f"{sys.executable} -m vmprof_tui report {CLANG} | cat", shell=True, capture_output=True,
                           text=True, cwd=ROOT, env=env, timeout=120)
    assert piped.returncode == 0 and LONG in piped.stdout and "…" not in piped.stdout, piped.stderr
    assert max(len(line) for line in piped.stdout.splitlines()) > 200
    res = subprocess.run([sys.executable, "-m", "vmprof_tui", "report", CLANG, "-o", tmp_path / "t.txt"], cwd=ROOT,
                         env=env, timeout=120)
    assert res.returncode == 0 and LONG in (tmp_path / "t.txt").read_text()
    cut = subprocess.run([sys.executable, "-m", "vmprof_tui", "report", CLANG, "--width", "100"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120).stdout
    assert LONG not in cut and max(len(line) for line in cut.splitlines()) <= 100


@pytest.mark.parametrize("args", [[CLANG], [STEAL3, "--level", "guest"], [STEAL3, "-U"],
                                  [STEAL3, "--vm", "steal1", "-K", "--percentage", "absolute"]])
def test_report_at_80_columns_is_never_wider_than_80(args: list) -> None:
    """Issue 36.10: rows of 81-88 characters at COLUMNS=80 (process and module columns kept their widths);
    now the function column gets its width first and notes wrap."""
    text = out("report", *args, columns=80)
    assert max(len(line) for line in text.splitlines()) <= 80, text


def test_report_in_an_80_column_tmux_terminal_is_never_wider() -> None:
    """Issue 36.10: at a real terminal (tmux, 80 columns, no COLUMNS) the table is laid out in its width;
    capture-pane -J joins a line the terminal wrapped, so a line wider than 80 would show."""
    if not shutil.which("tmux"):
        pytest.fail("tmux is not installed (apt-get install tmux)")
    server = f"vmprof-test-{os.getpid()}"
    cmd = f"env -u COLUMNS {sys.executable} -m vmprof_tui report {CLANG} --limit 60; echo vmprof-done; read x"
    subprocess.run(["tmux", "-L", server, "new-session", "-d", "-s", "t", "-x", "80", "-y", "100", cmd], cwd=ROOT,
                   check=True, timeout=30)
    try:
        deadline = time.monotonic() + 60
        screen = ""
        while "vmprof-done" not in screen and time.monotonic() < deadline:  # until the report has been written
            screen = subprocess.run(["tmux", "-L", server, "capture-pane", "-p", "-J", "-t", "t", "-S", "0",
                                     "-E", "99"], capture_output=True, text=True, timeout=30).stdout
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], timeout=30)
    assert "vmprof-done" in screen, screen
    lines = screen.splitlines()
    assert lines[0].startswith("Level: host") and any(line.startswith("Samples") for line in lines)
    assert max(len(line.rstrip()) for line in lines) <= 80, screen
    assert any("clang::" in line and line.rstrip().endswith("…") for line in lines), "long names are cut"


def test_table_demangles_and_says_what_total_counts() -> None:
    text = out("report", CLANG, columns=200)
    assert "clang::ASTContext::getDeclAttrs(clang::Decl const*)" in text and MANGLED not in text
    assert "(204 of them idle from sched events)" in text


# -- csv ---------------------------------------------------------------------------------

def test_csv_of_every_vm_has_one_header_and_numbers(tmp_path: Path) -> None:
    text = out("report", STEAL3, "--level", "guest", "--format", "csv")
    assert text.count("level,vm,") == 1 and "\n\n" not in text
    df = pd.read_csv(io.StringIO(text))
    assert df["samples"].dtype.kind == "i" and df["ratio"].dtype.kind == "f"
    assert set(df["vm"]) == set(VMS)
    path = tmp_path / "guest.csv"
    path.write_text(text)
    con = duckdb.connect()
    types = {r[0]: r[1] for r in con.execute("DESCRIBE SELECT * FROM read_csv_auto(?)", [str(path)]).fetchall()}
    assert types["samples"] in ("BIGINT", "INTEGER") and types["ratio"] == "DOUBLE"
    per_vm = dict(con.execute("SELECT vm, sum(samples) FROM read_csv_auto(?) GROUP BY vm", [str(path)]).fetchall())
    assert set(per_vm) == set(VMS) and all(v > 1900 for v in per_vm.values())


# -- collapsed and the flame graph -----------------------------------------------------------

def folded(*args: str | Path) -> dict[str, int]:
    lines = out("report", *args, "--format", "collapsed").splitlines()
    stacks = [line.rpartition(" ")[0] for line in lines]
    assert len(stacks) == len(set(stacks)), "equal stacks are one line"
    return {line.rpartition(" ")[0]: int(line.rpartition(" ")[2]) for line in lines}


def test_collapsed_host_level() -> None:
    f = folded(STEAL3)
    assert "[idle] (cpu idle)" in f and not any(k.startswith("?") for k in f)
    assert any(k.startswith("python [2880];") for k in f), "host processes keep their pid"
    for vm in VMS:  # each VM split by guest process and function, as pprof does
        assert f[f"[{vm}];{vm}/compute [1];compute_a"] > 400
    assert "python [2882];[libc.so.6]" in f, "an unresolved function is named by its module, as perf does"
    assert f"python [2877];{DEMANGLED}" in folded(CLANG)


def test_collapsed_guest_level_of_every_vm() -> None:
    f = folded(STEAL3, "--level", "guest")
    assert {k.split(";")[0] for k in f} == {f"[{vm}]" for vm in VMS}
    assert all(f[f"[{vm}];[steal] (outside)"] > 1000 for vm in VMS)


def test_svg_flame_graph_from_the_collapsed_stacks() -> None:
    from vmprof_tui.show.formats import svg

    text = out("report", STEAL3, "--format", "svg")
    root = ET.fromstring(text)  # a well-formed SVG document a browser opens
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("steal1/compute [1] (") for t in titles)
    tree = svg.parse_folded(out("report", STEAL3, "--format", "collapsed"))
    assert tree.total == 5317 and tree.children["[steal1]"].total == 685
    # FlameGraph's own example input parses the same way (flamegraph.pl's format: frames;... count)
    t = svg.parse_folded("main;a;b 3\nmain;a 2\nmain;c 5\n")
    assert t.total == 10 and t.children["main"].children["a"].total == 5
    with pytest.raises(svg.FoldedError):
        svg.parse_folded("main;a three\n")


# -- pprof --------------------------------------------------------------------------------

def go_pprof_top(path: Path, *flags: str) -> str:
    go = shutil.which("go")
    assert go, "go is not installed: tools/bootstrap.sh installs Debian's golang-go"
    res = subprocess.run([go, "tool", "pprof", "-top", *flags, str(path)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "HOME": os.environ.get("HOME", "/root")})
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_pprof_in_go_tool_pprof(tmp_path: Path) -> None:
    path = tmp_path / "host.pb.gz"
    out("report", STEAL3, "--format", "pprof", "-o", path)
    top = go_pprof_top(path, "-nodecount=1000", "-nodefraction=0", "-sample_index=samples")
    for vm in VMS:  # one node per VM's process: they are not merged into one `compute [1]`
        assert f"{vm}/compute [1]" in top
    assert "[libc.so.6]" in top and "[libz.so.1.2.13]" in top
    assert "Total samples = 5317" in top or "5317" in top
    from test_export_formats import Decoded  # the independent protobuf decoder
    d = Decoded(path.read_bytes())
    assert all(cpu == n * 1_000_000 for n, cpu in d.values), "cpu/nanoseconds is samples × period exactly"


def test_pprof_keeps_the_mangled_name(tmp_path: Path) -> None:
    path = tmp_path / "clang.pb.gz"
    out("report", CLANG, "--format", "pprof", "-o", path)
    from test_export_formats import Decoded
    d = Decoded(path.read_bytes())
    fn = next(f for f in d.p.function if d.s[f.name] == DEMANGLED)
    assert d.s[fn.system_name] == MANGLED
    assert DEMANGLED in go_pprof_top(path, "-nodecount=1000", "-nodefraction=0")


# -- json ---------------------------------------------------------------------------------

def test_json_ratio_process_and_no_empty_rows() -> None:
    doc = json.loads(out("report", STEAL3, "--format", "json"))
    assert doc["unresolved_ratio"] == pytest.approx(162 / 5317, abs=1e-4) and doc["unresolved_percent"] > 1
    vm_rows = [r for r in doc["rows"] if r["module"].startswith("(VM")]
    assert len(vm_rows) == 3 and all(r["process"] == "python" and r["pid"] for r in vm_rows)
    assert all(r["samples"] > 0 for r in doc["rows"])
    clang = json.loads(out("report", CLANG, "--format", "json"))
    row = next(r for r in clang["rows"] if r["symbol"] == MANGLED)
    assert row["function"] == DEMANGLED


def test_rows_that_round_to_nothing_are_not_shown() -> None:
    rows = [Row(10, "f", "m", "p", 1, "vm"), Row(0.3, "[steal]", "(vmm blocked)", None, None, "vm",
                                                 RowKind.STEAL_VMM_BLOCKED)]
    p = Profile("guest", "vm", None, 10.3, 1.0, 0, {}, rows)
    assert [r.function for r in p.shown_rows] == ["f"] and len(p.rows) == 2, "the data keeps them"
    assert [r["function"] for r in p.to_json()["rows"]] == ["f"]


# -- speedscope and chrome ----------------------------------------------------------------------

def test_speedscope_file_matches_speedscopes_schema() -> None:
    assert SCHEMA.exists(), "tools/bootstrap.sh installs npm speedscope into .cache/npm"
    schema = json.loads(SCHEMA.read_text())
    for args in ([STEAL3], [STEAL3, "--level", "guest"], [CLANG]):
        doc = json.loads(out("report", *args, "--format", "speedscope"))
        jsonschema.validate(doc, {**schema, "$ref": "#/definitions/FileFormat.File"})
        frames = doc["shared"]["frames"]
        for p in doc["profiles"]:
            assert len(p["samples"]) == len(p["weights"]) and p["endValue"] == sum(p["weights"])
            assert all(0 <= i < len(frames) for s in p["samples"] for i in s)
    guest = json.loads(out("report", STEAL3, "--level", "guest", "--format", "speedscope"))
    assert [p["name"] for p in guest["profiles"]] == [f"guest {vm}" for vm in VMS]


def test_chrome_args_are_what_the_docs_say() -> None:
    doc = json.loads(out("report", STEAL3, "--vm", "steal1", "--format", "chrome"))
    steal = [e for e in doc["traceEvents"] if e.get("cat") == "steal"]
    assert steal and all("holder" in e["args"] and "held_by_ns" not in e["args"] for e in steal)
    assert all(isinstance(e["args"]["exit_reason"], str) for e in steal if "exit_reason" in e["args"])
    guest = [e for e in doc["traceEvents"] if e.get("cat") == "guest"]
    assert guest and all("samples" not in e["args"] for e in guest)
    docs = (ROOT / "docs" / "formats.md").read_text()
    assert "`holder`" in docs and "held_by_ns" not in docs


# -- vmprof steal ------------------------------------------------------------------------------

def holder_recording(tmp_path: Path) -> Path:
    """web's vCPU 0 on CPU 0, preempted 20-30.2 ms: 10 ms by a kernel thread whose comm slot in the sched record
    holds a stale tail after the NUL (as the ring buffer gives it), then 0.2 ms by rcu_preempt."""
    from synth import MS, SynthRecording

    b = SynthRecording(frequency=1000, cpus=1)
    web = b.vm("web", pid=100, vcpus={0: 101})
    b.run(web, 0, cpu=0, start_ns=0, end_ns=20 * MS)
    b.preempt(web, 0, 20 * MS, 30 * MS + 200_000)
    b.host_task(23, "ksoftirqd/1\0-91", cpu=0, start_ns=20 * MS, end_ns=30 * MS, kernel=True)
    b.run(b.vm("db", pid=200, vcpus={0: 201}), 0, cpu=0, start_ns=30 * MS, end_ns=30 * MS + 200_000)
    b.run(web, 0, cpu=0, start_ns=30 * MS + 200_000, end_ns=100 * MS)
    return b.write(tmp_path / "holders.vmprof")


def test_steal_holders_named_and_no_zero_holders(tmp_path: Path) -> None:
    path = holder_recording(tmp_path)
    text = out("steal", path)
    assert "ksoftirqd/1 0.010s" in text and "-91" not in text and "\0" not in text
    held = text.split("who held the pCPU:")[1].split("steal the host")[0]
    assert "0.000s" not in held, "holders that round to 0 are not listed"
    assert "1 more under 1 ms (0.20 ms)" in text
    doc = json.loads(out("steal", path, "--format", "json"))
    (web,) = [d for d in doc if d["vm"] == "web"]
    assert set(web["vcpus"][0]["type1_by_holder_s"]) == {"ksoftirqd/1", "db"}
    trace = json.loads(out("report", path, "--vm", "web", "--format", "chrome"))
    assert {e["name"] for e in trace["traceEvents"] if e.get("cat") == "host"} >= {"ksoftirqd/1"}


@pytest.mark.parametrize("columns", [80, 160])
def test_steal_fits_the_terminal(columns: int) -> None:
    text = out("steal", STEAL3, columns=columns)
    assert max(len(line) for line in text.splitlines()) <= columns, text
