"""The multi-VM performance model of paper 003: a VM's resource usage under concurrent workloads.

Workloads w_1..w_m run at levels x_i in [0, 1] (a fraction of each workload's maximum).  The model
of the usage L of one resource (CPU in cores) is built order by order from few measurements:

* first order, one per workload: a 4th-degree polynomial fitted to the workload alone at N_1
  levels (formula 1, ``numpy.polynomial``);
* order k >= 2, one per set S of k workloads: the approximation
  ``g(worst_{i in S}(L_{S without i}(x) + L_i(x_i)))`` (formula 4; for k = 2 it is formula 2,
  ``g(L_i + L_j)``), where g caps at the resource's maximum ``l_max`` and worst is the largest
  usage (more of a resource used is worse), corrected by a spline D_S of the error measured at
  a few points with every workload of S running (formula 3).  The spline is scipy's thin-plate
  spline (``RBFInterpolator``), which takes scattered points in any dimension; on the faces where
  a workload of S is absent (x_i = 0) it is held to the error of the order below, which the model
  already knows, so few measured points inside suffice when they are precise.  The spline all but
  passes through its measured points (see SMOOTHING), so their measurement noise goes into the
  model: with the 5 points per pair and 10 per triple of the paper's experiment and run-to-run noise
  of several % of a core, the direct fit below, which averages 55 points over 20 terms, can be the
  more accurate of the two.  The corrected value is capped by g too.
* adding a VM to a host where N VMs already run (formula 5): fair scheduling, capped at l_max.

The conventional model the paper compares with fits all workloads at once: a polynomial of total
degree ``DIRECT_DEGREE`` in the m levels, least squares over the same number of measurements.

This module is pure arithmetic on measured points; model_measure.py measures them in demo VMs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import bounded_json, files

WORKLOADS = ("cpu", "net-send", "net-recv")
FIRST_DEGREE = 4  # formula (1)
DIRECT_DEGREE = 3  # the direct fit: 20 terms for 3 workloads, well below 55 measurements
SMOOTHING = 1e-3  # of the error spline (the paper gives none); small against the kernel's scale: the spline
# passes within ~0.001 core of its measured errors.  A leave-one-out choice (1e-3..10) was tried on the
# benchmark's points and on simulated ones: better with much noise, worse with little; not adopted.
FORMAT = "vmprof-model"
VERSION = 1

Subset = tuple[int, ...]
Measure = Callable[[np.ndarray], dict]  # levels of every workload -> {"value": usage, ...what else to keep}


class ModelError(ValueError):
    """A model file or an argument the model cannot use (one line for the user)."""


# -- sampling points -----------------------------------------------------------------------------

def split_count(total: int, parts: int) -> list[int]:
    """`total` measurements spread over `parts` models as evenly as possible, at least one each."""
    base, extra = divmod(max(total, parts), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def first_levels(count: int) -> np.ndarray:
    """N+1 levels from 0 to the maximum (the paper's sampling points of one workload)."""
    return np.linspace(0.0, 1.0, max(count, 2))


def _side(k: int, count: int, least: int = 1) -> int:
    """Levels per axis of the smallest k-dimensional grid that holds `count` points."""
    q = least
    while q ** k < count:
        q += 1
    return q


def _grid(levels: np.ndarray, k: int) -> np.ndarray:
    return np.array(list(itertools.product(levels, repeat=k)))


def _spread(grid: np.ndarray, count: int) -> np.ndarray:
    return grid[np.round(np.linspace(0, len(grid) - 1, count)).astype(int)]


def inner_points(k: int, count: int) -> np.ndarray:
    """`count` points with all k workloads running: spread over the grid {1/q .. 1}^k, q as small as fits."""
    q = _side(k, count)
    return _spread(_grid(np.arange(1, q + 1) / q, k), count)


def face_points(k: int, count: int) -> np.ndarray:
    """Points of the grid {0, 1/q .. 1}^k with some workload absent (x_i = 0): where the order below holds."""
    q = _side(k, count)
    grid = _grid(np.arange(0, q + 1) / q, k)
    return grid[(grid == 0).any(axis=1)]


def direct_points(m: int, count: int) -> np.ndarray:
    """The conventional design: `count` points spread over the full grid {0 .. 1}^m."""
    return _spread(_grid(np.linspace(0, 1, _side(m, count, least=2)), m), count)


def full(m: int, subset: Subset, x: np.ndarray) -> np.ndarray:
    """Levels of every workload from levels of the workloads in `subset` (the others absent)."""
    out = np.zeros((len(x), m))
    out[:, list(subset)] = x
    return out


# -- the model -----------------------------------------------------------------------------------

@dataclass
class Correction:
    """D_S: the thin-plate spline of the error of the order-k approximation over the workloads of S."""
    points: np.ndarray  # (n, k) levels of S: measured points and face anchors
    errors: np.ndarray  # (n,) measured - approximation
    spline: object = None

    def __post_init__(self) -> None:
        from scipy.interpolate import RBFInterpolator  # scipy loads slowly: only where a model is used

        self.spline = RBFInterpolator(self.points, self.errors, kernel="thin_plate_spline",
                                      smoothing=SMOOTHING, degree=1)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.spline(x)  # type: ignore[operator]


@dataclass
class Model:
    workloads: list[str]
    resource: str
    l_max: float  # the resource's maximum (g caps at it; formula 5)
    first: list[np.ndarray]  # polynomial coefficients per workload, lowest degree first
    points: list[dict] = field(default_factory=list)  # measured: {"order", "subset", "levels", "value"}
    corrections: dict[Subset, Correction] = field(default_factory=dict)
    max_order: int = 0  # corrections exist up to this order
    cpus: list[int] = field(default_factory=list)  # the CPUs the profiling VMs were pinned to (none: all)

    @property
    def m(self) -> int:
        return len(self.workloads)

    def first_order(self, i: int, x: np.ndarray) -> np.ndarray:
        return np.polynomial.polynomial.polyval(x, self.first[i])

    def g(self, v: np.ndarray) -> np.ndarray:
        return np.clip(v, 0.0, self.l_max)

    def approximate(self, subset: Subset, x: np.ndarray) -> np.ndarray:
        """L-hat_S: formula (4) (formula (2) for two workloads); x holds the levels of S, one row per point."""
        terms = [self.order(tuple(s for s in subset if s != i), x[:, [c for c, s in enumerate(subset) if s != i]])
                 + self.first_order(i, x[:, subset.index(i)]) for i in subset]
        return self.g(np.max(terms, axis=0))

    def order(self, subset: Subset, x: np.ndarray) -> np.ndarray:
        """L_S: the model of the workloads of S (levels x, one column per workload of S)."""
        if len(subset) == 1:
            return self.g(self.first_order(subset[0], x[:, 0]))  # the polynomial may stray past 0 or l_max
        value = self.approximate(subset, x)
        correction = self.corrections.get(subset)
        return self.g(value + correction(x)) if correction is not None else value

    def predict(self, levels: np.ndarray) -> np.ndarray:
        """Usage at each row of levels of all m workloads: the model of the workloads that run (level > 0).

        Beyond the highest order built, formula (4) applies without a correction."""
        levels = np.atleast_2d(np.asarray(levels, float))
        out = np.empty(len(levels))
        running = levels > 0
        for key in {tuple(r) for r in running.tolist()}:
            rows = np.nonzero((running == key).all(axis=1))[0]
            subset = tuple(i for i, on in enumerate(key) if on) or (0,)  # nothing runs: the idle VM
            out[rows] = self.order(subset, levels[np.ix_(rows, list(subset))])
        return out

    # -- formula (5) ---------------------------------------------------------------------------
    def add_vm(self, new: np.ndarray, running: Sequence[np.ndarray]) -> dict:
        """Usage of a VM added where `running` VMs (levels each) run: formula (5) with this model's VMs."""
        l_new = float(self.predict(new)[0])
        l_all = float(sum(self.predict(r)[0] for r in running))
        return dict(add_vm(l_new, l_all, len(running), self.l_max), alone=l_new, running=l_all)

    # -- files ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "workloads": self.workloads, "resource": self.resource,
                "l_max": self.l_max, "cpus": self.cpus, "first_degree": FIRST_DEGREE, "max_order": self.max_order,
                "first": [c.tolist() for c in self.first],
                "corrections": [{"subset": list(s), "points": c.points.tolist(), "errors": c.errors.tolist()}
                                for s, c in sorted(self.corrections.items())],
                "points": self.points}

    def save(self, path: Path) -> None:
        files.write_file(path, json.dumps(self.to_json(), indent=1))


