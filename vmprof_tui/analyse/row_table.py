"""A profile's rows as columns: what `vmprof report` filters, rounds, sorts and writes out (table, JSON, CSV).

A report of a large recording has hundreds of thousands of rows; as one `Row` object each, with their sort and
their text, they cost several times what they cost as columns (docs/scale.md, "Third round").  Here they are
numpy columns (samples, string ids, pids, kinds) and one array of the strings the
ids point into; names are looked up per distinct id, not per row.  Every operation gives what the same operation
on the rows as a list gives (report.py's list path, shares.whole_rows, shares.row_ratios, the --sort orders),
sums included: they add in row order, as Python's do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.analyse.shares import Row, percent
from vmprof_tui.resolve.demangle import demangle

KINDS = tuple(RowKind)  # a row's kind: its index here
_INDEX = {k: i for i, k in enumerate(KINDS)}
FUNCTION, UNKNOWN, VM = _INDEX[RowKind.FUNCTION], _INDEX[RowKind.UNKNOWN], _INDEX[RowKind.VM]
_IDLE = [_INDEX[RowKind.IDLE], _INDEX[RowKind.CPU_IDLE]]
_HALT_POLL = _INDEX[RowKind.HALT_POLL]
_VIRTUAL = np.array([k is not RowKind.FUNCTION and k.is_virtual for k in KINDS])


@dataclass
class RowTable:
    """Rows as columns; string columns are ids into `strings`, where "" is none (a Row's process or vm None);
    pid -1 is none."""
    samples: np.ndarray  # float
    kernel: np.ndarray  # float: of `samples`, those in kernel mode (Row.kernel)
    func: np.ndarray  # ids
    module: np.ndarray
    process: np.ndarray
    pid: np.ndarray
    vm: np.ndarray
    kind: np.ndarray  # index in KINDS
    numpy_samples: np.ndarray  # bool: Row.samples was a numpy number (JSON's ratio rounds as numpy does then)
    strings: np.ndarray  # object: str

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows())

    @staticmethod
    def of_rows(rows: Iterable[Row]) -> RowTable:
        ids: dict[str, int] = {"": 0}
        rows = list(rows)

        def column(values: Iterable[str | None]) -> np.ndarray:
            return np.array([ids.setdefault(v or "", len(ids)) for v in values], np.int32)

        table = RowTable(np.array([r.samples for r in rows], float), np.array([r.kernel for r in rows], float),
                         column(r.function for r in rows), column(r.module for r in rows),
                         column(r.process for r in rows),
                         np.array([-1 if r.pid is None else r.pid for r in rows], np.int32),
                         column(r.vm for r in rows), np.array([_INDEX[r.kind] for r in rows], np.int8),
                         np.array([isinstance(r.samples, np.generic) for r in rows], bool), np.empty(0, object))
        table.strings = object_array(list(ids))
        return table

    @staticmethod
    def of_functions(samples: np.ndarray, kernel: np.ndarray, ids: dict[str, np.ndarray], pid: np.ndarray,
                     unknown: np.ndarray, vm: str | None, strings: np.ndarray) -> RowTable:
        """Function rows (analyse/stream.py's RowColumns) of one VM's guest (vm) or of the host (None)."""
        strings = np.append(strings, object_array([vm or ""]))
        return RowTable(samples, kernel, ids["func"], ids["module"], ids["process"], pid,
                        np.full(len(samples), len(strings) - 1, np.int32),
                        np.where(unknown, UNKNOWN, FUNCTION).astype(np.int8), np.zeros(len(samples), bool), strings)

    def extended(self, other: RowTable) -> RowTable:
        """self with other's rows after its own, changed in place and returned: its columns are replaced one at a
        time, so a table of a million rows is not held twice."""
        if not len(other):
            return self
        shift = len(self.strings)
        for f in fields(self)[:-1]:
            theirs = getattr(other, f.name) + (shift if f.name in ("func", "module", "process", "vm") else 0)
            setattr(self, f.name, np.concatenate([getattr(self, f.name), theirs]))
        self.strings = np.concatenate([self.strings, other.strings])
        return self

    def take(self, index: np.ndarray) -> RowTable:
        """The rows of an index or a mask, in its order."""
        return RowTable(*(getattr(self, f.name)[index] for f in fields(self)[:-1]), strings=self.strings)

    def rows(self) -> list[Row]:
        """As Row objects (the filters' tests, and the formats that take Rows)."""
        s = self.strings
        samples = self.samples.tolist()
        for i in np.flatnonzero(self.numpy_samples).tolist():
            samples[i] = np.float64(samples[i])  # as the Row was: numpy rounds it (Row.to_json)
        return [Row(n, f, m, p or None, None if pid < 0 else pid, vm or None, KINDS[k], kern)
                for n, f, m, p, pid, vm, k, kern in zip(
                    samples, s[self.func].tolist(), s[self.module].tolist(), s[self.process].tolist(),
                    self.pid.tolist(), s[self.vm].tolist(), self.kind.tolist(), self.kernel.tolist(), strict=True)]

    # -- what report.py does to a profile's rows ------------------------------------------------------------
    def shown(self) -> RowTable:
        """Profile.shown_rows."""
        return self.take(self.samples >= 0.5)

    def whole(self) -> RowTable:
        """shares.whole_rows: in whole samples that add up to their sum rounded."""
        whole = np.floor(self.samples)
        short = int(round(self.samples.sum() - whole.sum()))
        if short:
            whole[np.argsort(-(self.samples - whole), kind="stable")[:short]] += 1
        changed = whole != np.round(self.samples)
        if not changed.any():
            return self
        out = self.take(slice(None))
        out.samples, out.kernel, out.numpy_samples = self.samples.copy(), self.kernel.copy(), self.numpy_samples.copy()
        out.samples[changed] = whole[changed]
        out.kernel[changed] = np.minimum(self.kernel[changed], whole[changed])
        out.numpy_samples[changed] = False
        return out

    def passing(self, tests: list[Callable[[Row], bool]]) -> RowTable:
        """The rows that pass every test.  A test reads a row's process, pid, module, vm and kind (report.py's
        row filters): it is asked once per distinct combination of them."""
        if not len(self):
            return self
        first, inverse = _combinations([self.process, self.pid, self.module, self.vm, self.kind])
        ok = np.array([all(test(r) for test in tests) for r in self.take(first).rows()], bool)
        return self.take(ok[inverse])

    def _sum(self, values: np.ndarray, rows: np.ndarray | slice = slice(None), of_samples: bool = True) -> float:
        """sum() of the values of `rows`, in row order, of the type Python's sum gives the rows' own numbers: for
        values made of samples, a numpy float once one row's is (the JSON's ratios round as numpy does then)."""
        total = sum(values[rows].tolist())
        return np.float64(total) if of_samples and self.numpy_samples[rows].any() else total

    def total(self) -> float:
        """sum(r.samples for r in rows)."""
        return self._sum(self.samples)

    def unresolved(self) -> float:
        return self._sum(self.samples, self.kind == UNKNOWN)

    def virtual_samples(self) -> float:
        """Profile.virtual_samples of these rows."""
        return self._sum(self.samples, _VIRTUAL[self.kind])

    def ratios(self, level: str) -> dict[str, float]:
        """shares.row_ratios of these rows: each part summed in row order, the parts in the order rows first
        touch them."""
        function = (self.kind == FUNCTION) | (self.kind == UNKNOWN)
        idle_task = function & (self.pid == 0) if level == "host" else np.zeros(len(self), bool)
        other = ~function
        steal = other & ~np.isin(self.kind, _IDLE + [VM, _HALT_POLL])
        mine = function & ~idle_task
        parts = [("os", mine, self.kernel, 0), ("user", mine, self.samples - self.kernel, 1),
                 ("idle", idle_task | (other & np.isin(self.kind, _IDLE)), self.samples, 0),
                 ("vm", self.kind == VM, self.samples, 0), ("halt_poll", self.kind == _HALT_POLL, self.samples, 0),
                 ("steal", steal, self.samples, 0)]
        touched = []
        for key, rows, values, then in parts:
            if rows.any():  # parts[key] += each value, in row order; first touched at its first row
                # (kernel samples are Python floats in every row: only the parts made of samples take a numpy type)
                value = self._sum(values, rows, of_samples=key != "os")
                touched.append((int(np.argmax(rows)), then, key, value))
        summed = {key: value for _at, _then, key, value in sorted(touched)}
        keys = ["os", "user", "idle", "vm"] if level == "host" else ["os", "user", "idle", "steal"] + (
            ["halt_poll"] if "halt_poll" in summed else [])
        return percent([(k, summed.get(k, 0.0)) for k in keys], sum(summed.values()))

    def order(self, sort: str, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """The order of a report's --sort of `rows` (an index), as an index into them: samples (largest first,
        then by function name), or by (demangled function, module, process, -samples), (process, pid, -samples,
        function), (pid, -samples, function), (module, -samples, function); ties keep the rows' order."""
        minus = -self.samples[rows]
        func = self._rank(self.func[rows])
        if sort in ("function", "name"):
            keys = [minus, self._rank(self.process[rows]), self._rank(self.module[rows]),
                    self._rank(self.func[rows], demangle)]
        elif sort == "process":
            keys = [func, minus, np.maximum(self.pid[rows], 0), self._rank(self.process[rows])]
        elif sort == "pid":
            keys = [func, minus, self.pid[rows]]
        elif sort == "module":
            keys = [func, minus, self._rank(self.module[rows])]
        else:
            keys = [func, minus]
        return np.lexsort(keys)  # stable: ties keep the rows' order, as Python's sorted

    def _rank(self, ids: np.ndarray, key: Callable[[str], str] | None = None) -> np.ndarray:
        """Each id's rank by its string (through `key`), as Python orders strings."""
        distinct, inverse = arrays.unique(ids, return_inverse=True)
        texts = self.strings[distinct].tolist()
        if key is not None:
            texts = [key(t) for t in texts]
        rank = {t: i for i, t in enumerate(sorted(set(texts)))}
        return np.array([rank[t] for t in texts], np.int32)[inverse]


def as_table(rows: list[Row] | RowTable) -> RowTable:
    return rows if isinstance(rows, RowTable) else RowTable.of_rows(rows)


def object_array(texts: list[str]) -> np.ndarray:
    out = np.empty(len(texts), object)
    out[:] = texts
    return out


def _combinations(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(a row of each distinct combination of the columns' values, each row's combination)."""
    key = np.zeros(len(columns[0]), np.int64)
    for c in columns:
        _values, inverse = arrays.unique(c, return_inverse=True)
        key = key * (int(inverse.max()) + 1) + inverse  # below rows² after the renumbering of the line below
        _keys, first, key = arrays.unique(key, return_index=True, return_inverse=True)
    return first, key
