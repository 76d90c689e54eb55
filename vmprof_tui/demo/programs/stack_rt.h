/* Shared by the call-stack demo programs (chain, recurse, clobber): one unit of
 * work is the same loop body everywhere, so the time a function takes is
 * proportional to the units it runs, and the time split over call chains is
 * known by construction.  These programs are built with frame pointers. */
#ifndef VMPROF_STACK_RT_H
#define VMPROF_STACK_RT_H

#include "guest_rt.h"

#define UNIT_ITERS 20000UL  /* about 20 us of work on these hosts */

/* Inlined into each leaf so that samples fall inside the leaf itself.  gcc 12 omits the frame of a
 * leaf function even with -mno-omit-leaf-frame-pointer; taking the frame address forces one. */
#define WORK(x, units)                                                            \
	do {                                                                      \
		__asm__ volatile("" : : "r"(__builtin_frame_address(0)));         \
		for (unsigned long _i = 0; _i < (units) * UNIT_ITERS; _i++) {     \
			(x) = (x) * 6364136223846793005UL + 1442695040888963407UL; \
			__asm__ volatile("" : "+r"(x));                            \
		}                                                                 \
	} while (0)

#define NOINLINE __attribute__((noinline))

#endif
