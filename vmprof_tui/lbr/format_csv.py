"""`vmprof blocks --format csv`: one row per block per sample (the paper's Table 2 with
the sample's context), for spreadsheets and further analysis.  Empty cells are unknown."""

from __future__ import annotations

import csv
import io

from vmprof_tui.lbr.blocks import BlockReport
from vmprof_tui.lbr.format_json import block_row

COLUMNS = ["sample", "time_ns", "cpu", "pid", "tid", "comm", "block", "start", "end", "function", "status", "exact",
           "cpi", "instructions", "internal_branches", "cycles", "ns", "lbr_cycles", "lbr_ns"]


def render(report: BlockReport, function: str | None = None, max_samples: int | None = None) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    shown, _ = report.shown_samples(function, max_samples)
    for i in shown:
        s = report.samples[i]
        for b in report.sample_blocks(i):
            row = block_row(report, b)
            if function is not None and row["function"] != function:
                continue
            w.writerow([s.index, s.time_ns, s.cpu, s.pid, s.tid, s.comm, row["block"], f"{row['start']:#x}",
                        f"{row['end']:#x}", row["function"], row["status"], int(row["exact"]),
                        "" if row["cpi"] is None else f"{row['cpi']:.6f}",
                        "" if row["instructions"] is None else row["instructions"], row["internal_branches"],
                        "" if row["cycles"] is None else f"{row['cycles']:.3f}",
                        "" if row["ns"] is None else f"{row['ns']:.3f}",
                        "" if row["lbr_cycles"] is None else row["lbr_cycles"],
                        "" if row["lbr_ns"] is None else f"{row['lbr_ns']:.3f}"])
    return out.getvalue()