def add_vm(l_new: float, l_all: float, n_vm: int, l_max: float) -> dict:
    """Formula (5): the usage of a VM whose usage alone is l_new, added where n_vm VMs use l_all of l_max.

    c1: it needs no more than its fair share l_max/(n_vm+1): it gets what it needs.  c2: it and the
    others together need the whole resource: it gets what the others leave, but never less than its
    fair share.  Otherwise the resource has room: it gets what it needs.
    """
    share = l_max / (n_vm + 1)
    if l_new <= share:
        case, value = "fair share covers it", l_new
    elif l_new + l_all >= l_max:
        case, value = "saturated", max(l_max - l_all, share)
    else:
        case, value = "room left", l_new
    return {"usage": value, "case": case, "fair_share": share}


def load(path: Path) -> Model:
    """Read a model file; anything wrong is one ModelError line."""
    try:
        data = bounded_json.loads(path.read_bytes(), f"{path}")
    except FileNotFoundError:
        raise ModelError(f"{path}: no such model file (make one with `vmprof model build -o {path}`)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: cannot read the model file: {e}") from None
    except bounded_json.JSONLimitError as e:
        raise ModelError(f"not a model file (bad JSON): {e}; rebuild it with `vmprof model build`") from None
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("it is not a vmprof model")
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, this vmprof reads {VERSION}")
        workloads = [str(w) for w in data["workloads"]]
        m = len(workloads)
        first = [np.asarray(c, float) for c in data["first"]]
        if not 1 <= m <= 8 or len(first) != m or any(c.ndim != 1 or not 1 <= len(c) <= 9 for c in first):
            raise ValueError("its first-order polynomials do not match its workloads")
        l_max = float(data["l_max"])
        model = Model(workloads, str(data["resource"]), l_max, first, list(data.get("points", [])),
                      max_order=int(data.get("max_order", 1)), cpus=[int(c) for c in data.get("cpus", [])])
        for c in data.get("corrections", []):
            subset = tuple(int(i) for i in c["subset"])
            pts, errs = np.asarray(c["points"], float), np.asarray(c["errors"], float)
            if (len(subset) < 2 or len(set(subset)) != len(subset) or not all(0 <= i < m for i in subset)
                    or pts.ndim != 2 or pts.shape[1] != len(subset) or errs.shape != (len(pts),)):
                raise ValueError(f"its correction for {subset} is malformed")
            model.corrections[subset] = Correction(pts, errs)
        values = np.concatenate([l_max, *first, *(c.errors for c in model.corrections.values())], axis=None)
        if not np.isfinite(values).all() or l_max <= 0:
            raise ValueError("it holds a value that is not a finite number")
    except (KeyError, TypeError, ValueError, np.linalg.LinAlgError) as e:
        raise ModelError(f"{path}: corrupt model file ({e}); rebuild it with `vmprof model build`") from None
    return model


