"""The command line behaves as users of perf and py-spy expect (issue 16, command line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, require_root, vmprof

from vmprof_tui.cli import COMMANDS, build_parser
from vmprof_tui.record import recording

GOLDEN = "tests/data/golden/steal3.vmprof"


def run_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmprof_tui", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_line(res: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert res.returncode == code, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], lines


def test_help_fits_80_columns_and_shows_defaults() -> None:
    for name in COMMANDS:
        out = subprocess.run([sys.executable, "-m", "vmprof_tui", name, "--help"], capture_output=True, text=True,
                             cwd=ROOT, env={**os.environ, "COLUMNS": "80"})
        assert out.returncode == 0
        wide = [line for line in out.stdout.splitlines() if len(line) > 80]
        assert not wide, (name, wide)
    _parser, commands = build_parser()
    for name, p in commands.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"vmprof {name} {action.option_strings[0]} has no help text"
    assert "(default: 1000)" in vmprof("record", "--help").stdout


def test_unknown_option_prints_the_commands_usage() -> None:
    res = vmprof("report", GOLDEN, "--bogus")
    assert res.returncode == 2
    assert res.stderr.startswith("usage: vmprof report") and "unrecognized arguments: --bogus" in res.stderr


def test_options_that_do_not_apply_are_errors() -> None:
    one_line(vmprof("report", GOLDEN, "--vcpu", "0"), 2, "--vcpu applies to the guest level")
    one_line(vmprof("report", GOLDEN, "--vm", "steal1", "--cpu", "1"), 2, "--cpu applies to the host level")
    one_line(vmprof("report", GOLDEN, "--time-range", "50:60"), 1, "starts after the end of")
    one_line(vmprof("report", GOLDEN, "--time-range", "2:1"), 2, "with 0 <= FROM < TO")
    one_line(vmprof("report", GOLDEN, "-i", "other.vmprof"), 2, "give the recording once")


def test_report_input_option_and_stdio() -> None:
    by_arg = vmprof("report", GOLDEN)
    by_i = vmprof("report", "-i", GOLDEN, "--stdio")
    assert by_arg.returncode == by_i.returncode == 0 and by_arg.stdout == by_i.stdout


def test_report_default_recording(tmp_path: Path) -> None:
    one_line(run_in(tmp_path, "report"), 1, "no recording given and no ./vmprof.data here")
    (tmp_path / "vmprof.data").write_bytes((ROOT / GOLDEN).read_bytes())
    res = run_in(tmp_path, "report")
    assert res.returncode == 0 and res.stdout.startswith("Level: host"), res.stderr


def test_pprof_is_not_written_to_a_terminal() -> None:
    """script(1) gives the command a terminal as stdout."""
    res = subprocess.run(["script", "-qec", f"{sys.executable} -m vmprof_tui report {GOLDEN} --format pprof",
                          "/dev/null"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 2 and "pprof output is binary" in res.stdout and "\x1f\x8b" not in res.stdout


def test_top_without_a_terminal_says_so() -> None:
    one_line(vmprof("top", "--replay", GOLDEN), 1, "the live screen needs a terminal")


def test_record_refuses_a_missing_pid_and_command() -> None:
    one_line(vmprof("record", "-d", "1", "-p", "999999999"), 1, "no process with pid 999999999")
    one_line(vmprof("record", "-d", "1", "--", "no-such-command-here"), 1, "command not found: no-such-command-here")
    one_line(vmprof("record", "-F", "0"), 2, "-F/--frequency/--rate: takes a whole number of Hz from 1 to 100000")


def test_record_a_command_from_start_to_end(tmp_path: Path) -> None:
    require_root()
    out = tmp_path / "cmd.vmprof"
    res = vmprof("record", "-o", str(out), "-a", "--rate", "500", "--", "sh", "-c",
                 "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exit 3")
    assert res.returncode == 3, res.stderr  # the command's status, as perf's
    assert "sh exited with status 3" in res.stderr
    rec = recording.load(out)
    assert rec.complete and rec.meta["frequency"] == 500
    names = {p["comm"] for p in rec.processes().values()}
    assert "sh" in names, "the command's own samples are in the recording"


def test_record_default_output_keeps_the_old_one(tmp_path: Path) -> None:
    require_root()
    first = run_in(tmp_path, "record", "-d", "0.3", "-q")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "vmprof.data").exists() and not (tmp_path / "vmprof.data.old").exists()
    second = run_in(tmp_path, "record", "-d", "0.3", "-q")
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "vmprof.data.old").exists()
    assert recording.load(tmp_path / "vmprof.data.old").complete


def test_doctor_explains_headers_of_another_kernel() -> None:
    out = vmprof("doctor")
    line = next(x for x in out.stdout.splitlines() if "kernel headers" in x)
    if os.uname().release not in os.path.realpath(f"/lib/modules/{os.uname().release}/build"):
        assert "headers of another kernel" in line and "BTF" in line, line


def csv_rows(*args: str) -> list[dict]:
    import csv
    import io
    res = vmprof("report", *args, "--format", "csv")
    assert res.returncode == 0, res.stderr
    return list(csv.DictReader(io.StringIO(res.stdout)))


def test_report_sorts_by_perfs_keys() -> None:
    for key, column in (("process", "process"), ("module", "module"), ("function", "function")):
        rows = csv_rows(GOLDEN, "--sort", key)
        values = [r[column] for r in rows]
        assert values == sorted(values), key
    pids = [int(r["pid"]) for r in csv_rows(GOLDEN, "-s", "pid") if r["pid"]]
    assert pids == sorted(pids)


def test_report_filters_by_process_pid_and_module() -> None:
    rows = csv_rows(GOLDEN, "--comm", "kdamond.0,kworker/1:1")
    assert rows and {r["process"] for r in rows} == {"kdamond.0", "kworker/1:1"}
    rows = csv_rows(GOLDEN, "--pid", "2877", "--dso", "libc.so.6")
    assert rows and all(r["pid"] == "2877" and r["module"] == "libc.so.6" for r in rows)
    assert all(r["process"] == "compute" for r in csv_rows(GOLDEN, "--vm", "steal1", "--comm", "compute"))
    wide = {**os.environ, "COLUMNS": "300"}
    table = vmprof("report", GOLDEN, "--comm", "kdamond.0", env=wide).stdout  # perf's default: of the rows kept
    assert "note: rows only of process kdamond.0: totals, ratios and percentages are of these rows" in table
    assert "Total samples: 10 " in table
    table = vmprof("report", GOLDEN, "--comm", "kdamond.0", "--percentage", "absolute", env=wide).stdout
    assert "are of the whole level (--percentage absolute)" in table and "Total samples: 5317" in table
    one_line(vmprof("report", GOLDEN, "--pid", "web"), 2, "--pid takes numbers")


def test_report_kernel_or_user_only() -> None:
    lbr = "tests/data/golden/lbr.vmprof"
    user = csv_rows(lbr, "-K")
    assert user and not any(r["module"].startswith("[kernel") for r in user)
    assert not any(r["function"] == "[idle]" for r in user), "idle is neither mode's code"
    kernel = csv_rows(lbr, "-U")
    assert kernel and all(r["module"] == "[kernel.kallsyms]" for r in kernel)
    guest_user = csv_rows(GOLDEN, "--vm", "steal1", "-K")
    assert {r["function"] for r in guest_user} >= {"compute_a", "compute_b"}
    assert not any(r["module"] in ("(outside)", "(vmm blocked)") for r in guest_user), "blank time is no mode's"
    # the demo guests run in user mode only; KVM's and the VMM's work for a vCPU is the guest's steal, no mode's
    assert csv_rows(GOLDEN, "--vm", "steal1", "-U") == []
    assert vmprof("report", GOLDEN, "-K", "-U").returncode == 2


def report_json(*args: str) -> dict:
    import json
    res = vmprof("report", *args, "--format", "json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_mode_filters_make_the_totals_and_ratios_of_what_they_keep() -> None:
    """-K/-U (issue 36.4): as perf, percentages are of the samples kept, and the header says so; blank time
    (idle, steal), KVM's and the VMM's work for a vCPU and halt polling are neither mode's and go."""
    for args, zero in ((["-U"], ("user", "idle")), (["-K"], ("os", "idle")),
                       (["--vm", "steal1", "-K"], ("os", "idle", "steal"))):
        doc = report_json(GOLDEN, *args)
        assert doc["rows"] and doc["total_samples"] == sum(r["samples"] for r in doc["rows"]), args
        assert abs(sum(doc["ratios"].values()) - 100.0) < 0.01 and all(doc["ratios"][k] == 0 for k in zero), args
        assert abs(sum(r["ratio"] for r in doc["rows"]) - 100.0) < 0.1, args
        assert not any(r["function"] in ("[idle]", "[steal]", "[halt poll]") for r in doc["rows"]), args
        assert any("totals, ratios and percentages are of these rows" in n for n in doc["notes"]), args
    user = {(r["function"], r["module"]) for r in report_json(GOLDEN, "-K")["rows"]}
    kernel = {(r["function"], r["module"]) for r in report_json(GOLDEN, "-U")["rows"]}
    assert not (user & kernel) - {(f"[{vm}]", f"(VM{i})") for i, vm in enumerate(("steal1", "steal2", "steal3"), 1)}
    whole = report_json(GOLDEN, "--vm", "steal1")
    absolute = report_json(GOLDEN, "--vm", "steal1", "-K", "--percentage", "absolute")
    assert absolute["total_samples"] == whole["total_samples"] and absolute["ratios"] == whole["ratios"]
    assert any("of the whole level (--percentage absolute)" in n for n in absolute["notes"])
    table = vmprof("report", GOLDEN, "-U", env={**os.environ, "COLUMNS": "200"}).stdout
    assert "note: rows only of kernel mode: totals, ratios and percentages are of these rows" in table


