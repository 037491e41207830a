// SPDX-License-Identifier: MIT
/* hybctl profile: being written (issue 5). */
#include <stdio.h>

#include "hybctl.h"

int cmd_profile(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fputs("hybctl profile: not built yet\n", stderr);
	return 1;
}
