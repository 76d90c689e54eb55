"""Bad option values (issue 33, items 5, 12, 13): one line saying what is wrong, exit status 2, before anything
runs (no BPF compile, no measurement)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import vmprof

from vmprof_tui.cli.common import scheduler_address, time_range
from vmprof_tui.estimate import model as M
from vmprof_tui.fleet.metrics import parse_address

GOLDEN = "tests/data/golden/steal3.vmprof"


def one_line(args: list[str], says: str, code: int = 2) -> float:
    """Runs `vmprof ARGS`, checks its one line and status; returns how long it took."""
    t = time.monotonic()
    res = vmprof(*args)
    elapsed = time.monotonic() - t
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code and len(lines) == 1 and says in lines[0], (args, res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    return elapsed


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "soon"])
def test_record_duration_must_be_a_finite_number_above_0(value: str) -> None:
    one_line(["record", "-d", value], "argument -d/--duration: takes a number of seconds above 0")


@pytest.mark.parametrize("command", [["record"], ["agent", "--spool", "/nonexistent/spool"]])
@pytest.mark.parametrize("value", ["0", "-5", "1e7", "100001", "fast"])
def test_frequency_is_checked_before_the_bpf_compile(command: list[str], value: str) -> None:
    elapsed = one_line([*command, "-F", value], "takes a whole number of Hz from 1 to 100000")
    assert elapsed < 10, "refused at once, not after compiling the BPF programs"


@pytest.mark.parametrize("value", ["nan:nan", "0:nan", "nan:3", "-1:2", "2:1", "3", "a:b", "0:inf"])
@pytest.mark.parametrize("command", ["report", "steal"])
def test_time_range_must_be_finite_from_0_and_increasing(command: str, value: str) -> None:
    one_line([command, GOLDEN, f"--time-range={value}"], "argument --time-range: takes FROM:TO in seconds")


@pytest.mark.parametrize("value", ["-1", "0", "x"])
def test_limit_must_be_a_whole_number_from_1(value: str) -> None:
    one_line(["report", GOLDEN, "--limit", value], "argument --limit: takes a whole number from 1")


@pytest.mark.parametrize("value", [":99999", "99999", "host:", "127.0.0.1:-1"])
def test_agent_metrics_port_must_be_0_to_65535(value: str) -> None:
    one_line(["agent", "--spool", "/nonexistent/spool", "--metrics", value], "--metrics takes PORT, :PORT or ADDR:PORT")


@pytest.mark.parametrize("value", ["not a url", "tcp://", "tcp://node1:99999", "http://x:1/path"])
def test_analyze_scheduler_must_be_an_address(value: str, tmp_path: Path) -> None:
    one_line(["analyze", str(tmp_path), "--store", str(tmp_path / "s"), "--scheduler", value],
             "argument --scheduler: takes a Dask scheduler address")


@pytest.mark.parametrize("command", [["agent", "--spool", "/nonexistent/spool"], ["demo"], ["top"]])
def test_every_command_checks_frequency_and_duration_alike(command: list[str]) -> None:
    one_line([*command, "-F", "0"], "argument -F/--frequency/--rate: takes a whole number of Hz from 1 to 100000")
    if command[0] != "top":
        one_line([*command, "-d", "nan"], "takes a number of seconds above 0, not 'nan'")


def test_diff_limit_and_guest_timeout_use_the_same_checks() -> None:
    one_line(["diff", "--store", "/nonexistent", "--vm", "v", "a", "b", "--limit", "0"], "argument --limit: takes")
    one_line(["guest", "fetch", "--vm", "x", "--timeout", "nan"], "argument --timeout: takes a number of seconds")


def test_model_evaluate_checks_its_outputs_before_measuring(tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    M.Model(["cpu", "net-send"], "host-cpu", 2.0, [np.array([0.0, 1.0]), np.array([0.0, 0.5])],
            max_order=1).save(model)
    missing = tmp_path / "missing"
    for option in ("-o", "--save"):
        elapsed = one_line(["model", "evaluate", str(model), option, str(missing / "x.png")],
                           f"{option} {missing / 'x.png'}: the folder {missing} does not exist")
        assert elapsed < 20, "refused before the demo VMs start"


def test_predict_measure_and_costs_check_their_output_before_running(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "o.json"
    one_line(["predict", "measure", "-o", str(out), "--", "sleep", "30"], f"the folder {out.parent} does not exist")
    one_line(["predict", "costs", "-o", str(out)], f"the folder {out.parent} does not exist")
    (tmp_path / "dir.json").mkdir()
    one_line(["predict", "costs", "-o", str(tmp_path / "dir.json")], "is a folder")


@pytest.mark.parametrize("address", ["tcp://node1:8786", "node1:8786", "127.0.0.1:8786", "tls://h.example:8786",
                                     "[::1]:8786"])
def test_scheduler_addresses_dask_takes_are_accepted(address: str) -> None:
    assert scheduler_address(address) == address


@pytest.mark.parametrize("address", [":9466", "9466", "127.0.0.1:9466", "[::]:9466"])
def test_metrics_addresses_are_accepted(address: str) -> None:
    assert parse_address(address)[1] == 9466


def test_time_range_gives_its_two_numbers() -> None:
    assert time_range("2.5:10") == (2.5, 10.0)
