/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vmprof_vmx ABI: the one definition of what the helper module publishes and
 * what the vmprof BPF sampler reads.  Included by the module (kernel C) and
 * meant to be included verbatim by the BPF C that bcc compiles: it needs only
 * <linux/types.h>, which every UAPI header tree has.
 *
 * The module keeps one record per possible CPU in a flat array:
 *
 *     rec(cpu) = records + cpu * VMPROF_VMX_REC_SIZE,   0 <= cpu < nr_records
 *
 * `records`, `record_size`, `nr_records` and `abi` are published read-only in
 * /sys/module/vmprof_vmx/parameters/.  A record is rewritten on its own CPU,
 * in the same interrupt as the perf sample that reads it and before that
 * sample's BPF program runs: see BPF_CONTRACT.md for the full rules.
 */
#ifndef VMPROF_VMX_ABI_H
#define VMPROF_VMX_ABI_H

#include <linux/types.h>

#define VMPROF_VMX_ABI_VERSION	1
/* "VMX1" in memory order (little endian). 0 once the module is unloading. */
#define VMPROF_VMX_MAGIC	0x31584d56u
#define VMPROF_VMX_REC_SIZE	64

/* rec.flags */
#define VMPROF_VMX_F_VALID	 (1u << 0) /* guest_rip/cr3/exit_reason/cpl are good */
#define VMPROF_VMX_F_NMI	 (1u << 1) /* written in NMI context (else IRQ) */
#define VMPROF_VMX_F_CR3_VCPU	 (1u << 2) /* no EPT: cr3 is vcpu->arch.cr3 */
#define VMPROF_VMX_F_NESTED	 (1u << 3) /* vCPU was running an L2 guest */
#define VMPROF_VMX_F_NO_VMX	 (1u << 4) /* CR4.VMXE clear: not a VMX vCPU */
#define VMPROF_VMX_F_PROTECTED	 (1u << 5) /* guest state not readable (TDX) */
#define VMPROF_VMX_F_VMREAD_FAIL (1u << 6) /* a VMREAD failed or faulted */

/*
 * Values of kvm_vcpu.arch.handling_intr_from_guest (KVM's enum
 * kvm_intr_type; 0 means "not handling an interrupt that arrived in guest
 * mode").  Stable since the IRQ/NMI split (before 6.1).
 */
#define VMPROF_KVM_HANDLING_IRQ	1
#define VMPROF_KVM_HANDLING_NMI	2

struct vmprof_vmx_rec {
	__u32 seq;		/*  0: odd while the module writes the record */
	__u32 flags;		/*  4: VMPROF_VMX_F_* */
	__u64 vcpu;		/*  8: struct kvm_vcpu * this capture belongs to */
	__u64 stamp_ns;		/* 16: ktime_get_mono_fast_ns() == bpf_ktime_get_ns() clock */
	__u64 guest_rip;	/* 24: VMCS GUEST_RIP */
	__u64 guest_cr3;	/* 32: VMCS GUEST_CR3 (or vcpu->arch.cr3, F_CR3_VCPU) */
	__u32 exit_reason;	/* 40: raw VMCS VM_EXIT_REASON of the current exit */
	__u32 guest_cpl;	/* 44: SS.DPL from VMCS GUEST_SS_AR_BYTES, 0..3 */
	__u64 captures;		/* 48: records written on this CPU since load */
	__u32 fails;		/* 56: captures on this CPU without F_VALID */
	__u32 magic;		/* 60: VMPROF_VMX_MAGIC while the module is live */
};

#endif /* VMPROF_VMX_ABI_H */
