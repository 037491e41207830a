/* SPDX-License-Identifier: MIT */
/* Setting the thread's last failure (hyb/error.h) from inside libhyb. */
#ifndef HYB_UTIL_ERROR_H
#define HYB_UTIL_ERROR_H

#include <stdarg.h>

#include "hyb/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Format the thread's message; returns rc (a negative errno) for `return
 * hyb_error_set(...)`. The arguments may include hyb_last_error(), to put
 * context around the message a failed call left:
 * `return hyb_error_set(rc, "%s: %s", path, hyb_last_error());`.
 */
int hyb_error_set(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int hyb_error_vset(int rc, const char *fmt, va_list ap);
/* Counts the messages set on this thread: a caller can tell whether a call explained itself. */
unsigned int hyb_error_count(void);
/* The rc the thread's last message was set with (0 before any). */
int hyb_error_rc(void);
/*
 * At a public call's boundary, over internal steps that write their reason
 * into a buffer and return -1 without an errno of their own: the errno of the
 * failure underneath - the rc of the last message set on this thread since
 * hyb_error_count() read `since` (a device fault, a read, a pool, out of
 * memory) - or fallback when nothing below set one (or only -EAGAIN, a retry).
 */
int hyb_error_cause(unsigned int since, int fallback);

#ifdef __cplusplus
}
#endif

#endif
