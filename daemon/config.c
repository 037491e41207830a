// SPDX-License-Identifier: MIT
/* hybd's configuration: defaults, key = value files, flags (see config.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "hyb/manifest.h"
#include "load.h"
#include "log.h"

const char hybd_config_help[] =
	"config keys (file: one 'key = value' a line, '#' starts a comment line;\n"
	"flags: -o key=value; sizes take K, M, G, T = 1024-based units):\n"
	"  model = PATH             the GGUF model (or plan) to serve (required)\n"
	"  backend = auto|kmod|local  pools and queue: the module, or in-process (default auto)\n"
	"  name = hyb               instance name: pools are NAME.n<node>, NAME.manifest\n"
	"  nodes = all|0,1|0-3      NUMA nodes to place on (default all with memory)\n"
	"  placement = layer|interleave|explicit   policy (default layer)\n"
	"  place = PREFIX:NODE,...  explicit rules, longest prefix wins, '*' for the rest\n"
	"  split_experts = no       yes: every expert tensor split by rows across the\n"
	"                           nodes, each holding its rows of every expert\n"
	"                           (docs/NUMA.md; layer/interleave, 2-8 nodes)\n"
	"  pools_per_node = 1       weight pools per node\n"
	"  dram_budget = 0          bytes of weights kept resident; 0: the whole model\n"
	"  page_pool = 64M          per node, room for on-demand loads when over budget\n"
	"  queue = 0                reload queue to serve (0..15)\n"
	"  queue_depth = 32         reads in flight while streaming (1..256)\n"
	"  io_chunk = 1M            bytes per read (multiple of 4096, up to 64M)\n"
	"  chunk = 1M               reload chunk: a critical request waits at most one\n"
	"                           (two for uploads: the device lane keeps two in flight)\n"
	"  device = auto            copy device for UPLOAD/EVICT: cuda (GPU cache, shared\n"
	"                           with apps through CUDA IPC), cpu (host-memory slots),\n"
	"                           none, auto (cuda when a GPU opens, else cpu)\n"
	"  cuda_device = 0          CUDA device ordinal (device = cuda or auto)\n"
	"  gpu_slots = 64           cache slots of the device\n"
	"  gpu_cache = BYTES        cache size instead: gpu_slots = gpu_cache / slot_bytes\n"
	"  slot_bytes = auto        bytes per slot (auto: a plan's largest group, else 2M)\n"
	"  copy_bandwidth = 16G     cpu device: bytes per second (0: unpaced)\n"
	"  log_format = kv|json     structured log lines (default kv)\n"
	"  log_level = info         debug|info|warn|error\n"
	"  log_file = PATH          default: stderr (-f), STATE_DIR/NAME.log (daemon)\n"
	"  state_dir = DIR          manifest file, pid file, statistics\n"
	"  pid_file = PATH          default STATE_DIR/NAME.pid\n"
	"  progress = auto          load progress: auto|bar|lines|quiet\n"
	"  stats_interval = 10      seconds between statistics log lines (0: none); the\n"
	"                           statistics file STATE_DIR/NAME.stats is kept anyway\n"
	"  clients = any            who may ask for LOAD/UPLOAD/EVICT: any (whoever may\n"
	"                           open the device), or uid:N,gid:N,... (effective ids)\n";

void hybd_config_defaults(struct hybd_config *c)
{
	memset(c, 0, sizeof(*c));
	c->backend = HYB_BACKEND_AUTO;
	snprintf(c->name, sizeof(c->name), "hyb");
	c->nodes_all = true;
	c->place.policy = HYB_NUMA_PLACE_LAYER;
	c->place.pools_per_node = 1;
	c->place.page_pool = 64ull << 20;
	c->io_depth = 32;
	c->io_chunk = 1u << 20;
	c->chunk = 1u << 20;
	c->device = HYBD_DEV_AUTO;
	c->gpu_slots = 64;
	c->slot_bytes = 0;	/* auto: hybd_start sizes slots to the model */
	c->copy_bandwidth = 16ull << 30;
	c->log_format = HLOG_KV;
	c->log_level = HLOG_INFO;
	hyb_state_dir(c->state_dir, sizeof(c->state_dir));
	c->progress = HYBD_PROGRESS_AUTO;
	c->stats_interval = 10;
}

