/* clobber: one function breaks the frame-pointer chain (the rest keep it).
 *
 * Per round: _start → main → intact runs 1 unit with a correct chain;
 * _start → main → clobbered runs 1 unit with %rbp pointing at a decoy frame
 * whose "return addresses" are no code at all.  A profiler must mark
 * clobbered's stacks partial and invent no caller for it.
 * Parameters: a = units (0: 50), b = rounds (0: forever).
 */
#include "stack_rt.h"

NOINLINE unsigned long intact(unsigned long x, unsigned long units)
{
	WORK(x, units);
	return x;
}

/* clobbered(x, units): the loop of WORK, written in assembly because the compiler never lets C
 * code repoint %rbp.  It points %rbp at a decoy frame it builds on its own stack: a chain that
 * climbs as a real one does ({next frame, return address} pairs) but whose "return addresses"
 * 0xdead0000beef and 0x5a5a5a5a5a5a are no code at all. */
unsigned long clobbered(unsigned long x, unsigned long units);
__asm__(".text\n"
	".global clobbered\n"
	".type clobbered, @function\n"
	"clobbered:\n"
	"  push %rbp\n"
	"  sub $32, %rsp\n"
	"  mov %rsp, %rbp\n"
	"  lea 16(%rsp), %rax\n"
	"  mov %rax, (%rsp)\n"
	"  movabs $0xdead0000beef, %rax\n"
	"  mov %rax, 8(%rsp)\n"
	"  movq $0, 16(%rsp)\n"
	"  movabs $0x5a5a5a5a5a5a, %rax\n"
	"  mov %rax, 24(%rsp)\n"
	"  imul $20000, %rsi, %rcx\n"
	"  mov %rdi, %rax\n"
	"  movabs $6364136223846793005, %rdx\n"
	"  movabs $1442695040888963407, %r8\n"
	"  test %rcx, %rcx\n"
	"  jz 2f\n"
	"1: imul %rdx, %rax\n"
	"  add %r8, %rax\n"
	"  dec %rcx\n"
	"  jnz 1b\n"
	"2: add $32, %rsp\n"
	"  pop %rbp\n"
	"  ret\n"
	".size clobbered, . - clobbered\n");

INLINE unsigned long clobber_round(unsigned long x, unsigned long units)
{
	return clobbered(intact(x, units), units);
}

STACK_PROGRAM_MAIN(clobber_round)
