"""CPU used by `vmprof top` at 1 kHz on all CPUs with three demo VMs (target: at most 5% of one core).

The block view (`blocks`, and `block`: Enter on its first row) is measured on `vmprof demo --scenario
lbr` instead (no VM): a live session of `vmprof top --lbr=simulate --blocks hash_step -- lbr_demo`, which
polls the simulated collector, whose tracing thread (single-stepping: a core by nature) is left out of the
figure.

Runs the steal3 demo, starts `vmprof top` in a tmux terminal, lets it settle, opens the screen to
measure with the keys a user would press, then measures the process's CPU time (utime + stime from
/proc) over a steady interval.  Screens: the overview, the host (Enter on the first row: the longest
table, every host function), and the first VM's vCPUs, processes, functions, steal and timeline.
Usage: python benchmarks/tui.py [--seconds 30] [--screen NAME|all] [--baseline TREE --repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from vmprof_tui.demo import runner
from vmprof_tui.lbr.simulated_collector import THREAD_NAME

ROOT = Path(__file__).resolve().parent.parent
# screen: (keys from the overview, with the cursor on its first row (the host), text the screen then shows)
SCREENS = {
    "overview": ((), "OS:USER:IDLE:VM"),
    "host": (("Enter",), "Host:"),
    "vm": (("Down", "Enter"), ": vCPUs"),
    "process": (("Down", "Enter", "Enter"), "guest processes, steal and idle"),
    "function": (("Down", "Enter", "Enter", "Enter"), ": functions"),
    "steal": (("Down", "s"), "steal by cause"),
    "timeline": (("Down", "t"), "one column ="),
    "blocks": ((), "Enter: disassembly"),
    "block": (("Enter",), "call/return chain"),
}
BLOCK_SCREENS = ("blocks", "block")  # vmprof demo --scenario lbr opens the block view itself


def cpu_seconds(pid: int, but: str | None = None) -> float:
    """utime + stime of a process, without its threads named `but`."""
    def of(stat: Path) -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    left_out = [of(t / "stat") for t in Path(f"/proc/{pid}/task").iterdir()
                if but and (t / "comm").read_text().strip() == but] if but else []
    return of(Path(f"/proc/{pid}/stat")) - sum(left_out)


def find_top(command: str = "top") -> int:
    for _ in range(50):
        out = subprocess.run(["pgrep", "-f", f"vmprof_tui {command}"], capture_output=True, text=True).stdout.split()
        pids = [int(p) for p in out if int(p) != os.getpid()]
        if pids:
            return max(pids)
        time.sleep(0.2)
    raise RuntimeError("vmprof top did not start")


def measure(tree: Path, screen: str, seconds: float) -> float:
    """% of one core `vmprof top` (the code in `tree`) used on `screen` over `seconds`."""
    session = f"vmprof-bench-{os.getpid()}"
    blocks = screen in BLOCK_SCREENS
    command = "demo --scenario lbr" if blocks else "top -F 1000"
    but = THREAD_NAME.decode() if blocks else None
    with contextlib.nullcontext() if blocks else runner.DemoRun(runner.scenario_specs("steal3"),
                                                                  duration_s=seconds + 60):
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "40",
                        f"cd {tree} && env -u COLUMNS -u LINES {sys.executable} -m vmprof_tui {command}"], check=True)
        try:
            pid = find_top(command.split()[0])
            if blocks:  # the demo builds its program, then opens the block view
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and "Enter: disassembly" not in subprocess.run(
                        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout:
                    time.sleep(0.5)
            time.sleep(1 if blocks else 8)  # compile, first frames, symbol caches warm
            keys, shows = SCREENS[screen]
            for key in keys:
                subprocess.run(["tmux", "send-keys", "-t", session, key], check=True)
                time.sleep(1)  # the next screen and its first refresh
            time.sleep(2)
            shown = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                   text=True).stdout
            if shows not in shown:
                raise RuntimeError(f"the {screen} screen did not open:\n" + shown)
            c0, t0 = cpu_seconds(pid, but), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(pid, but), time.monotonic()
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return 100 * (c1 - c0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--screen", choices=(*SCREENS, "all"), default="overview")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another source tree (e.g. `git archive` of an older commit), measured in turn with this one")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (one run of each tree a round)")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        print("tmux is needed (apt-get install tmux)")
        return 1
    trees = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    for screen in (s for s in SCREENS if s not in BLOCK_SCREENS) if args.screen == "all" else (args.screen,):
        used: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, tree in trees.items():
                used[name].append(measure(tree, screen, args.seconds))
                print(f"  {screen} {name}: {used[name][-1]:.1f}%", flush=True)
        this = sum(used["this"]) / len(used["this"])
        what = "vmprof demo --scenario lbr (live, tracing thread left out)" if screen in BLOCK_SCREENS else \
            "vmprof top at 1 kHz, 3 VMs"
        line = (f"{what}, {screen} screen: {this:.1f}% of one core over {args.seconds:.0f} s, "
                f"mean of {args.repeat} (target <= 5%)")
        if args.baseline:
            base = sum(used["baseline"]) / len(used["baseline"])
            line += f"; baseline {base:.1f}%: this / baseline = {this / base:.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
