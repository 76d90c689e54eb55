"""Start, watch and stop a set of demo VMs (one demo VMM process per VM)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from vmprof_tui.demo import builds, guestos, kvm, scenarios, workloads
from vmprof_tui.demo.loader import BadProgram, check_program


class DemoError(RuntimeError):
    pass


class BadRealProgram(DemoError):
    """A real program the guest kernel cannot run (bad usage: the CLI exits 2)."""


def tsc_ticks_per_ms() -> int:
    """Calibrate the host TSC against CLOCK_MONOTONIC (guests read the same TSC).

    No Python API reads the TSC, so a 10-byte function (rdtsc; shl rdx,32;
    or rax,rdx; ret) is placed in an executable page and called through ctypes.
    """
    code = b"\x0f\x31\x48\xc1\xe2\x20\x48\x09\xd0\xc3"
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr)
    t0, c0 = time.monotonic_ns(), rdtsc()
    time.sleep(0.05)
    t1, c1 = time.monotonic_ns(), rdtsc()
    return int((c1 - c0) * 1_000_000 / (t1 - t0))


def check_kvm() -> None:
    """Fail early, with one line, when this host cannot run the demo VMs."""
    dev = kvm.kvm_device()
    if not os.path.exists(dev):
        raise DemoError(f"{dev} does not exist: this host has no KVM, so the demo VMs cannot run "
                        "(enable virtualisation or load kvm_intel/kvm_amd)")
    if not os.access(dev, os.R_OK | os.W_OK):
        raise DemoError(f"no permission to use {dev}: run as root or join the 'kvm' group")


def resolve_specs(specs: list[dict], bundle_root: Path, duration_s: float | None) -> list[dict]:
    """Fill in ELF paths, the TSC rate for duty programs, bundle folders and the duration."""
    tsc = None
    cpus = os.cpu_count() or 1
    for spec in specs:
        spec["bundle"] = str(bundle_root / spec["name"])
        if duration_s:
            spec["duration_s"] = duration_s
        for vcpu in spec["vcpus"]:
            if vcpu.get("pin") is not None and vcpu["pin"] >= cpus:
                vcpu["pin"] = cpus - 1
            for proc in vcpu["processes"]:
                if "argv" in proc:  # a real program, run by the guest kernel
                    proc["path"] = str(real_program(proc))
                    spec["kernel"] = str(guestos.kernel_path())
                    if proc.get("dir") is None:  # its files: a fresh empty directory, gone with the run's folder
                        files = bundle_root / f"{spec['name']}-files"
                        files.mkdir(parents=True, exist_ok=True)
                        proc["dir"] = str(files)
                    continue
                proc["path"] = str(builds.program_path(proc["program"]))
                proc["name"] = proc["program"]
                if proc["program"] in ("duty", "load", "blink"):  # they pace themselves by the TSC
                    tsc = tsc or tsc_ticks_per_ms()
                    proc["args"][2] = tsc
    return specs


def real_program(proc: dict) -> Path:
    """The ELF file of a real program (a user's --exec, or a workload built from Debian's libraries), checked:
    DemoError with one line for what the guest kernel cannot run."""
    path = Path(proc["exec"]) if "exec" in proc else workloads.program_path(proc["program"])
    try:
        check_program(path).stream.close()
    except BadProgram as e:
        raise BadRealProgram(str(e)) from None
    if proc.get("dir") is not None and not Path(proc["dir"]).is_dir():
        raise BadRealProgram(f"--dir {proc['dir']} is not a directory")
    proc.setdefault("name", path.name)
    return path


class DemoRun:
    """A running set of demo VMs.  Use as a context manager; stop() returns the ground truth."""

    def __init__(self, specs: list[dict], duration_s: float | None = None,
                 bundle_root: Path | None = None) -> None:
        check_kvm()
        self._tmp = None
        if bundle_root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vmprof-demo-")
            bundle_root = Path(self._tmp.name)
        self.bundle_root = bundle_root
        self.specs = resolve_specs(specs, bundle_root, duration_s)
        self.procs: list[subprocess.Popen] = []
        self.native: list[subprocess.Popen] = []  # real programs run natively beside their VM (native-vs-guest)
        self.ready: dict[str, dict] = {}
        self.truth: dict[str, dict] = {}
        self.faults: list[dict] = []
        self.output: list[dict] = []  # what real programs wrote to stdout and stderr, and notices about them
        self.errors: list[str] = []
        self._readers: list[threading.Thread] = []
        self._cond = threading.Condition()

    def __enter__(self) -> DemoRun:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 20.0) -> dict[str, dict]:
        for spec in self.specs:
            for vcpu in spec["vcpus"]:
                for proc in vcpu["processes"]:
                    if "native_pin" in proc:  # the same binary and arguments, on the host
                        self.native.append(subprocess.Popen(
                            ["taskset", "-c", str(proc["native_pin"]), proc["path"], *proc["argv"][1:]],
                            cwd=proc.get("dir") or self.bundle_root, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for spec in self.specs:
            proc = subprocess.Popen([sys.executable, "-m", "vmprof_tui.demo.vmm", json.dumps(spec)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL)
            self.procs.append(proc)
            reader = threading.Thread(target=self._read, args=(spec["name"], proc), daemon=True)
            reader.start()
            self._readers.append(reader)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.ready) < len(self.specs):
                if self.errors or time.monotonic() > deadline:
                    break
                self._cond.wait(0.1)
        if len(self.ready) < len(self.specs):
            self.stop()
            raise DemoError(self.errors[0] if self.errors else "demo VMs did not start in time")
        return self.ready

    def _read(self, name: str, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._cond:
                kind = event.get("event")
                if kind == "ready":
                    self.ready[name] = event
                elif kind == "exit":
                    self.truth[name] = event
                elif kind == "fault":
                    self.faults.append(event)
                elif kind in ("output", "notice"):
                    self.output.append(event)
                self._cond.notify_all()
        err = proc.stderr.read().strip()
        with self._cond:
            if err and name not in self.ready:
                self.errors.append(err.splitlines()[-1])
            self._cond.notify_all()

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until every VM has ended by itself (duration reached or programs done)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for p in self.procs:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                p.wait(remaining)
            except subprocess.TimeoutExpired:
                break

    def stop(self) -> dict[str, dict]:
        """Stop every VM (SIGTERM, then SIGKILL after 5 s) and return the ground truth."""
        for p in self.native:
            if p.poll() is None:
                p.terminate()
            p.wait()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for r in self._readers:
            r.join(2)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return self.truth


def scenario_specs(name: str, custom: scenarios.Custom | None = None) -> list[dict]:
    try:
        return scenarios.build(name, custom)
    except KeyError:
        raise DemoError(f"unknown scenario {name!r}; choose from {', '.join(scenarios.NAMES)}") from None
