"""What the demo prints itself: the per-second vCPU load line and the VMM's ground truth."""

from __future__ import annotations

from vmprof_tui.libc import schedstat


def load_line(ready: dict[str, dict], last: dict[tuple[int, int], int], dt: float, elapsed: float) -> str:
    """Each vCPU thread's CPU share over the last `dt` seconds (`last` keeps the previous readings)."""
    parts = []
    for name, vm in ready.items():
        loads = []
        for v in vm["vcpus"]:
            key = (vm["pid"], v["tid"])
            now = schedstat(*key)[0]
            if now and key in last:
                loads.append(f"vcpu{v['vcpu']} {100 * (now - last[key]) / 1e9 / dt:5.1f}%")
            elif not now:
                loads.append(f"vcpu{v['vcpu']} ended")
            last[key] = now
        parts.append(f"{name}[{vm['pid']}]: " + ", ".join(loads))
    return f"{elapsed:6.1f}s  " + "  ".join(parts)


def format_truth(truth: dict[str, dict]) -> str:
    def sec(ns: int) -> str:
        return f"{ns / 1e9:.3f}s"

    lines = ["ground truth (time in KVM_RUN measured by the demo VMM):"]
    for name, vm in truth.items():
        throttled = f", vCPU cgroup throttled {sec(vm['throttled_ns'])}" if "throttled_ns" in vm else ""
        lines.append(f"  {name} (pid {vm['pid']}): wall {sec(vm['wall_ns'])}{throttled}")
        for v in vm["vcpus"]:
            lines.append(f"    vcpu{v['vcpu']} tid {v['tid']} pin {v['pin']}: guest {sec(v['kvm_run_ns'])}, "
                         f"halted {sec(v['halt_ns'])} (idle {sec(v['pure_halt_ns'])} + wake-up wait "
                         f"{sec(v['wakeup_wait_ns'])}), on-CPU {sec(v['thread_cpu_ns'])}, "
                         f"run-queue wait {sec(v['run_delay_ns'])}")
        for p in vm["processes"]:
            lines.append(f"    pid {p['pid']} {p['name']} (cr3 {p['cr3']:#x}): in KVM_RUN {sec(p['run_ns'])}, "
                         f"on-CPU {sec(p['cpu_ns'])}, work {p['work']}")
            if "syscalls" in p:  # a real program: the system calls its VMM served
                calls = sorted(p["syscalls"].items(), key=lambda kv: -kv[1]["count"])
                lines.append(f"      {sum(c['count'] for _, c in calls)} system calls served in "
                             f"{sec(sum(c['ns'] for _, c in calls))}: " + ", ".join(
                                 f"{n} {c['count']}" for n, c in calls[:6]) + (", ..." if len(calls) > 6 else "")
                             + f"; {p['state']}" + (f" with status {p['exit_code']}" if p["exit_code"] is not None
                                                     else ""))
    return "\n".join(lines)
