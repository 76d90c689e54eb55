/* load: one synthetic workload of the multi-VM model (paper 003, `vmprof model`) at a level.
 * Parameters: a = mode (0 cpu, 1 net-send, 2 net-recv), b = level in 1/1000 of the maximum,
 * c = TSC ticks per ms (from the VMM), d = packets per period at level 1000 (net modes).
 *
 * Periods of PERIOD_MS on an absolute TSC schedule: cpu spins for level/1000 of each period
 * (the duty loop); net-send fills and sends its share of packets, net-recv posts receive
 * buffers and checksums what arrived, both through the demo VMM's virtual NIC (docs/model.md);
 * then the process sleeps to the next period.  A period that overruns (the vCPU is shared)
 * starts the next one at once, with no catch-up: that is the saturation the model learns.
 */
#include "guest_rt.h"

#define PORT_NET_BUF  0x20  /* value: guest page number of the NIC area (1 header page + NET_SLOTS) */
#define PORT_NET_TX   0x21  /* value: packets in slots 0..value-1 to send */
#define PORT_NET_RX   0x22  /* value: receive buffers posted; the VMM fills slots with what arrived */
#define NET_SLOTS     32
#define PACKET_BYTES  1024
#define PERIOD_MS     20

struct slot { unsigned int len; unsigned char data[4092]; };
struct nic_area { unsigned int rx_count; unsigned char pad[4092]; struct slot slots[NET_SLOTS]; };

static struct nic_area nic __attribute__((aligned(4096)));
static unsigned long sink;

__attribute__((noinline)) void spin_until(unsigned long end)
{
	unsigned long x = sink;
	while (rdtsc() < end) {
		for (int i = 0; i < 1000; i++) {
			x = x * 6364136223846793005UL + 1442695040888963407UL;
			__asm__ volatile("" : "+r"(x));
		}
	}
	sink = x;
}

__attribute__((noinline)) void net_send(unsigned long packets, unsigned long seq)
{
	while (packets) {
		unsigned int n = packets < NET_SLOTS ? (unsigned int)packets : NET_SLOTS;
		for (unsigned int i = 0; i < n; i++) {
			unsigned long *p = (unsigned long *)nic.slots[i].data;
			for (unsigned int w = 0; w < PACKET_BYTES / 8; w++)
				p[w] = seq * 0x9E3779B97F4A7C15UL + w;
			nic.slots[i].len = PACKET_BYTES;
			seq++;
		}
		port_out(PORT_NET_TX, n);
		packets -= n;
	}
}

__attribute__((noinline)) void net_recv(unsigned long packets)
{
	unsigned long sum = sink;
	while (packets) {
		unsigned int n = packets < NET_SLOTS ? (unsigned int)packets : NET_SLOTS;
		port_out(PORT_NET_RX, n);
		unsigned int got = *(volatile unsigned int *)&nic.rx_count;
		for (unsigned int i = 0; i < got && i < NET_SLOTS; i++) {
			const unsigned long *p = (const unsigned long *)nic.slots[i].data;
			unsigned int words = nic.slots[i].len / 8;
			for (unsigned int w = 0; w < words && w < 4092 / 8; w++)
				sum += p[w];
		}
		packets -= n;
	}
	sink = sum;
}

int main(unsigned long mode, unsigned long level, unsigned long tsc_per_ms, unsigned long max_packets)
{
	unsigned long period = PERIOD_MS * tsc_per_ms, next = rdtsc(), owed = 0, seq = 0;
	if (mode != 0)
		port_out(PORT_NET_BUF, (unsigned int)((unsigned long)&nic >> 12));
	for (;;) {
		unsigned long start = next;
		next = start + period;
		if (mode == 0) {
			spin_until(start + period / 1000 * level);
		} else {
			owed += max_packets * level;  /* packets in thousandths, so no level is rounded away */
			unsigned long packets = owed / 1000;
			owed %= 1000;
			if (mode == 1)
				net_send(packets, seq);
			else
				net_recv(packets);
			seq += packets;
		}
		unsigned long now = rdtsc();
		if (now < next)
			guest_sleep_ms((unsigned int)((next - now + tsc_per_ms - 1) / tsc_per_ms));
		else
			next = now;
	}
	return 0;
}
