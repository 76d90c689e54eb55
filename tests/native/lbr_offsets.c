/* Prints the layout of struct lbr_record (bpf/lbr_record.h) as "name offset size"
 * lines, for tests/test_lbr_record.py to compare with the numpy dtype.  Compiled with
 * -DLBR_NR=... -DLBR_FIELDS=... for every variant. */
#include <stddef.h>
#include <stdio.h>
#include <linux/types.h>
#include "lbr_record.h"

#define HDR(m) printf("hdr." #m " %zu %zu\n", offsetof(struct lbr_record_hdr, m), \
		      sizeof(((struct lbr_record_hdr *)0)->m))
#define REC(m) printf(#m " %zu %zu\n", offsetof(struct lbr_record, m), sizeof(((struct lbr_record *)0)->m))

int main(void)
{
	printf("record %d %zu\n", 0, sizeof(struct lbr_record));
	printf("header %d %zu\n", 0, sizeof(struct lbr_record_hdr));
	printf("raw_entry %d %zu\n", 0, sizeof(struct lbr_raw_entry));
	HDR(time_ns);
	HDR(ip);
	HDR(cycles);
	HDR(cycles_enabled);
	HDR(cycles_running);
	HDR(instructions);
	HDR(instructions_enabled);
	HDR(instructions_running);
	HDR(pid);
	HDR(tid);
	HDR(cpu);
	HDR(lbr_bytes);
	HDR(cycles_err);
	HDR(instructions_err);
	HDR(nr);
	HDR(fields);
	HDR(filter);
	HDR(reserved);
	REC(hdr);
#if LBR_FIELDS & LBR_FIELD_FROM
	REC(from);
#endif
#if LBR_FIELDS & LBR_FIELD_TO
	REC(to);
#endif
#if LBR_FIELDS & LBR_FIELD_INFO
	REC(info);
#endif
	return 0;
}
