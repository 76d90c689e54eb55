/* Minimal runtime for vmprof demo guest programs.
 *
 * Demo guests run in 64-bit long mode at CPL 3 with no guest kernel.  They
 * talk to the demo VMM (vmprof_tui/demo/vmm.py) through "doorbell ports":
 * 32-bit stores to a page mapped at DOORBELL_VA that has no guest memory
 * behind it, so each store is an MMIO exit to the VMM.  (An `out` with
 * IOPL=3 raises #GP under PVM on these hosts, so port I/O is not used.)
 * Port numbers are part of the contract with the VMM (docs/demo.md).
 */
#ifndef VMPROF_GUEST_RT_H
#define VMPROF_GUEST_RT_H

#define PORT_EXIT     0x10  /* value: exit code; the process ends */
#define PORT_SLEEP_MS 0x11  /* value: milliseconds to sleep (the vCPU idles if nothing else runs) */
#define PORT_PROGRESS 0x12  /* value: units of work done since the last report */
#define PORT_SLEEP_US 0x13  /* value: microseconds to sleep */

#define DOORBELL_VA 0x7fe000000000UL  /* mapped to DOORBELL_GPA by the VMM */

#ifdef VMPROF_NATIVE
/* Built as a normal host program (tests compare native and guest speed). */
static volatile unsigned int native_doorbell[64];
static inline void port_out(unsigned int port, unsigned int value)
{
	native_doorbell[port & 63] = value;
}
#else
static inline void port_out(unsigned int port, unsigned int value)
{
	*(volatile unsigned int *)(DOORBELL_VA + port * 8UL) = value;
}
#endif

static inline unsigned long rdtsc(void)
{
	unsigned int lo, hi;
	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((unsigned long)hi << 32) | lo;
}

/* Entry: the VMM sets rdi, rsi, rdx, rcx to the program's four parameters and
 * rsp to the top of its stack.  main() returning ends the process. */
int main(unsigned long a, unsigned long b, unsigned long c, unsigned long d);

#ifndef VMPROF_NATIVE
__asm__(".text\n"
	".global _start\n"
	".type _start, @function\n"
	"_start:\n"
	"  and $-16, %rsp\n"
	"  call main\n"
	"  mov %eax, %edi\n"
	"  call guest_exit\n"
	"1: jmp 1b\n"
	".size _start, . - _start\n");

__attribute__((noinline, used)) void guest_exit(unsigned int code)
{
	port_out(PORT_EXIT, code);
	for (;;)
		;
}
#endif

/* Ask the VMM to put this process to sleep; the vCPU halts if nothing else runs. */
__attribute__((noinline)) void guest_sleep_ms(unsigned int ms)
{
	port_out(PORT_SLEEP_MS, ms);
}

__attribute__((noinline)) void guest_sleep_us(unsigned int us)
{
	port_out(PORT_SLEEP_US, us);
}

#endif
