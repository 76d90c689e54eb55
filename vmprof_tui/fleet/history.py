"""Asking the store: per-window history of a VM, differential profiles, anomalies — SQL in DuckDB over
the Parquet dataset (embedded, no server)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from vmprof_tui.fleet.tasks import STATES, TABLES


class StoreError(RuntimeError):
    pass


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An ISO time (UTC unless it says otherwise), or an age: 1h, 30m, 2d (that long ago)."""
    now = now or datetime.now(UTC)
    m = re.fullmatch(r"\s*-?(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        return now - timedelta(seconds=float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise StoreError(f"not a time: {text!r} (an ISO time such as 2026-11-22T10:00, or an age such as 1h)") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@dataclass
class WindowRow:
    host: str
    vm: str
    window: int
    start: datetime
    window_s: float
    shares: dict[str, float]  # state -> % of the VM's vCPU time in the window
    top: list[tuple[str, str, float]]  # (function, module, % of the VM's samples)
    anomalies: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"host": self.host, "vm": self.vm, "window_id": self.window, "start": self.start.isoformat(),
                "window_s": self.window_s, **{f"{k}_pct": round(v, 3) for k, v in self.shares.items()},
                "top": [{"function": f, "module": m, "pct": round(p, 3)} for f, m, p in self.top],
                "anomalies": self.anomalies}


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        if not (path / "vcpu").is_dir():
            raise StoreError(f"{path} holds no analysed window (vmprof analyze SPOOL --store {path} fills it)")
        self.db = duckdb.connect()
        for table, schema in TABLES.items():  # a table with no file yet is an empty view of its columns
            if any((path / table).glob("*/*/*.parquet")):
                glob = str(path / table / "**" / "*.parquet")
                self.db.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{_quote(glob)}', "
                                "hive_partitioning = true, union_by_name = true)")
            else:
                columns = ", ".join(f"NULL::{_SQL_TYPES[str(f.type)]} AS {f.name}" for f in schema)
                self.db.execute(f"CREATE VIEW {table} AS SELECT {columns} WHERE false")
        names = {row[0] for row in self.db.execute("DESCRIBE vcpu").fetchall()}
        if "window_id" not in names or "cause" in names:
            raise StoreError(f"{path} was written by an older vmprof (a `window` column, causes in vcpu): analyse "
                             "the spools again into a new store")

    def _where(self, host: str | None, vm: str | None, since: datetime | None,
               until: datetime | None) -> tuple[str, list]:
        cond, params = ["true"], []
        for column, value in (("host", host), ("vm", vm)):
            if value is not None:
                cond.append(f"{column} = ?")
                params.append(value)
        if since is not None:  # as epoch seconds: a time-zone-aware value would need pytz in DuckDB's client
            cond.append("epoch(window_start) >= ?")
            params.append(since.timestamp())
        if until is not None:
            cond.append("epoch(window_start) < ?")
            params.append(until.timestamp())
        return " AND ".join(cond), params

    def history(self, host: str | None = None, vm: str | None = None, since: datetime | None = None,
                until: datetime | None = None, top: int = 3) -> list[WindowRow]:
        where, params = self._where(host, vm, since, until)
        states = self.db.execute(
            f"SELECT host, vm, window_id, epoch(min(window_start)), max(window_s), state, sum(seconds) FROM vcpu "
            f"WHERE {where} GROUP BY ALL ORDER BY host, vm, window_id", params).fetchall()
        rows: dict[tuple, WindowRow] = {}
        for h, v, w, start, window_s, state, seconds in states:
            row = rows.setdefault((h, v, w), WindowRow(h, v, int(w), datetime.fromtimestamp(start, UTC),
                                                       float(window_s), {}, []))
            row.shares[state] = float(seconds)
        for row in rows.values():
            total = sum(row.shares.values()) or 1.0
            row.shares = {s: 100.0 * row.shares.get(s, 0.0) / total for s in STATES}
            row.shares["steal"] = row.shares["steal_type1"] + row.shares["steal_type2"]
        funcs = self.db.execute(
            f"SELECT host, vm, window_id, function, module, sum(samples) AS n, "
            f"sum(sum(samples)) OVER (PARTITION BY host, vm, window_id) AS total FROM profile WHERE {where} "
            f"GROUP BY host, vm, window_id, function, module ORDER BY host, vm, window_id, n DESC", params).fetchall()
        for h, v, w, fn, mod, n, total in funcs:
            row = rows.get((h, v, w))
            if row is not None and len(row.top) < top:
                row.top.append((fn, mod, 100.0 * float(n) / float(total or 1)))
        return sorted(rows.values(), key=lambda r: (r.host, r.vm, r.start, r.window))

    def function_shares(self, vm: str, since: datetime | None, until: datetime | None,
                        host: str | None = None) -> dict[tuple[str, str], float]:
        where, params = self._where(host, vm, since, until)
        got = self.db.execute(f"SELECT function, module, sum(samples) FROM profile WHERE {where} GROUP BY ALL",
                              params).fetchall()
        total = sum(float(n) for _f, _m, n in got) or 1.0
        return {(f, m): 100.0 * float(n) / total for f, m, n in got}

    def per_window_function_shares(self, host: str | None, vm: str | None, since: datetime | None,
                                   until: datetime | None) -> dict[tuple, dict[tuple[str, str], float]]:
        where, params = self._where(host, vm, since, until)
        got = self.db.execute(
            f"SELECT host, vm, window_id, function, module, sum(samples) / sum(sum(samples)) OVER "
            f"(PARTITION BY host, vm, window_id) * 100 FROM profile WHERE {where} "
            f"GROUP BY host, vm, window_id, function, module", params).fetchall()
        out: dict[tuple, dict[tuple[str, str], float]] = {}
        for h, v, w, f, m, pct in got:
            out.setdefault((h, v, int(w)), {})[(f, m)] = float(pct)
        return out


    def vms(self, host: str | None = None) -> list[str]:
        """The VMs the store holds (of one host)."""
        where, params = self._where(host, None, None, None)
        return [v for (v,) in self.db.execute(f"SELECT DISTINCT vm FROM vcpu WHERE {where} ORDER BY vm",
                                              params).fetchall()]

    def hosts(self) -> list[str]:
        return [h for (h,) in self.db.execute("SELECT DISTINCT host FROM vcpu ORDER BY host").fetchall()]

    def functions(self, host: str, vm: str, window: int, limit: int = 100) -> list[tuple[str, str, str, float]]:
        """(process, function, module, % of the VM's samples) of one stored window, largest first."""
        got = self.db.execute(
            "SELECT coalesce(process, ''), function, module, sum(samples) AS n, sum(sum(samples)) OVER () FROM profile "
            "WHERE host = ? AND vm = ? AND window_id = ? GROUP BY ALL ORDER BY n DESC LIMIT ?",
            [host, vm, window, limit]).fetchall()
        return [(p, f, m, 100.0 * float(n) / float(total or 1)) for p, f, m, n, total in got]


