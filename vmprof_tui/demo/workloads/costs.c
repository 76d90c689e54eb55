/* costs: the cost loops of `vmprof predict costs` as a static program, so that they run inside a demo VM on
 * the demo guest kernel (`vmprof predict costs --vm`) as on any machine.  Every cost is the wall time of one
 * operation, in chunks long enough that a neighbour's share of the pCPU shows up in it; the clock is
 * clock_gettime, which the guest kernel hands to the VMM, so a chunk is at least a few milliseconds.
 * Arguments: repetitions, milliseconds per repetition, [the one cost to measure, or "probe": the two loops].
 * memory_loop is seconds per load of a pointer chase, fcntl an F_SETLK (lock or unlock) of a file.
 * Prints per cost "cost NAME s/op ..." (wall time, one value per repetition) and "cpu NAME s/op ..." (the
 * thread's CPU time: without steal), and "unsupported NAME why"
 * for what the guest kernel has no call for; one line on stderr and status 1 when a call fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common.h"

#define FILE_BYTES (8L << 20)
#define PAGE 4096L
#define FAULT_PAGES 256L

static double min_time;
static char buf[65536];
static int read_fd = -1, write_fd = -1, map_fd = -1;

static void fail(const char *what)
{
	fprintf(stderr, "costs: %s failed: %s\n", what, strerror(errno));
	exit(1);
}

/* The same 4-instruction dependent chain as predict_costs.SNIPPETS_ASM's compute_loop. */
static double compute(long n)
{
	double t0 = now();
	long a = 0, d = 1;
	__asm__ volatile("1: add %1, %0\n\txor %0, %1\n\tsub $1, %2\n\tjnz 1b" : "+r"(a), "+r"(d), "+r"(n));
	return now() - t0;
}

static double null_call(long n)
{
	double t0 = now();
	for (long i = 0; i < n; i++) {
		long r = 110; /* getppid */
		__asm__ volatile("syscall" : "+a"(r) : : "rcx", "r11", "memory");
	}
	return now() - t0;
}

static double open_close(long n)
{
	double t0 = now();
	for (long i = 0; i < n; i++) {
		int fd = openat(AT_FDCWD, "open-me", O_RDONLY);
		if (fd < 0)
			fail("openat");
		close(fd);
	}
	return now() - t0;
}

static double read_size(long n, long size)
{
	double t0 = now();
	long off = 0;
	for (long i = 0; i < n; i++) {
		if (pread(read_fd, buf, size, off) != size)
			fail("pread64");
		off = off + size >= FILE_BYTES ? 0 : off + size;
	}
	return now() - t0;
}

static double read_4k(long n) { return read_size(n, 4096); }
static double read_64k(long n) { return read_size(n, 65536); }

/* A written page's life, as natively: appended to an empty file, released by ftruncate. */
static double write_size(long n, long size)
{
	double t0 = now();
	long off = 0;
	for (long i = 0; i < n; i++) {
		if (pwrite(write_fd, buf, size, off) != size)
			fail("pwrite64");
		off += size;
		if (off >= FILE_BYTES) {
			if (ftruncate(write_fd, 0))
				fail("ftruncate");
			off = 0;
		}
	}
	if (ftruncate(write_fd, 0))
		fail("ftruncate");
	return now() - t0;
}

static double write_4k(long n) { return write_size(n, 4096); }
static double write_64k(long n) { return write_size(n, 65536); }

static double stat_path(long n)
{
	struct stat st;
	double t0 = now();
	for (long i = 0; i < n; i++)
		if (stat("open-me", &st))
			fail("stat");
	return now() - t0;
}

/* A 4 KiB overwrite made durable, as a database's journal and pages are. */
static double write_sync(long n)
{
	double t0 = now();
	for (long i = 0; i < n; i++)
		if (pwrite(write_fd, buf, 4096, 0) != 4096 || fdatasync(write_fd))
			fail("pwrite64 + fdatasync");
	return now() - t0;
}

