/* Finding the running kvm_vcpu from a BPF program without kprobes or fentry
 * (docs/backends.md): while a vCPU is loaded, KVM's preempt notifier is on
 * the vCPU thread's task_struct.preempt_notifiers, with ops->sched_in ==
 * kvm_sched_in.  All offsets are -D macros computed from the running kernel's
 * BTF by vmprof_tui/backends.py; KVM_SCHED_IN comes from /proc/kallsyms. */
#ifndef VMPROF_VCPU_H
#define VMPROF_VCPU_H

#define KVM_MP_STATE_HALTED 3

#if defined(BACKEND_VMX)
#include "vmprof_vmx_bpf.h"
#endif

/* vCPU threads seen so far (tid -> VMM tgid), filled by userspace discovery
 * and by the programs themselves when they meet a loaded vCPU. */
BPF_HASH(vcpu_tids, u32, u32, 65536);

static __always_inline u64 read_u64(const void *p)
{
	u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), p);
	return v;
}

static __always_inline u32 read_u32(const void *p)
{
	u32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), p);
	return v;
}

static __always_inline u8 read_u8(const void *p)
{
	u8 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), p);
	return v;
}

/* The kvm_vcpu loaded on `task`, or NULL. */
static __always_inline void *loaded_vcpu(const void *task)
{
	void *node = (void *)read_u64(task + TASK_PREEMPT_NOTIFIERS);
	if (!node)
		return 0;
	/* struct preempt_notifier { struct hlist_node link; struct preempt_ops *ops; } */
	void *ops = (void *)read_u64(node + PN_OPS);
	if (ops && read_u64(ops + OPS_SCHED_IN) == KVM_SCHED_IN)
		return node - VCPU_PREEMPT_NOTIFIER;
	return 0;
}

/* The last VM-exit reason, in the backend's own numbering. */
static __always_inline u32 vcpu_exit_reason(const void *vcpu)
{
#if defined(BACKEND_PVM)
	return read_u32(vcpu - PVM_VCPU + PVM_EXIT_REASON);
#elif defined(BACKEND_SVM)
	void *vmcb = (void *)read_u64(vcpu - SVM_VCPU + SVM_VMCB);
	return vmcb ? read_u32(vmcb + VMCB_EXIT_CODE) : 0;
#elif defined(BACKEND_VMX)
	return read_u32(vcpu - VMX_VCPU + VMX_EXIT_REASON) & 0xffff;
#else
	return 0;
#endif
}

/* Guest RIP, CR3 and privilege of a vCPU interrupted in guest mode.
 * Returns extra SAMPLE_* flags. */
static __always_inline u16 vcpu_guest_state(const void *vcpu, u8 handling, u64 *rip, u64 *cr3)
{
#if defined(BACKEND_PVM)
	*rip = read_u64(vcpu + VCPU_RIP);
	*cr3 = read_u64(vcpu + VCPU_CR3);
	return read_u32(vcpu - PVM_VCPU + PVM_CPL) == 0 ? SAMPLE_GUEST_KERNEL : 0;
#elif defined(BACKEND_SVM)
	void *vmcb = (void *)read_u64(vcpu - SVM_VCPU + SVM_VMCB);
	*rip = read_u64(vcpu + VCPU_RIP);
	*cr3 = vmcb ? read_u64(vmcb + VMCB_SAVE_CR3) : 0;
	return vmcb && read_u8(vmcb + VMCB_SAVE_CPL) == 0 ? SAMPLE_GUEST_KERNEL : 0;
#elif defined(BACKEND_VMX) && defined(VMX_REC_BASE)
	/* helper_kmod publishes VMCS guest state per CPU (helper_kmod/BPF_CONTRACT.md) */
	struct vmprof_vmx_rec h = {};
	if (vmx_helper_read((u64)vcpu, handling, &h) != VMX_HELPER_OK)
		return SAMPLE_GUEST_UNKNOWN;
	*rip = h.guest_rip;
	*cr3 = h.guest_cr3;
	return h.guest_cpl == 0 ? SAMPLE_GUEST_KERNEL : 0;
#else
	return SAMPLE_GUEST_UNKNOWN;
#endif
}

static __always_inline void remember_vcpu_thread(u32 tid, u32 tgid)
{
	vcpu_tids.insert(&tid, &tgid);
}

#endif
