/* One rep-prefixed string instruction that repeats 4096 times in place (tests/test_lbr_simulate.py):
 * single-stepping traps after each iteration with the same RIP, the PMU counts one instruction. */
static unsigned char buf[4096];

int main(void)
{
	void *dst = buf;
	unsigned long n = sizeof(buf);
	__asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(0x5a) : "memory");
	return buf[4095] == 0x5a ? 0 : 1;
}

#include "host_start.h"
