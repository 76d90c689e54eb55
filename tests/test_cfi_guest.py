"""Call paths by call-frame information inside demo guests running real programs (issue 34): shor and sqlite,
static programs whose libraries (Debian's libquantum and libsqlite3) have no frame pointers, recorded with
`--call-graph cfi` and unwound from the host through the guest's page tables and its bundle's objects."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import Recorded, fuzz_process, record_scenario
from test_cfi import frames_of_vm

from vmprof_tui.analyse.analysis import analyse
from vmprof_tui.analyse.callgraph import PARTIAL, CallGraph
from vmprof_tui.demo import scenarios
from vmprof_tui.record.bpf_records import (
    KSTACK_TAIL,
    SAMPLE_DTYPE,
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    USTACK_GUEST_KERNEL,
    stack_rows,
)
from vmprof_tui.resolve.cfi import read_cfi
from vmprof_tui.resolve.spaces import guest_symbols
from vmprof_tui.resolve.unwind import COMPLETE, KernelRules, unwind_guest_kernel

# the guest kernel's functions, and its code without a symbol (as the flame graphs name it)
KERNEL_FRAMES = {"syscall_entry", "do_syscall", "call_vmm", "set_fs_base", "kentry", "[guest.kallsyms]"}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    tmp = tmp_path_factory.mktemp("real")
    vms = [scenarios.real_vm("shor", scenarios.Custom(programs=("shor",), args=("143", "6"), dir=str(tmp),
                                                     pin=scenarios.SHARED_CPU)),
           scenarios.real_vm("sqlite", scenarios.Custom(programs=("sqlite",), args=("6",), dir=str(tmp),
                                                       pin=scenarios.SHARED_CPU))]
    # 4 kHz, the two VMs time-sliced on one pCPU for 6 s: about 10 000 samples of shor; sqlite spends most of its
    # time in system calls served by the VMM (host samples), about 2 000 of its samples are its user code
    return record_scenario(tmp, vms, 6.0, frequency=4000, stacks=True, call_graph="cfi")


@pytest.mark.parametrize("program", ["shor", "sqlite"])
def test_real_programs_in_guests_reach_main(real: Recorded, program: str) -> None:
    """>= 95% of the program's user samples (those not in the guest kernel) carry a chain _start → ... → main."""
    got = frames_of_vm(CallGraph(analyse(real.rec)), program, program)
    user = Counter({c: n for c, n in got.items() if not KERNEL_FRAMES & set(c)})
    total = sum(user.values())
    to_main = sum(n for c, n in user.items() if "main" in c and c[0] == "_start" and PARTIAL not in c)
    print(f"{program}: {to_main} of {total} user samples ({100 * to_main / max(total, 1):.2f}%) reach main; "
          f"others {Counter({c[-4:]: n for c, n in user.items() if 'main' not in c}).most_common(5)}")
    assert total > 1000 and to_main >= 0.95 * total


def test_guest_kernel_chains_continue_into_user_code_to_main(real: Recorded) -> None:
    """A sample in the guest kernel during sqlite's system calls: the kernel's frames (by the kernel's own CFI, else
    walked by frame pointers) syscall_entry → do_syscall → call_vmm, below them the user chain unwound by call-frame
    information from the copy taken at the kernel's entry, to _start → main (before this, frame pointers ended it
    at the first library function).  Samples at the entry's first instruction or at its SYSRET, still on the user
    stack, continue from RCX (SYSCALL's user RIP) the same way."""
    got = frames_of_vm(CallGraph(analyse(real.rec)), "sqlite", "sqlite")
    kernel = Counter({c: n for c, n in got.items() if KERNEL_FRAMES & set(c)})
    to_main = sum(n for c, n in kernel.items() if c[:1] == ("_start",) and "main" in c and PARTIAL not in c)
    total = sum(kernel.values())
    through = sum(n for c, n in kernel.items() if c[-3:] == ("syscall_entry", "do_syscall", "call_vmm"))
    print(f"{total} guest-kernel samples ({through} in call_vmm), {to_main} reach main; "
          f"others {Counter({c[-5:]: n for c, n in kernel.items() if 'main' not in c}).most_common(5)}")
    assert total > 500 and to_main >= 0.95 * total


