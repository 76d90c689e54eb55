/* A guest program that faults: it reports progress once, then stores to an
 * unmapped address (0x1000 + its first parameter, so the compiler cannot
 * see the fault coming). */
#include "guest_rt.h"

__attribute__((noinline)) void crash_here(unsigned long where)
{
	*(volatile unsigned long *)(0x1000 + where) = 1;
}

int main(unsigned long a, unsigned long b, unsigned long c, unsigned long d)
{
	(void)b; (void)c; (void)d;
	port_out(PORT_PROGRESS, 1);
	crash_here(a);
	return 0;
}
