"""What docs/ and README.md name of the package exists: every `vmprof_tui/...` path, every dotted
`vmprof_tui.x.y` module (and the function or class it may end with), and every `stage/module.py` path of a
package stage (docs/architecture.md writes them relative to vmprof_tui/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STAGES = sorted(p.parent.name for p in (ROOT / "vmprof_tui").glob("*/__init__.py"))


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _dotted_exists(dotted: str) -> bool:
    """A module or package of vmprof_tui, or a name defined at the top of one."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:k])
        module = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        if module.exists():
            rest = parts[k:]
            return not rest or (len(rest) == 1 and rest[0] in _top_level_names(module))
    return False


def stale_names() -> list[str]:
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        where = doc.relative_to(ROOT)
        for path in re.findall(r"(?<![\w/.])vmprof_tui/[\w/.\-]*\w", text):
            if not (ROOT / path).exists():
                stale.append(f"{where}: {path}")
        for dotted in re.findall(r"(?<![\w/.])vmprof_tui(?:\.\w+)+", text):
            if not _dotted_exists(dotted):
                stale.append(f"{where}: {dotted}")
        for path in re.findall(rf"(?<![\w/.])((?:{'|'.join(STAGES)})/[\w/\-]*\w\.py)\b", text):
            if not (ROOT / "vmprof_tui" / path).exists():
                stale.append(f"{where}: {path}")
    return stale


def test_docs_name_only_modules_that_exist() -> None:
    stale = stale_names()
    assert not stale, "docs name modules that do not exist:\n" + "\n".join(stale)


# a measured figure: a number of seconds or a speed ratio, beside a word of cost or speed
FIGURE = re.compile(r"\d[\d,.]*\s?(ms|µs|us|s|x|[MG]B/s)\b")
COST = re.compile(r"faster|slower|speed|costs?\b|\btook\b|\btakes\b|a refresh|\bRSS\b|measured", re.IGNORECASE)


def test_no_timings_in_docstrings_or_comments() -> None:
    """Measured figures live in docs/performance.md or benchmarks/, where they can be kept current; the code's
    docstrings and comments say why, without numbers that go stale."""
    import io
    import tokenize
    found = []
    for path in sorted((ROOT / "vmprof_tui").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            is_doc = tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""', "'''"))
            if tok.type == tokenize.COMMENT or is_doc:
                for i, line in enumerate(tok.string.splitlines()):
                    if FIGURE.search(line) and COST.search(line):
                        found.append(f"{name}:{tok.start[0] + i}: {line.strip()}")
    assert not found, "measured figures in the code (move them to docs/performance.md):\n" + "\n".join(found)
