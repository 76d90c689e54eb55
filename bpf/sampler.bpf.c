/* vmprof sampler: one perf_event program on every CPU (cycles NMI on PMU
 * hosts, cpu-clock otherwise).  For every sample it records host context and,
 * when the interrupted task is a vCPU thread interrupted in guest mode, the
 * vCPU, guest RIP, guest CR3, guest privilege and last exit reason; with -g (WITH_STACKS) also
 * the host and guest call stacks (stacks.h). */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include "sample.h"

BPF_RINGBUF_OUTPUT(samples, SAMPLE_RING_PAGES);
BPF_PERCPU_ARRAY(samples_lost, u64, 1);

/* The name of every sampled process, so that one that exits before user space reads /proc (which it
 * does once per drain) is still named.  A process's name is its main thread's comm; another thread's
 * comm stands in until the main thread is sampled.  Checked on every main-thread sample: exec renames. */
struct process_comm {
	char comm[16];
	u64 from_main;
};
BPF_TABLE("lru_hash", u32, struct process_comm, process_comms, 16384);

static __always_inline void remember_comm(u32 pid, u32 tid)
{
	struct process_comm *known = process_comms.lookup(&pid);
	if (known && pid != tid)
		return; /* another thread's name never replaces a known one */
	struct process_comm now = {.from_main = pid == tid};
	bpf_get_current_comm(&now.comm, sizeof(now.comm));
	if (known && known->from_main && ((u64 *)known->comm)[0] == ((u64 *)now.comm)[0] &&
	    ((u64 *)known->comm)[1] == ((u64 *)now.comm)[1])
		return; /* the usual case: the main thread, same name */
	process_comms.update(&pid, &now);
}

#include "vcpu.h"
#ifdef WITH_STACKS
#include "stacks.h"
#endif

#ifdef HOST_COUNTS
BPF_HASH(host_counts, struct vmprof_host_count_key, u64, HOST_COUNT_ENTRIES);
BPF_PERCPU_ARRAY(host_counts_lost, u64, 1);

/* A host task's sample, counted here; false for a sample the ring buffer must carry (a vCPU thread's:
 * the guest profile and the steal split need each one with its time; the idle task's: CPU idle comes from
 * the sched events, per CPU). */
static __always_inline bool counted(u32 pid, u16 flags, u64 ip, bool vcpu_thread)
{
	if (vcpu_thread || !pid)
		return false;
	struct vmprof_host_count_key key = {.pid = pid, .flags = flags, .ip = ip};
	u64 one = 1;
	u64 *n = host_counts.lookup(&key);
	if (n)
		__sync_fetch_and_add(n, 1);
	else if (host_counts.update(&key, &one) != 0) { /* full until user space takes the counts */
		int zero = 0;
		host_counts_lost.increment(zero);
	}
	return true;
}
#endif

int on_sample(struct bpf_perf_event_data *ctx)
{
	u64 ip = PT_REGS_IP(&ctx->regs); /* the context read once, up front (the verifier refuses a moved ctx pointer) */
	u16 flags = (ctx->regs.cs & 3) ? 0 : SAMPLE_HOST_KERNEL;
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = id >> 32, tid = (u32)id;
	void *vcpu = loaded_vcpu((void *)bpf_get_current_task());
#if defined(RECOVER_SWITCHES) || defined(HOST_COUNTS)
	bool vcpu_thread = vcpu || (pid && vcpu_tids.lookup(&tid)); /* loaded, or known outside KVM_RUN */
#endif
	if (pid)
		remember_comm(pid, tid);
#ifdef RECOVER_SWITCHES
	if (!pid || vcpu_thread)
		seen_running(pid, tid, pid != 0);
#endif
#ifdef HOST_COUNTS
	if (counted(pid, flags, ip, vcpu_thread))
		return 0;
#endif
	struct vmprof_sample *s = samples.ringbuf_reserve(sizeof(struct vmprof_sample));
	if (!s) {
		int zero = 0;
		samples_lost.increment(zero);
		return 0;
	}
	s->time_ns = bpf_ktime_get_ns();
	s->host_ip = ip;
	s->guest_ip = 0;
	s->guest_cr3 = 0;
	s->pid = pid;
	s->tid = tid;
	s->exit_reason = 0;
	s->stack_id = -1;
	s->cpu = bpf_get_smp_processor_id();
	s->vcpu_id = 0;
	s->flags = flags;
	s->pad = 0;

	if (vcpu) {
		s->flags |= SAMPLE_VCPU;
		s->vcpu_id = read_u32(vcpu + VCPU_VCPU_ID);
		s->exit_reason = vcpu_exit_reason(vcpu);
		if (read_u32(vcpu + VCPU_MP_STATE) == KVM_MP_STATE_HALTED)
			s->flags |= SAMPLE_HALTED;
		/* KVM_HANDLING_IRQ (1) for a cpu-clock sampler, KVM_HANDLING_NMI (2) for cycles; any other
		 * value means the interrupt did not arrive in guest mode for this event (as perf decides) */
		u8 handling = read_u8(vcpu + VCPU_INTR_FROM_GUEST);
		if (handling == EXPECTED_HANDLING) {
			u64 rip = 0, cr3 = 0;
			s->flags |= SAMPLE_GUEST | vcpu_guest_state(vcpu, handling, &rip, &cr3);
			s->guest_ip = rip;
			s->guest_cr3 = cr3;
			/* only a thread in KVM_RUN runs the guest; a VMM thread can load a vCPU for an ioctl */
			remember_vcpu_thread(s->tid, s->pid);
		}
	}
#ifdef WITH_STACKS
	s->stack_id = record_stacks(ctx, s, vcpu);
#endif
	samples.ringbuf_submit(s, BPF_RB_NO_WAKEUP); /* userspace drains on a timer */
	return 0;
}
