"""A non-editable install works: `pip install .` into a fresh venv gives a vmprof that finds its BPF C as
package data (vmprof_tui/bpf in the wheel), loads it (`vmprof doctor`), and reports a stored recording byte
for byte as the source tree does (tests/data/golden/expected)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "data" / "golden"))
from make import COMMANDS, HERE  # noqa: E402

# a few of the golden cases: the host and guest reports and the steal table
CASES = [(out, args) for out, args in COMMANDS["steal3"] if out in ("report-host.txt", "report-guest.txt", "steal.txt")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with vmprof installed from a wheel built of this tree.  Like tools/bootstrap.sh's .venv it
    sees the system site packages (Debian's python3-bpfcc); the dependencies come from pip's wheel cache, and
    the build uses the venv's own setuptools (no isolated build environment to download)."""
    where = tmp_path_factory.mktemp("install")
    # a copy of the tree as a clone has it (links kept): pip builds in the tree it is given, and a build/ left
    # in this one by an earlier build could bring removed modules into the wheel
    src, venv = where / "src", where / "venv"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "build", "dist", "*.egg-info", "test-artifacts", "__pycache__", ".*_cache"))
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "--no-build-isolation", str(src)], capture_output=True, text=True, timeout=600,
                         cwd=venv)
    assert res.returncode == 0, f"pip install . failed:\n{res.stderr[-2000:]}"
    return venv


def test_install_is_not_the_source_tree(installed: Path) -> None:
    """The installed vmprof imports from the venv, and its BPF C is in the package there."""
    code = "import vmprof_tui.collect.bpf as b; print(b.__file__); print(b.BPF_DIR)"
    res = subprocess.run([str(installed / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         cwd=installed, timeout=60, check=True)
    module, bpf_dir = res.stdout.split()
    assert Path(module).is_relative_to(installed) and not Path(module).is_relative_to(ROOT / "vmprof_tui")
    assert Path(bpf_dir).is_relative_to(installed)
    assert {"sample.h", "sampler.bpf.c", "sched.bpf.c", "lbr.bpf.c", "syscalls.bpf.c", "vmprof_vmx_abi.h"} <= {
        p.name for p in Path(bpf_dir).iterdir()}
    assert not any(p.is_symlink() for p in Path(bpf_dir).iterdir()), "the wheel holds copies, not links"


def test_installed_doctor_loads_the_bpf_programs(installed: Path) -> None:
    res = subprocess.run([str(installed / "bin" / "vmprof"), "doctor"], capture_output=True, text=True,
                         cwd=installed, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert any(line.startswith("ok  BPF programs") for line in res.stdout.splitlines()), res.stdout


@pytest.mark.parametrize(("out", "args"), CASES, ids=[o for o, _ in CASES])
def test_installed_report_is_golden(installed: Path, out: str, args: list[str]) -> None:
    """Run from the repository root with the recording's relative path, as the golden outputs were made; the
    console script puts its own folder, not the working directory, on sys.path."""
    rec = (HERE / "steal3.vmprof").relative_to(ROOT)
    argv = [str(rec) if a == "REC" else a for a in args]
    res = subprocess.run([str(installed / "bin" / "vmprof"), *argv], capture_output=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "COLUMNS": "120"})
    got = res.stdout + f"\n[exit {res.returncode}]\n".encode() + res.stderr
    assert got == (HERE / "expected" / "steal3" / out).read_bytes(), f"installed vmprof {' '.join(argv)} differs"
