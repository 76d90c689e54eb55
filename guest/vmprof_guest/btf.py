"""The one reader of the kernel's BTF (/sys/kernel/btf): struct member offsets and sizes, enumerator values.

Standard library only, and Python 3.9: the guest agent needs a handful of offsets (task_struct.mm,
mm_struct.pgd, ...) from the guest's kernel and must run alone inside a guest.  The host (vmprof_tui) reads
the offsets its BPF programs need with the same file: vmprof_tui/collect/btf.py is a link to this one.
Reading them from BTF means no kernel headers of the right version are needed, and nothing is guessed.
A module's BTF (/sys/kernel/btf/kvm_intel) is split BTF: its type ids and strings continue vmlinux's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

BTF_MAGIC = 0xEB9F
BTF_DIR = Path("/sys/kernel/btf")
VMLINUX_BTF = BTF_DIR / "vmlinux"

# BTF kinds (include/uapi/linux/btf.h) and the size of the data that follows each type record.
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_FWD, KIND_TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC = 9, 10, 11, 12, 13, 14, 15
KIND_FLOAT, KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 16, 17, 18, 19
_MODIFIERS = {KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG}
_SIZED = {KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FLOAT, KIND_DATASEC}


class BtfError(RuntimeError):
    """BTF is missing, malformed, or lacks a type or member that is needed."""


@dataclass(frozen=True)
class Field:
    offset: int  # bytes from the start of the outer struct
    size: int  # bytes


@dataclass
class _Type:
    kind: int
    name: str
    size_or_type: int
    vlen: int
    kind_flag: bool
    blob: bytes  # the BTF blob the type is in (vmlinux's or a module's)
    data_off: int  # where the kind-specific records start in it


@dataclass
class Btf:
    """Parsed type section of one BTF blob, on top of its base for split BTF (types are decoded lazily)."""

    data: bytes
    types: list[_Type | None] = field(default_factory=list)  # index = type id (0 = void)
    by_name: dict[tuple[int, str], int] = field(default_factory=dict)
    _strings: bytes = b""
    _base: Btf | None = None

    # -- loading -------------------------------------------------------------
    @classmethod
    def load(cls, path: Path = VMLINUX_BTF, base: Btf | None = None) -> Btf:
        """A BTF file; a module's (split BTF) needs vmlinux's as `base`."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise BtfError(f"cannot read {path}: {e.strerror} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)") from None
        return cls.parse(data, base)

    @classmethod
    def parse(cls, data: bytes, base: Btf | None = None) -> Btf:
        if len(data) < 24:
            raise BtfError("BTF blob is too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != BTF_MAGIC:
            raise BtfError("not a little-endian BTF blob (bad magic)")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        type_base, str_base = hdr_len + type_off, hdr_len + str_off
        if type_base + type_len > len(data) or str_base + str_len > len(data):
            raise BtfError("BTF sections run past the end of the blob")
        btf = cls(data=data, types=list(base.types) if base else [None], by_name=dict(base.by_name) if base else {},
                  _strings=data[str_base:str_base + str_len], _base=base)
        pos, end = type_base, type_base + type_len
        while pos + 12 <= end:
            name_off, info, size_or_type = struct.unpack_from("<III", data, pos)
            kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, bool(info >> 31)
            pos += 12
            t = _Type(kind, btf._string(name_off), size_or_type, vlen, kflag, data, pos)
            pos += _extra_size(kind, vlen)
            btf.types.append(t)
            if t.name and kind in (KIND_STRUCT, KIND_UNION, KIND_TYPEDEF, KIND_INT, KIND_ENUM, KIND_ENUM64):
                btf.by_name.setdefault((kind, t.name), len(btf.types) - 1)
        return btf

    def _string(self, off: int) -> str:
        if self._base is not None:  # split BTF: the base's strings come first
            if off < len(self._base._strings):
                return self._base._string(off)
            off -= len(self._base._strings)
        elif off == 0:
            return ""
        if off >= len(self._strings):
            return ""
        end = self._strings.find(b"\0", off)
        return self._strings[off:end if end >= 0 else len(self._strings)].decode("ascii", "replace")

    # -- queries ---------------------------------------------------------------
    def type(self, type_id: int) -> _Type:
        if not 0 < type_id < len(self.types):
            raise BtfError(f"BTF type id {type_id} out of range")
        t = self.types[type_id]
        assert t is not None
        return t

    def struct_id(self, name: str) -> int:
        """A struct's (or else a union's) type id."""
        type_id = self.by_name.get((KIND_STRUCT, name), self.by_name.get((KIND_UNION, name)))
        if type_id is None:
            raise BtfError(f"struct {name} is not in the kernel's BTF")
        return type_id

    def resolve(self, type_id: int) -> int:
        """Skip typedefs and qualifiers."""
        for _ in range(64):
            t = self.type(type_id)
            if t.kind not in _MODIFIERS:
                return type_id
            type_id = t.size_or_type
        raise BtfError("BTF typedef chain too long")

    def sizeof(self, type_id: int, depth: int = 0) -> int:
        """Bytes of a type (an array's elements times their size)."""
        t = self.type(self.resolve(type_id))
        if t.kind == KIND_PTR:
            return 8
        if t.kind == KIND_ARRAY and depth < 16:
            elem, _index, nelems = struct.unpack_from("<III", t.blob, t.data_off)
            return nelems * self.sizeof(elem, depth + 1)
        if t.kind in _SIZED:
            return t.size_or_type
        raise BtfError(f"BTF type {t.name or type_id} has no size")

    def members(self, type_id: int) -> list[tuple[str, int, int]]:
        """(name, type id, bit offset) of a struct/union's members."""
        t = self.type(type_id)
        if t.kind not in (KIND_STRUCT, KIND_UNION):
            raise BtfError(f"BTF type {t.name or type_id} is not a struct or union")
        out = []
        for i in range(t.vlen):
            name_off, mtype, offset = struct.unpack_from("<III", t.blob, t.data_off + 12 * i)
            out.append((self._string(name_off), mtype, offset & 0xFFFFFF if t.kind_flag else offset))
        return out

    def member(self, struct_name: str, path: str) -> tuple[int, int]:
        """(type id, bit offset) of `path` ("a.b.c") in struct `struct_name`, looking through anonymous members."""
        type_id = self.struct_id(struct_name)
        total_bits = 0
        for part in path.split("."):
            found = self._find_member(self.resolve(type_id), part, 0)
            if found is None:
                raise BtfError(f"struct {struct_name} has no member {path} in this kernel's BTF")
            type_id, bits = found
            total_bits += bits
        return type_id, total_bits

    def member_offset(self, struct_name: str, path: str) -> int:
        """Byte offset of `path` ("a.b.c") in struct `struct_name`."""
        _type_id, bits = self.member(struct_name, path)
        if bits % 8:
            raise BtfError(f"{struct_name}.{path} is a bit field")
        return bits // 8

    def field(self, path: str) -> Field:
        """Offset and size of a member path like ``kvm_vcpu.arch.regs``."""
        struct_name, _, members = path.partition(".")
        type_id, _bits = self.member(struct_name, members)
        return Field(self.member_offset(struct_name, members), self.sizeof(type_id))

    def offset(self, path: str) -> int:
        """Byte offset of a member path like ``kvm_vcpu.arch.cr3``."""
        struct_name, _, members = path.partition(".")
        return self.member_offset(struct_name, members)

    def struct_size(self, name: str) -> int:
        return self.sizeof(self.struct_id(name))

    def enum_value(self, name: str) -> int:
        """The value of an enumerator such as ``VCPU_REGS_RBP``."""
        for t in self.types:
            if t is None or t.kind not in (KIND_ENUM, KIND_ENUM64):
                continue
            size = 8 if t.kind == KIND_ENUM else 12
            for i in range(t.vlen):
                name_off, lo = struct.unpack_from("<Ii", t.blob, t.data_off + size * i)
                if self._string(name_off) != name:
                    continue
                if t.kind == KIND_ENUM:
                    return lo if t.kind_flag else lo & 0xFFFFFFFF
                hi = struct.unpack_from("<i" if t.kind_flag else "<I", t.blob, t.data_off + size * i + 8)[0]
                return hi << 32 | lo & 0xFFFFFFFF
        raise BtfError(f"enumerator {name} is not in this kernel's BTF")

    def _find_member(self, type_id: int, name: str, depth: int) -> tuple[int, int] | None:
        if depth > 8:
            return None
        for mname, mtype, bits in self.members(type_id):
            if mname == name:
                return mtype, bits
            if not mname:
                inner = self.resolve(mtype)
                if self.type(inner).kind in (KIND_STRUCT, KIND_UNION):
                    found = self._find_member(inner, name, depth + 1)
                    if found is not None:
                        return found[0], bits + found[1]
        return None


def _extra_size(kind: int, vlen: int) -> int:
    if kind in (KIND_INT, KIND_VAR, KIND_DECL_TAG):
        return 4
    if kind == KIND_ARRAY:
        return 12
    if kind in (KIND_STRUCT, KIND_UNION, KIND_DATASEC, KIND_ENUM64):
        return 12 * vlen
    if kind in (KIND_ENUM, KIND_FUNC_PROTO):
        return 8 * vlen
    return 0
