// SPDX-License-Identifier: MIT
/* The thread's last failure (hyb/error.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"

static _Thread_local char msg[1024];
static _Thread_local unsigned int count;
static _Thread_local int last_rc;

const char *hyb_last_error(void)
{
	return msg;
}

int hyb_error_vset(int rc, const char *fmt, va_list ap)
{
	char buf[sizeof(msg)];

	/* through a copy: the arguments may include hyb_last_error() itself */
	vsnprintf(buf, sizeof(buf), fmt, ap);
	memcpy(msg, buf, sizeof(msg));
	count++;
	last_rc = rc;
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

int hyb_error_rc(void)
{
	return last_rc;
}

int hyb_error_cause(unsigned int since, int fallback)
{
	/* -EAGAIN asks for a retry (an event not done yet): it explains no failure */
	return count != since && last_rc < 0 && last_rc != -EAGAIN ? last_rc : fallback;
}