/* A lock taken and released on a file, as a database does around its reads and writes (F_SETLK). */
static double fcntl_lock(long n)
{
	struct flock fl = {.l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
	double t0 = now();
	for (long i = 0; i < n; i++) {
		fl.l_type = i & 1 ? F_UNLCK : F_WRLCK;
		if (fcntl(write_fd, F_SETLK, &fl))
			fail("fcntl F_SETLK");
	}
	return now() - t0;
}

/* The same pointer chase as predict_costs' memory loop: dependent loads through a random cycle of the cache
 * lines of MEMORY_BYTES, which is larger than a core's L2 and smaller than the L3, so each load misses the
 * nearer caches and the TLB and whatever evicts caches or walks page tables more slowly shows in it. */
#define MEMORY_BYTES (4L << 20)
#define LINE 64L
static char *chain;
static double memory(long n)
{
	double t0 = now();
	char *p = chain;
	for (long i = 0; i < n; i++)
		p = *(char **)p;
	__asm__ volatile("" : : "r"(p));
	return now() - t0;
}

static void make_chain(void)
{
	long lines = MEMORY_BYTES / LINE;
	long *order = malloc(lines * sizeof *order);
	chain = mmap(NULL, MEMORY_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!order || chain == MAP_FAILED)
		fail("memory for the memory loop");
	unsigned long x = 88172645463325252UL;
	for (long i = 0; i < lines; i++)
		order[i] = i;
	for (long i = lines - 1; i > 0; i--) { /* Sattolo: one cycle through every line */
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		long j = (long)(x % (unsigned long)i), t = order[i];
		order[i] = order[j], order[j] = t;
	}
	for (long i = 0; i < lines; i++)
		*(char **)(chain + order[i] * LINE) = chain + order[(i + 1) % lines] * LINE;
	free(order);
}

static double mmap_munmap(long n)
{
	double t0 = now();
	for (long i = 0; i < n; i++) {
		void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			fail("mmap");
		munmap(p, 65536);
	}
	return now() - t0;
}

/* What a native minor fault becomes here: a fresh page of guest memory mapped at mmap (the guest kernel maps
 * eagerly) and first written, which the host backs and KVM maps at that first touch.  The pages stay mapped:
 * the guest kernel would give an unmapped range's pages back at the next mmap there, no longer fresh.  So this
 * cost is measured on a fixed budget of guest memory (FRESH_PAGES per repetition), not for min_time. */
#define FRESH_PAGES 2048L
static double minor_fault(long n)
{
	double t0 = now();
	for (long done = 0; done < n; done += FAULT_PAGES) {
		volatile char *p = mmap(NULL, FAULT_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
					-1, 0);
		if (p == MAP_FAILED)
			fail("mmap");
		for (long i = 0; i < FAULT_PAGES; i++)
			p[i * PAGE] = 1;
	}
	return now() - t0;
}

/* A file page mapped and read: the guest kernel reads the whole mapping at mmap (no page cache to fault
 * from), which is what a native major fault becomes here. */
static double major_fault(long n)
{
	double t0 = now();
	long sum = 0;
	for (long done = 0; done < n; done += FAULT_PAGES) {
		volatile char *p = mmap(NULL, FAULT_PAGES * PAGE, PROT_READ, MAP_PRIVATE, map_fd, 0);
		if (p == MAP_FAILED)
			fail("mmap of a file");
		for (long i = 0; i < FAULT_PAGES; i++)
			sum += p[i * PAGE];
		munmap((void *)p, FAULT_PAGES * PAGE);
	}
	(void)sum;
	return now() - t0;
}

static long calibrate(double (*run)(long), long start)
{
	long n = start;
	for (;;) {
		double dt = run(n);
		if (dt >= min_time / 16 || n >= 1L << 40)
			return (long)(n * (min_time / 4) / (dt > 1e-9 ? dt : 1e-9)) + 1;
		n *= 4;
	}
}

/* The CPU time of the thread running this program: under the demo guest kernel the VMM answers with its vCPU
 * thread's, which is the wall time less the steal (the thread's wait for its pCPU). */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One line of wall seconds per operation and one of CPU seconds, a value per repetition. */
static void measure(const char *name, double (*run)(long), int repeat, long start)
{
	double wall[64], cpu[64];
	int fresh = run == minor_fault; /* fresh memory: a fixed number of pages per repetition */
	long n = fresh ? FRESH_PAGES : calibrate(run, start);
	if (repeat > 64)
		repeat = 64;
	for (int r = 0; r < repeat; r++) {
		double total = 0, c0 = cpu_now();
		long ops = 0;
		while (ops == 0 || (!fresh && total < min_time)) {
			total += run(n);
			ops += n;
		}
		wall[r] = total / ops;
		cpu[r] = (cpu_now() - c0) / ops;
	}
	printf("cost %s", name);
	for (int r = 0; r < repeat; r++)
		printf(" %.6e", wall[r]);
	printf("\ncpu %s", name);
	for (int r = 0; r < repeat; r++)
		printf(" %.6e", cpu[r]);
	printf("\n");
	fflush(stdout);
}

static int make_file(const char *path, long bytes)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		fail(path);
	memset(buf, 'x', sizeof buf);
	for (long off = 0; off < bytes; off += sizeof buf)
		if (write(fd, buf, sizeof buf) != (long)sizeof buf)
			fail("write");
	return fd;
}

