"""The table of `vmprof steal`: one block per VM, from analyse.steal.steal_report."""

from __future__ import annotations


def render(report: dict, limit: int | None = 20) -> str:
    lines = [f"VM {report['vm']}"]
    for v in report["vcpus"]:
        r = v["ratios"]
        lines.append(f"  vcpu{v['vcpu']} (tid {v['tid']}): wall {v['wall_s']:.3f}s  guest {r['guest']:.1f}%  "
                     f"idle {r['idle']:.1f}%  steal {r['steal']:.1f}% (type 1 {r['steal_type1']:.1f}%, "
                     f"type 2 {r['steal_type2']:.1f}%)")
        c = v["type1_by_cause_s"]
        if any(s for k, s in c.items() if k != "preempted"):  # more than plain preemption
            lines.append("    type 1 by cause: " + ", ".join(f"{k} {s:.3f}s" for k, s in c.items() if s))
        if v["skew_s"]:
            lines.append(f"    co-stop (it could not run while a sibling vCPU ran): {v['skew_s']:.3f}s")
        extra = []
        if v["halts"]:
            extra.append(f"halt polling {v['halt_poll_s']:.3f}s ({v['halts_ended_by_polling']} of {v['halts']} "
                         "halts ended while KVM polled)")
        if v["irq_while_running_s"]:
            extra.append(f"pCPU IRQ time while it ran {v['irq_while_running_s']:.3f}s (inside its guest time)")
        if extra:
            lines.append("    " + "; ".join(extra))
        if v["type1_by_holder_s"]:
            lines.append("    type 1, who held the pCPU: " + ", ".join(
                f"{k} {s:.3f}s" for k, s in v["type1_by_holder_s"].items()))
        if v["type2_by_exit_s"]:
            lines.append("    type 2, VMM/KVM on the vCPU's behalf by exit reason: " + ", ".join(
                f"{k} {s:.3f}s" for k, s in v["type2_by_exit_s"].items()))
        lines.append(f"    steal the host reports to the guest (run-queue delay): {v['host_reported_steal_s']:.3f}s"
                     f" — misses type 2 ({v['steal_type2_s']:.3f}s)")
        if v["host_run_delay_s"] is not None:
            host, mine = v["host_run_delay_s"], v["host_reported_steal_s"]
            lines.append(f"    the host's own run-queue delay (schedstat, while recorded): {host:.3f}s; "
                         f"vmprof's type 1 {mine:.3f}s = " + " + ".join(f"{k} {s:.3f}s" for k, s in c.items())
                         + f"; difference {host - mine:+.3f}s (schedstat is read once a second, so it may miss up "
                         "to a second at either end)")
    lines.append("  corrected execution times: apparent = own run time + steal between two of its samples; "
                 "corrected = apparent - that steal;")
    lines.append("  host-steal corrected = apparent - the run-queue wait the host reports (what a guest can do)")
    header = f"    {'apparent':>9} {'steal':>8} {'corrected':>9} {'host-steal corr.':>16}  "
    for title, key in (("process", "processes"), ("process / function", "functions")):
        lines.append(header + title)
        for c in report[key][:limit]:
            name = c["process"] + (f" / {c['function']} ({c['module']})" if c["function"] else "")
            lines.append(f"    {c['apparent_s']:>8.3f}s {c['attributed_steal_s']:>7.3f}s {c['corrected_s']:>8.3f}s "
                         f"{c['host_steal_corrected_s']:>15.3f}s  {name} vcpu{c['vcpu']}")
    lines += [f"  note: {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"