def test_ratios_made_from_the_rows_are_the_profiles_ratios() -> None:
    """What a filtered profile's ratios are made of (its rows) gives the unfiltered ratios back."""
    from vmprof_tui.analyse.analysis import analyse
    from vmprof_tui.analyse.shares import row_ratios

    an = analyse(recording.load(ROOT / GOLDEN))
    for p in [an.host_profile(), an.host_profile(1)] + [an.guest_profile(vm) for vm in an.vm_names()]:
        made = row_ratios(p.level, p.rows)
        assert made.keys() == p.ratios.keys() and all(abs(made[k] - p.ratios[k]) < 1e-6 for k in made)


def test_vcpu_or_cpu_that_matches_nothing_names_the_valid_ones() -> None:
    """--vcpu/--cpu the recording has not (issue 36.8): one line with the valid values, exit 1."""
    one_line(vmprof("report", GOLDEN, "--vm", "steal1", "--vcpu", "7"), 1, "--vcpu 7 matches nothing")
    assert "VM steal1 has vCPUs 0" in vmprof("report", GOLDEN, "--vm", "steal1", "--vcpu", "7").stderr
    one_line(vmprof("report", GOLDEN, "--level", "guest", "--vcpu", "7"), 1, "VM steal3 has vCPUs 0")
    one_line(vmprof("report", GOLDEN, "--cpu", "5"), 1, "--cpu 5 matches nothing: tests/data/golden/steal3.vmprof "
                                                        "has CPUs 0-1")
    assert vmprof("report", GOLDEN, "--cpu", "1").returncode == 0


