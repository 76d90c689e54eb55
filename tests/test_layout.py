"""The one-way data flow is visible in the imports: a stage imports only from itself and the stages
before it (docs/architecture.md), no module imports itself back through others, and no module grows past
~600 lines.  The exceptions are listed here, each with its reason; `-s` prints the layout's facts."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

# every package of vmprof_tui, in the order data flows: the demo VMs are what is sampled; estimate works on
# analyses and demo runs; show and cli come last.  fleet and lbr are wings on the whole core: fleet (the agent's
# metrics, the store and its screen) and lbr (the LBR path, collection to screen: docs/lbr.md) may import every
# stage before them and none of those imports them (but the LBR contracts below)
STAGES = ("demo", "collect", "record", "resolve", "analyse", "estimate", "show", "fleet", "lbr", "cli")
# the ground floor every stage may import: the package's version, libc, the grouping of integer arrays, how files
# are created, JSON from untrusted files parsed with limits, the one memory-mapping type (mapping.py), and the
# contracts between programs: the sample record
# (bpf/sample.h in numpy), the LBR record and its fields (bpf/lbr_record.h), and the guest bundle format (the
# guest agent and the demo VMM write it)
SHARED = ("vmprof_tui", "vmprof_tui.libc", "vmprof_tui.arrays", "vmprof_tui.files", "vmprof_tui.bounded_json",
          "vmprof_tui.mapping",
          "vmprof_tui.record.bpf_records", "vmprof_tui.lbr.records", "vmprof_tui.lbr.model",
          "vmprof_tui.resolve.bundle_format")
# importing module -> (the later modules it imports, why)
ALLOWED = {
    "vmprof_tui.collect.session": (("vmprof_tui.resolve.elf", "vmprof_tui.resolve.object_table",
                                    "vmprof_tui.resolve.untrusted"),
                                   "host objects' build ids and symbols are read, with limits, while sampling"),
    "vmprof_tui.collect.guest_fetch": (("vmprof_tui.resolve.bundle",), "a fetched guest bundle is validated at once"),
}
MAX_EXCEPTIONS = 3
MAX_METHODS = 30  # "~25" methods a class
# classes past it: what their methods are
MANY_METHODS = {"SyscallServer": "one handler per system call the demo VMM serves (a dispatch table)"}
MAX_LINES = 610  # "~600": a module past it is split
# modules still past it, each with a reason, none more than 10% past
TO_SPLIT: dict[str, str] = {}  # modules over MAX_LINES, each with why it is not split yet


def modules() -> dict[str, Path]:
    """Every module of vmprof_tui by its dotted name."""
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted((ROOT / "vmprof_tui").rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The vmprof_tui modules a file imports, anywhere in it (also inside functions and TYPE_CHECKING blocks:
    a cycle through them is still a cycle for a reader)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vmprof_tui"):
            for a in node.names:
                name = f"{node.module}.{a.name}"
                out.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("vmprof_tui")}
    return out


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def shared(module: str) -> bool:
    return module in SHARED


def against_the_flow() -> list[str]:
    known = modules()
    wrong = []
    for module, path in known.items():
        here = stage_of(module)
        if here is None or here == "cli":  # cli/ wires the stages together
            continue
        allowed = ALLOWED.get(module, ((), ""))[0]
        for name in sorted(imports(path, known)):
            there = stage_of(name)
            if shared(name) or there is None or STAGES.index(there) <= STAGES.index(here) or name in allowed:
                continue
            wrong.append(f"{module} imports {name}")
    return wrong


def cycles() -> list[list[str]]:
    """The strongly connected groups of modules (Tarjan's algorithm): each is an import cycle."""
    known = modules()
    graph = {m: sorted(imports(p, known) & known.keys() - {m}) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_imports_follow_the_data_flow() -> None:
    wrong = against_the_flow()
    assert not wrong, "imports against the data flow:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    found = cycles()
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_package_has_a_stage() -> None:
    """A new package is placed in the flow (or on the ground floor) before it can import anything."""
    packages = {p.parent.name for p in (ROOT / "vmprof_tui").glob("*/__init__.py")}
    assert packages <= set(STAGES), packages - set(STAGES)


def test_the_layout_facts() -> None:
    """The largest module stays under MAX_LINES (~600) and the exceptions to the flow few; printed for review."""
    known = modules()
    lines = {m: len(p.read_text().splitlines()) for m, p in known.items()}
    used = {m: why for m, (names, why) in ALLOWED.items()
            if any(n in imports(known[m], known) for n in names)}
    largest = max((m for m in lines if m not in TO_SPLIT), key=lines.get)
    print(f"\nlargest module: {largest} ({lines[largest]} lines)")
    for m, why in TO_SPLIT.items():
        print(f"still to split: {m} ({lines[m]} lines): {why}")
        assert MAX_LINES < lines[m] <= MAX_LINES * 1.1, (m, lines[m])
    methods = {f"{m}.{node.name}": sum(isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for f in node.body)
               for m, p in known.items() for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, ast.ClassDef)}
    big = [c for c in methods if c.rpartition(".")[2] not in MANY_METHODS]
    widest = max(big, key=methods.get)
    print(f"largest class: {widest} ({methods[widest]} methods)")
    print(f"import cycles: {len(cycles())}")
    print(f"exceptions to the data flow ({len(ALLOWED)}):")
    for m, (names, why) in ALLOWED.items():
        print(f"  {m} -> {', '.join(names)}: {why}")
    assert used.keys() == ALLOWED.keys(), f"stale exceptions: {ALLOWED.keys() - used.keys()}"
    assert len(ALLOWED) <= MAX_EXCEPTIONS
    assert lines[largest] <= MAX_LINES, (largest, lines[largest])
    assert methods[widest] <= MAX_METHODS, (widest, methods[widest])


def test_nothing_cites_files_outside_the_repository() -> None:
    """The repository stands alone: what a reader needs is in docs/, not in a design file beside the checkout."""
    import subprocess
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    citing = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".c", ".h", ".S", ".sh", ".toml", ".txt"} and path.is_file():
            text = path.read_text(errors="replace")
            outside = ("DESIGN.md", "../shared", "shared/references")
            if name != "tests/test_layout.py" and any(w in text for w in outside):
                citing.append(name)
    assert not citing, citing


