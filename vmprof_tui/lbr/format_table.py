"""`vmprof blocks --format table`: plain-text tables for a terminal.

1. summary: samples, blocks accepted / exact / rejected by reason, unresolved addresses;
2. per function and per block across samples: occurrences, instructions, mean and
   percentiles of the block time (CPI x instructions), timed-LBR cycles beside it;
3. for the first samples: the paper's Table 2 (block, start, end, function, CPI,
   instructions, cycles) and its Table 7 (the call/return chain with symbol names).
"""

from __future__ import annotations

import math

from vmprof_tui.lbr.blocks import STATUS_NAMES, STATUS_OK, BlockReport


def _f(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def _stat(d: dict[str, float] | None, key: str, digits: int = 1) -> str:
    return _f(d[key], digits) if d else "-"


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                                 strict=True))).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def summary(report: BlockReport, function: str | None) -> list[str]:
    c = report.counts
    rej = report.rejected()
    freq = f"CPU {report.freq_hz / 1e9:.3f} GHz" if report.freq_hz else "no CPU frequency (cycles only)"
    lines = [
        f"vmprof blocks{f': function {function}' if function else ''} -- {c['samples']} samples "
        f"({c['samples'] - c['samples_without_cpi']} with measured CPI), {c['entries']} branch entries, {freq}",
        f"blocks: {c['blocks']} total, {c['blocks_ok']} counted ({c['blocks_exact']} exact), "
        f"{c['blocks_rejected']} rejected" + (" (" + ", ".join(f"{k} {v}" for k, v in rej.items()) + ")" if rej
                                              else ""),
        f"unresolved addresses: {c['unresolved_addresses']}; timed-LBR blocks: {c['blocks_timed_lbr']}"
        + (f"; values reconstructed from the code: {c['reconstructed_values']}" if c["reconstructed_values"] else "")
        + (f"; blocks where perf's listing disagrees: {c['blocks_listed_mismatch']}"
           if c["blocks_listed_mismatch"] else ""),
    ]
    lines += [f"note: {n}" for n in report.notes]
    if function and not report.function_ids(function).size:
        lines.append(f"note: no counted block lies in a function named {function!r}")
    return lines


def function_table(report: BlockReport, function: str | None) -> list[str]:
    rows = []
    for s in report.function_stats(function):
        rows.append([s.function, str(s.blocks), str(s.samples), str(s.distinct_blocks), str(s.instructions),
                     f"{100 * s.exact_share:.0f}", _stat(s.cycles, "mean"), _stat(s.cycles, "p50"),
                     _stat(s.cycles, "p90"), _stat(s.cycles, "p99"), _stat(s.ns, "mean"),
                     _stat(s.lbr_cycles, "mean"), _f(s.total_cycles, 0)])
    head = ["function", "blocks", "samples", "distinct", "instr", "exact%", "mean cyc", "p50", "p90", "p99",
            "mean ns", "LBR cyc", "total cyc"]
    return ["per function (block occurrences across samples; cycles = CPI x instructions, LBR cyc = timed LBR)",
            *_table(head, rows, set(range(1, len(head))))]


def block_table(report: BlockReport, function: str | None, limit: int = 30) -> list[str]:
    stats = report.block_stats(function)
    rows = []
    for s in stats[:limit]:
        rows.append([f"{s.start:#x}", f"{s.end:#x}", s.function, str(s.ic), "yes" if s.exact else "no",
                     str(s.count), _stat(s.cycles, "mean"), _stat(s.cycles, "p50"), _stat(s.cycles, "p90"),
                     _stat(s.cycles, "p99"), _stat(s.ns, "mean"), _stat(s.lbr_cycles, "mean"), str(s.lbr_count)])
    head = ["start", "end", "function", "instr", "exact", "count", "mean cyc", "p50", "p90", "p99", "mean ns",
            "LBR cyc", "LBR n"]
    more = [f"... {len(stats) - limit} more blocks (use --format json or csv)"] if len(stats) > limit else []
    return [f"per block ({len(stats)} distinct; addresses in the object file)",
            *_table(head, rows, set(range(3, len(head)))), *more]


def sample_tables(report: BlockReport, i: int) -> list[str]:
    s = report.samples[i]
    lines = [f"sample {s.index}: cpu {s.cpu} pid {s.pid} tid {s.tid} {s.comm} time {s.time_ns} ns, "
             f"ip {s.ip:#x} ({s.ip_symbol}); cycles {s.cycles if s.cycles is not None else '-'}, "
             f"instructions {s.instructions if s.instructions is not None else '-'}, CPI {_f(s.cpi, 3)}"]
    rows = []
    for b in report.sample_blocks(i):
        ok = int(b["status"]) == STATUS_OK
        rows.append([f"block{int(b['pos'])}", f"{int(b['start']):#x}", f"{int(b['end']):#x}",
                     report.function_name(b) if ok else "-", _f(float(b["cpi"]), 3),
                     str(int(b["ic"])) if ok else "-", _f(float(b["est_cycles"]), 2), _f(float(b["est_ns"]), 1),
                     str(int(b["lbr_cycles"])) if b["lbr_cycles"] >= 0 else "-",
                     ("exact" if b["exact"] else "has branches") if ok else STATUS_NAMES[int(b["status"])]])
    head = ["block", "start", "end", "function", "CPI", "instr", "cycles", "ns", "LBR cyc", "status"]
    lines += _table(head, rows, {4, 5, 6, 7, 8})
    crow = [[f"LBR{j}", c.kind, c.from_symbol, c.to_symbol] for j, c in enumerate(report.chains[i])]
    crow.append(["(current)", "(sampled IP)", "", s.ip_symbol])
    lines += ["", "call/return chain (oldest first)", *_table(["entry", "type", "from", "to"], crow, set())]
    return lines


def render(report: BlockReport, function: str | None = None, max_samples: int | None = 3) -> str:
    lines = summary(report, function)
    lines += ["", *function_table(report, function), "", *block_table(report, function)]
    shown, _ = report.shown_samples(function, max_samples)
    for i in shown:
        lines += ["", *sample_tables(report, i)]
    return "\n".join(lines) + "\n"
