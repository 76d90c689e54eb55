/* _start of the freestanding host programs that are single-stepped (programs/lbr_demo.c, and
 * tests/native/lbr_workload.c): call main, exit with its value; no libc, so every instruction
 * the process runs is the program's own. */
__asm__(".text\n"
	".globl _start\n"
	".type _start, @function\n"
	"_start:\n"
	"	xor %ebp, %ebp\n"
	"	call main\n"
	"	mov %eax, %edi\n"
	"	mov $60, %eax\n"
	"	syscall\n"
	"	hlt\n"
	".size _start, . - _start\n");
