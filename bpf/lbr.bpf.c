/* vmprof LBR collection (issue 7): branch records + measured CPI per sample.
 *
 * Attached (PERF_EVENT_IOC_SET_BPF) to one perf-event group per CPU, opened by
 * vmprof_tui/lbr/collect.py:
 *   leader  PERF_TYPE_HARDWARE cycles, sampling, sample_type |= BRANCH_STACK,
 *           branch_sample_type = the chosen filter (call/return, call, any; user
 *           or user+kernel), read_format = TOTAL_TIME_ENABLED|RUNNING
 *   member  PERF_TYPE_HARDWARE instructions, counting only; its fd is stored at
 *           index cpu of the PERF_EVENT_ARRAY lbr_instructions
 * For each sample it emits one struct lbr_record (lbr_record.h) into the ring
 * buffer lbr_events: the branch entries as the pattern keeps them, the running
 * totals of both counters, pid/tid/cpu/time/ip.
 *
 * UAPI headers only: no kernel structure is read.  Untested on the development
 * machines (they have no PMU); it compiles and passes the verifier there (tests/
 * test_lbr_bpf.py).  Parameters: see lbr_record.h, plus LBR_MAX_CPUS and
 * LBR_RING_PAGES.
 */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include "lbr_record.h"

#ifndef LBR_MAX_CPUS
#define LBR_MAX_CPUS 1024
#endif
#ifndef LBR_RING_PAGES
#define LBR_RING_PAGES 256
#endif

struct lbr_scratch {
	struct lbr_raw_entry e[LBR_NR];
};

BPF_PERF_ARRAY(lbr_instructions, LBR_MAX_CPUS);
BPF_RINGBUF_OUTPUT(lbr_events, LBR_RING_PAGES);
BPF_PERCPU_ARRAY(lbr_scratch, struct lbr_scratch, 1);
BPF_PERCPU_ARRAY(lbr_stats, u64, LBR_STAT_NR);
BPF_ARRAY(lbr_target, u32, 1); /* tgid to keep, 0 = every process */

static __always_inline void lbr_count(int idx)
{
	lbr_stats.increment(idx);
}

int lbr_on_sample(struct bpf_perf_event_data *ctx)
{
	int zero = 0;
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	u32 *target = lbr_target.lookup(&zero);

	if (target && *target && *target != tgid)
		return 0;
	lbr_count(LBR_STAT_SAMPLES);

	struct lbr_scratch *s = lbr_scratch.lookup(&zero);
	if (!s)
		return 0;
	struct lbr_record *rec = lbr_events.ringbuf_reserve(sizeof(struct lbr_record));
	if (!rec) {
		lbr_count(LBR_STAT_DROPPED);
		return 0;
	}

	struct bpf_perf_event_value v = {};
	int err = bpf_perf_prog_read_value(ctx, &v, sizeof(v));
	rec->hdr.cycles = v.counter;
	rec->hdr.cycles_enabled = v.enabled;
	rec->hdr.cycles_running = v.running;
	rec->hdr.cycles_err = err;

	struct bpf_perf_event_value w = {};
	int err2 = lbr_instructions.perf_counter_value(CUR_CPU_IDENTIFIER, &w, sizeof(w));
	rec->hdr.instructions = w.counter;
	rec->hdr.instructions_enabled = w.enabled;
	rec->hdr.instructions_running = w.running;
	rec->hdr.instructions_err = err2;
	if (err || err2)
		lbr_count(LBR_STAT_COUNTER_ERR);

	long n = bpf_read_branch_records(ctx, s->e, sizeof(s->e), 0);
	int nr = n > 0 ? n / sizeof(struct lbr_raw_entry) : 0;
	if (n < 0)
		lbr_count(LBR_STAT_LBR_ERR);

	rec->hdr.time_ns = bpf_ktime_get_ns();
	rec->hdr.ip = PT_REGS_IP(&ctx->regs);
	rec->hdr.pid = tgid;
	rec->hdr.tid = (u32)id;
	rec->hdr.cpu = bpf_get_smp_processor_id();
	rec->hdr.lbr_bytes = n;
	rec->hdr.nr = nr;
	rec->hdr.fields = LBR_FIELDS;
	rec->hdr.filter = LBR_FILTER;
	rec->hdr.reserved = 0;

#pragma unroll
	for (int i = 0; i < LBR_NR; i++) {
		int ok = i < nr;
#if LBR_FIELDS & LBR_FIELD_FROM
		rec->from[i] = ok ? s->e[i].from : 0;
#endif
#if LBR_FIELDS & LBR_FIELD_TO
		rec->to[i] = ok ? s->e[i].to : 0;
#endif
#if LBR_FIELDS & LBR_FIELD_INFO
		rec->info[i] = ok ? s->e[i].info : 0;
#endif
	}
	lbr_events.ringbuf_submit(rec, 0);
	return 0; /* the sample itself is not needed in perf's own buffer */
}