def test_guest_kernel_frames_by_its_cfi_equal_the_walked_ones(real: Recorded) -> None:
    """A guest-kernel sample's copy ends with its kernel stack (bpf/stacks.h); unwound by the demo kernel's own
    call-frame information (its ELF file in the VM's bundle, its entry's CFI directives in entry.S), its kernel
    frames up to the entry frame's user RIP equal the frame-pointer walk of the same sample for >= 95%."""
    rec = real.rec
    bundle = guest_symbols("sqlite", rec.bundles["sqlite"]).bundle
    assert bundle is not None and bundle.kernel is not None and bundle.kernel.object_path is not None
    rules = KernelRules(read_cfi(bundle.kernel.object_path))
    s, u = rec.samples, rec.ustacks
    assert u is not None and len(rules.table)
    rows, urows = stack_rows(s, rec.stacks), stack_rows(s, u)
    kernel = ((s["flags"] & SAMPLE_GUEST) != 0) & (rows >= 0) & (urows >= 0) & (
        ((s["flags"] & SAMPLE_GUEST_KERNEL) != 0) | (s["guest_ip"] >= 1 << 47))
    at = np.nonzero(kernel & ((u["flags"][np.maximum(urows, 0)] & USTACK_GUEST_KERNEL) != 0))[0]
    same = 0
    for i, (chain, why) in zip(at.tolist(), unwind_guest_kernel(u, urows[at], s["guest_ip"][at], rules), strict=True):
        w = rec.stacks[rows[i]]
        walked = w["guest"][:w["guest_depth"]].tolist()
        user = next((k for k, a in enumerate(walked) if a < 1 << 47), len(walked))
        same += why == COMPLETE and chain == walked[:user + 1] and chain[-1] == int(u["ip"][urows[i]])
    # what the kernel stack costs on disk: the copies compressed as the recording does (zstd), with and without it
    import pyarrow as pa

    copies = u[urows[at]].copy()
    with_kernel = len(pa.compress(copies.tobytes(), codec="zstd", asbytes=True))
    copies["data"][:, copies["data"].shape[1] - KSTACK_TAIL:] = 0
    without = len(pa.compress(copies.tobytes(), codec="zstd", asbytes=True))
    print(f"{len(at)} of {int(kernel.sum())} guest-kernel samples with their kernel stack; kernel frames by CFI "
          f"equal the walked ones for {same} ({100 * same / max(len(at), 1):.2f}%); on disk "
          f"{(with_kernel - without) / max(len(at), 1):.1f} bytes more per such sample")
    assert len(at) > 500 and same >= 0.95 * len(at)


