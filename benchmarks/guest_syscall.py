"""The round trip of a system call of a real program on the demo guest kernel (docs/demo.md, issue 31).

A static C program makes N getppid calls and times them with CLOCK_MONOTONIC (itself a served call, twice in
all); the VMM's ground truth gives its own serving time per call.  On this host's kvm_pvm the return to user
mode (SYSRETQ) is emulated by KVM on every call.

    .venv/bin/python benchmarks/guest_syscall.py [CALLS]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from vmprof_tui.demo import runner, scenarios

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10000;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		syscall(SYS_getppid);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.3f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1e3);
	return 0;
}
"""


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "rt.c", Path(tmp) / "rt"
        src.write_text(SOURCE)
        subprocess.run(["gcc", "-static", "-O2", "-o", str(exe), str(src)], check=True)
        native = float(subprocess.run([str(exe), str(calls)], capture_output=True, text=True).stdout)
        vm = scenarios.real_vm("rt", scenarios.Custom(exec=str(exe), args=(str(calls),), pin=scenarios.SHARED_CPU,
                                                       mem_mb=64))
        with runner.DemoRun([vm], duration_s=120) as run:
            run.wait(130)
    guest = float(next(e["text"] for e in run.output if e["event"] == "output"))
    served = run.truth["rt"]["processes"][0]["syscalls"]["getppid"]
    print(f"getppid x {calls}: native {native:.3f} us, in the demo VM {guest:.2f} us per round trip, "
          f"of which the VMM serving it {served['ns'] / served['count'] / 1e3:.2f} us")


if __name__ == "__main__":
    main()
