/* Entry points of the demo guest kernel: boot, SYSCALL and exceptions (see kernel.h). */
#include "kernel.h"

	.text
/* Boot, at CPL 0 on this process's kernel stack: rdi = user entry, rsi = user stack,
 * rdx = guest-physical address of the virtual-IF area.  Registers the area first (the fork
 * runs CPL-0 code natively only once it is registered), then enters user mode. */
	.globl kentry
	.type kentry, @function
kentry:
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
	.size kentry, . - kentry

/* SYSCALL from user mode: rax = number, rdi rsi rdx r10 r8 r9 = arguments, rcx = user rip,
 * r11 = user rflags.  Linux preserves every register but rax, rcx and r11. */
	.globl syscall_entry
	.type syscall_entry, @function
	.balign 16
syscall_entry:
	mov %rsp, user_rsp(%rip)
	lea kstack_top(%rip), %rsp
	pushq user_rsp(%rip)
	push %rcx
	push %rbp
	mov %rsp, %rbp
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
	pop %rcx
	mov user_rsp(%rip), %rsp
	sysretq
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
