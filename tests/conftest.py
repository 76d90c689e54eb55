"""Shared fixtures.  Tests that need KVM, BPF or root run for real (CI runs as root
on a KVM host); on a machine without them they fail with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def vmprof(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the vmprof CLI as a user would."""
    return subprocess.run([sys.executable, "-m", "vmprof_tui", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kw)


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (CI runs as root); run the suite with sudo")