# -- building ------------------------------------------------------------------------------------

def design(m: int, counts: Sequence[int]) -> list[dict]:
    """The sampling points, order by order: {"order", "subset", "levels"} (levels of all m workloads).

    counts[k-1] is the number of measurements of order k over all its models; 0 skips order k (its
    approximation then stays uncorrected: the paper's variant that goes from order 1 to order 3)."""
    points = []
    for i, n in enumerate(split_count(counts[0], m)):
        points += [{"order": 1, "subset": [i], "levels": full(m, (i,), np.array([[x]]))[0].tolist()}
                   for x in first_levels(n)]
    for k in range(2, min(len(counts), m) + 1):
        if counts[k - 1] <= 0:
            continue
        subsets = list(itertools.combinations(range(m), k))
        for subset, n in zip(subsets, split_count(counts[k - 1], len(subsets)), strict=True):
            points += [{"order": k, "subset": list(subset), "levels": full(m, subset, x[None])[0].tolist()}
                       for x in inner_points(k, n)]
    return points


def build(workloads: Sequence[str], counts: Sequence[int], measure: Measure, resource: str, l_max: float,
          cpus: Sequence[int] = ()) -> Model:
    """Measure the design's points (each gets what `measure` returns, "value" at least) and fit."""
    points = design(len(workloads), counts)
    for p in points:
        p.update(measure(np.array(p["levels"])))
    model = fit(workloads, resource, l_max, points, min(len(counts), len(workloads)))
    model.cpus = list(cpus)
    return model