static const char *hybd_device_name(enum hybd_device d)
{
	static const char *const names[] = { "cpu", "none", "cuda", "auto" };

	return (unsigned int)d < 4 ? names[d] : "?";
}

static int hybd_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned int shift = 0;
	char *end;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	}
	if (shift && !strcmp(end, "iB"))
		end += 2;
	else if (!strcmp(end, "B"))
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_uint(const char *s, unsigned long long lo, unsigned long long hi,
		      unsigned long long *out)
{
	char *end;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end || *out < lo || *out > hi ? -1 : 0;
}

static int set_path(char *dst, size_t len, const char *key, const char *val, char *err,
		    size_t errlen)
{
	if (!*val)
		return hyb_errf(err, errlen, "%s: empty path", key);
	if (strlen(val) >= len)
		return hyb_errf(err, errlen, "%s: path longer than %zu bytes", key, len - 1);
	snprintf(dst, len, "%s", val);
	return 0;
}

static int uint_in(const char *key, const char *val, unsigned long long lo,
		   unsigned long long hi, unsigned long long *u, char *err, size_t errlen)
{
	if (parse_uint(val, lo, hi, u))
		return hyb_errf(err, errlen, "%s: '%s' is not a number in %llu..%llu", key, val, lo,
			    hi);
	return 0;
}

static int size_in(const char *key, const char *val, uint64_t lo, uint64_t hi, uint64_t mult,
		   uint64_t *sz, char *err, size_t errlen)
{
	if (hybd_parse_size(val, sz) || *sz < lo || *sz > hi || *sz % mult)
		return hyb_errf(err, errlen, "%s: '%s' is not a size in %llu..%llu%s", key, val,
			    (unsigned long long)lo, (unsigned long long)hi,
			    mult > 1 ? ", a multiple of 4096" : "");
	return 0;
}

/* The keys of NUMA placement (numa_place.h); 1 when key is not one of them. */
static int set_place_key(struct hybd_config *c, const char *key, const char *val, char *err,
			 size_t errlen)
{
	char why[256];

	if (!strcmp(key, "nodes")) {
		if (!strcmp(val, "all")) {
			c->nodes_all = true;
			c->place.n_nodes = 0;
			return 0;
		}
		if (hyb_numa_place_parse_nodes(&c->place, val, why, sizeof(why)))
			return hyb_errf(err, errlen, "nodes: %s", why);
		c->nodes_all = false;
		return 0;
	}
	if (!strcmp(key, "placement")) {
		if (hyb_numa_place_parse_policy(val, &c->place.policy))
			return hyb_errf(err, errlen, "placement: '%s' is not layer, interleave or "
				    "explicit", val);
		return 0;
	}
	if (!strcmp(key, "place")) {
		if (hyb_numa_place_parse_rules(&c->place, val, why, sizeof(why)))
			return hyb_errf(err, errlen, "place: %s", why);
		return 0;
	}
	if (!strcmp(key, "split_experts")) {
		if (!strcmp(val, "yes") || !strcmp(val, "true") || !strcmp(val, "1"))
			c->place.split_experts = true;
		else if (!strcmp(val, "no") || !strcmp(val, "false") || !strcmp(val, "0"))
			c->place.split_experts = false;
		else
			return hyb_errf(err, errlen, "split_experts: '%s' is not yes or no", val);
		return 0;
	}
	return 1;
}

