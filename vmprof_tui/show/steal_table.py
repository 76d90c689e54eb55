"""The table of `vmprof steal`: one block per VM, from analyse.steal.steal_report.

Every line fits the terminal (COLUMNS, else the terminal, else 80 columns): lists of holders and exit
reasons wrap, the name column of the corrected times comes last and is cut with an ellipsis.  Holders and
exit reasons that round to 0.000 s are counted in one "N more under 1 ms" item instead of being listed.
"""

from __future__ import annotations

import textwrap

from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.show.text import fill, width

SHOWN_S = 0.0005  # below this a holder or exit reason prints as 0.000 s


def seconds_list(title: str, items: dict[str, float], cols: int) -> list[str]:
    """`title:` then `name 0.123s` items packed into lines of cols; the items below SHOWN_S summed into one."""
    shown = [f"{k} {s:.3f}s" for k, s in items.items() if s >= SHOWN_S]
    small = [s for s in items.values() if s < SHOWN_S]
    if small:
        shown.append(f"{len(small)} more under 1 ms ({sum(small) * 1e3:.2f} ms)")
    return fill([f"{title}:"] + [f"{x}," for x in shown[:-1]] + shown[-1:], cols, "    ", "      ", " ")


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def render(report: dict, limit: int | None = 20, cols: int | None = None) -> str:
    cols = cols or width()
    lines = [f"VM {report['vm']}"]
    for v in report["vcpus"]:
        r = v["ratios"]
        lines += fill([f"vcpu{v['vcpu']} (tid {v['tid']}):", f"wall {v['wall_s']:.3f}s", f"guest {r['guest']:.1f}%",
                       f"idle {r['idle']:.1f}%", f"steal {r['steal']:.1f}%", f"(type 1 {r['steal_type1']:.1f}%,",
                       f"type 2 {r['steal_type2']:.1f}%)"], cols, "  ", "    ", " ")
        causes = v["type1_by_cause_s"]
        if any(s for k, s in causes.items() if k != "preempted"):  # more than plain preemption
            lines += seconds_list("type 1 by cause", {k: s for k, s in causes.items() if s}, cols)
        extra = []
        if v["skew_s"]:
            extra.append(f"co-stop (it could not run while a sibling vCPU ran) {v['skew_s']:.3f}s;")
        if v["halts"]:
            extra.append(f"halt polling {v['halt_poll_s']:.3f}s ({v['halts_ended_by_polling']} of {v['halts']} "
                         "halts ended while KVM polled);")
        if v["irq_while_running_s"]:
            extra.append(f"pCPU IRQ time while it ran {v['irq_while_running_s']:.3f}s (inside its guest time);")
        if extra:
            lines += fill(extra, cols, "    ", "      ", " ")
        if v["type1_by_holder_s"]:
            lines += seconds_list("type 1, who held the pCPU", v["type1_by_holder_s"], cols)
        if v["type2_by_exit_s"]:
            lines += seconds_list("type 2, the VMM/KVM on its behalf, by exit", v["type2_by_exit_s"], cols)
        if v.get("exits_to_vmm"):
            lines += fill(["exits to the VMM (KVM_RUN returned):", ", ".join(
                f"{name} {int(n)}" for name, n in v["exits_to_vmm"].items()) + ";"], cols, "    ", "      ", " ")
        lines += fill(["steal the host reports to the guest (run-queue delay):", f"{v['host_reported_steal_s']:.3f}s,",
                       f"which misses type 2 ({v['steal_type2_s']:.3f}s)"], cols, "    ", "      ", " ")
        h = v["host_run_delay"]
        if h is not None:
            mine = h["vmprof_type1_by_cause_s"]
            lines += fill([f"over the {h['span_s']:.3f}s between the first and the last schedstat reading:",
                           f"the host's own run-queue delay {h['host_s']:.3f}s;", f"vmprof's type 1 "
                           f"{sum(mine.values()):.3f}s =", " + ".join(f"{k} {s:.3f}s" for k, s in mine.items()) + ";",
                           f"difference {h['difference_s']:+.3f}s"], cols, "    ", "      ", " ")
    lines += fill(["corrected execution times:", "apparent = own run time + steal between two of its samples;",
                   "corrected = apparent - that steal;", "host-steal corrected = apparent - the run-queue wait",
                   "the host reports (what a guest can do)"], cols, "  ", "    ", " ")
    header = f"    {'apparent':>9} {'steal':>8} {'corrected':>9} {'host-steal':>10}  "
    name_width = max(12, cols - len(header))
    for title, key in (("process", "processes"), ("process / function", "functions")):
        lines.append(header + title)
        for c in report[key][:limit]:
            name = c["process"] + (f" / {demangle(c['function'])} ({c['module']})" if c["function"] else "")
            lines.append(f"    {c['apparent_s']:>8.3f}s {c['attributed_steal_s']:>7.3f}s {c['corrected_s']:>8.3f}s "
                         f"{c['host_steal_corrected_s']:>9.3f}s  " + cut(f"{name} vcpu{c['vcpu']}", name_width))
    for n in report["notes"]:
        lines += textwrap.wrap(f"note: {n}", cols, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"
