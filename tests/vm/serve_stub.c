// SPDX-License-Identifier: MIT
/*
 * The VM bench links `hyb` statically for `hyb run --manifest`, and hyb
 * serve's HTTP library (libmicrohttpd, through GnuTLS and p11-kit) has no
 * complete static build on Debian. Nothing in the VM serves HTTP (hyb serve
 * is tested on the host), so the VM's hyb is linked without the serve
 * objects and this stands in for the command.
 */
#include <stdio.h>

int cmd_serve(int argc, char **argv);

int cmd_serve(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fputs("hyb: serve is not in the VM's static build\n", stderr);
	return 2;
}
