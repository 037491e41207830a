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

#ifdef __cplusplus
}
#endif

#endif
