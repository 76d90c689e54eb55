/* Entry points of the demo guest kernel: boot, SYSCALL and exceptions (see kernel.h). */
#include "kernel.h"

	.text
	.cfi_sections .debug_frame  /* as gcc's for kernel.c (-g, no unwind tables): the VM's bundle carries it */
/* Boot, at CPL 0 on this process's kernel stack: rdi = user entry, rsi = user stack,
 * rdx = guest-physical address of the virtual-IF area.  Registers the area first (the fork
 * runs CPL-0 code natively only once it is registered), then enters user mode. */
	.globl kentry
	.type kentry, @function
kentry:
	.cfi_startproc
	.cfi_undefined rip  /* nothing called it: the outermost frame */
	mov $MSR_PVM_VIF, %ecx
	mov %rdx, %rax
	or $1, %rax
	shr $32, %rdx
	wrmsr
	mov %rdi, %rcx
	mov %rsi, %rsp
	mov $0x202, %r11
	xor %eax, %eax
	xor %ebx, %ebx
	xor %edx, %edx
	xor %esi, %esi
	xor %edi, %edi
	xor %ebp, %ebp
	xor %r8d, %r8d
	xor %r9d, %r9d
	xor %r10d, %r10d
	xor %r12d, %r12d
	xor %r13d, %r13d
	xor %r14d, %r14d
	xor %r15d, %r15d
	sysretq
	.cfi_endproc
	.size kentry, . - kentry

/* SYSCALL from user mode: rax = number, rdi rsi rdx r10 r8 r9 = arguments, rcx = user rip,
 * r11 = user rflags.  Linux preserves every register but rax, rcx and r11. */
	.globl syscall_entry
	.type syscall_entry, @function
	.balign 16
/* Its call-frame information (read by resolve/unwind.py from the VM's bundle) names the kernel stack's top
 * as the entry frame's CFA: the user RIP at CFA - 16, the user RBP at CFA - 24 and the user RSP at CFA - 8,
 * where the unwinder leaves the kernel stack for the user's.  Before the switch and after it back, the
 * user RIP is in RCX: a register in a register, which the unwinder does not follow. */
syscall_entry:
	.cfi_startproc simple
	.cfi_def_cfa rsp, 0
	.cfi_register rip, rcx
	mov %rsp, user_rsp(%rip)
	lea kstack_top(%rip), %rsp
	pushq user_rsp(%rip)
	.cfi_def_cfa_offset 8
	push %rcx
	.cfi_def_cfa_offset 16
	.cfi_offset rip, -16
	push %rbp
	.cfi_def_cfa_offset 24
	.cfi_offset rbp, -24
	mov %rsp, %rbp
	.cfi_def_cfa_register rbp
	push %r11
	push %rax
	push %rdi
	push %rsi
	push %rdx
	push %r10
	push %r8
	push %r9
	mov %rsp, %rdi
	sub $8, %rsp  /* eleven pushes: the call wants RSP 16-aligned */
	call do_syscall
	add $8, %rsp
	pop %r9
	pop %r8
	pop %r10
	pop %rdx
	pop %rsi
	pop %rdi
	add $8, %rsp
	pop %r11
	pop %rbp
	.cfi_def_cfa rsp, 16
	.cfi_same_value rbp
	pop %rcx
	.cfi_def_cfa_offset 8
	.cfi_register rip, rcx
	mov user_rsp(%rip), %rsp
	.cfi_def_cfa_offset 0
	sysretq
	.cfi_endproc
	.size syscall_entry, . - syscall_entry

/* Exception stubs, 16 bytes apart: vectors that push no error code push a zero. */
	.globl idt_stubs
	.balign 16
idt_stubs:
	.set vec, 0
	.rept 32
	.balign 16
	.if vec == 8 || (vec >= 10 && vec <= 14) || vec == 17 || vec == 21 || vec == 29 || vec == 30
	push $vec
	.else
	push $0
	push $vec
	.endif
	jmp fault_entry
	.set vec, vec + 1
	.endr

	.type fault_entry, @function
fault_entry:
	mov %rsp, %rdi
	and $-16, %rsp
	call handle_fault
1:	jmp 1b
	.size fault_entry, . - fault_entry

	.bss
	.balign 16
	.globl kstack, kstack_top
kstack:
	.skip 16384
kstack_top:
	.balign 8
	.globl user_rsp
user_rsp:
	.skip 8
	.section .note.GNU-stack,"",@progbits
