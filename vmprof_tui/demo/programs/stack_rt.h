/* Shared by the call-stack demo programs (chain, recurse, clobber): one unit of
 * work is the same loop body everywhere, so the time a function takes is
 * proportional to the units it runs, and the time split over call chains is
 * known by construction.  These programs are built with frame pointers, and again without them
 * (-DVMPROF_NO_FRAME_POINTERS -fomit-frame-pointer: the `-nofp` programs, unwound by call-frame information). */
#ifndef VMPROF_STACK_RT_H
#define VMPROF_STACK_RT_H

#include "guest_rt.h"

#define UNIT_ITERS 20000UL  /* about 20 us of work on these hosts */

/* Inlined into each leaf so that samples fall inside the leaf itself.  gcc 12 omits the frame of a
 * leaf function even with -mno-omit-leaf-frame-pointer; taking the frame address forces one. */
#ifdef VMPROF_NO_FRAME_POINTERS
#define FORCE_FRAME() do { } while (0)
#else
#define FORCE_FRAME() __asm__ volatile("" : : "r"(__builtin_frame_address(0)))
#endif
#define WORK(x, units)                                                            \
	do {                                                                      \
		FORCE_FRAME();                                                    \
		for (unsigned long _i = 0; _i < (units) * UNIT_ITERS; _i++) {     \
			(x) = (x) * 6364136223846793005UL + 1442695040888963407UL; \
			__asm__ volatile("" : "+r"(x));                            \
		}                                                                 \
	} while (0)

#define NOINLINE __attribute__((noinline))
#define INLINE static inline __attribute__((always_inline))

static unsigned long sink;

/* main(units, rounds): runs ROUND(x, units) `rounds` times (0: forever), units defaulting to 50, and
 * reports one unit of progress per round.  ROUND must be inlined (INLINE), so that main calls the
 * program's functions itself and the chains start _start → main. */
#define STACK_PROGRAM_MAIN(ROUND)                                                          \
	int main(unsigned long units, unsigned long rounds, unsigned long c, unsigned long d) \
	{                                                                                  \
		(void)c; (void)d;                                                          \
		unsigned long x = 12345;                                                   \
		for (unsigned long r = 0; rounds == 0 || r < rounds; r++) {                \
			x = ROUND(x, units ? units : 50);                                  \
			port_out(PORT_PROGRESS, 1);                                        \
		}                                                                          \
		sink = x;                                                                  \
		return 0;                                                                  \
	}

#endif
