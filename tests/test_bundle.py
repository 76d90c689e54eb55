"""Guest bundles on the host (issue 5): the reader, hostile input, demo guests, fetch, fuzzing."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, fuzz_process

from vmprof_tui.collect import guest_fetch
from vmprof_tui.mapping import Mapping
from vmprof_tui.resolve import bundle as B
from vmprof_tui.resolve import bundle_format, elf, symtab
from vmprof_tui.resolve.spaces import ObjectCache, guest_symbols

sys.path.insert(0, str(ROOT / "tests" / "data" / "bundles"))
import hostile  # noqa: E402

GUEST = ROOT / "guest"


# -- CR3 normalisation on the host ------------------------------------------------------------


@pytest.mark.parametrize(("value", "root"), [
    (0x0000_0001_2345_6000, 0x0000_0001_2345_6000),  # already a root
    (0x0000_0001_2345_6001, 0x0000_0001_2345_6000),  # PCID 1
    (0x0000_0001_2345_6FFF, 0x0000_0001_2345_6000),  # PCID 4095
    (0x8000_0001_2345_6801, 0x0000_0001_2345_6000),  # no-flush bit 63 + PCID (PTI user PCID bit 11)
    (0x6000_0001_2345_6000, 0x0000_0001_2345_6000),  # LAM bits 62:61
    (0x0000_0001_2345_7000, 0x0000_0001_2345_7000),  # PTI user root (bit 12) is kept: bundles list both
    (0x000F_FFFF_FFFF_F000, 0x000F_FFFF_FFFF_F000),  # the highest 52-bit physical page
])
def test_normalise_cr3(value: int, root: int) -> None:
    assert bundle_format.normalise_cr3(value) == root
    assert int(bundle_format.normalise_cr3_array(np.array([value], dtype=np.uint64))[0]) == root


# There are two copies of the bundle format's identity and of CR3 normalisation on purpose: the guest agent
# (guest/vmprof_guest) is installed alone inside guests and must not import vmprof_tui, so it keeps its own.
# This test is what keeps the two copies one definition in effect.
def test_guest_agent_agrees_with_the_host() -> None:
    sys.path.insert(0, str(GUEST))
    try:
        from vmprof_guest import assemble, cr3
    finally:
        sys.path.remove(str(GUEST))
    assert (assemble.FORMAT, assemble.VERSION) == (bundle_format.FORMAT, bundle_format.VERSION)
    assert assemble.VERSION in bundle_format.VERSIONS
    assert cr3.CR3_ADDR_MASK == bundle_format.CR3_ADDR_MASK
    rng = np.random.default_rng(11)
    values = [0, 1, 0xFFF, 0x1000, 0x1FFF, 1 << 51, (1 << 52) - 1, 1 << 52, 1 << 61, 1 << 62, 1 << 63,
              (1 << 64) - 1, 0x8000_0001_2345_6801, 0x6000_0001_2345_7ABC,
              *(1 << b for b in range(64)), *((1 << b) - 1 for b in range(1, 65)),
              *rng.integers(0, 1 << 64, size=2000, dtype=np.uint64, endpoint=False).tolist()]
    host_array = bundle_format.normalise_cr3_array(np.array(values, dtype=np.uint64)).tolist()
    for v, from_array in zip(values, host_array, strict=True):
        assert cr3.normalise_cr3(v) == bundle_format.normalise_cr3(v) == from_array, hex(v)


# -- hostile bundles: each rejected with one clear line, nothing written outside ---------------------------


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize("case", list(hostile.CASES))
def test_hostile_bundle_rejected(case: str, tmp_path: Path) -> None:
    build, phrase = hostile.CASES[case]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    bundle_path = build(scratch)
    before = _tree(tmp_path)
    work = tmp_path / "work"
    with pytest.raises(B.BundleError) as info:
        B.load_bundle(bundle_path, hostile.case_limits(), workdir=work)
    message = str(info.value)
    assert "\n" not in message and len(message) < 500
    assert message.startswith(f"guest bundle {bundle_path}: ")
    reason = message[len(f"guest bundle {bundle_path}: "):]
    assert phrase in reason, reason
    assert not work.exists(), "a rejected bundle left its extraction folder"
    assert _tree(tmp_path) == before, "the reader wrote something"
    for escaped in (tmp_path / hostile.TRAVERSAL_TARGET, Path("/tmp") / hostile.TRAVERSAL_TARGET):
        assert not escaped.exists()


def test_good_bundles_load_and_resolve(tmp_path: Path) -> None:
    for build in (hostile.good_folder, hostile.good_tar):
        b = B.load_bundle(build(tmp_path), hostile.case_limits())
        with b:
            (proc,) = b.processes
            assert proc.cr3 == [0x1000]
            obj = proc.maps[0].object_path
            assert obj is not None and obj.is_file() and obj.resolve().is_relative_to(b.root.resolve())
            syms = elf.read_elf_symbols(obj)
            assert list(syms.names) == ["hello"]
        # what the analysis uses: CR3 -> address space -> (function, module)
        again = tmp_path / f"again-{build.__name__}"
        again.mkdir()
        g = guest_symbols("vm1", build(again))
        space = g.processes[bundle_format.normalise_cr3(0x8000_0000_0000_1001)]
        # The map covers file offset 0 at 0x401000; `hello` is at file offset 120.
        funcs, mods = space.resolve(np.array([0x401000 + 120 + 3, 0x401000], np.uint64), ObjectCache())
        assert funcs == ["hello", "[unknown]"] and mods == ["hello", "hello"]
        g.bundle.close()
        if build is hostile.good_tar:
            assert not b.root.exists(), "close() removes the private extraction folder"


def test_rejected_bundle_only_costs_its_own_guest(tmp_path: Path) -> None:
    good = hostile.good_folder(tmp_path)
    bad = hostile.tar_traversal(tmp_path)
    ok, rejected = guest_symbols("vm1", good), guest_symbols("vm2", bad)
    assert ok.note is None and ok.processes
    assert rejected.note is not None and "path traversal" in rejected.note and not rejected.processes
    ok.bundle.close()


# -- ELF symbols -----------------------------------------------------------------------------------------------


def test_elf_symbols_of_a_real_library() -> None:
    """libc's dynamic symbols, and the file-offset → address arithmetic a sample goes through."""
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    syms = elf.read_elf_symbols(libc)
    assert len(syms) > 1000 and syms.elf_type == 3 and syms.build_id
    assert np.all(syms.starts[1:] >= syms.starts[:-1])
    i = list(syms.names).index("malloc")
    start = int(syms.starts[i])
    text = next(s for s in syms.segments if s.flags & 1 and s.vaddr <= start < s.vaddr + s.memsz)
    # A guest mapped the text segment at 0x7f0000000000 + (vaddr & ~0xfff) with offset = segment offset & ~0xfff
    m = Mapping(start=0x7F00_0000_0000 + (text.vaddr & ~0xFFF), end=0x7F00_0000_0000 + text.vaddr + text.memsz,
                perms="r-xp", offset=text.offset & ~0xFFF, path=str(libc), object_path=libc, build_id=None)
    sampled = np.array([0x7F00_0000_0000 + start + 5], dtype=np.uint64)
    vaddr = syms.vaddrs_for_map(m, sampled)
    assert int(vaddr[0]) == start + 5
    assert syms.names[syms.lookup(vaddr)[0]] in ("malloc", "__libc_malloc")
    assert syms.lookup(np.array([0], dtype=np.uint64))[0] == -1
    assert int(syms.file_offsets_to_vaddrs(np.array([1 << 40], dtype=np.uint64))[0]) == int(elf.NO_ADDR)


