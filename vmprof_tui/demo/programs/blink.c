/* blink: busy for BUSY us, then sleep IDLE us, repeated: halts short enough
 * (tens of microseconds) for KVM to poll them out instead of blocking.
 * Parameters: a = busy us, b = idle us, c = TSC ticks per ms (from the VMM).
 */
#include "guest_rt.h"

static unsigned long sink;

__attribute__((noinline)) void blink_work(unsigned long ticks)
{
	unsigned long end = rdtsc() + ticks, x = sink;
	while (rdtsc() < end) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		__asm__ volatile("" : "+r"(x));
	}
	sink = x;
}

int main(unsigned long busy_us, unsigned long idle_us, unsigned long tsc_per_ms, unsigned long unused)
{
	(void)unused;
	for (unsigned long i = 1;; i++) {
		blink_work(busy_us * tsc_per_ms / 1000);
		if (i % 64 == 0)
			port_out(PORT_PROGRESS, 64);  /* cycles done: rarely, each report is an exit */
		guest_sleep_us((unsigned int)idle_us);
	}
	return 0;
}