int main(int argc, char **argv)
{
	int repeat = argc > 1 ? atoi(argv[1]) : 5;
	min_time = (argc > 2 ? atof(argv[2]) : 300) / 1000;
	const char *only = argc > 3 ? argv[3] : NULL;
	int probe = only && strcmp(only, "probe") == 0; /* the two loops alone: the target's state just before a run */
	if (repeat < 1 || repeat > 64 || min_time <= 0) {
		fprintf(stderr, "costs: repetitions (1-64) and milliseconds must be positive\n");
		return 2;
	}
	static const struct {
		const char *name;
		double (*run)(long);
		long start;
	} loops[] = {{"compute_loop", compute, 1024}, {"memory_loop", memory, 1024}, {"null_syscall", null_call, 4},
		     {"open_close", open_close, 4},
		     {"read_4k", read_4k, 4}, {"read_64k", read_64k, 4}, {"write_4k", write_4k, 4},
		     {"write_64k", write_64k, 4}, {"mmap_munmap", mmap_munmap, 4},
		     {"minor_fault", minor_fault, FAULT_PAGES}, {"major_fault", major_fault, FAULT_PAGES},
		     {"stat", stat_path, 4}, {"fcntl", fcntl_lock, 4}, {"write_sync", write_sync, 1}};
	if (!only || probe || strcmp(only, "memory_loop") == 0)
		make_chain();
	if (!only || (!probe && strcmp(only, "compute_loop") != 0 && strcmp(only, "memory_loop") != 0)) {
		close(make_file("open-me", 1));
		read_fd = make_file("read-me", FILE_BYTES);
		write_fd = open("write-me", O_WRONLY | O_CREAT | O_TRUNC, 0600);
		map_fd = make_file("map-me", FAULT_PAGES * PAGE);
		if (write_fd < 0)
			fail("write-me");
	}
	for (size_t i = 0; i < sizeof loops / sizeof *loops; i++)
		if (!only || strcmp(only, loops[i].name) == 0 || (probe && i < 2))
			measure(loops[i].name, loops[i].run, repeat, loops[i].start);
	if (!only) {
		printf("unsupported fork_exit the guest kernel has no fork: one program per vCPU\n");
		printf("unsupported fork_exec_exit the guest kernel has no fork or exec\n");
		printf("unsupported context_switch one process per vCPU: no other process to switch to\n");
		unlink("open-me");
		unlink("read-me");
		unlink("write-me");
		unlink("map-me");
	}
	return 0;
}