_SQL_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "int32": "INTEGER", "double": "DOUBLE",
              "timestamp[us, tz=UTC]": "TIMESTAMPTZ"}


def _quote(text: str) -> str:
    return text.replace("'", "''")


@dataclass
class DiffRow:
    function: str
    module: str
    a_pct: float
    b_pct: float

    @property
    def delta(self) -> float:
        return self.b_pct - self.a_pct


def diff(store: Store, vm: str, a: tuple[datetime, datetime], b: tuple[datetime, datetime],
         host: str | None = None, limit: int = 20, names: tuple[str, str] = ("A", "B")) -> list[DiffRow]:
    """Functions whose share of the VM's samples rose or fell most from range A to range B; a range without
    samples is an error (against nothing, every function would seem to appear or vanish)."""
    if vm not in store.vms(host):
        raise StoreError(f"no VM named {vm} in the store{f' on host {host}' if host else ''} "
                         f"(VMs: {', '.join(store.vms(host)) or 'none'})")
    sa, sb = store.function_shares(vm, *a, host=host), store.function_shares(vm, *b, host=host)
    for shares, name, (lo, hi) in ((sa, names[0], a), (sb, names[1], b)):
        if not shares:
            raise StoreError(f"range {name} ({lo:%Y-%m-%d %H:%M:%S} to {hi:%Y-%m-%d %H:%M:%S} UTC) holds no window "
                             f"of VM {vm}: nothing to compare with")
    rows = [DiffRow(f, m, sa.get((f, m), 0.0), sb.get((f, m), 0.0)) for f, m in set(sa) | set(sb)]
    return sorted(rows, key=lambda r: (-abs(r.delta), r.function))[:limit]


def flag_anomalies(rows: list[WindowRow], function_shares: dict[tuple, dict[tuple[str, str], float]],
                   baseline: int = 10, k: float = 4.0, floor: float = 2.0) -> None:
    """Mark windows whose steal, idle or a function's share departs from that VM's recent baseline: more than
    k robust deviations (1.4826 × MAD of the last `baseline` windows, at least `floor` points) from their
    median. Needs at least 3 earlier windows."""
    by_vm: dict[tuple[str, str], list[WindowRow]] = {}
    for r in rows:
        by_vm.setdefault((r.host, r.vm), []).append(r)
    for series in by_vm.values():
        for i, row in enumerate(series):
            past = series[max(0, i - baseline):i]
            if len(past) < 3:
                continue
            for name in ("steal", "idle"):
                _check(row, name, row.shares[name], [p.shares[name] for p in past], k, floor)
            mine = function_shares.get((row.host, row.vm, row.window), {})
            earlier = [function_shares.get((p.host, p.vm, p.window), {}) for p in past]
            for key in set(mine) | {key for e in earlier for key in e}:
                _check(row, f"{key[0]} ({key[1]})", mine.get(key, 0.0), [e.get(key, 0.0) for e in earlier], k, floor)


def _check(row: WindowRow, name: str, value: float, past: list[float], k: float, floor: float) -> None:
    med = statistics.median(past)
    spread = max(1.4826 * statistics.median(abs(x - med) for x in past), floor)
    if abs(value - med) > k * spread:
        row.anomalies.append(f"{name} {value:.1f}% (baseline {med:.1f}% ± {spread:.1f})")
