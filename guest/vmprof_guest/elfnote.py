"""Just enough ELF to name an object file: its GNU build id (standard library only)."""

from __future__ import annotations

import struct
from typing import BinaryIO

ELF_MAGIC = b"\x7fELF"
PT_NOTE = 4
SHT_NOTE = 7
NT_GNU_BUILD_ID = 3
MAX_NOTE_BYTES = 1 << 20
MAX_HEADERS = 4096


def is_elf(head: bytes) -> bool:
    return head[:4] == ELF_MAGIC


def build_id_from_notes(data: bytes, want_name: bytes = b"GNU", want_type: int = NT_GNU_BUILD_ID) -> str | None:
    """Find a note of `want_type` owned by `want_name` in a run of ELF notes; its descriptor as hex."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        pos += 12
        name_end = pos + namesz
        desc_start = pos + ((namesz + 3) & ~3)
        desc_end = desc_start + descsz
        if desc_end > len(data):
            return None
        name = data[pos:name_end].rstrip(b"\0")
        if ntype == want_type and name == want_name and 0 < descsz <= 64:
            return data[desc_start:desc_end].hex()
        pos = desc_start + ((descsz + 3) & ~3)
    return None


def read_build_id(f: BinaryIO) -> str | None:
    """The NT_GNU_BUILD_ID of an open ELF file (little-endian, 32 or 64 bit), or None."""
    try:
        f.seek(0)
        ident = f.read(64)
        if not is_elf(ident) or len(ident) < 52 or ident[5] != 1:  # ELFDATA2LSB only
            return None
        is64 = ident[4] == 2
        if is64:
            phoff, = struct.unpack_from("<Q", ident, 32)
            phentsize, phnum = struct.unpack_from("<HH", ident, 54)
            fmt, size = "<IIQQQQQQ", 56
        else:
            phoff, = struct.unpack_from("<I", ident, 28)
            phentsize, phnum = struct.unpack_from("<HH", ident, 42)
            fmt, size = "<IIIIIIII", 32
        if phentsize < size or phnum > MAX_HEADERS or phoff == 0:
            return None
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(min(phnum, len(table) // phentsize)):
            fields = struct.unpack_from(fmt, table, i * phentsize)
            if is64:
                p_type, _flags, p_offset, _v, _p, p_filesz = fields[:6]
            else:
                p_type, p_offset, _v, _p, p_filesz = fields[:5]
            if p_type != PT_NOTE or p_filesz > MAX_NOTE_BYTES:
                continue
            f.seek(p_offset)
            found = build_id_from_notes(f.read(p_filesz))
            if found:
                return found
    except (OSError, struct.error, ValueError, OverflowError):
        return None
    return None


def file_build_id(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return read_build_id(f)
    except OSError:
        return None
