"""One BTF reader (guest/vmprof_guest/btf.py, standard library only), used by the guest agent and, through the
link vmprof_tui/collect/btf.py, by the host's backends: what it reads agrees with bpftool's dump of the running
kernel, and split BTF (a module's, on top of vmlinux) continues the base's type ids and strings."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from vmprof_tui.collect import backends
from vmprof_tui.collect import btf as host_btf
from vmprof_tui.collect.btf import VMLINUX_BTF, Btf, BtfError


class BpftoolBtf:
    """The reference: bpftool's JSON dump of the same file, walked the plain way."""

    def __init__(self) -> None:
        dump = subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(VMLINUX_BTF)], capture_output=True,
                              check=True, timeout=120).stdout
        self.types = {t["id"]: t for t in json.loads(dump)["types"]}
        self.named: dict[str, dict] = {}
        for t in self.types.values():
            if t["kind"] in ("STRUCT", "UNION"):
                self.named.setdefault(t["name"], t)

    def _plain(self, tid: int) -> dict:
        t = self.types[tid]
        while t["kind"] in ("TYPEDEF", "VOLATILE", "CONST", "RESTRICT", "TYPE_TAG"):
            t = self.types[t["type_id"]]
        return t

    def _size(self, tid: int) -> int:
        t = self._plain(tid)
        return 8 if t["kind"] == "PTR" else t["nr_elems"] * self._size(t["type_id"]) if t["kind"] == "ARRAY" \
            else t["size"]

    def _member(self, t: dict, name: str) -> tuple[int, int] | None:
        for m in t["members"]:
            if m["name"] == name:
                return m["bits_offset"], m["type_id"]
            if m["name"] == "(anon)" and self._plain(m["type_id"])["kind"] in ("STRUCT", "UNION"):
                inner = self._member(self._plain(m["type_id"]), name)
                if inner is not None:
                    return m["bits_offset"] + inner[0], inner[1]
        return None

    def field(self, path: str) -> tuple[int, int]:
        name, *members = path.split(".")
        bits, tid = 0, self.named[name]["id"]
        for m in members:
            found = self._member(self._plain(tid), m)
            if found is None:
                raise BtfError(path)
            bits, tid = bits + found[0], found[1]
        return bits // 8, self._size(tid)

    def offset(self, path: str) -> int:
        return self.field(path)[0]

    def struct_size(self, name: str) -> int:
        return self.named[name]["size"]

    def enum_value(self, name: str) -> int:
        for t in self.types.values():
            for v in t.get("values", []) if t["kind"] in ("ENUM", "ENUM64") else []:
                if v["name"] == name:
                    return int(v["val"])
        raise BtfError(name)


@pytest.fixture(scope="module")
def reference() -> BpftoolBtf:
    return BpftoolBtf()


def test_btf_reader_is_one_file() -> None:
    """The host's module is the guest agent's file (a link), not a second reader."""
    assert Path(host_btf.__file__).resolve() == (ROOT / "guest" / "vmprof_guest" / "btf.py").resolve()


def test_btf_offsets_match_bpftool(reference: BpftoolBtf) -> None:
    """Every member path, size and enumerator the host's backends read on this kernel, and the guest agent's
    offsets, are what bpftool's dump says."""
    btf = Btf.load()

    class Both:  # answers with the reader under test, after checking it against the reference
        def field(self, path: str) -> host_btf.Field:
            got = btf.field(path)
            assert (got.offset, got.size) == reference.field(path), path
            return got

        def offset(self, path: str) -> int:
            assert btf.offset(path) == reference.offset(path), path
            return btf.offset(path)

        def struct_size(self, name: str) -> int:
            assert btf.struct_size(name) == reference.struct_size(name), name
            return btf.struct_size(name)

        def enum_value(self, name: str) -> int:
            assert btf.enum_value(name) == reference.enum_value(name), name
            return btf.enum_value(name)

    both = Both()
    offsets = backends._guest_memory_offsets(both, both.field("kvm_vcpu.arch.regs").offset)
    for path in ("task_struct.preempt_notifiers", "task_struct.pid", "task_struct.tgid", "task_struct.comm",
                 "preempt_notifier.ops", "preempt_ops.sched_in", "kvm_vcpu.preempt_notifier", "kvm_vcpu.vcpu_id",
                 "kvm_vcpu.arch.cr3", "kvm_vcpu.arch.mp_state", "task_struct.mm", "task_struct.tasks",
                 "mm_struct.pgd"):
        both.offset(path)
    both.enum_value("VCPU_REGS_RIP")
    assert len(offsets) == 14  # and VCPU_RCX: where SYSCALL leaves the user RIP (docs/stacks.md)
    computed = backends._compute_offsets(backends.detect_backend())
    assert computed["TASK_PID"] == reference.offset("task_struct.pid")
    assert computed["VCPU_RIP"] == reference.field("kvm_vcpu.arch.regs")[0] + 8 * reference.enum_value(
        "VCPU_REGS_RIP")


def _split_blob(base: Btf, int_id: int) -> bytes:
    """A module's BTF: one struct `vmprof_split` {int a; int b;} whose member type is the base's int, its names
    in its own string section (offsets after the base's strings)."""
    strings = b"\0vmprof_split\0a\0b\0"
    shift = len(base._strings)
    types = struct.pack("<III", shift + 1, 4 << 24 | 2, 8)  # STRUCT, vlen 2, size 8
    types += struct.pack("<III", shift + 14, int_id, 0) + struct.pack("<III", shift + 16, int_id, 32)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def test_split_btf_continues_the_base() -> None:
    base = Btf.load()
    int_id = base.by_name[(1, "int")]
    split = Btf.parse(_split_blob(base, int_id), base)
    own = split.struct_id("vmprof_split")
    assert own == len(base.types)  # the first id after the base's
    assert split.field("vmprof_split.b") == host_btf.Field(4, 4)
    assert split.struct_size("vmprof_split") == 8
    assert split.offset("task_struct.pid") == base.offset("task_struct.pid")  # the base's types stay reachable
    with pytest.raises(BtfError, match="no member c"):
        split.offset("vmprof_split.c")
