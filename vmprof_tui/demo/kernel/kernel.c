/* The demo guest kernel: hands each Linux system call of its one user process to the demo VMM
 * through the mailbox and a doorbell store, and reports exceptions it cannot serve. */
#include "kernel.h"

/* Filled by the VMM: descriptor tables, the TSS, and the virtual-IF area (a page of its own). */
__attribute__((aligned(4096), used)) unsigned char vif_area[4096];
__attribute__((aligned(64), used)) u64 gdt[16];
__attribute__((aligned(64), used)) u64 idt[64];
__attribute__((aligned(64), used)) unsigned char tss[128];
__attribute__((aligned(64), used)) volatile struct mailbox mailbox;

static inline void ring(unsigned int port)
{
	*(volatile u64 *)(DOORBELL_VA + port * 8UL) = port;
}

static inline void wrmsr(unsigned int msr, u64 value)
{
	__asm__ volatile("wrmsr" : : "c"(msr), "a"((unsigned int)value), "d"((unsigned int)(value >> 32)) : "memory");
}

/* After the VMM served arch_prctl(ARCH_SET_FS): load the thread pointer here, at CPL 0. */
__attribute__((noinline)) void set_fs_base(u64 base)
{
	wrmsr(MSR_FS_BASE, base);
}

__attribute__((noinline)) long call_vmm(u64 nr, const struct uregs *r)
{
	/* A stack slot gives this leaf a frame: GCC 12 builds a leaf that uses no stack without one, even with
	 * -mno-omit-leaf-frame-pointer, and a stack walk from the doorbell store would then skip do_syscall. */
	volatile u64 number = nr;
	mailbox.nr = number;
	mailbox.args[0] = r->rdi;
	mailbox.args[1] = r->rsi;
	mailbox.args[2] = r->rdx;
	mailbox.args[3] = r->r10;
	mailbox.args[4] = r->r8;
	mailbox.args[5] = r->r9;
	mailbox.rip = r->rip;
	ring(PORT_SYSCALL);  /* the VMM serves the call during this store's exit */
	return (long)mailbox.ret;
}

long do_syscall(struct uregs *r)
{
	extern u64 user_rsp;
	mailbox.rsp = user_rsp;
	long ret = call_vmm(r->rax, r);
	if (r->rax == NR_ARCH_PRCTL && r->rdi == ARCH_SET_FS && ret == 0)
		set_fs_base(mailbox.fs_base);
	return ret;
}

void handle_fault(struct fault_frame *f)
{
	mailbox.vector = f->vector;
	mailbox.error = f->error;
	mailbox.rip = f->rip;
	mailbox.rsp = f->rsp;
	u64 cr2;
	__asm__ volatile("mov %%cr2, %0" : "=r"(cr2));
	mailbox.cr2 = cr2;
	ring(PORT_FAULT);  /* the VMM ends the process */
	for (;;)
		;
}
