/* SPDX-License-Identifier: MIT */
/*
 * The message of a failure. A call that fails returns a negative errno (or
 * NULL) and leaves one line naming the problem, which hyb_last_error()
 * returns on the same thread until the next failing call there. docs/API.md
 * says which calls follow this convention today.
 */
#ifndef HYB_ERROR_H
#define HYB_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* The calling thread's last failure, "" before any. Never NULL. */
const char *hyb_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
