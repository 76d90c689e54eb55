"""Assemble a guest bundle (docs/bundle.md, version 1) from what the agent gathered."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import stat
import sys
from dataclasses import dataclass, field
from typing import BinaryIO

from vmprof_guest import __version__, procfs
from vmprof_guest.cr3 import Cr3Result
from vmprof_guest.elfnote import is_elf, read_build_id
from vmprof_guest.writer import Writer

FORMAT = "vmprof-guest-bundle"
VERSION = 1
_KEY_RE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Options:
    vm: str
    copy_objects: bool = True
    known_build_ids: frozenset[str] = frozenset()
    max_object_bytes: int = 256 << 20
    max_total_bytes: int = 2 << 30


@dataclass
class _Object:
    key: str | None  # objects/<key> once copied; None when not copied
    build_id: str | None
    size: int
    f: BinaryIO | None  # kept open from capture to copy, so a deleted or replaced file is still the one mapped


@dataclass
class Builder:
    options: Options
    processes: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _objects: dict[tuple[int, int], _Object] = field(default_factory=dict)
    _planned_bytes: int = 0
    _keys: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # -- objects -----------------------------------------------------------------
    def _open_mapped(self, pid: int, m: procfs.MapEntry) -> BinaryIO | None:
        """The file behind a mapping: map_files (works for deleted files and other mount
        namespaces), then the process's root, then the plain path; only if it is the same inode."""
        for path in (f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}", f"/proc/{pid}/root{m.clean_path}",
                     m.clean_path):
            try:
                f = open(path, "rb")  # noqa: SIM115 - kept open until the bundle is written
            except OSError:
                continue
            st = os.fstat(f.fileno())
            # map_files is the mapped file by definition; elsewhere the inode must match (the device
            # number in maps differs from st_dev on overlay and FUSE file systems, so it is not compared)
            if stat.S_ISREG(st.st_mode) and (path.startswith("/proc/") and "/map_files/" in path
                                             or st.st_ino == m.inode):
                return f
            f.close()
        return None

    def prepare(self, info: procfs.ProcInfo) -> None:
        """Open the object files of a process's executable maps now, while they can still be opened."""
        for m in info.maps:
            if m.is_file and "x" in m.perms:
                self._object_for(info.pid, m)

    def _object_for(self, pid: int, m: procfs.MapEntry) -> _Object | None:
        ident = (os.makedev(m.dev_major, m.dev_minor), m.inode)
        if ident in self._objects:
            return self._objects[ident]
        f = self._open_mapped(pid, m)
        if f is None:
            self._objects[ident] = obj = _Object(None, None, 0, None)
            self.note(f"could not open {m.clean_path} (pid {pid}); its samples stay unresolved")
            return obj
        head = f.read(4)
        size = os.fstat(f.fileno()).st_size
        build_id = read_build_id(f) if is_elf(head) else None
        obj = _Object(None, build_id, size, f)
        self._objects[ident] = obj
        known = bool(build_id) and build_id in self.options.known_build_ids
        skip = None
        if size > self.options.max_object_bytes:
            skip = f"{m.clean_path} not copied: {size} bytes > limit {self.options.max_object_bytes}"
        elif self._planned_bytes + size > self.options.max_total_bytes:
            skip = f"{m.clean_path} not copied: the bundle would exceed {self.options.max_total_bytes} bytes"
        if not is_elf(head) or not self.options.copy_objects or known or skip:
            if skip and is_elf(head) and self.options.copy_objects and not known:
                self.note(skip)
            obj.f = None
            f.close()
            return obj
        obj.key = self._key(build_id, f)
        self._planned_bytes += size
        return obj

    def _key(self, build_id: str | None, f: BinaryIO) -> str:
        if build_id:
            key = _KEY_RE.sub("_", build_id)[:100]
        else:
            h = hashlib.sha256()
            f.seek(0)
            while chunk := f.read(1 << 20):
                h.update(chunk)
            key = "sha256-" + h.hexdigest()[:40]
        base, n = key, 1
        while key in self._keys:  # same build id, different files: keep both
            n += 1
            key = f"{base}.{n}"
        self._keys.add(key)
        return key

    # -- processes ---------------------------------------------------------------
    def add_process(self, info: procfs.ProcInfo, cr3: list[int], extra: dict | None = None) -> dict:
        """Record one process; opens (and keeps open) the object files of its executable maps."""
        exec_files = {(m.dev_major, m.dev_minor, m.inode) for m in info.maps if m.is_file and "x" in m.perms}
        maps = []
        for m in info.maps:
            entry = {"start": m.start, "end": m.end, "perms": m.perms, "offset": m.offset,
                     "path": m.path, "object": None, "build_id": None}
            if m.is_file and (m.dev_major, m.dev_minor, m.inode) in exec_files:
                obj = self._object_for(info.pid, m)
                if obj is not None:
                    entry["object"] = f"objects/{obj.key}" if obj.key else None
                    entry["build_id"] = obj.build_id
            maps.append(entry)
        record = {"pid": info.pid, "tids": info.tids or [info.pid], "name": info.name, "cmdline": info.cmdline,
                  "exe": info.exe, "cr3": cr3, "maps": maps, "ppid": info.ppid,
                  "kernel_thread": info.kernel_thread, "start_boot_ns": info.start_ns}
        if extra:
            record.update(extra)
        self.processes.append(record)
        return record

    # -- output ------------------------------------------------------------------
    def write(self, writer: Writer, cr3: Cr3Result, kallsyms: bytes | None, kernel_extra: dict | None = None) -> dict:
        copied = 0
        for obj in self._objects.values():
            if obj.key is None or obj.f is None:
                continue
            obj.f.seek(0)
            if not writer.add_file(f"objects/{obj.key}", obj.f, obj.size):
                self.note(f"objects/{obj.key} changed size while being copied; its symbols may be wrong")
            obj.f.close()
            obj.f = None
            copied += 1
        if kallsyms is not None:
            writer.add_bytes("kallsyms", kallsyms)
        kernel = {"release": os.uname().release, "build_id": procfs.kernel_build_id(),
                  "kallsyms": "kallsyms" if kallsyms is not None else None,
                  "modules": procfs.read_modules()}
        if kernel_extra:
            kernel.update(kernel_extra)
        if cr3.missing:
            self.note(f"CR3 values unavailable: {cr3.missing}")
        index = {"format": FORMAT, "version": VERSION, "vm": self.options.vm,
                 "created_by": f"vmprof-guest {__version__} (python {sys.version.split()[0]})",
                 "cr3_method": cr3.method if cr3.page_offset_base is not None else "none",
                 "cr3_detail": cr3.detail(), "kernel": kernel, "processes": self.processes,
                 "notes": self.notes}
        writer.add_bytes("bundle.json", json.dumps(index, indent=1).encode())
        writer.close()
        return {"processes": len(self.processes), "objects": copied, "notes": len(self.notes)}

    def discard(self) -> None:
        for obj in self._objects.values():
            if obj.f is not None:
                obj.f.close()
                obj.f = None
