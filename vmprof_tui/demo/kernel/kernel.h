/* The demo guest kernel's contract with the demo VMM (vmprof_tui/demo/guestos.py reads the same
 * numbers; docs/demo.md describes them).  Every process has its own copy of this kernel, linked at
 * KERNEL_BASE, so the mailbox, the stack and the descriptor tables are per process. */
#ifndef VMPROF_KERNEL_H
#define VMPROF_KERNEL_H

#define DOORBELL_VA   0x7fe000000000UL  /* stores there are MMIO exits to the VMM */
#define PORT_SYSCALL  0x30  /* the mailbox holds a system call; the VMM writes its result */
#define PORT_FAULT    0x31  /* the mailbox holds an exception the kernel cannot serve */

#define MSR_FS_BASE   0xc0000100
#define MSR_PVM_VIF   0x4b564d10  /* this host's kvm_pvm: gpa | 1 registers the virtual-IF area */
#define NR_ARCH_PRCTL 158
#define ARCH_SET_FS   0x1002

#ifndef __ASSEMBLER__
typedef unsigned long u64;

/* The mailbox shared with the VMM (its layout is guestos.MAILBOX). */
struct mailbox {
	u64 nr;        /* system call number */
	u64 args[6];
	u64 ret;       /* written by the VMM */
	u64 rip;       /* user RIP of the call, or the faulting RIP */
	u64 rsp;       /* user RSP */
	u64 vector;    /* exception vector (PORT_FAULT) */
	u64 error;     /* exception error code */
	u64 cr2;       /* faulting address of a page fault */
	u64 fs_base;   /* the value to load into FS.base when ret says so */
};

/* What syscall_entry pushes: the user rsp and a frame-pointer frame (rbp, user rip) so that stack walks
 * continue from the kernel into user code — the sampler reads the user rsp at the frame + 16 to copy the
 * user stack for unwinding by call-frame information (bpf/stacks.h) — then the call's registers. */
struct uregs {
	u64 r9, r8, r10, rdx, rsi, rdi, rax, r11, rbp, rip, rsp;
};

/* What the exception stubs push below the CPU's own frame. */
struct fault_frame {
	u64 vector, error, rip, cs, rflags, rsp, ss;
};
#endif
#endif
