// SPDX-License-Identifier: MIT
/*
 * SIGBUS on a guarded file mapping: say what could not be read, then exit
 * (map_guard.h says why exiting is the only honest way out of a fault).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "map_guard.h"

struct guard_slot {
	atomic_int used;             /* claimed by an add */
	atomic_uintptr_t base;       /* 0 while the slot is not (yet, any more) guarding */
	uint64_t len;
	_Atomic(const struct hyb_gguf_file *) g;
	char path[256];
};

static struct guard_slot slots[HYB_MAP_GUARD_SLOTS];
static struct sigaction previous;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static bool installed;

/* ---- async-signal-safe output -------------------------------------------- */

struct line {
	char buf[1024];
	size_t n;
};

static void put(struct line *l, const char *s, size_t n)
{
	if (n > sizeof(l->buf) - l->n)
		n = sizeof(l->buf) - l->n;
	memcpy(l->buf + l->n, s, n);
	l->n += n;
}

static void puts_(struct line *l, const char *s)
{
	put(l, s, strlen(s));
}

static void putu(struct line *l, uint64_t v)
{
	char d[24];
	int i = (int)sizeof(d);

	do {
		d[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	put(l, d + i, sizeof(d) - (size_t)i);
}

/* Where in g byte off of the file lies: the header, a tensor, or between tensors. */
static void put_place(struct line *l, const struct hyb_gguf_file *g, uintptr_t addr, uint64_t off)
{
	if (!g) {
		puts_(l, "while reading its header");
		return;
	}
	if (off < g->data_offset) {
		puts_(l, "in the GGUF header");
		return;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &g->tensors[i];
		const uintptr_t d = (uintptr_t)t->data;

		if (addr >= d && addr - d < t->nbytes) {
			puts_(l, "tensor ");
			put(l, t->name.ptr, t->name.len < 200 ? t->name.len : 200);
			puts_(l, ", byte ");
			putu(l, addr - d);
			puts_(l, " of it");
			return;
		}
	}
	puts_(l, "between tensors");
}

static void report(const struct guard_slot *s, uintptr_t addr)
{
	const uint64_t off = addr - atomic_load(&s->base);
	struct line l = { .n = 0 };
	ssize_t w;

	puts_(&l, "hyb: ");
	puts_(&l, s->path);
	puts_(&l, ": cannot read byte ");
	putu(&l, off);
	puts_(&l, " (");
	put_place(&l, atomic_load(&s->g), addr, off);
	puts_(&l, "): the kernel could not bring that page of the mapped file in (SIGBUS):"
		  " a read error on the drive, or the file was truncated or replaced while in"
		  " use\n");
	w = write(STDERR_FILENO, l.buf, l.n);
	(void)w;
}

/* ---- the handler ------------------------------------------------------------ */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	const uintptr_t addr = (uintptr_t)si->si_addr;

	/* si_addr means a faulting address only when the kernel raised it (si_code > 0) */
	for (int i = 0; si->si_code > 0 && i < HYB_MAP_GUARD_SLOTS; i++) {
		const struct guard_slot *s = &slots[i];
		const uintptr_t b = atomic_load(&s->base);

		if (b && addr >= b && addr - b < s->len) {
			report(s, addr);
			_exit(HYB_MAP_GUARD_EXIT);
		}
	}
	/* not ours: whatever handled SIGBUS before us */
	if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction) {
		previous.sa_sigaction(sig, si, uc);
		return;
	}
	if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
		previous.sa_handler(sig);
		return;
	}
	/*
	 * The default action (ignoring a fault would re-run the instruction for
	 * ever): it takes effect when this handler returns, whether the signal
	 * came from the faulting instruction (which runs again) or was sent.
	 */
	signal(SIGBUS, SIG_DFL);
	raise(SIGBUS);
}

static void install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	installed = !sigaction(SIGBUS, &sa, &previous);
}

int hyb_map_guard_add(const void *base, uint64_t len, const char *path)
{
	pthread_once(&install_once, install);
	if (!installed || !base || !len)
		return -1;
	for (int i = 0; i < HYB_MAP_GUARD_SLOTS; i++) {
		struct guard_slot *s = &slots[i];
		int free_slot = 0;

		if (!atomic_compare_exchange_strong(&s->used, &free_slot, 1))
			continue;
		size_t n = strlen(path);

		if (n >= sizeof(s->path))
			n = sizeof(s->path) - 1;
		memcpy(s->path, path, n);
		s->path[n] = 0;
		s->len = len;
		atomic_store(&s->g, NULL);
		atomic_store(&s->base, (uintptr_t)base); /* last: the handler sees a whole slot */
		return i;
	}
	return -1;
}

void hyb_map_guard_set_gguf(int slot, const struct hyb_gguf_file *g)
{
	if (slot >= 0 && slot < HYB_MAP_GUARD_SLOTS)
		atomic_store(&slots[slot].g, g);
}

void hyb_map_guard_remove(int slot)
{
	if (slot < 0 || slot >= HYB_MAP_GUARD_SLOTS)
		return;
	atomic_store(&slots[slot].base, 0);
	atomic_store(&slots[slot].g, NULL);
	atomic_store(&slots[slot].used, 0);
}