/* The keys that name one of a few choices; 1 when key is not one of them. */
static int set_choice_key(struct hybd_config *c, const char *key, const char *val, char *err,
			  size_t errlen)
{
	static const char *const progress[] = { "auto", "bar", "lines", "quiet" };

	if (!strcmp(key, "backend")) {
		if (!strcmp(val, "auto"))
			c->backend = HYB_BACKEND_AUTO;
		else if (!strcmp(val, "kmod"))
			c->backend = HYB_BACKEND_KMOD;
		else if (!strcmp(val, "local"))
			c->backend = HYB_BACKEND_LOCAL;
		else
			return hyb_errf(err, errlen, "backend: '%s' is not auto, kmod or local", val);
		return 0;
	}
	if (!strcmp(key, "device")) {
		/* cuda is a valid choice in every build: hybd_start says when it cannot be had */
		for (int i = HYBD_DEV_CPU; i <= HYBD_DEV_AUTO; i++) {
			if (!strcmp(val, hybd_device_name((enum hybd_device)i))) {
				c->device = (enum hybd_device)i;
				return 0;
			}
		}
		return hyb_errf(err, errlen, "device: '%s' is not auto, cuda, cpu or none", val);
	}
	if (!strcmp(key, "log_format")) {
		if (hlog_parse_format(val, &c->log_format))
			return hyb_errf(err, errlen, "log_format: '%s' is not kv or json", val);
		return 0;
	}
	if (!strcmp(key, "log_level")) {
		if (hlog_parse_level(val, &c->log_level) || c->log_level == HLOG_OFF)
			return hyb_errf(err, errlen, "log_level: '%s' is not debug, info, warn or "
				    "error", val);
		return 0;
	}
	if (!strcmp(key, "progress")) {
		for (int i = 0; i < 4; i++) {
			if (!strcmp(val, progress[i])) {
				c->progress = (enum hybd_progress)i;
				return 0;
			}
		}
		return hyb_errf(err, errlen, "progress: '%s' is not auto, bar, lines or quiet", val);
	}
	return 1;
}

/* Numbers and sizes, each in its range; 1 when key is not one of them. */
static int set_number_key(struct hybd_config *c, const char *key, const char *val, char *err,
			  size_t errlen)
{
	unsigned long long u;
	uint64_t sz;

#define UINT_KEY(k, field, lo, hi)                                                    \
	if (!strcmp(key, k)) {                                                        \
		if (uint_in(key, val, lo, hi, &u, err, errlen))                       \
			return -1;                                                    \
		c->field = (__typeof__(c->field))u;                                   \
		return 0;                                                             \
	}
#define SIZE_KEY(k, field, lo, hi, mult)                                              \
	if (!strcmp(key, k)) {                                                        \
		if (size_in(key, val, lo, hi, mult, &sz, err, errlen))                \
			return -1;                                                    \
		c->field = (__typeof__(c->field))sz;                                  \
		return 0;                                                             \
	}
	UINT_KEY("pools_per_node", place.pools_per_node, 1, 16)
	SIZE_KEY("dram_budget", place.dram_budget, 0, UINT64_MAX, 1)
	SIZE_KEY("page_pool", place.page_pool, 0, 1ull << 40, 1)
	UINT_KEY("queue", queue, 0, HYB_RQ_MAX_QUEUES - 1)
	UINT_KEY("queue_depth", io_depth, 1, 256)
	SIZE_KEY("io_chunk", io_chunk, 4096, 64u << 20, 4096)
	SIZE_KEY("chunk", chunk, 4096, 1ull << 30, 4096)
	UINT_KEY("cuda_device", cuda_device, 0, 1023)
	UINT_KEY("gpu_slots", gpu_slots, 1, 1u << 20)
	SIZE_KEY("gpu_cache", gpu_cache, 0, 1ull << 40, 1)
	if (!strcmp(key, "slot_bytes") && !strcmp(val, "auto")) {
		c->slot_bytes = 0;
		return 0;
	}
	SIZE_KEY("slot_bytes", slot_bytes, 4096, 1ull << 34, 1)
	SIZE_KEY("copy_bandwidth", copy_bandwidth, 0, UINT64_MAX, 1)
	UINT_KEY("stats_interval", stats_interval, 0, 86400)
	return 1;
#undef UINT_KEY
#undef SIZE_KEY
}

