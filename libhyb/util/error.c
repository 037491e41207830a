// SPDX-License-Identifier: MIT
/* The thread's last failure (hyb/error.h). */
#include <stdio.h>

#include "util/error.h"

static _Thread_local char msg[1024];
static _Thread_local unsigned int count;

const char *hyb_last_error(void)
{
	return msg;
}

int hyb_error_vset(int rc, const char *fmt, va_list ap)
{
	vsnprintf(msg, sizeof(msg), fmt, ap);
	count++;
	return rc;
}

int hyb_error_set(int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	hyb_error_vset(rc, fmt, ap);
	va_end(ap);
	return rc;
}

unsigned int hyb_error_count(void)
{
	return count;
}
