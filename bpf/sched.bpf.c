/* vmprof scheduler events: every context switch in which a vCPU thread (or the
 * idle task) leaves or takes a CPU, with whether the one leaving was preempted or blocked, and
 * whether its vCPU was halted.  These give exact run/blank intervals. */
#include "sample.h"

BPF_RINGBUF_OUTPUT(sched_events, SCHED_RING_PAGES);
BPF_PERCPU_ARRAY(sched_lost, u64, 1);

#include "vcpu.h"

RAW_TRACEPOINT_PROBE(sched_switch)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
	 *          unsigned int prev_state) */
	bool preempt = (bool)ctx->args[0];
	void *prev = (void *)ctx->args[1];
	void *next = (void *)ctx->args[2];
	u32 prev_state = (u32)ctx->args[3];
	u32 prev_tid = read_u32(prev + TASK_PID);
	u32 next_tid = read_u32(next + TASK_PID);
	void *prev_vcpu = loaded_vcpu(prev);
	u8 flags = 0;

	if (prev_vcpu || vcpu_tids.lookup(&prev_tid))
		flags |= SCHED_PREV_VCPU;
	if (loaded_vcpu(next) || vcpu_tids.lookup(&next_tid))
		flags |= SCHED_NEXT_VCPU;
	/* also every switch to or from the idle task (pid 0): the host level measures idle
	 * from these, since an idle CPU may take no sampling interrupts at all */
	if (!flags && prev_tid != 0 && next_tid != 0)
		return 0;

	struct vmprof_sched_event *e = sched_events.ringbuf_reserve(sizeof(struct vmprof_sched_event));
	if (!e) {
		int zero = 0;
		sched_lost.increment(zero);
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->prev_pid = read_u32(prev + TASK_TGID);
	e->prev_tid = prev_tid;
	e->next_pid = read_u32(next + TASK_TGID);
	e->next_tid = next_tid;
	e->prev_exit_reason = 0;
	e->cpu = bpf_get_smp_processor_id();
	e->prev_vcpu_id = 0;
	__builtin_memset(e->pad, 0, sizeof(e->pad));
	if (preempt || prev_state == 0)
		flags |= SCHED_PREV_RUNNABLE;
	if (prev_vcpu) {
		flags |= SCHED_PREV_LOADED;
		e->prev_vcpu_id = read_u32(prev_vcpu + VCPU_VCPU_ID);
		e->prev_exit_reason = vcpu_exit_reason(prev_vcpu);
		if (read_u32(prev_vcpu + VCPU_MP_STATE) == KVM_MP_STATE_HALTED)
			flags |= SCHED_PREV_HALTED;
	}
	e->flags = flags;
	bpf_probe_read_kernel_str(e->next_comm, sizeof(e->next_comm), next + TASK_COMM);
	sched_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}
