"""`vmprof blocks --format json`: the whole report as one JSON document.

Addresses are integers (runtime addresses for `start`/`end`, object-file addresses for
`vstart`/`vend`); times are cycles and ns (null when unknown); statistics objects hold
mean, p50, p90, p99, min, max."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import numpy as np

from vmprof_tui.lbr.blocks import STATUS_NAMES, BlockReport


def _num(x: float | int | None) -> float | int | None:
    if x is None:
        return None
    if isinstance(x, float | np.floating) and math.isnan(x):
        return None
    return x.item() if isinstance(x, np.generic) else x


def block_row(report: BlockReport, b: np.void) -> dict[str, Any]:
    """One block of one sample: the columns of the paper's Table 2."""
    return {
        "block": int(b["pos"]),
        "start": int(b["start"]),
        "end": int(b["end"]),
        "vstart": int(b["vstart"]),
        "vend": int(b["vend"]),
        "function": report.function_name(b),
        "status": STATUS_NAMES[int(b["status"])],
        "exact": bool(b["exact"]),
        "reconstructed": bool(b["reconstructed"]),
        "cpi": _num(float(b["cpi"])),
        "instructions": int(b["ic"]) if b["ic"] >= 0 else None,
        "internal_branches": int(b["internal"]),
        "cycles": _num(float(b["est_cycles"])),
        "ns": _num(float(b["est_ns"])),
        "lbr_cycles": int(b["lbr_cycles"]) if b["lbr_cycles"] >= 0 else None,
        "lbr_ns": _num(float(b["lbr_ns"])),
        "perf_listed_instructions": int(b["ic_listed"]) if b["ic_listed"] >= 0 else None,
    }


def sample_dict(report: BlockReport, i: int) -> dict[str, Any]:
    s = report.samples[i]
    return {
        "sample": s.index, "time_ns": s.time_ns, "cpu": s.cpu, "pid": s.pid, "tid": s.tid, "comm": s.comm,
        "vm": s.vm, "ip": s.ip, "ip_symbol": s.ip_symbol, "cycles": s.cycles, "instructions": s.instructions,
        "cpi": s.cpi, "entries": s.nr, "reconstructed_values": s.reconstructed,
        "blocks": [block_row(report, b) for b in report.sample_blocks(i)],
        "chain": [{"entry": j, "kind": c.kind, "from": c.from_, "to": c.to, "from_symbol": c.from_symbol,
                   "to_symbol": c.to_symbol} for j, c in enumerate(report.chains[i])],
    }


def report_dict(report: BlockReport, function: str | None = None, max_samples: int | None = None) -> dict[str, Any]:
    shown, with_function = report.shown_samples(function, max_samples)
    return {
        "function": function,
        "freq_hz": report.freq_hz,
        "counts": report.counts,
        "rejected": report.rejected(),
        "notes": report.notes,
        "functions": [asdict(f) for f in report.function_stats(function)],
        "blocks": [asdict(b) for b in report.block_stats(function)],
        "samples_with_function": with_function,
        "samples": [sample_dict(report, i) for i in shown],
    }


def render(report: BlockReport, function: str | None = None, max_samples: int | None = None) -> str:
    return json.dumps(report_dict(report, function, max_samples), indent=1, allow_nan=False)
