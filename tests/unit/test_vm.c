// SPDX-License-Identifier: MIT
/*
 * The kernel module's tests run in a QEMU virtual machine (tests/vm/run.sh:
 * builds hybpool.ko against the Debian kernel headers, boots that kernel
 * with two NUMA nodes, runs hybtest and hybfuzz inside, checks dmesg). This
 * test drives it from the C runner so `make test` covers the module, on
 * every kernel run.sh --kernels lists (Debian 12's 6.1 and 6.12); it is
 * skipped only when qemu cannot start a machine at all on this host (the
 * script exits 77 then) or when HYB_SKIP_VM=1 asks for it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

/* run.sh on one kernel (NULL: its own pick, the newest); its exit status */
static int run_vm(const char *kver, const char *out)
{
	char cmd[512];
	int st;

	if (kver)
		snprintf(cmd, sizeof(cmd), "HYB_VM_KVER='%s' HYB_VM_OUT='%s' bash tests/vm/run.sh",
			 kver, out);
	else
		snprintf(cmd, sizeof(cmd), "bash tests/vm/run.sh");
	fflush(NULL);
	st = system(cmd);
	CHECK_MSG(st != -1 && WIFEXITED(st), "could not run tests/vm/run.sh (status %d)", st);
	return WEXITSTATUS(st);
}

TEST(vm_hybpool)
{
	const char *skip = getenv("HYB_SKIP_VM");
	char kver[8][128], out[256];
	int rc, n = 0;
	FILE *f;

	if (skip && !strcmp(skip, "1"))
		SKIP("HYB_SKIP_VM=1: VM bench for hybpool.ko not run");
	if (access("tests/vm/run.sh", R_OK))
		SKIP("tests/vm/run.sh not found: run the tests from the repository root");
	/* every kernel with an image and headers (run.sh installs 6.1 and 6.12), newest first */
	fflush(NULL);
	f = popen("bash tests/vm/run.sh --kernels", "r");
	CHECK(f);
	while (n < 8 && fgets(kver[n], sizeof(kver[n]), f)) {
		kver[n][strcspn(kver[n], "\n")] = 0;
		if (kver[n][0] && strspn(kver[n], "0123456789abcdefghijklmnopqrstuvwxyz.+-_") ==
				      strlen(kver[n]))
			n++;
	}
	rc = pclose(f);
	if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77)
		SKIP("virtualization is impossible here (qemu cannot start a machine)");
	CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && n > 0,
		  "tests/vm/run.sh --kernels found no kernel image + headers pair (exit %d)",
		  WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
	for (int i = 0; i < n; i++) {
		/* the newest in build/vm (console.txt there), the others beside it */
		snprintf(out, sizeof(out), "build/vm%s%s", i ? "-" : "", i ? kver[i] : "");
		rc = run_vm(kver[i], out);
		if (rc == 77)
			SKIP("virtualization is impossible here (qemu cannot start a machine)");
		CHECK_MSG(rc == 0, "VM bench on %s failed (exit %d); console log: %s/console.txt",
			  kver[i], rc, out);
		printf("    hybpool.ko passed the VM bench on %s\n", kver[i]);
	}
}