def test_guest_kernel_frames_join_the_unwound_user_chain() -> None:
    """The walked kernel frames (up to the first user address) then the chain unwound from the copy; a missing copy
    keeps the kernel frames only; a deep pair is cut at the chain's limit, never beyond."""
    from vmprof_tui.record.bpf_records import STACK_DTYPE, STACK_GUEST_MAX
    from vmprof_tui.resolve.stacks import _below_guest_kernel, _guest_kernel_frames

    k = [0xFFFFFFFF80001000 + i for i in range(3)]
    walked = np.zeros(3, STACK_DTYPE)
    for w in walked:
        w["guest"][:5] = [*k, 0x401000, 0x1234]  # the user part of a frame-pointer walk: stopped or garbage
        w["guest_depth"] = 5
    walked[2]["guest"][:STACK_GUEST_MAX] = [*k, *range(0x400000, 0x400000 + STACK_GUEST_MAX - 3)]
    walked[2]["guest_depth"] = STACK_GUEST_MAX
    chains = np.zeros((3, STACK_GUEST_MAX), np.uint64)
    chains[0, :3] = [0x401000, 0x402000, 0x403000]
    chains[1, :1] = [0x401000]
    chains[2, :] = 0x500000
    depth = np.array([3, 1, STACK_GUEST_MAX], np.uint8)
    kernel = _guest_kernel_frames(np.zeros(3, SAMPLE_DTYPE), walked, np.full(3, -1), None, None, {}, None, {})
    _below_guest_kernel(kernel, chains, depth, np.arange(3), np.array([True, False, True]))
    assert chains[0, :depth[0]].tolist() == [*k, 0x401000, 0x402000, 0x403000] and not chains[0, depth[0]:].any()
    assert chains[1, :depth[1]].tolist() == k and depth[1] == 3
    assert depth[2] == STACK_GUEST_MAX and chains[2, :3].tolist() == k and (chains[2, 3:] == 0x500000).all()


def test_a_hostile_guest_kernel_stack_or_table_ends_partial(tmp_path: Path) -> None:
    """The kernel stack is guest memory and the kernel's file comes from the guest's bundle: a saved RBP that
    loops ends the kernel chain (a frame that does not climb), and a kernel file whose .debug_frame is garbage is
    one note line, its samples then keep the frame-pointer walk."""
    from test_cfi import _section

    from vmprof_tui.demo import guestos
    from vmprof_tui.record.bpf_records import ustack_dtype
    from vmprof_tui.resolve.stacks import _kernel_rules
    from vmprof_tui.resolve.unwind import NOT_CLIMBING

    path = guestos.kernel_path()
    rules = KernelRules(read_cfi(path))
    image = guestos.KernelImage.load(path)
    sp = image.symbols["kstack_top"] - 256
    u = np.zeros(1, ustack_dtype(4 * KSTACK_TAIL))
    tail = u["data"][0, 3 * KSTACK_TAIL:]
    tail[:16] = np.array([sp, sp], np.uint64).view(np.uint8)  # RSP, and RBP = RSP: a frame whose saved RBP is itself
    tail[16:32] = np.array([sp, image.symbols["do_syscall"] + 0x20], np.uint64).view(np.uint8)
    leaf = np.array([image.symbols["call_vmm"] + 0x10], np.uint64)
    [(chain, why)] = unwind_guest_kernel(u, np.zeros(1, np.int64), leaf, rules)
    assert why == NOT_CLIMBING and chain == [int(leaf[0]), image.symbols["do_syscall"] + 0x20]

    data = bytearray(path.read_bytes())
    off, size = _section(bytes(data), ".debug_frame")
    data[off:off + size] = b"\xff" * size
    bad = tmp_path / "kernel"
    bad.write_bytes(bytes(data))
    notes: list[str] = []
    vm = SimpleNamespace(bundle=SimpleNamespace(kernel=SimpleNamespace(object_path=bad)))
    assert _kernel_rules(vm, notes, {}) is None  # type: ignore[arg-type]
    assert len(notes) == 1 and "\n" not in notes[0] and "frame pointers" in notes[0], notes
    print(notes[0])


def test_fuzz_guest_kernel_stack(tmp_path: Path) -> None:
    """The atheris target `kstack` (tests/fuzz/fuzz_bundle.py): any kernel stack bytes and leaf unwound by the demo
    kernel's CFI end within the chain's limit, for a bounded time: no crash, hang or OOM."""
    proc = fuzz_process("kstack", 6, tmp_path)
    _, err = proc.communicate(timeout=180)
    done = [line for line in err.splitlines() if line.startswith("Done ")]
    crashes = [c.name for c in tmp_path.iterdir() if c.name.startswith(("crash-", "timeout-", "oom-"))]
    print(done[-1] if done else err[-2000:])
    assert proc.returncode == 0 and done and not crashes, err[-3000:]