def test_malformed_elf_is_an_elf_error(tmp_path: Path) -> None:
    good = hostile.minimal_elf()
    cases = {
        "empty": b"",
        "not-elf": b"MZ" + bytes(100),
        "truncated": good[:40],
        "bad-class": good[:4] + b"\x09" + good[5:],
        "shoff-beyond": good[:40] + (1 << 40).to_bytes(8, "little") + good[48:],
        "phnum-huge": good[:56] + (0xFFFF).to_bytes(2, "little") + good[58:],
        "symtab-beyond": _patch_symtab(good, offset=1 << 33),
        "symtab-self-link": _patch_symtab(good, link=2),
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(elf.ElfError) as info:
            elf.read_elf_symbols(path)
        assert "\n" not in str(info.value) and str(info.value).startswith(name), (name, str(info.value))
    link = tmp_path / "link"
    link.symlink_to("/lib/x86_64-linux-gnu/libc.so.6")
    with pytest.raises(B.BundleError, match="symbolic link"):
        elf.read_elf_symbols(link)
    with pytest.raises(elf.ElfError, match="symbols, over the limit of 0"):
        elf.elf_symbols_from_bytes(good, B.Limits(max_symbols=0))


def _patch_symtab(image: bytes, offset: int | None = None, link: int | None = None) -> bytes:
    data = bytearray(image)
    shoff = int.from_bytes(data[40:48], "little")
    sh = shoff + 2 * 64  # section 2 is .symtab
    if offset is not None:
        data[sh + 24:sh + 32] = offset.to_bytes(8, "little")
    if link is not None:
        data[sh + 40:sh + 44] = link.to_bytes(4, "little")
    return bytes(data)


def test_kallsyms_parsing() -> None:
    text = (b"ffffffff81000000 T _text\nffffffff81000100 t helper\nffffffff82000000 D data_sym\n"
            b"ffffffffc0000000 t mod_fn\t[kvm]\nffffffff81000200 W weak_fn\n")
    ks = symtab.parse_kallsyms(text)
    assert list(ks.names) == ["_text", "helper", "weak_fn", "mod_fn"] and list(ks.modules)[-1] == "kvm"
    assert list(ks.lookup(np.array([0xFFFFFFFF81000150, 0xFFFFFFFF80000000], dtype=np.uint64))) == [1, -1]
    with pytest.raises(B.BundleError, match="line 1"):
        symtab.parse_kallsyms(b"garbage\n")


# -- demo guests go through the same code path ---------------------------------------------------------------


def test_demo_bundle_loads_and_matches_ready_event() -> None:
    from vmprof_tui.demo import runner

    runner.check_kvm()
    with runner.DemoRun(runner.scenario_specs("two-procs"), duration_s=2) as run:
        for name, ready in run.ready.items():
            with B.load_bundle(run.bundle_root / name) as b:
                assert b.cr3_method == "vmm" and b.vm == name
                g = guest_symbols(name, run.bundle_root / name)
                for p in ready["processes"]:
                    proc = next(q for q in b.processes if bundle_format.normalise_cr3(p["cr3"]) in q.cr3)
                    assert proc.pid == p["pid"] and proc.name == p["name"]
                    text = next(m for m in proc.maps if m.executable and m.object_path)
                    syms = elf.read_elf_symbols(text.object_path)
                    # a sampled CR3 as the CPU shows it (PCID bits set)
                    space = g.processes[bundle_format.normalise_cr3(p["cr3"] | 0x5)]
                    assert space.pid == proc.pid
                    for fn in ("compute_a", "main"):
                        addr = int(syms.starts[list(syms.names).index(fn)])
                        funcs, mods = space.resolve(np.array([addr + 1], np.uint64), ObjectCache())
                        assert funcs == [fn] and mods == [Path(text.path).name]


# -- vmprof guest fetch, through a fake virsh ----------------------------------------------------------------------

FAKE_VIRSH = r'''#!PYTHON
"""A stand-in for `virsh qemu-agent-command` that behaves like qemu-ga on this machine."""
import base64, json, os, subprocess, sys
state = os.environ["FAKE_VIRSH_STATE"]
args = [a for a in sys.argv[1:]]
if "-c" in args:
    i = args.index("-c"); del args[i:i + 2]
if args[:1] != ["qemu-agent-command"]:
    sys.exit("fake virsh: only qemu-agent-command")
vm, msg = args[1], json.loads(args[2])
if vm != "guest1":
    sys.stderr.write(f"error: failed to get domain '{vm}'\n"); sys.exit(1)
cmd, a = msg["execute"], msg.get("arguments", {})
limit = int(os.environ.get("FAKE_QGA_MAX_OUTPUT", 16 << 20))
def reply(value):
    print(json.dumps({"return": value}))
if cmd == "guest-exec":
    n = len(os.listdir(state))
    out, err = open(f"{state}/{n}.out", "wb"), open(f"{state}/{n}.err", "wb")
    try:
        p = subprocess.Popen([a["path"], *a.get("arg", [])], stdout=out, stderr=err)
    except OSError as e:  # what libvirt prints when qemu-ga cannot start the program
        sys.stderr.write("error: internal error: unable to execute QEMU agent command 'guest-exec': Guest agent "
                         f"command failed, error was 'Failed to execute child process ({e.strerror})'\n")
        sys.exit(1)
    with open(f"{state}/{n}.pid", "w") as f:
        f.write(str(p.pid))
    p.wait()  # qemu-ga returns at once; waiting here keeps the fake simple
    with open(f"{state}/{n}.rc", "w") as f:
        f.write(str(p.returncode))
    reply({"pid": n})
elif cmd == "guest-exec-status":
    n = a["pid"]
    out = open(f"{state}/{n}.out", "rb").read()
    err = open(f"{state}/{n}.err", "rb").read()
    rc = int(open(f"{state}/{n}.rc").read())
    reply({"exited": True, "exitcode": rc, "out-data": base64.b64encode(out[:limit]).decode(),
           "out-truncated": len(out) > limit, "err-data": base64.b64encode(err).decode()})
elif cmd == "guest-file-open":  # handles live in qemu-ga; here: a state file with the path and position
    handle = 1000 + len(os.listdir(state))
    with open(f"{state}/{handle}.handle", "w") as f:
        json.dump({"path": a["path"], "pos": 0}, f)
    reply(handle)
elif cmd == "guest-file-read":
    h = json.load(open(f"{state}/{a['handle']}.handle"))
    with open(h["path"], "rb") as f:
        f.seek(h["pos"])
        data = f.read(a["count"])
    h["pos"] += len(data)
    json.dump(h, open(f"{state}/{a['handle']}.handle", "w"))
    reply({"count": len(data), "buf-b64": base64.b64encode(data).decode(), "eof": len(data) < a["count"]})
elif cmd == "guest-file-close":
    reply({})
else:
    print(json.dumps({"error": {"class": "CommandNotFound", "desc": f"{cmd} not supported"}}))
'''


@pytest.fixture
def fake_virsh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    virsh = bindir / "virsh"
    virsh.write_text(FAKE_VIRSH.replace("#!PYTHON", f"#!{sys.executable}"))
    virsh.chmod(0o755)
    state = tmp_path / "qga"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VIRSH_STATE", str(state))
    monkeypatch.setenv("PYTHONPATH", str(GUEST))
    return state


AGENT = [sys.executable, "-m", "vmprof_guest"]
FAST = ["--no-objects", "--pgd-method", "bpf-tasklist"]


def test_fetch_through_qemu_ga(fake_virsh: Path, tmp_path: Path) -> None:
    out = tmp_path / "guests"
    path = guest_fetch.fetch_bundle("guest1", out, guest_command=AGENT, extra_args=FAST)
    assert path == out / "guest1.tar"
    with B.load_bundle(path) as b:
        assert b.vm == "guest1" and len(b.processes) > 5
        assert b.kernel is not None and b.kernel.symbols is not None and len(b.kernel.symbols) > 1000
    assert sorted(p.name for p in out.iterdir()) == ["guest1.tar"]


def test_fetch_falls_back_to_a_guest_file_when_output_is_truncated(fake_virsh: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_QGA_MAX_OUTPUT", "10000")
    monkeypatch.setattr(guest_fetch, "READ_CHUNK", 256 << 10)
    path = guest_fetch.fetch_bundle("guest1", tmp_path / "g", guest_command=AGENT, extra_args=FAST)
    with B.load_bundle(path) as b:
        assert len(b.processes) > 5
    leftovers = list(Path(guest_fetch.GUEST_TMP).glob("vmprof-bundle-*.tar"))
    assert not leftovers, "the guest file was not removed"


def test_fetch_errors_are_one_clear_line(fake_virsh: Path, tmp_path: Path) -> None:
    with pytest.raises(guest_fetch.FetchError, match="check the name with: virsh list"):
        guest_fetch.fetch_bundle("nosuchvm", tmp_path)
    with pytest.raises(guest_fetch.FetchError, match="is not installed in guest1"):
        guest_fetch.fetch_bundle("guest1", tmp_path, guest_command=["/nonexistent/vmprof-guest"])
    bad = tmp_path / "evil-agent"
    traversal = hostile.tar_traversal(tmp_path)
    bad.write_text(f"#!/bin/sh\ncat {traversal}\n")
    bad.chmod(0o755)
    with pytest.raises(guest_fetch.FetchError, match="rejected: .*path traversal"):
        guest_fetch.fetch_bundle("guest1", tmp_path / "out", guest_command=[str(bad)])
    assert not list((tmp_path / "out").iterdir()), "a rejected bundle is not kept"


def test_fetch_cli(fake_virsh: Path, tmp_path: Path) -> None:
    import argparse

    from vmprof_tui.cli import guest as guest_cli

    parser = argparse.ArgumentParser(prog="vmprof guest")
    guest_cli.add_arguments(parser)
    args = parser.parse_args(["fetch", "--vm", "guest1", "-o", str(tmp_path), "--guest-command",
                              " ".join(AGENT), *[f"--agent-arg={a}" for a in FAST]])
    assert args.func(args) == 0
    assert (tmp_path / "guest1.tar").is_file()


# -- fuzzing (atheris), bounded -------------------------------------------------------------------------------------


FUZZ_SECONDS = 6  # per target; the four run side by side


def test_fuzz(tmp_path: Path) -> None:
    """Each atheris target for a bounded time: no crash, no timeout, no out-of-memory."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.fail("atheris is not installed: pip install atheris (a manylinux wheel; it is a test dependency)")
    procs = {target: fuzz_process(target, FUZZ_SECONDS, tmp_path / target)
             for target in ("json", "tar", "bundle", "elf")}
    failures = []
    for target, proc in procs.items():
        _, err = proc.communicate(timeout=FUZZ_SECONDS + 90)
        log = [line for line in err.splitlines() if not line.startswith("INFO: Instrumenting")]
        crashes = [c for c in (tmp_path / target).iterdir() if c.name.startswith(("crash-", "timeout-", "oom-"))]
        done = [line for line in log if line.startswith("Done ")]
        print(f"fuzz {target}: {done[-1] if done else 'no summary'}")
        if proc.returncode != 0 or crashes or not done:
            failures.append(f"{target}: exit {proc.returncode}; " + " | ".join(log[-25:]) + "".join(
                f"; {c.name} = {base64.b64encode(c.read_bytes()[:300]).decode()}" for c in crashes))
    assert not failures, "\n".join(failures)


def test_hostile_seeds_can_be_written(tmp_path: Path) -> None:
    """The generator is also a tool: python tests/data/bundles/hostile.py OUTDIR."""
    proc = subprocess.run([sys.executable, str(ROOT / "tests/data/bundles/hostile.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == len(hostile.CASES)
    assert tarfile.is_tarfile(tmp_path / "traversal.tar")
    assert json.loads((tmp_path / "wrong-version" / "bundle.json").read_text())["version"] == 2


def test_a_guest_object_with_a_broken_symbol_table_says_why_its_rows_are_unknown(tmp_path: Path) -> None:
    """The object's .symtab links to no string table: its samples are [unknown], and a note names the object and
    what is wrong with it (before, the rows were [unknown] with no word why)."""
    import struct

    from elftools.elf.elffile import ELFFile

    g = guest_symbols("vm1", hostile.good_folder(tmp_path))
    space = g.processes[bundle_format.normalise_cr3(0x8000_0000_0000_1001)]
    obj = space.maps[0].object_path
    data = bytearray(obj.read_bytes())
    with open(obj, "rb") as f:
        elf_file = ELFFile(f)
        shoff, shentsize = elf_file.header["e_shoff"], elf_file.header["e_shentsize"]
        index = next(i for i, s in enumerate(elf_file.iter_sections()) if s.header["sh_type"] == "SHT_SYMTAB")
    struct.pack_into("<I", data, shoff + index * shentsize + 40, 0)  # Elf64_Shdr.sh_link
    obj.write_bytes(bytes(data))
    cache = ObjectCache()
    funcs, _mods = space.resolve(np.array([0x401000 + 120 + 3], np.uint64), cache)
    assert funcs == ["[unknown]"]
    assert cache.notes == [f"{obj.name}: malformed ELF: symtab links to no string table: samples in {obj.name} "
                           "show [unknown]"], cache.notes
    g.bundle.close()