def fit(workloads: Sequence[str], resource: str, l_max: float, points: list[dict], max_order: int) -> Model:
    """The model from measured points: first-order polynomials, then the corrections order by order."""
    model = Model(list(workloads), resource, l_max, [], points)
    for i in range(model.m):
        pts = [p for p in points if p["order"] == 1 and p["subset"] == [i]]
        xs = np.array([p["levels"][i] for p in pts])
        model.first.append(np.polynomial.polynomial.polyfit(xs, [p["value"] for p in pts],
                                                            min(FIRST_DEGREE, len(xs) - 1)))
    model.max_order = 1
    for k in range(2, max_order + 1):
        for subset in itertools.combinations(range(model.m), k):
            pts = [p for p in points if p["order"] == k and tuple(p["subset"]) == subset]
            if pts:
                xs = np.array([[p["levels"][s] for s in subset] for p in pts])
                fit_correction(model, subset, xs, np.array([p["value"] for p in pts]), len(pts))
        model.max_order = k
    return model


def fit_correction(model: Model, subset: Subset, xs: np.ndarray, ys: np.ndarray, n: int) -> None:
    """Formula (3): D_S through the measured errors and the face anchors (error of the order below)."""
    k = len(subset)
    faces = face_points(k, n)
    lower = model.predict(full(model.m, subset, faces))
    anchors = lower - model.approximate(subset, faces)
    errors = ys - model.approximate(subset, xs)
    model.corrections[subset] = Correction(np.vstack([xs, faces]), np.concatenate([errors, anchors]))


# -- the conventional direct fit -----------------------------------------------------------------

def _exponents(m: int, degree: int) -> list[tuple[int, ...]]:
    return [e for e in itertools.product(range(degree + 1), repeat=m) if sum(e) <= degree]


@dataclass
class DirectFit:
    """A polynomial of total degree `degree` in all levels at once, least squares, capped like g."""
    coef: np.ndarray
    exponents: list[tuple[int, ...]]
    l_max: float

    @classmethod
    def fit(cls, levels: np.ndarray, values: np.ndarray, l_max: float, degree: int = DIRECT_DEGREE) -> DirectFit:
        exps = _exponents(levels.shape[1], degree)
        while len(exps) > len(levels) and degree > 1:  # never more terms than measurements
            degree -= 1
            exps = _exponents(levels.shape[1], degree)
        coef, *_ = np.linalg.lstsq(cls._design(levels, exps), values, rcond=None)
        return cls(coef, exps, l_max)

    @staticmethod
    def _design(levels: np.ndarray, exps: list[tuple[int, ...]]) -> np.ndarray:
        e = np.array(exps)
        return np.prod(levels[:, None, :] ** e[None, :, :], axis=2)

    def predict(self, levels: np.ndarray) -> np.ndarray:
        return np.clip(self._design(np.atleast_2d(levels), self.exponents) @ self.coef, 0.0, self.l_max)


def compare(model: Model, direct_levels: np.ndarray, direct_values: np.ndarray, grid: np.ndarray,
            grid_values: np.ndarray) -> dict:
    """Errors on the evaluation grid of the model and of the direct fit of as many measurements."""
    direct = DirectFit.fit(direct_levels, direct_values, model.l_max)
    errors = {"proposed": model.predict(grid) - grid_values, "direct fit": direct.predict(grid) - grid_values}
    return {"errors": errors, "summary": {k: error_summary(v) for k, v in errors.items()}, "direct": direct}


def evaluation_grid(m: int, n: int) -> np.ndarray:
    """Every combination of n levels per workload (the paper: n = 11, m = 3, 1331 points)."""
    return _grid(np.linspace(0, 1, n), m)


def error_summary(errors: np.ndarray) -> dict:
    a = np.abs(errors)
    return {"n": int(len(a)), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "mean": float(a.mean()), "max": float(a.max())}


def parse_load(text: str, workloads: Sequence[str]) -> np.ndarray:
    """`cpu=0.5,net-send=0.3` -> levels of every workload (absent ones 0).  ModelError when malformed."""
    levels = np.zeros(len(workloads))
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq:
            raise ModelError(f"bad load {text!r}: write WORKLOAD=LEVEL,... (e.g. cpu=0.5,net-send=0.3)")
        if name.strip() not in workloads:
            raise ModelError(f"bad load {text!r}: unknown workload {name.strip()!r}; the model has "
                             f"{', '.join(workloads)}")
        try:
            x = float(value)
        except ValueError:
            raise ModelError(f"bad load {text!r}: {value!r} is not a number") from None
        if not math.isfinite(x) or not 0.0 <= x <= 1.0:
            raise ModelError(f"bad load {text!r}: levels are fractions of the maximum, from 0 to 1")
        levels[list(workloads).index(name.strip())] = x
    return levels
