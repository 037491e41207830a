// SPDX-License-Identifier: MIT
/* hybctl plan: being written (issue 5). */
#include <stdio.h>

#include "hybctl.h"

int cmd_plan(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fputs("hybctl plan: not built yet\n", stderr);
	return 1;
}
