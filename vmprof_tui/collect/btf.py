"""Kernel structure offsets from the running kernel's BTF.

bpftool dumps BTF as JSON (the well-kept reader; pyelftools reads only ELF
.BTF sections, not /sys/kernel/btf files); this module only walks member
paths such as ``kvm_vcpu.arch.regs`` to byte offsets and sizes.  Module BTF
(``/sys/kernel/btf/kvm_intel``) is split BTF on top of vmlinux.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BTF_DIR = Path("/sys/kernel/btf")


class BtfError(RuntimeError):
    pass


@dataclass(frozen=True)
class Field:
    offset: int  # bytes from the start of the outer struct
    size: int  # bytes


class Btf:
    def __init__(self, types: dict[int, dict]) -> None:
        self.types = types
        self.by_name: dict[str, int] = {}
        for tid, t in types.items():
            if t.get("kind") in ("STRUCT", "UNION") and t.get("name") and t["name"] not in self.by_name:
                self.by_name[t["name"]] = tid

    @classmethod
    def load(cls, path: Path, base: Btf | None = None) -> Btf:
        bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
        if not Path(path).exists():
            raise BtfError(f"{path} does not exist: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF=y is needed)")
        cmd = [bpftool, "-j", "btf", "dump", "file", str(path)]
        if base is not None:
            cmd += ["base", str(BTF_DIR / "vmlinux")]
        try:
            out = subprocess.run(cmd, capture_output=True, check=True).stdout
        except FileNotFoundError:
            raise BtfError("bpftool is not installed (apt-get install bpftool)") from None
        except subprocess.CalledProcessError as e:
            raise BtfError(f"bpftool cannot read {path}: {e.stderr.decode().strip()[:200]}") from None
        types = {t["id"]: t for t in json.loads(out)["types"]}
        if base is not None:
            types = {**base.types, **types}
        return cls(types)

    def _resolve(self, tid: int) -> dict:
        t = self.types[tid]
        while t["kind"] in ("TYPEDEF", "VOLATILE", "CONST", "RESTRICT", "TYPE_TAG"):
            t = self.types[t["type_id"]]
        return t

    def sizeof(self, tid: int) -> int:
        t = self._resolve(tid)
        if t["kind"] == "PTR":
            return 8
        if t["kind"] == "ARRAY":
            return t["nr_elems"] * self.sizeof(t["type_id"])
        return int(t["size"])

    def field(self, path: str) -> Field:
        """Offset and size of a member path like ``kvm_vcpu.arch.regs``."""
        struct, *members = path.split(".")
        if struct not in self.by_name:
            raise BtfError(f"struct {struct} is not in this kernel's BTF")
        tid, offset = self.by_name[struct], 0
        for name in members:
            t = self._resolve(tid)
            found = self._find_member(t, name)
            if found is None:
                raise BtfError(f"{path}: no member {name} in this kernel's BTF")
            bits, tid = found
            offset += bits // 8
        return Field(offset, self.sizeof(tid))

    def _find_member(self, t: dict, name: str) -> tuple[int, int] | None:
        for m in t.get("members", []):
            if m["name"] == name:
                return m["bits_offset"], m["type_id"]
            if m["name"] in ("(anon)", ""):  # anonymous struct/union: look inside
                inner = self._find_member(self._resolve(m["type_id"]), name)
                if inner is not None:
                    return m["bits_offset"] + inner[0], inner[1]
        return None

    def offset(self, path: str) -> int:
        return self.field(path).offset

    def struct_size(self, name: str) -> int:
        if name not in self.by_name:
            raise BtfError(f"struct {name} is not in this kernel's BTF")
        return self.sizeof(self.by_name[name])

    def enum_value(self, name: str) -> int:
        """The value of an enumerator such as ``VCPU_REGS_RBP``."""
        for t in self.types.values():
            if t.get("kind") in ("ENUM", "ENUM64"):
                for v in t.get("values", []):
                    if v["name"] == name:
                        return int(v["val"])
        raise BtfError(f"enumerator {name} is not in this kernel's BTF")
