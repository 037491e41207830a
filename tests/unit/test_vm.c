// SPDX-License-Identifier: MIT
/*
 * The kernel module's tests run in a QEMU virtual machine (tests/vm/run.sh:
 * builds hybpool.ko against the Debian kernel headers, boots that kernel
 * with two NUMA nodes, runs hybtest and hybfuzz inside, checks dmesg). This
 * test drives it from the C runner so `make test` covers the module; it is
 * skipped only when qemu cannot start a machine at all on this host (the
 * script exits 77 then) or when HYB_SKIP_VM=1 asks for it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

TEST(vm_hybpool)
{
	const char *skip = getenv("HYB_SKIP_VM");
	int st, rc;

	if (skip && !strcmp(skip, "1"))
		SKIP("HYB_SKIP_VM=1: VM bench for hybpool.ko not run");
	if (access("tests/vm/run.sh", R_OK))
		SKIP("tests/vm/run.sh not found: run the tests from the repository root");
	fflush(NULL);
	st = system("bash tests/vm/run.sh");
	CHECK_MSG(st != -1 && WIFEXITED(st), "could not run tests/vm/run.sh (status %d)", st);
	rc = WEXITSTATUS(st);
	if (rc == 77)
		SKIP("virtualization is impossible here (qemu cannot start a machine)");
	CHECK_MSG(rc == 0, "VM bench failed (exit %d); console log: build/vm/console.txt", rc);
}
