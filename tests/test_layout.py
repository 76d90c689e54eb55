"""The one-way data flow is visible in the imports: a stage imports only from itself and the stages
before it (docs/architecture.md).  The exceptions are listed here, each with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

STAGES = ("collect", "record", "resolve", "analyse", "fleet", "show", "cli")
SHARED = {"vmprof_tui", "vmprof_tui.libc", "vmprof_tui.record.records",  # version, libc, the sample record,
          "vmprof_tui.arrays", "vmprof_tui.files",  # the grouping of integer arrays, how files are created,
          "vmprof_tui.bounded_json"}  # and JSON from untrusted files, parsed with limits
# (importing module prefix, imported module prefix): why
ALLOWED = {
    ("vmprof_tui.collect.session", "vmprof_tui.resolve.elf"): "build ids of host objects are read while sampling",
    ("vmprof_tui.collect.session", "vmprof_tui.resolve.bundle"): "build ids of host objects are read while sampling",
    ("vmprof_tui.collect.session", "vmprof_tui.resolve.object_table"): "the agent stores host objects' symbols",
    ("vmprof_tui.collect.session", "vmprof_tui.resolve.untrusted"): "host object files are read with limits",
    ("vmprof_tui.collect.guest_fetch", "vmprof_tui.resolve.bundle"): "a fetched guest bundle is validated at once",
    ("vmprof_tui.collect.lbr", "vmprof_tui.record"): "the LBR ring buffer holds the recorded LBR layout",
    ("vmprof_tui.collect.lbr_capability", "vmprof_tui.record.lbr_model"): "branch filter types",
    ("vmprof_tui.collect.lbr_patterns", "vmprof_tui.record"): "pattern sizes are record sizes",
    ("vmprof_tui.collect.session", "vmprof_tui.record"): "chunks carry record arrays",
    ("vmprof_tui.collect.bpf", "vmprof_tui.record"): "ring buffers hold the record dtypes",
    ("vmprof_tui.record.perf_script", "vmprof_tui.resolve.elfcode"): "perf script lines name their objects",
    ("vmprof_tui.collect.lbr_simulate", "vmprof_tui.analyse.lbr_groundtruth"): "--lbr=simulate samples the "
    "single-step ground truth",
    ("vmprof_tui.collect.lbr_simulate", "vmprof_tui.record"): "it writes a recording of LBR records",
}


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vmprof_tui"):
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("vmprof_tui")]
    return out


def test_imports_follow_the_data_flow() -> None:
    wrong = []
    for path in sorted((ROOT / "vmprof_tui").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        here = stage_of(module)
        if here is None:
            continue
        for name in imports(path):
            there = stage_of(name)
            if name in SHARED or there is None and not name.startswith("vmprof_tui.demo"):
                continue
            if there is not None and STAGES.index(there) <= STAGES.index(here):
                continue
            if here == "cli":
                continue
            if any(module.startswith(a) and name.startswith(b) for a, b in ALLOWED):
                continue
            wrong.append(f"{module} imports {name}")
    assert not wrong, "imports against the data flow:\n" + "\n".join(sorted(set(wrong)))


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
