"""atheris fuzz targets for the guest-bundle reader and the ELF symbol reader.

    python tests/fuzz/fuzz_bundle.py TARGET [libFuzzer options] [CORPUS_DIR ...]

TARGET is one of
  json   bundle.json bytes            -> parse_index
  tar    raw archive bytes            -> load_bundle (tar, plain or gzip)
  bundle a tar built from the input   -> load_bundle (structured: member names, kinds, sizes, index)
  elf    object file bytes            -> elf_symbols_from_bytes (and the ELF lookups on success)
  cfi    object file bytes            -> cfi_from_bytes (call-frame information; seeds: /usr/bin/true, a
                                         demo program and the demo guest kernel, whose .eh_frame /
                                         .debug_frame mutations then reach)
  kstack a guest kernel's stack copy  -> unwind_guest_kernel with the demo guest kernel's call-frame
                                         information (a guest-kernel sample's stack is guest memory)

An empty corpus folder is first filled with seeds (the hand-made bundles of
tests/data/bundles/hostile.py, a minimal ELF, /usr/bin/true).

A target passes when every input either loads or is rejected with BundleError
(one line), nothing is written outside the private extraction folder, and no
other exception escapes.  tests/test_bundle.py runs each for a few seconds.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data" / "bundles"))

with atheris.instrument_imports(include=["vmprof_tui", "elftools"]):
    import elftools.elf.elffile  # noqa: F401 - instrumented for coverage feedback

    from vmprof_tui.resolve import bundle as B
    from vmprof_tui.resolve import cfi, elf, unwind

import hostile  # noqa: E402 - after the instrumented import

LIMITS = B.Limits(max_index_bytes=1 << 20, max_kallsyms_bytes=1 << 20, max_object_bytes=1 << 20,
                  max_total_bytes=4 << 20, max_members=64, max_processes=64, max_maps_per_process=64,
                  max_maps_total=256, max_symbols=4096, max_string=256, max_list=256,
                  max_tar_header_bytes=4096, max_elf_sections=256, max_elf_segments=64)
# libFuzzer ends the process without running Python's cleanup: the test gives a folder it removes itself.
SCRATCH = Path(tempfile.mkdtemp(prefix="vmprof-fuzz-", dir=os.environ.get("VMPROF_FUZZ_SCRATCH")))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
NAMES = ["bundle.json", "kallsyms", "objects/good", "objects/a", "./bundle.json", "objects", "objects/",
         "../escape", "/abs", "objects/../../x", "objects/.", "x", "objects/a/b", "objects/" + "n" * 130]
KINDS = [tarfile.REGTYPE, tarfile.REGTYPE, tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
         tarfile.CHRTYPE, tarfile.FIFOTYPE]


def _check_one_line(e: B.BundleError) -> None:
    assert "\n" not in str(e), repr(str(e))


def _scratch_is_clean(work: Path) -> None:
    """Only the (removed or kept) workdir and the input may exist in the scratch folder."""
    for entry in SCRATCH.iterdir():
        assert entry.name in ("input.tar", work.name), f"something was written outside the workdir: {entry}"


def _load(path: Path) -> None:
    work = SCRATCH / "work"
    shutil.rmtree(work, ignore_errors=True)
    try:
        b = B.load_bundle(path, LIMITS, workdir=work)
    except B.BundleError as e:
        _check_one_line(e)
        assert not work.exists(), "a rejected tar left its extraction folder behind"
    else:
        for p in b.processes:
            for m in p.maps:
                if m.object_path is not None:
                    assert m.object_path.resolve().is_relative_to(work.resolve())
                    try:
                        elf.read_elf_symbols(m.object_path, LIMITS)
                    except elf.ElfError as e:
                        _check_one_line(e)
        b.close()
    _scratch_is_clean(work)


def fuzz_json(data: bytes) -> None:
    try:
        B.parse_index(data, LIMITS)
    except B.BundleError as e:
        _check_one_line(e)


def fuzz_tar(data: bytes) -> None:
    path = SCRATCH / "input.tar"
    path.write_bytes(data)
    _load(path)


def fuzz_bundle(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _ in range(fdp.ConsumeIntInRange(0, 6)):
            info = tarfile.TarInfo(fdp.PickValueInList(NAMES) if fdp.ConsumeBool() else _text(fdp, 20))
            info.type = fdp.PickValueInList(KINDS)
            if info.type == tarfile.REGTYPE:
                which = fdp.ConsumeIntInRange(0, 3)
                if which == 0:
                    body = json.dumps(_mutated_index(fdp)).encode()
                elif which == 1:
                    body = hostile.minimal_elf()
                    if fdp.ConsumeBool() and body:
                        pos = fdp.ConsumeIntInRange(0, len(body) - 1)
                        body = body[:pos] + fdp.ConsumeBytes(8) + body[pos + 8:]
                else:
                    body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 512))
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            else:
                info.linkname = _text(fdp, 10)
                tar.addfile(info)
    path = SCRATCH / "input.tar"
    path.write_bytes(buf.getvalue())
    _load(path)


def _text(fdp: atheris.FuzzedDataProvider, n: int) -> str:
    return fdp.ConsumeUnicode(n).encode("utf-8", "replace").decode("utf-8")


def _mutated_index(fdp: atheris.FuzzedDataProvider) -> object:
    idx = hostile.index(["objects/good" if fdp.ConsumeBool() else fdp.PickValueInList(NAMES)])
    values = [None, True, -1, 0, 1 << 64, 2**63, "x", "objects/good", [], {}, 1.5, "r-xp", "../x"]
    proc = idx["processes"][0]
    targets = [(idx, "version"), (idx, "format"), (idx, "kernel"), (proc, "pid"), (proc, "cr3"), (proc, "maps"),
               (proc, "tids"), (proc, "cmdline"), (proc["maps"][0], "start"), (proc["maps"][0], "end"),
               (proc["maps"][0], "perms"), (proc["maps"][0], "offset"), (proc["maps"][0], "build_id")]
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        obj, key = fdp.PickValueInList(targets)
        obj[key] = fdp.PickValueInList(values)
    if fdp.ConsumeBool():
        idx["kernel"] = {"release": "6.1", "build_id": None, "kallsyms": "kallsyms", "modules": []}
    return idx


def fuzz_elf(data: bytes) -> None:
    try:
        syms = elf.elf_symbols_from_bytes(data, LIMITS)
    except B.BundleError as e:
        _check_one_line(e)
        return
    import numpy as np

    assert len(syms.starts) == len(syms.ends) == len(syms.names)
    assert bool(np.all(syms.starts[1:] >= syms.starts[:-1]))
    probe = np.array([0, 0x401000, 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64)
    syms.lookup(probe)
    syms.file_offsets_to_vaddrs(np.array([0, 4096, 1 << 40, (1 << 64) - 1], dtype=np.uint64))


def fuzz_cfi(data: bytes) -> None:
    try:
        table = cfi.cfi_from_bytes(data, LIMITS)
    except B.BundleError as e:
        _check_one_line(e)
        return
    assert len(table.start) == len(table.end) == len(table.ra) == len(table.bp)
    assert bool((table.start[1:] >= table.start[:-1]).all())
    table.row(0x401000)


_KERNEL: list = []  # the demo guest kernel's unwind rules, built once


def fuzz_kstack(data: bytes) -> None:
    import numpy as np

    from vmprof_tui.record.bpf_records import KSTACK_TAIL, STACK_GUEST_MAX, ustack_dtype

    if not _KERNEL:
        from vmprof_tui.demo import guestos

        _KERNEL.append(unwind.KernelRules(cfi.read_cfi(guestos.kernel_path())))
    rules = _KERNEL[0]
    fdp = atheris.FuzzedDataProvider(data)
    starts = rules.starts
    ip = starts[fdp.ConsumeIntInRange(0, len(starts) - 1)] + fdp.ConsumeIntInRange(0, 64) \
        if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, (1 << 64) - 1)
    u = np.zeros(1, ustack_dtype(4 * KSTACK_TAIL))
    tail = fdp.ConsumeBytes(KSTACK_TAIL)
    u["data"][0, 4 * KSTACK_TAIL - KSTACK_TAIL:][:len(tail)] = np.frombuffer(tail, np.uint8)
    [(chain, why)] = unwind.unwind_guest_kernel(u, np.zeros(1, np.int64), np.array([ip], np.uint64), rules)
    assert 1 <= len(chain) <= STACK_GUEST_MAX and (why in unwind.REASONS or why == unwind.COMPLETE)
    assert chain[0] == ip


TARGETS = {"json": fuzz_json, "tar": fuzz_tar, "bundle": fuzz_bundle, "elf": fuzz_elf, "cfi": fuzz_cfi,
           "kstack": fuzz_kstack}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options] [CORPUS ...]", file=sys.stderr)
        sys.exit(2)
    target = TARGETS[sys.argv[1]]
    for arg in sys.argv[2:]:  # an empty corpus folder starts from the seeds
        if not arg.startswith("-") and os.path.isdir(arg) and not os.listdir(arg):
            write_seeds(sys.argv[1], Path(arg))
    try:
        atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
        atheris.Fuzz()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)


def write_seeds(target: str, out: Path) -> None:
    """Seed inputs for a target (the hand-made hostile bundles and good ones)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vmprof-seeds-"))
    try:
        if target == "json":
            (out / "good.json").write_text(json.dumps(hostile.index()))
            (out / "kernel.json").write_text(json.dumps(hostile.index(kernel={"release": "6.1", "build_id": "ab",
                                                                              "kallsyms": "kallsyms",
                                                                              "modules": []})))
        elif target == "tar":
            for build in (hostile.good_tar, hostile.tar_traversal, hostile.tar_symlink, hostile.tar_truncated,
                          hostile.tar_unexpected, hostile.tar_no_index):
                path = build(tmp)
                shutil.copyfile(path, out / path.name)
        elif target == "elf":
            (out / "minimal").write_bytes(hostile.minimal_elf())
            for name in ("/usr/bin/true",):
                if os.path.exists(name):
                    data = Path(name).read_bytes()
                    if len(data) <= 1 << 20:
                        (out / "true").write_bytes(data)
        elif target == "cfi":
            from vmprof_tui.demo import builds

            (out / "true").write_bytes(Path("/usr/bin/true").read_bytes())
            (out / "chain-nofp").write_bytes(builds.program_path("chain-nofp").read_bytes())
            from vmprof_tui.demo import guestos

            (out / "kernel").write_bytes(guestos.kernel_path().read_bytes())
        elif target == "bundle":
            (out / "empty").write_bytes(b"\0" * 64)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--seeds":
        write_seeds(sys.argv[2], Path(sys.argv[3]))
    else:
        main()