def test_options_a_format_ignores_are_errors() -> None:
    one_line(vmprof("report", GOLDEN, "--format", "collapsed", "--sort", "module"), 2, "--sort applies to")
    one_line(vmprof("report", GOLDEN, "--format", "pprof", "--limit", "3", "-o", "/dev/null"), 2,
             "--limit does not apply to pprof")
    one_line(vmprof("report", GOLDEN, "--format", "chrome", "--comm", "python"), 2, "chrome output is the whole")
    one_line(vmprof("report", GOLDEN, "--children", "--comm", "python"), 2, "--children and --callers show every")
    one_line(vmprof("report", GOLDEN, "--width", "20"), 2, "--width takes at least 60 columns")


def test_whole_rows_add_up_to_the_rounded_total() -> None:
    """Rounded one by one, fractional rows add up to one sample off their rounded sum (issue 36.5)."""
    from vmprof_tui.analyse.shares import Row, whole_rows

    rows = [Row(5.0, "f", "m"), Row(0.6, "a", "m"), Row(0.6, "b", "m"), Row(0.8, "c", "m")]
    assert sum(round(r.samples) for r in rows) == 8 and round(sum(r.samples for r in rows)) == 7
    whole = whole_rows(rows)
    assert [round(r.samples) for r in whole] == [5, 1, 0, 1] and whole[0] is rows[0]
    same = [Row(2.4, "a", "m"), Row(1.6, "b", "m")]  # adds up already: plain rounding, rows unchanged
    assert whole_rows(same) == same


def test_guest_bundle_for_a_vm_not_in_the_recording_is_one_line(tmp_path: Path) -> None:
    """`--guest-bundle nosuch=PATH` names nothing (was silently ignored): one line with the recording's VMs."""
    for command in ("report", "steal"):
        one_line(vmprof(command, GOLDEN, "--guest-bundle", f"nosuch={tmp_path}"), 1,
                 f"--guest-bundle nosuch={tmp_path}: no VM named nosuch in {GOLDEN} (VMs: steal1, steal2, steal3)")


def test_top_as_an_unprivileged_user_says_the_privilege_error_first() -> None:
    """As `nobody` (a terminal given), the first and only line is the privilege error, not "no KVM guest runs on
    this host" (which it cannot know)."""
    import pty
    import select

    require_root()
    main, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui", "top"], cwd=ROOT, stdin=side, stdout=side,
                            stderr=side, user="nobody", group="nogroup", extra_groups=[],
                            env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/nonexistent"})
    os.close(side)
    out = b""
    try:
        while True:
            if select.select([main], [], [], 60)[0]:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the other side closed: the process ended
                    break
                if not chunk:
                    break
                out += chunk
            else:
                raise AssertionError(f"no end after 60 s: {out!r}")
    finally:
        os.close(main)
    assert proc.wait(30) == 1
    lines = out.decode().strip().splitlines()
    assert lines == ["vmprof: not enough privileges to load BPF and open perf events: run as root (or grant "
                     "CAP_BPF and CAP_PERFMON)"], lines
