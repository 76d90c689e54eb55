"""The text of `vmprof predict estimate`: the per-target breakdown and, with several targets, a comparison."""

from __future__ import annotations

from vmprof_tui.estimate.predict import GROUPS, Counts, Estimate, Term


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.3f} us"
    return f"{s * 1e9:.2f} ns"


def _fmt_n(n: float) -> str:
    return f"{n:,.3f}" if isinstance(n, float) and not float(n).is_integer() else f"{int(n):,}"


def render(counts: Counts, estimates: list[Estimate], top: int = 12) -> str:
    """The per-target breakdown and, with several targets, a comparison table."""
    lines = [f"command: {' '.join(counts.command)} (exit status {counts.exit_status})",
             f"reference: {counts.reference.get('host', '?')}: wall {counts.wall_s:.3f} s, user {counts.user_s:.3f} s,"
             f" system {counts.system_s:.3f} s; {counts.syscall_total:,} syscalls, {counts.minor_faults:,} minor + "
             f"{counts.major_faults:,} major faults, {counts.processes_created} processes"]
    for est in estimates:
        total = est.total_s or 1e-30
        spread = f" (range {est.low_s:.3f}-{est.high_s:.3f} s from the spread of the costs)"
        lines += ["", f"target {est.target}: predicted {est.total_s:.3f} s{spread}"
                  + (f", {est.total_s / counts.wall_s:.2f}× the reference wall time" if counts.wall_s else "")]
        if est.steal_share:
            lines.append(f"  of which steal: {est.total_s * est.steal_share:.3f} s ({100 * est.steal_share:.1f}% "
                         "of the target's runnable time went to other work on its CPU: neighbours, the host)")
        lines += [
                  f"  compute: {est.compute_basis}",
                  f"  {'term':34} {'count':>16} {'cost each':>12} {'time':>12} {'share':>6}"]
        shown = [t for t in est.terms if t.group != "syscall"]
        sys_terms = sorted((t for t in est.terms if t.group == "syscall"), key=lambda t: -t.seconds)
        for t in (t for t in shown if t.group == "compute"):  # the compute part, and the memory-bound part
            lines.append(_row(t, total))
        for g, label in (("syscall", "system calls"), ("fault", "page faults"), ("process", "processes"),
                         ("switch", "context switches")):
            lines.append(f"  {label + ' (total)':34} {'':>16} {'':>12} {_fmt_s(est.group_s(g)):>12} "
                         f"{100 * est.group_s(g) / total:5.1f}%")
            members = sys_terms[:top] if g == "syscall" else [t for t in shown if t.group == g]
            for t in members:
                lines.append(_row(t, total, indent=4))
            if g == "syscall" and len(sys_terms) > top:
                rest = sys_terms[top:]
                lines.append(f"    {f'{len(rest)} other syscalls':32} {_fmt_n(sum(t.count for t in rest)):>16} "
                             f"{'':>12} {_fmt_s(sum(t.seconds for t in rest)):>12} "
                             f"{100 * sum(t.seconds for t in rest) / total:5.1f}%")
        lines.append(f"  * fallback costs (kinds not measured, charged a null syscall): {_fmt_s(est.fallback_s)} "
                     f"({100 * est.fallback_s / total:.1f}% of the prediction)")
        lines += [f"  note: {n}" for n in est.notes]
    if len(estimates) > 1:
        lines += ["", f"{'target':24} {'predicted':>11} {'compute':>11} {'syscalls':>11} {'faults':>11} "
                  f"{'processes':>11} {'switches':>11}"]
        for est in estimates:
            lines.append(f"{est.target[:24]:24} {est.total_s:10.3f}s" + "".join(
                f" {est.group_s(g):10.3f}s" for g in GROUPS))
    return "\n".join(lines) + "\n"


def _row(t: Term, total: float, indent: int = 2) -> str:
    name = t.name + (" *" if t.fallback else "")
    count, cost = _fmt_n(t.count), _fmt_s(t.cost_s)
    if t.unit == "reference CPU s":  # seconds of the reference × a ratio
        count, cost = f"{t.count:.6f} s", f"× {t.cost_s:.4f}"
    return (f"{'':{indent}}{name:{36 - indent}} {count:>16} {cost:>12} "
            f"{_fmt_s(t.seconds):>12} {100 * t.seconds / total:5.1f}%")
