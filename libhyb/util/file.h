/* SPDX-License-Identifier: MIT */
/* Files written aside and renamed into place, so readers see the old or the whole new one. */
#ifndef HYB_UTIL_FILE_H
#define HYB_UTIL_FILE_H

/*
 * The last step of such a write: tmp is complete (e: 0, or the errno its
 * writing met), rename it over path. 0, or -errno with tmp removed and the
 * reason in hyb_last_error().
 */
int hyb_file_commit(const char *tmp, const char *path, int e);

#endif