/* clients = any | uid:N,gid:N,... */
static int set_clients(struct hybd_config *c, const char *val, char *err, size_t errlen)
{
	struct hyb_reload_clients cl = { 0 };
	const char *p = val;

	if (!strcmp(val, "any")) {
		c->clients = cl;
		return 0;
	}
	while (*p) {
		bool gid = !strncmp(p, "gid:", 4);
		unsigned long long id;
		char *end;

		if (!gid && strncmp(p, "uid:", 4))
			return hyb_errf(err, errlen, "clients: '%s': want any, or uid:N and gid:N "
					"separated by commas", val);
		if (cl.n == HYB_RELOAD_MAX_CLIENTS)
			return hyb_errf(err, errlen, "clients: more than %d ids",
					HYB_RELOAD_MAX_CLIENTS);
		errno = 0;
		id = strtoull(p + 4, &end, 10);
		if (end == p + 4 || errno || id >= UINT32_MAX || (*end && *end != ','))
			return hyb_errf(err, errlen, "clients: '%s': bad id after %.4s", val, p);
		cl.ids[cl.n].gid = gid;
		cl.ids[cl.n++].id = (uint32_t)id;
		if (*end == ',' && !end[1])
			return hyb_errf(err, errlen, "clients: empty entry after the last comma");
		p = *end ? end + 1 : end;
	}
	if (!cl.n)
		return hyb_errf(err, errlen, "clients: empty (any, or uid:N,gid:N,...)");
	c->clients = cl;
	return 0;
}

int hybd_config_set(struct hybd_config *c, const char *key, const char *val, char *err,
		    size_t errlen)
{
	int rc;

	if (!strcmp(key, "model"))
		return set_path(c->model, sizeof(c->model), key, val, err, errlen);
	if (!strcmp(key, "log_file"))
		return set_path(c->log_file, sizeof(c->log_file), key, val, err, errlen);
	if (!strcmp(key, "state_dir"))
		return set_path(c->state_dir, sizeof(c->state_dir), key, val, err, errlen);
	if (!strcmp(key, "pid_file"))
		return set_path(c->pid_file, sizeof(c->pid_file), key, val, err, errlen);
	if (!strcmp(key, "clients"))
		return set_clients(c, val, err, errlen);
	if (!strcmp(key, "name")) {
		if (!hyb_load_name_ok(val))
			return hyb_errf(err, errlen, "name: '%s' must be 1..%d of [A-Za-z0-9._-]", val,
				    HYB_LOAD_NAME_MAX);
		snprintf(c->name, sizeof(c->name), "%s", val);
		return 0;
	}
	if ((rc = set_place_key(c, key, val, err, errlen)) <= 0 ||
	    (rc = set_choice_key(c, key, val, err, errlen)) <= 0 ||
	    (rc = set_number_key(c, key, val, err, errlen)) <= 0)
		return rc;
	return hyb_errf(err, errlen, "unknown key '%s' (hybd --help lists the keys)", key);
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
		*--e = 0;
	return s;
}

int hybd_config_load(struct hybd_config *c, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *line = NULL, why[512];
	size_t cap = 0;
	ssize_t got;
	int lineno = 0, ret = 0;

	if (!f)
		return hyb_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
	while (!ret && (got = getline(&line, &cap, f)) >= 0) {
		char *s, *eq, *key, *val;
		size_t n;

		lineno++;
		if (got > 4096) {
			ret = hyb_errf(err, errlen, "%s:%d: line longer than 4096 bytes", path, lineno);
			break;
		}
		if (memchr(line, 0, (size_t)got)) {
			ret = hyb_errf(err, errlen, "%s:%d: NUL byte in the line (not a text file?)",
				   path, lineno);
			break;
		}
		s = trim(line);
		if (!*s || *s == '#')
			continue;
		eq = strchr(s, '=');
		if (!eq) {
			ret = hyb_errf(err, errlen, "%s:%d: expected 'key = value', found '%.60s'",
				   path, lineno, s);
			break;
		}
		*eq = 0;
		key = trim(s);
		val = trim(eq + 1);
		if (!*key) {
			ret = hyb_errf(err, errlen, "%s:%d: no key before '='", path, lineno);
			break;
		}
		/* "quoted" keeps leading/trailing spaces */
		n = strlen(val);
		if (n >= 2 && val[0] == '"' && val[n - 1] == '"') {
			val[n - 1] = 0;
			val++;
		}
		if (hybd_config_set(c, key, val, why, sizeof(why)))
			ret = hyb_errf(err, errlen, "%s:%d: %s", path, lineno, why);
	}
	if (!ret && ferror(f))
		ret = hyb_errf(err, errlen, "%s: read error", path);
	free(line);
	fclose(f);
	return ret;
}

