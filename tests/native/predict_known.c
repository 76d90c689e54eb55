/* A program whose system calls and page faults are known exactly, for tests/test_predict.py.
 *
 *   predict_known N PAGES FORKS WRITES
 *
 * N getppid calls; PAGES fresh anonymous pages written once each (huge pages refused, so one
 * minor fault per page); WRITES pwrite64 calls of 1000 bytes each to /dev/null; FORKS children,
 * each making one getppid call and exiting, each waited for.  Every counted call goes through
 * syscall(2), never through a libc wrapper that might cache or batch.  Prints the minor faults
 * the kernel accounted to the page touching alone (getrusage before and after). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char buf[1000];

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: predict_known N PAGES FORKS WRITES\n");
		return 2;
	}
	long n = atol(argv[1]), pages = atol(argv[2]), forks = atol(argv[3]), writes = atol(argv[4]);
	long page = sysconf(_SC_PAGESIZE);

	for (long i = 0; i < n; i++)
		syscall(SYS_getppid);

	size_t len = (size_t)(pages ? pages : 1) * page;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 3;
	madvise(p, len, MADV_NOHUGEPAGE);
	struct rusage before, after;
	getrusage(RUSAGE_SELF, &before);
	for (long i = 0; i < pages; i++)
		p[i * page] = 1;
	getrusage(RUSAGE_SELF, &after);

	int fd = open("/dev/null", O_WRONLY);
	for (long i = 0; i < writes; i++)
		if (syscall(SYS_pwrite64, fd, buf, sizeof(buf), 0) != sizeof(buf))
			return 4;

	for (long i = 0; i < forks; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			syscall(SYS_getppid);
			_exit(0);
		}
		if (pid < 0 || waitpid(pid, NULL, 0) != pid)
			return 5;
	}
	printf("touch_faults %ld\n", after.ru_minflt - before.ru_minflt);
	return 0;
}
