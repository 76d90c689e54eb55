"""The machine code `predict costs` times: its measurement loops (SNIPPETS_CODE, called through ctypes from an
executable mapping) and a minimal static ELF that forks and execs (FORKER_CODE).  The assembly sources are kept
beside the bytes; ``tests/test_predict.py`` reassembles them and compares."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable

from vmprof_tui.estimate.predict import PredictError

# Assembled with GNU as (intel syntax) from SNIPPETS_ASM; offsets from `nm`.
SNIPPETS_ASM = r"""
	.intel_syntax noprefix
	.text
	.globl compute_loop
compute_loop:			/* (n): 4 instructions per iteration */
	xor eax, eax
	mov edx, 1
1:	add rax, rdx
	xor rdx, rax
	sub rdi, 1
	jnz 1b
	ret
	.globl null_loop
null_loop:			/* (n): n getppid */
1:	mov eax, 110
	syscall
	sub rdi, 1
	jnz 1b
	ret
	.globl open_close_loop
open_close_loop:		/* (n, path): n openat(AT_FDCWD, path, O_RDONLY) + close */
	mov r8, rdi
	mov r9, rsi
1:	mov eax, 257
	mov rdi, -100
	mov rsi, r9
	xor edx, edx
	xor r10d, r10d
	syscall
	test rax, rax
	js 2f
	mov rdi, rax
	mov eax, 3
	syscall
	sub r8, 1
	jnz 1b
	xor eax, eax
2:	ret
	.globl rw_loop
rw_loop:			/* (n, fd, buf, size, nr, limit): nr = pread64/pwrite64 at offsets 0, size, ... wrapping at limit */
	push rbx
	push rbp
	push r12
	push r13
	push r14
	push r15
	mov rbx, rdi
	mov r12, rsi
	mov r13, rdx
	mov r14, rcx
	mov r15, r8
	mov rbp, r9
	xor r10d, r10d
1:	mov rax, r15
	mov rdi, r12
	mov rsi, r13
	mov rdx, r14
	syscall
	test rax, rax
	js 3f
	add r10, r14
	cmp r10, rbp
	jb 2f
	xor r10d, r10d
2:	sub rbx, 1
	jnz 1b
	xor eax, eax
3:	pop r15
	pop r14
	pop r13
	pop r12
	pop rbp
	pop rbx
	ret
	.globl mmap_loop
mmap_loop:			/* (n, len): n mmap(anonymous, len) + munmap */
	push rbx
	push r12
	mov rbx, rdi
	mov r12, rsi
1:	mov eax, 9
	xor edi, edi
	mov rsi, r12
	mov edx, 3
	mov r10d, 0x22
	mov r8, -1
	xor r9d, r9d
	syscall
	cmp rax, -4095
	jae 2f
	mov rdi, rax
	mov rsi, r12
	mov eax, 11
	syscall
	sub rbx, 1
	jnz 1b
	xor eax, eax
2:	pop r12
	pop rbx
	ret
	.globl touch_write
touch_write:			/* (addr, pages, stride): one byte written per page */
1:	mov byte ptr [rdi], 1
	add rdi, rdx
	sub rsi, 1
	jnz 1b
	xor eax, eax
	ret
	.globl touch_read
touch_read:			/* (addr, pages, stride): one byte read per page, returns their sum */
	xor eax, eax
1:	movzx ecx, byte ptr [rdi]
	add rax, rcx
	add rdi, rdx
	sub rsi, 1
	jnz 1b
	ret
	.globl pingpong
pingpong:			/* (n, rfd, wfd, buf, starter): starter writes then reads 1 byte, the other reads then writes */
	push rbx
	push r12
	push r13
	push r14
	push r15
	mov rbx, rdi
	mov r12, rsi
	mov r13, rdx
	mov r14, rcx
	mov r15, r8
1:	test r15, r15
	jz 2f
	mov eax, 1
	mov rdi, r13
	mov rsi, r14
	mov edx, 1
	syscall
	cmp rax, 1
	jne 9f
2:	xor eax, eax
	mov rdi, r12
	mov rsi, r14
	mov edx, 1
	syscall
	cmp rax, 1
	jne 9f
	test r15, r15
	jnz 3f
	mov eax, 1
	mov rdi, r13
	mov rsi, r14
	mov edx, 1
	syscall
	cmp rax, 1
	jne 9f
3:	sub rbx, 1
	jnz 1b
	xor eax, eax
	jmp 8f
9:	mov rax, -1
8:	pop r15
	pop r14
	pop r13
	pop r12
	pop rbx
	ret
	.globl memory_loop
memory_loop:			/* (n, start): n dependent loads, each loading the address of the next */
	mov rax, rsi
1:	mov rax, [rax]
	sub rdi, 1
	jnz 1b
	ret
