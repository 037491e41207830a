// SPDX-License-Identifier: MIT
/* What hybctl pools, stalls and numa share: picking the backend, JSON and units. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hybctl.h"

int ctl_parse_backend(const char *cmd, const char *s, enum hyb_backend_kind *kind)
{
	if (!strcmp(s, "kmod"))
		*kind = HYB_BACKEND_KMOD;
	else if (!strcmp(s, "local"))
		*kind = HYB_BACKEND_LOCAL;
	else
		return fprintf(stderr, "hybctl %s: --backend '%s': use kmod or local\n", cmd, s),
		       -1;
	return 0;
}

/*
 * The module unless --backend local. Without the module the answer is one
 * line: embedded processes keep their pools to themselves, so there is
 * nothing another process could show.
 */
struct hyb_backend *ctl_backend(const char *cmd, enum hyb_backend_kind kind, bool quiet)
{
	struct hyb_backend *b;
	const char *err;

	if (kind == HYB_BACKEND_AUTO)
		kind = HYB_BACKEND_KMOD;
	b = hyb_backend_open(kind);
	err = hyb_last_error();
	if (!b && !quiet) {
		if (strstr(err, "not loaded"))
			fprintf(stderr, "hybctl %s: %s (embedded mode has no shared %s to show)\n",
				cmd, err, strcmp(cmd, "stalls") ? "pools" : "queues");
		else
			fprintf(stderr, "hybctl %s: %s\n", cmd, err);
	}
	return b;
}

void ctl_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

void ctl_bytes(char *buf, size_t len, uint64_t b)
{
	if (b >= (10ULL << 30))
		snprintf(buf, len, "%.0f GiB", b / 1073741824.0);
	else if (b >= (1ULL << 30))
		snprintf(buf, len, "%.1f GiB", b / 1073741824.0);
	else
		snprintf(buf, len, "%.0f MiB", b / 1048576.0);
}

void ctl_ns(char *buf, size_t len, uint64_t ns)
{
	if (ns >= 1000000000ULL)
		snprintf(buf, len, "%.2f s", ns / 1e9);
	else if (ns >= 1000000ULL)
		snprintf(buf, len, "%.2f ms", ns / 1e6);
	else
		snprintf(buf, len, "%.1f us", ns / 1e3);
}

void ctl_pool_flags(char *buf, size_t len, uint32_t flags)
{
	static const struct {
		uint32_t bit;
		const char *name;
	} names[] = {
		{ HYB_MEMPOOL_F_KERNEL, "kernel" }, { HYB_MEMPOOL_F_HUGETLB, "hugetlb" },
		{ HYB_MEMPOOL_F_THP, "thp" }, { HYB_MEMPOOL_F_LOCKED, "locked" },
		{ HYB_MEMPOOL_F_SHARED, "shared" },
	};
	size_t n = 0;

	buf[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!(flags & names[i].bit))
			continue;
		n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? "," : "",
				      names[i].name);
	}
	if (!n)
		snprintf(buf, len, "4k");
}

void ctl_json_flags(FILE *f, uint32_t flags)
{
	char buf[96], *tok, *save = NULL;
	int first = 1;

	ctl_pool_flags(buf, sizeof(buf), flags);
	fputc('[', f);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		fprintf(f, "%s\"%s\"", first ? "" : ", ", tok);
		first = 0;
	}
	fputc(']', f);
}
