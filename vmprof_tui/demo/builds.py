"""The demo guest programs: C sources in programs/, built on first use with gcc.

They are freestanding static non-PIE x86-64 executables with a symbol table,
loaded by the demo VMM at their link address.  Builds are cached by a hash of
the sources and flags, so every run uses exactly the bytes the sources say.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

NAMES = ("compute", "duty", "jacobi", "load", "chain", "recurse", "clobber", "blink", "chain-nofp", "recurse-nofp")
CFLAGS = ["-O2", "-Wall", "-Werror", "-ffreestanding", "-nostdlib", "-static", "-no-pie",
          "-fno-pic", "-fno-stack-protector", "-fcf-protection=none", "-fno-asynchronous-unwind-tables",
          "-g", "-Wl,--build-id"]
# The call-stack programs keep a frame-pointer chain in every function (leaves too) and real calls
# (no sibling-call jumps), so each sample's chain is known by construction.
STACK_PROGRAMS = ("chain", "recurse", "clobber")
FRAME_POINTER_FLAGS = ("-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fno-optimize-sibling-calls")
# The same call-stack programs without frame pointers (NAME-nofp): only call-frame information (.debug_frame,
# from -g) tells their chains (record --call-graph cfi); still real calls, so the chains stay known.
NO_FRAME_POINTER_FLAGS = ("-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-DVMPROF_NO_FRAME_POINTERS")
NOFP = "-nofp"


def flags_for(name: str) -> list[str]:
    if name.endswith(NOFP):
        return CFLAGS + list(NO_FRAME_POINTER_FLAGS)
    return CFLAGS + list(FRAME_POINTER_FLAGS if name in STACK_PROGRAMS else ())


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("VMPROF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vmprof")
    return Path(base) / "guest-programs"


def _source_dir() -> Path:
    return Path(str(resources.files("vmprof_tui.demo") / "programs"))


def program_path(name: str) -> Path:
    """Path of the built program `name`, building it if needed."""
    if name not in NAMES:
        raise BuildError(f"unknown demo program {name!r}; choose from {', '.join(NAMES)}")
    src = _source_dir()
    return compiled(src / f"{name.removesuffix(NOFP)}.c", flags_for(name), name, "the demo guest programs",
                    (src / "guest_rt.h", src / "stack_rt.h"))


LBR_DEMO_ROUNDS = 3_000  # ~93 instructions a round: 280,000 instructions (docs/demo.md: the time it takes)


def lbr_demo_path(rounds: int = LBR_DEMO_ROUNDS) -> Path:
    """The host program `vmprof demo --scenario lbr` single-steps (programs/lbr_demo.c), built if needed."""
    src = _source_dir()
    return compiled(src / "lbr_demo.c", [*CFLAGS, f"-DROUNDS={rounds}"], "lbr_demo", "the LBR demo program",
                    (src / "host_start.h",))


def compiled(source: Path, flags: list[str], name: str, what: str, headers: tuple[Path, ...] = (),
             more_sources: tuple[Path, ...] = (), libs: tuple[str, ...] = ()) -> Path:
    """`source` (with `more_sources`, and the `headers` it includes, from their folder) built with `flags` into
    the cache as `name`, once per their bytes and the flags: every run uses exactly what the sources say.
    `what` names it in errors."""
    digest = hashlib.sha256()
    for part in (source, *more_sources, *headers):
        digest.update(part.read_bytes())
    digest.update(" ".join([*flags, *libs]).encode())
    out = cache_dir() / digest.hexdigest()[:16] / name
    if not out.exists():
        _compile([source, *more_sources], out, [*flags, *{f"-I{h.parent}" for h in headers}], what, libs)
    return out


def build(source: Path, out: Path, extra_flags: tuple[str, ...] = ()) -> None:
    """Compile one guest program (it may include guest_rt.h) to `out`."""
    _compile([source], out, [*CFLAGS, *extra_flags, f"-I{_source_dir()}"], "the demo guest programs")


def _compile(sources: list[Path], out: Path, flags: list[str], what: str, libs: tuple[str, ...] = ()) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError(f"no C compiler found to build {what}: apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    proc = subprocess.run([cc, *flags, "-o", str(tmp), *map(str, sources), *libs], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"building {sources[0].name} failed: {proc.stderr.strip()[:500]}")
    tmp.rename(out)
