/* A syscall-heavy static program for the guest-kernel tests: for the given seconds, writes and reads back
 * 4 KiB blocks of a file in its directory (pwrite64, pread64) with a little compute between calls. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static unsigned long checksum(const unsigned char *p, int n)
{
	unsigned long h = 1469598103934665603UL;
	for (int r = 0; r < 8; r++)
		for (int i = 0; i < n; i++)
			h = (h ^ p[i]) * 1099511628211UL;
	return h;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 1.0;
	int fd = open("/blocks.bin", O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		perror("open /blocks.bin");
		return 1;
	}
	static unsigned char block[4096];
	unsigned long h = 0, calls = 0;
	double end = now() + seconds;
	for (long i = 0; now() < end; i++) {
		memset(block, (int)i, sizeof block);
		if (pwrite(fd, block, sizeof block, (i % 64) * 4096) != sizeof block ||
		    pread(fd, block, sizeof block, (i % 64) * 4096) != sizeof block) {
			perror("pwrite/pread");
			return 1;
		}
		h ^= checksum(block, sizeof block);
		calls += 3;
	}
	close(fd);
	printf("syscall_heavy: %lu calls, checksum %lx\n", calls, h);
	return 0;
}