def test_timelines_know_nothing_of_profiles() -> None:
    """analyse/timeline.py builds the vCPU timelines from sched events alone: no profile, name or analysis in it."""
    known = modules()
    used = imports(known["vmprof_tui.analyse.timeline"], known)
    assert used <= {"vmprof_tui.arrays", "vmprof_tui.analyse.blanks", "vmprof_tui.record.bpf_records"}, used


def test_one_mapping_type() -> None:
    """A process's memory mapping (an address range of a file at an offset) has one type in the package,
    vmprof_tui/mapping.py: host snapshots, guest bundles, stack frames and the demo VMM all use it."""
    found = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                fields = {s.target.id for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                if {"start", "end"} <= fields and fields & {"offset", "path", "perms"}:
                    found.append(f"{module}.{node.name}")
    # the demo guest kernel's own mmap bookkeeping: areas it splits and re-protects (mutable PROT_* bits)
    kernel_areas = "vmprof_tui.demo.usermem.Area"
    assert [f for f in found if f != kernel_areas] == ["vmprof_tui.mapping.Mapping"], found


def test_window_is_never_a_span() -> None:
    """"Window" is the live screen's or the agent's (docs/architecture.md, glossary): the [lo, hi) an analysis or
    a recording covers is its span (`span()`, `recording_span`), and one class only is named Window."""
    windows, methods = [], []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "Window":
                windows.append(module)
            if isinstance(node, ast.ClassDef):
                methods += [f"{module}.{node.name}.{f.name}" for f in node.body
                            if isinstance(f, ast.FunctionDef) and f.name in ("window", "recording_window")]
            if isinstance(node, ast.FunctionDef) and node.name == "recording_window":
                methods.append(f"{module}.{node.name}")
    assert windows == ["vmprof_tui.analyse.source"], windows
    assert not methods, methods
