/* SPDX-License-Identifier: MIT */
/*
 * The record bpf/lbr.bpf.c emits for every sample of the LBR collection path
 * (issue 7: LBR block timing with measured CPI).  One definition, shared with
 * vmprof_tui/lbr/record.py (record_dtype); tests/test_lbr_record.py compiles
 * tests/native/lbr_offsets.c against this header and checks every size and
 * offset against the numpy dtype, for every combination of the macros below.
 *
 * Compile-time parameters (bcc cflags):
 *   LBR_NR      entries per record (the CPU's LBR depth: 16 in the paper, 32 on
 *               newer Intel parts; /sys/bus/event_source/devices/cpu/caps/branches)
 *   LBR_FIELDS  which parts of each entry are kept: bit 0 from, bit 1 to,
 *               bit 2 info (the perf_branch_entry flags word: mispredict bits
 *               and, on CPUs with timed LBR, the 16-bit cycle count)
 *   LBR_FILTER  recorded in the header only: bit 0 call, 1 return, 2 any, 3 kernel
 *
 * Entries are stored newest first, as the kernel hands them over
 * (bpf_read_branch_records: entries[0] is the most recent branch).
 * Counter values are the raw running totals of the perf-event group; the
 * analysis takes differences between consecutive records of the same CPU.
 * Only UAPI-compatible fixed-width types: usable from BPF C and user C alike.
 */
#ifndef VMPROF_LBR_RECORD_H
#define VMPROF_LBR_RECORD_H

#ifndef LBR_NR
#define LBR_NR 16
#endif
#ifndef LBR_FIELDS
#define LBR_FIELDS 3
#endif
#ifndef LBR_FILTER
#define LBR_FILTER 3
#endif

#define LBR_FIELD_FROM 1
#define LBR_FIELD_TO 2
#define LBR_FIELD_INFO 4

/* Layout of struct perf_branch_entry (UAPI), without its bitfields. */
struct lbr_raw_entry {
	__u64 from;
	__u64 to;
	__u64 info;
};

struct lbr_record_hdr {
	__u64 time_ns;              /* bpf_ktime_get_ns() */
	__u64 ip;                   /* sampled instruction pointer */
	__u64 cycles;               /* group leader (cycles): running total */
	__u64 cycles_enabled;
	__u64 cycles_running;
	__u64 instructions;         /* group member (instructions): running total */
	__u64 instructions_enabled;
	__u64 instructions_running;
	__u32 pid;                  /* tgid */
	__u32 tid;
	__u32 cpu;
	__s32 lbr_bytes;            /* bpf_read_branch_records(): bytes copied, or -errno */
	__s32 cycles_err;           /* bpf_perf_prog_read_value(): 0 or -errno */
	__s32 instructions_err;     /* bpf_perf_event_read_value(): 0 or -errno */
	__u16 nr;                   /* valid entries */
	__u8 fields;                /* LBR_FIELDS */
	__u8 filter;                /* LBR_FILTER */
	__u32 reserved;
};

struct lbr_record {
	struct lbr_record_hdr hdr;
#if LBR_FIELDS & LBR_FIELD_FROM
	__u64 from[LBR_NR];
#endif
#if LBR_FIELDS & LBR_FIELD_TO
	__u64 to[LBR_NR];
#endif
#if LBR_FIELDS & LBR_FIELD_INFO
	__u64 info[LBR_NR];
#endif
};

/* Per-CPU counters of the collector (BPF_PERCPU_ARRAY lbr_stats). */
#define LBR_STAT_SAMPLES 0       /* program runs for the target */
#define LBR_STAT_DROPPED 1       /* ring buffer full: record lost */
#define LBR_STAT_LBR_ERR 2       /* bpf_read_branch_records() failed */
#define LBR_STAT_COUNTER_ERR 3   /* a counter read failed */
#define LBR_STAT_NR 4

#endif
