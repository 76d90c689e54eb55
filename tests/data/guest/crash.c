/* A static program that faults: a store to address 16 (exception 14) in user mode. */
int main(int argc, char **argv)
{
	(void)argv;
	*(volatile int *)(long)(argc * 16) = 1;
	return 0;
}