int hybd_config_check(const struct hybd_config *c, char *err, size_t errlen)
{
	if (!c->model[0])
		return hyb_errf(err, errlen, "no model: set 'model = PATH' in the config file or "
			    "pass -m PATH");
	if (c->place.policy == HYB_NUMA_PLACE_EXPLICIT && !c->place.n_rules)
		return hyb_errf(err, errlen, "placement = explicit needs 'place = PREFIX:NODE, ...' "
			    "rules");
	if (c->place.policy != HYB_NUMA_PLACE_EXPLICIT && c->place.n_rules)
		return hyb_errf(err, errlen, "'place' rules are used by placement = explicit only "
			    "(placement is %s)", hyb_numa_place_policy_name(c->place.policy));
	if (c->place.split_experts) {
		struct hyb_numa_place_config pc = c->place;

		/* nodes = all is resolved at start, and its count checked by the placement */
		if (c->nodes_all)
			pc.n_nodes = 2;
		if (hyb_numa_place_check_split(&pc, err, errlen))
			return -1;
	}
	if (c->device != HYBD_DEV_NONE && (uint64_t)c->gpu_slots * c->slot_bytes > (1ull << 40))
		return hyb_errf(err, errlen, "gpu_slots * slot_bytes is over 1 TiB");
	return 0;
}

void hybd_config_print(const struct hybd_config *c, FILE *f)
{
	static const char *const backends[] = { "auto", "kmod", "local" };
	static const char *const progress[] = { "auto", "bar", "lines", "quiet" };
	static const char *const levels[] = { "debug", "info", "warn", "error", "off" };
	char slot[24] = "auto";

	if (c->slot_bytes)
		snprintf(slot, sizeof(slot), "%llu", (unsigned long long)c->slot_bytes);
	fprintf(f, "model = %s\nbackend = %s\nname = %s\n", c->model, backends[c->backend],
		c->name);
	if (c->nodes_all) {
		fprintf(f, "nodes = all\n");
	} else {
		fprintf(f, "nodes = ");
		for (unsigned int i = 0; i < c->place.n_nodes; i++)
			fprintf(f, "%s%d", i ? "," : "", c->place.nodes[i]);
		fputc('\n', f);
	}
	fprintf(f, "placement = %s\n", hyb_numa_place_policy_name(c->place.policy));
	if (c->place.n_rules) {
		fprintf(f, "place = ");
		for (unsigned int i = 0; i < c->place.n_rules; i++)
			fprintf(f, "%s%s:%d", i ? ", " : "", c->place.rules[i].prefix,
				c->place.rules[i].node);
		fputc('\n', f);
	}
	fprintf(f, "split_experts = %s\n", c->place.split_experts ? "yes" : "no");
	fprintf(f, "pools_per_node = %u\ndram_budget = %llu\npage_pool = %llu\nqueue = %u\n"
		"queue_depth = %u\nio_chunk = %u\nchunk = %llu\ndevice = %s\ncuda_device = %d\n"
		"gpu_slots = %u\ngpu_cache = %llu\n"
		"slot_bytes = %s\ncopy_bandwidth = %llu\nlog_format = %s\nlog_level = %s\n"
		"%slog_file = %s\nstate_dir = %s\n%spid_file = %s\nprogress = %s\n"
		"stats_interval = %u\n", c->place.pools_per_node,
		(unsigned long long)c->place.dram_budget, (unsigned long long)c->place.page_pool,
		c->queue, c->io_depth, c->io_chunk, (unsigned long long)c->chunk,
		hybd_device_name(c->device), c->cuda_device, c->gpu_slots,
		(unsigned long long)c->gpu_cache, slot,
		(unsigned long long)c->copy_bandwidth,
		c->log_format == HLOG_JSON ? "json" : "kv", levels[c->log_level],
		c->log_file[0] ? "" : "# (default) ", c->log_file[0] ? c->log_file : "-",
		c->state_dir, c->pid_file[0] ? "" : "# (default) ",
		c->pid_file[0] ? c->pid_file : "STATE_DIR/NAME.pid", progress[c->progress],
		c->stats_interval);
	fprintf(f, "clients = ");
	for (unsigned int i = 0; i < c->clients.n; i++)
		fprintf(f, "%s%s:%u", i ? "," : "", c->clients.ids[i].gid ? "gid" : "uid",
			c->clients.ids[i].id);
	fprintf(f, "%s\n", c->clients.n ? "" : "any");
}
