// SPDX-License-Identifier: MIT
/* Files written aside and renamed into place (util/file.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

int hyb_file_commit(const char *tmp, const char *path, int e)
{
	if (!e && rename(tmp, path))
		e = errno;
	if (!e)
		return 0;
	unlink(tmp);
	return hyb_error_set(-e, "%s: %s", path, strerror(e));
}
