"""The guest agent, vmprof-guest (issue 5), run for real on this machine (itself a Linux guest)."""

from __future__ import annotations

import ast
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, require_root

from vmprof_tui.resolve import bundle as B
from vmprof_tui.resolve import bundle_format, elf

GUEST = ROOT / "guest"
sys.path.insert(0, str(GUEST))

from vmprof_guest import cr3, elfnote, procfs  # noqa: E402

GIB = 1 << 30


def agent(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run vmprof-guest as a user would (python -m, the guest package on the path)."""
    env = {**os.environ, "PYTHONPATH": str(GUEST)}
    return subprocess.run([sys.executable, "-m", "vmprof_guest", *args], capture_output=True, timeout=timeout,
                          env=env, **kw)


# -- CR3 arithmetic on known values -------------------------------------------------------------------------


def test_cr3_normalisation_known_values() -> None:
    assert cr3.normalise_cr3(0x0000_0001_2345_6000) == 0x1_2345_6000
    assert cr3.normalise_cr3(0x0000_0001_2345_6ABC) == 0x1_2345_6000  # PCID 0xabc
    assert cr3.normalise_cr3(0x8000_0001_2345_6801) == 0x1_2345_6000  # no-flush + user PCID bit 11
    assert cr3.normalise_cr3(0x6000_0001_2345_6000) == 0x1_2345_6000  # LAM_U57/U48
    # PTI: an 8 KiB-aligned pair, kernel root even, user root = kernel | bit 12; either one yields the pair
    assert cr3.pti_roots(0x1_2345_6000, pti=True) == [0x1_2345_6000, 0x1_2345_7000]
    assert cr3.pti_roots(0x8000_0001_2345_7801, pti=True) == [0x1_2345_6000, 0x1_2345_7000]
    assert cr3.pti_roots(0x1_2345_7000, pti=False) == [0x1_2345_7000]
    # that host and guest agree: tests/test_bundle.py::test_guest_agent_agrees_with_the_host


def test_direct_map_arithmetic_known_values() -> None:
    # no memory randomisation: the L4 default base
    assert cr3.cr3_from_pgd(0xFFFF_8881_2345_6000, 0xFFFF_8880_0000_0000) == 0x1_2345_6000
    # KASLR'd direct map (1 GiB aligned) and a pgd 6 GiB into RAM
    base = 0xFFFF_9A3F_4000_0000
    pgd = base + 0x1_8765_4000
    assert cr3.cr3_from_pgd(pgd, base) == 0x1_8765_4000
    with pytest.raises(cr3.Cr3Error):
        cr3.cr3_from_pgd(pgd + 8, base)  # not a page
    with pytest.raises(cr3.Cr3Error):
        cr3.cr3_from_pgd(base - 0x1000, base)  # below the direct map
    with pytest.raises(cr3.Cr3Error):
        cr3.cr3_from_pgd(pgd, base, max_phys=4 * GIB)  # beyond RAM
    # candidates for the base given one direct-map pointer and 16 GiB of RAM
    cands = cr3.direct_map_candidates(pgd, max_phys=16 * GIB)
    assert base in cands and cands[0] == pgd & ~(GIB - 1) and len(cands) == 16
    assert all(c % GIB == 0 and 0 <= pgd - c < 16 * GIB for c in cands)
    # never below the architectural floor
    assert cr3.direct_map_candidates(0xFFFF_8881_2345_6000, 64 * GIB) == [
        0xFFFF_8881_0000_0000, 0xFFFF_8880_C000_0000, 0xFFFF_8880_8000_0000, 0xFFFF_8880_4000_0000,
        0xFFFF_8880_0000_0000]
    assert cr3.direct_map_floor(0xFF11_0001_0000_0000) == cr3.DIRECT_MAP_FLOOR_L5
    # System.map + KASLR: the image slid by 0x19000000
    slide = cr3.kaslr_offset(0xFFFF_FFFF_9A00_0000, 0xFFFF_FFFF_8100_0000)
    assert slide == 0x1900_0000 and 0xFFFF_FFFF_82A1_B2C8 + slide == 0xFFFF_FFFF_9BA1_B2C8


def _kcore_header(segments: list[tuple[int, int, int]]) -> bytes:
    ehdr = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7, 4, 62, 1, 0, 64, 0, 0,
                       64, 56, len(segments) + 1, 0, 0, 0)
    phdrs = struct.pack("<IIQQQQQQ", 4, 0, 0, 0, 0, 0, 0, 0)  # PT_NOTE first, as in /proc/kcore
    for vaddr, paddr, size in segments:
        phdrs += struct.pack("<IIQQQQQQ", 1, 7, 0x1000, vaddr, paddr, size, size, 0x1000)
    return ehdr + phdrs


def test_direct_map_from_kcore_headers(tmp_path: Path) -> None:
    base = 0xFFFF_9A3F_4000_0000
    segments = [(0xFFFF_FFFF_8100_0000, 0x0100_0000, 0x0200_0000),  # kernel text
                (0xFFFF_C900_0000_0000, 0xFFFF_FFFF_FFFF_FFFF, 1 << 40),  # vmalloc
                (base + 0x1000, 0x1000, 0x9E000), (base + 0x10_0000, 0x10_0000, 0xBFF0_0000)]  # RAM
    assert cr3.page_offset_base_from_kcore(cr3.kcore_ram_segments(_kcore_header(segments))) == base
    with pytest.raises(cr3.Cr3Error):
        cr3.page_offset_base_from_kcore(segments[:2] + [(base + GIB + 0x1000, 0x1000, 0x1000),
                                                        (base + 0x10_0000, 0x10_0000, 0x1000)])
    smap = tmp_path / "System.map"
    smap.write_text("ffffffff81000000 T _text\nffffffff82a1b2c8 D page_offset_base\nffffffff82a1b2d0 D x\n")
    assert cr3.read_system_map(str(smap), {"_text", "page_offset_base"}) == {
        "_text": 0xFFFF_FFFF_8100_0000, "page_offset_base": 0xFFFF_FFFF_82A1_B2C8}


# -- the agent on this machine ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def machine_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    require_root()
    out = tmp_path_factory.mktemp("agent") / "guest.tar"
    sleeper = subprocess.Popen(["sleep", "60"])
    # an argument longer than the bundle format allows must be cut, not make the bundle invalid
    long_arg = subprocess.Popen(["sh", "-c", "sleep 60", "x" * 10_000])
    try:
        proc = agent("bundle", "-o", str(out), "--vm", "ci-guest", "-v")
    finally:
        for p in (sleeper, long_arg):
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr.decode()
    return out, proc.stderr.decode(), sleeper.pid


def test_agent_bundle_on_this_machine(machine_bundle: tuple[Path, str, int]) -> None:
    path, stderr, sleeper_pid = machine_bundle
    print(stderr)
    with B.load_bundle(path) as b:
        assert b.vm == "ci-guest" and b.created_by.startswith("vmprof-guest ")
        # kernel: release, build id, kallsyms
        assert b.kernel is not None and b.kernel.release == os.uname().release
        assert b.kernel.build_id == procfs.kernel_build_id() and b.kernel.build_id
        assert b.kernel.symbols is not None and len(b.kernel.symbols) > 10_000
        assert "schedule" in set(b.kernel.symbols.names)
        # processes with maps and copied objects
        users = [p for p in b.processes if not p.kernel_thread]
        assert len(users) >= 3
        sleeper = next(p for p in b.processes if p.pid == sleeper_pid)
        assert sleeper.cmdline == ["sleep", "60"] and sleeper.exe and sleeper.exe.endswith("sleep")
        text = next(m for m in sleeper.maps if m.executable and m.path.endswith("/sleep"))
        assert text.object_path is not None and text.build_id
        syms = elf.read_elf_symbols(text.object_path)
        assert syms.build_id == text.build_id
        libc = next(m for m in sleeper.maps if m.executable and "libc.so" in m.path)
        assert libc.object_path is not None and len(elf.read_elf_symbols(libc.object_path)) > 1000
        # CR3: values, or exactly what this kernel lacks
        if b.cr3_method == "none":
            missing = b.cr3_detail.get("missing")
            assert missing and any("CR3 values unavailable" in n for n in b.notes)
            print(f"CR3 unavailable here: {missing}")
        else:
            assert b.cr3_method in cr3.PGD_METHODS and b.cr3_detail["direct_map"] in (
                "kcore", "kallsyms", "system-map", "pagemap-probe", "iomem-text")
            with_cr3 = [p for p in users if p.cr3]
            assert sleeper.cr3, "a sleeping process has its CR3 (the task walk does not need it to run)"
            assert len(with_cr3) >= len(users) - 1  # our own exiting agent aside
            ram = [(r.start, r.end) for r in procs_ram()]
            for p in with_cr3:
                for root in p.cr3:
                    assert root % 4096 == 0 and bundle_format.normalise_cr3(root) == root
                    assert not ram or any(lo <= root <= hi for lo, hi in ram), hex(root)
            roots = [p.cr3[0] for p in with_cr3]
            assert len(set(roots)) == len(roots), "two live processes share a page-table root"
            print(f"CR3 via {b.cr3_method} + {b.cr3_detail['direct_map']}, page_offset_base "
                  f"{b.cr3_detail['page_offset_base']:#x}: {len(with_cr3)}/{len(users)} processes")


def procs_ram() -> list[procfs.IomemRange]:
    return [r for r in procfs.read_iomem() if r.name == "System RAM" and r.end]


def test_agent_streams_a_tar_on_stdout(tmp_path: Path) -> None:
    """`-o -` (what qemu-ga runs), with objects the host already has named by build id only."""
    require_root()
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    libc_id = elfnote.file_build_id(str(libc))
    known = tmp_path / "known"
    known.write_text(f"{libc_id}\n")
    proc = agent("bundle", "-o", "-", "--known-build-ids", str(known), "--max-object-mb", "1",
                 "--pgd-method", "bpf-tasklist", "-v")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout[257:262] == b"ustar" and b"vmprof-guest: wrote stdout" in proc.stderr
    (tmp_path / "g.tar").write_bytes(proc.stdout)
    with B.load_bundle(tmp_path / "g.tar") as b:
        libc_maps = [m for p in b.processes for m in p.maps if m.path == str(libc)]
        assert libc_maps and all(m.object_path is None and m.build_id == libc_id for m in libc_maps)
        assert any("not copied" in n and "> limit 1048576" in n for n in b.notes), b.notes
        copied = [m.object_path for p in b.processes for m in p.maps if m.object_path is not None]
        assert all(path.stat().st_size <= 1 << 20 for path in copied)


def test_pgd_methods_agree_on_this_machine() -> None:
    """Each mm->pgd method separately; where two see a process they must give the same pgd."""
    require_root()
    from vmprof_guest import bpf

    session = bpf.Session.open()  # BPF raw tracepoints load on these machines (docs/backends.md)
    try:
        results = {}
        for method in cr3.PGD_METHODS:
            res = cr3.collect(session=session, pgd_methods=(method,), sched_window_s=0.3)
            print(method, res.tried)
            if method == "bpf-iter" and res.method == "none":
                assert "task iterator" in res.tried[0]["result"]  # refused: says so and why
                continue
            assert res.method == method and res.page_offset_base is not None, res.tried
            results[method] = res
        # Independent check of the direct-map base: the kernel image is also in the direct map, at its
        # physical address from /proc/iomem; its first bytes read the same through both mappings.
        base = results["bpf-tasklist"].page_offset_base
        assert base is not None
        code = next(r for r in procfs.read_iomem() if r.name == "Kernel code")
        text = procfs.kallsyms_lookup(procfs.read_kallsyms()[0], {"_text"})["_text"]
        via_text, via_direct_map = session.kread([text, base + code.start])
        assert via_text is not None and via_text == via_direct_map
        # ... which is also the agent's fallback method when /proc/self/pagemap is unusable
        assert cr3._iomem_text_probe(session, results["bpf-tasklist"], {"_text": text}) == base
    finally:
        session.close()
    me = os.getpid()
    assert me in results["bpf-tasklist"].pgds and me in results["bpf-sched"].pgds
    assert 1 in results["bpf-tasklist"].pgds, "the task walk sees every process, sleeping or not"
    for a in results.values():
        for b in results.values():
            for tgid in set(a.pgds) & set(b.pgds):
                assert a.pgds[tgid][0] == b.pgds[tgid][0], (tgid, a.method, b.method)
    bases = {r.page_offset_base for r in results.values()}
    assert len(bases) == 1


@pytest.mark.parametrize("events", ["bpf", "proc-connector", "poll"])
def test_watch_catches_a_50ms_process(events: str, tmp_path: Path) -> None:
    """A process that lives 50 ms during the watch is in the bundle, with its maps (and CR3 with BPF)."""
    require_root()
    out, stop = tmp_path / "watch.tar", tmp_path / "stop"
    args = ["watch", "--until", str(stop), "-o", str(out), "--events", events, "--no-objects"]
    if events == "poll":
        args += ["--no-bpf"]
    env = {**os.environ, "PYTHONPATH": str(GUEST)}
    watcher = subprocess.Popen([sys.executable, "-m", "vmprof_guest", *args], stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        assert watcher.stderr is not None
        deadline = time.monotonic() + 60
        for line in watcher.stderr:
            if "watching" in line:
                assert f"events: {events}" in line, line
                break
            assert time.monotonic() < deadline
        t0 = time.monotonic()
        short = subprocess.Popen(["sleep", "0.05"])
        short.wait()
        lived = time.monotonic() - t0
        time.sleep(0.2)
        if events == "proc-connector":
            watcher.send_signal(signal.SIGTERM)  # also a way to end the watch
        else:
            stop.touch()
        rest = watcher.stderr.read()
        assert watcher.wait(60) == 0, rest
    finally:
        if watcher.poll() is None:
            watcher.kill()
    with B.load_bundle(out) as b:
        recs = [p for p in b.processes if p.pid == short.pid and p.cmdline == ["sleep", "0.05"]]
        assert recs, f"the {lived * 1000:.0f} ms process is missing ({events})"
        rec = recs[-1]
        assert rec.exited and any(m.path.endswith("/sleep") and m.executable for m in rec.maps)
        assert any("libc.so" in m.path for m in rec.maps), "libraries mapped after exec were captured"
        if events == "bpf":
            assert rec.cr3, "the exec/exit hooks record the page-table root"


def test_agent_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    """No site-packages at all (python -I -S): the agent still writes a bundle and says CR3 needs bcc."""
    for path in (GUEST / "vmprof_guest").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("vmprof_guest", "bcc", "__future__"), \
                    f"{path.name} imports {name}"
    require_root()
    code = (f"import sys; sys.path.insert(0, {str(GUEST)!r}); from vmprof_guest.agent import main; "
            f"sys.exit(main(['bundle', '-o', {str(tmp_path / 'b')!r}, '--no-objects']))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CR3 unavailable: bcc is not installed" in proc.stderr
    with B.load_bundle(tmp_path / "b") as b:
        assert b.cr3_method == "none" and "bcc" in b.cr3_detail["missing"] and len(b.processes) > 3


def test_cr3_command_states_what_is_missing() -> None:
    proc = agent("cr3", "--no-bpf", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    assert out["pgd_source"] == "none" and "BPF disabled" in out["missing"] and out["processes"]


def test_usage_errors() -> None:
    assert agent().returncode == 2
    assert agent("watch", "--until", "-5", "-o", "/nonexistent/x").returncode == 2
    proc = agent("bundle", "-o", str(ROOT), "--no-bpf")  # an existing, non-empty folder
    assert proc.returncode == 1 and b"not an empty folder" in proc.stderr


# -- the pieces ---------------------------------------------------------------------------------------------------


def test_build_ids_and_proc_parsing(tmp_path: Path) -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    assert elfnote.file_build_id(str(libc)) == elf.read_elf_symbols(libc).build_id
    assert elfnote.file_build_id("/etc/hostname") is None
    assert procfs.parse_stat("42 (a (b) c) S 7 42 42 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 12345 0 0") == (
        "a (b) c", 7, 4194560, 12345)
    maps = procfs.parse_maps("55d0c0a00000-55d0c0a02000 r-xp 00002000 fd:01 1234  /usr/bin/my prog (deleted)\n"
                             "7ffd1000-7ffd2000 rw-p 00000000 00:00 0  [stack]\n")
    assert maps[0].clean_path == "/usr/bin/my prog" and maps[0].deleted and maps[0].offset == 0x2000
    assert maps[0].dev_major == 0xFD and maps[0].inode == 1234 and maps[0].is_file
    assert not maps[1].is_file and maps[1].path == "[stack]"
