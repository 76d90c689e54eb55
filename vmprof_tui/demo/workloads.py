"""Real workloads for the demo VMs: Debian's static libraries (libquantum, zlib, liblzma, SQLite, Lua) with a
small main of this project's own each (workloads/*.c), built on first use as static x86-64 programs that the
guest kernel runs unmodified, and as the same binaries run natively on the host for comparisons."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from vmprof_tui.demo import builds

# name -> (the static libraries it links, the Debian package holding them)
LIBRARIES = {"shor": (["-lquantum", "-lm"], "libquantum-dev"), "gzip": (["-lz"], "zlib1g-dev"),
             "xz": (["-llzma"], "liblzma-dev"), "sqlite": (["-lsqlite3", "-lm"], "libsqlite3-dev"),
             "lua": (["-llua5.4", "-lm"], "liblua5.4-dev")}
CFLAGS = ["-O2", "-g", "-Wall", "-Werror", "-static", "-no-pie", "-fno-omit-frame-pointer",
          "-mno-omit-leaf-frame-pointer", "-Wl,--build-id"]  # the mains keep frame pointers; the libraries have none


def _source_dir() -> Path:
    return Path(str(resources.files("vmprof_tui.demo") / "workloads"))


def program_path(name: str) -> Path:
    """The built workload `name` (a static executable), building it if needed; BuildError with one line."""
    if name not in LIBRARIES:
        raise builds.BuildError(f"unknown real workload {name!r}; choose from {', '.join(LIBRARIES)}")
    libs, package = LIBRARIES[name]
    source = _source_dir() / f"{name}.c"
    if not source.exists():
        raise builds.BuildError(f"the {name} workload is not written yet")
    try:
        return builds.compiled(source, CFLAGS, name, f"the {name} workload",
                                 headers=(_source_dir() / "common.h",), libs=tuple(libs))
    except builds.BuildError as e:
        raise builds.BuildError(f"{e} (the {name} workload needs {package}: apt-get install {package})") from None
