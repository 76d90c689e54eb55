/* Shared by the real workloads' mains: a clock and generated text. */
#ifndef VMPROF_WORKLOAD_COMMON_H
#define VMPROF_WORKLOAD_COMMON_H
#include <stddef.h>
#include <time.h>

static inline double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Whether to go on after `done` rounds: `seconds` 0 runs until stopped, a negative number runs that many
 * rounds (a fixed amount of work, to compare run times), a positive one runs until `end`. */
static inline int more(double seconds, double end, int done)
{
	if (seconds < 0)
		return done < -seconds;
	return seconds == 0 || now() < end;
}

/* `n` bytes of English-like text from a fixed word list and a linear congruential generator: compressible
 * like real text, the same bytes on every run. */
static inline void make_text(unsigned char *out, size_t n)
{
	static const char *words[] = {"the", "guest", "kernel", "serves", "system", "calls", "of", "a", "real",
		"program", "while", "vmprof", "samples", "every", "virtual", "cpu", "from", "host", "and", "steal",
		"time", "is", "measured", "by", "exit", "reason", "in", "each", "profile", "function", "share"};
	unsigned long x = 12345;
	size_t i = 0;
	while (i < n) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		const char *w = words[(x >> 33) % (sizeof words / sizeof *words)];
		while (*w && i < n)
			out[i++] = (unsigned char)*w++;
		if (i < n)
			out[i++] = (x >> 60) == 0 ? '\n' : ' ';
	}
}
#endif