"""

SNIPPETS_CODE = bytes.fromhex(
    "31c0ba010000004801d04831c24883ef0175f4c3b86e0000000f054883ef0175f3c34989f84989f1b80101000048c7c7"
    "9cffffff4c89ce31d24531d20f054885c078124889c7b8030000000f054983e80175d531c0c353554154415541564157"
    "4889fb4989f44989d54989ce4d89c74c89cd4531d24c89f84c89e74c89ee4c89f20f054885c078134d01f24939ea7203"
    "4531d24883eb0175dc31c0415f415e415d415c5d5bc35341544889fb4989f4b80900000031ff4c89e6ba0300000041ba"
    "2200000049c7c0ffffffff4531c90f05483d01f0ffff73154889c74c89e6b80b0000000f054883eb0175c431c0415c5b"
    "c3c607014801d74883ee0175f431c0c331c00fb60f4801c84801d74883ee0175f1c35341544155415641574889fb4989"
    "f44989d54989ce4d89c74d85ff7418b8010000004c89ef4c89f6ba010000000f054883f801753c31c04c89e74c89f6ba"
    "010000000f054883f80175274d85ff7518b8010000004c89ef4c89f6ba010000000f054883f801750a4883eb0175ab31"
    "c0eb0748c7c0ffffffff415f415e415d415c5bc34889f0488b004883ef0175f7c3")
SNIPPETS = {"compute_loop": 0x00, "null_loop": 0x14, "open_close_loop": 0x22, "rw_loop": 0x56, "mmap_loop": 0xA6,
            "touch_write": 0xF1, "touch_read": 0x100, "pingpong": 0x112, "memory_loop": 0x194}

FORKER_ASM = r"""
	.intel_syntax noprefix
	.text
	.globl _start
/* argc 1: exit at once; 2: ITER x (fork, the child exits, wait4);
   3: the same with the child exec'ing argv[0] (with argc 1) */
_start:
	mov rax, [rsp]
	cmp rax, 1
	jbe 8f
	mov ebx, 0x11223344	/* ITER, patched */
	mov r12, rax
	mov r13, [rsp + 8]
1:	mov eax, 57
	syscall
	test rax, rax
	js 9f
	jz 3f
	mov rdi, -1
	xor esi, esi
	xor edx, edx
	xor r10d, r10d
	mov eax, 61
	syscall
	sub rbx, 1
	jnz 1b
8:	xor edi, edi
	mov eax, 231
	syscall
3:	cmp r12, 3
	jne 8b
	push 0
	push r13
	mov rsi, rsp
	mov rdi, r13
	xor edx, edx
	mov eax, 59
	syscall
9:	mov edi, 1
	mov eax, 231
	syscall
"""

FORKER_CODE = bytes.fromhex(
    "488b04244883f8017636bb443322114989c44c8b6c2408b8390000000f054885c0783f742448c7c7ffffffff31f631d2"
    "4531d2b83d0000000f054883eb0175d731ffb8e70000000f054983fc0375f16a0041554889e64c89ef31d2b83b000000"
    "0f05bf01000000b8e70000000f05")
ITER_MARK = (0x11223344).to_bytes(4, "little")

PAGE = mmap.PAGESIZE


def forker_elf(iterations: int) -> bytes:
    """A static x86-64 ELF executable: one PT_LOAD segment (headers + FORKER_CODE) at 0x400000."""
    import struct

    base, ehsize, phsize = 0x400000, 64, 56
    code = FORKER_CODE.replace(ITER_MARK, int(iterations).to_bytes(4, "little"))
    entry = base + ehsize + phsize
    size = ehsize + phsize + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    eh = ident + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, entry, ehsize, 0, 0, ehsize, phsize, 1, 0, 0, 0)
    ph = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # PT_LOAD, R+X
    return eh + ph + code


class Snippets:
    """SNIPPETS_CODE in an executable mapping, callable through ctypes."""

    def __init__(self) -> None:
        try:
            self._mem = mmap.mmap(-1, PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        except OSError as e:
            raise PredictError(f"predict costs: cannot map executable memory for the measurement loops: "
                               f"{e.strerror}") from None
        self._mem.write(SNIPPETS_CODE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))
        L = ctypes.c_long  # noqa: N806

        def fn(name: str, nargs: int) -> Callable[..., int]:
            return ctypes.CFUNCTYPE(L, *([L] * nargs))(addr + SNIPPETS[name])

        self.compute_loop = fn("compute_loop", 1)
        self.null_loop = fn("null_loop", 1)
        self.open_close_loop = fn("open_close_loop", 2)
        self.rw_loop = fn("rw_loop", 6)
        self.mmap_loop = fn("mmap_loop", 2)
        self.touch_write = fn("touch_write", 3)
        self.touch_read = fn("touch_read", 3)
        self.pingpong = fn("pingpong", 5)
        self.memory_loop = fn("memory_loop", 2)


_SNIPPETS: Snippets | None = None


def snippets() -> Snippets:
    global _SNIPPETS
    if _SNIPPETS is None:
        _SNIPPETS = Snippets()
    return _SNIPPETS
