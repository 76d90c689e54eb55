#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Check the VMX exit-reason table (vmprof_tui/analyse/vmx_exits.py).

Usage: check_exit_table.py [path/to/uapi/asm/vmx.h]

The table is vmprof_tui/analyse/vmx_exits.py (VMX_EXIT_REASONS and
VMX_EXIT_CATEGORIES), read as literals without importing vmprof.  Checks: it parses as plain
literals; every category is one of VMX_EXIT_CATEGORIES; and, when a kernel
uapi <asm/vmx.h> is given, every EXIT_REASON_<NAME> it defines is in the table
under the same number and name.  Prints one line; exit 1 on a mismatch.
"""
import ast
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_table(py_path):
    found = {}
    for node in ast.parse(py_path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                found[target.id] = ast.literal_eval(node.value)
    if "VMX_EXIT_REASONS" not in found:
        raise SystemExit(f"check_exit_table: no VMX_EXIT_REASONS in {py_path}")
    return found["VMX_EXIT_REASONS"], found["VMX_EXIT_CATEGORIES"]


def main(argv):
    reasons, categories = load_table(HERE.parent / "vmprof_tui" / "analyse" / "vmx_exits.py")
    problems = []
    for num, (name, cat) in sorted(reasons.items()):
        if not isinstance(num, int) or not 0 <= num <= 0xFFFF:
            problems.append(f"bad number {num!r}")
        if cat not in categories:
            problems.append(f"{num} {name}: unknown category {cat!r}")
    names = {name: num for num, (name, _cat) in reasons.items()}
    if len(names) != len(reasons):
        problems.append("duplicate names in the table")
    checked = 0
    if len(argv) > 1:
        header = Path(argv[1]).read_text(encoding="utf-8")
        for name, value in re.findall(r"^#define\s+EXIT_REASON_(\w+)\s+(\d+)\s*$", header, flags=re.M):
            checked += 1
            if names.get(name) != int(value):
                problems.append(f"{name}={value} in {argv[1]}, table has {names.get(name)!r}")
    if problems:
        print("check_exit_table: FAIL: " + "; ".join(problems))
        return 1
    src = f"{checked} names checked against {argv[1]}" if len(argv) > 1 else "no kernel header given"
    print(f"check_exit_table: OK: {len(reasons)} reasons, {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
