// SPDX-License-Identifier: MIT
/*
 * hybd: the box-mode daemon. This file is the process:
 * flags and config file, daemonising, the pid file and the signals; the
 * daemon's work is in server.c (and the engine it drives), which tests run
 * in-process.
 *
 * Signals are blocked in every thread and read from a signalfd by the main
 * thread only, so no handler runs in the middle of I/O or a lock: SIGTERM
 * and SIGINT shut down cleanly (also while the model is loading), SIGHUP
 * reopens the log file.
 *
 * Exit status: 0 clean shutdown, 1 could not start (the log says why),
 * 2 bad flags or configuration.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "server.h"

#define HYBD_VERSION "0.1"
#define MAX_SETS 128

static const char usage[] =
	"usage: hybd [-f] [-c FILE] [-m MODEL] [-b auto|kmod|local] [-n NAME]\n"
	"            [-p layer|interleave|explicit] [--split-experts] [-q QUEUE]\n"
	"            [-o KEY=VALUE]... [--check]\n"
	"  Loads a model into NUMA-placed neuron pools with io_uring, publishes its\n"
	"  manifest, and serves the reload queue until SIGTERM or SIGINT.\n"
	"  -f, --foreground   stay in the foreground, log to stderr (systemd: Type=simple)\n"
	"  -c, --config FILE  key = value file; flags given with it override it\n"
	"  -m, --model PATH   = -o model=PATH       -b, --backend = -o backend=\n"
	"  -n, --name NAME    = -o name=NAME        -p, --placement = -o placement=\n"
	"  -q, --queue N      = -o queue=N          -o, --set KEY=VALUE any key below\n"
	"  --split-experts    = -o split_experts=yes (docs/NUMA.md)\n"
	"  --check            print the effective configuration and exit\n"
	"  -V, --version\n";

struct sigctx {
	int fd;
	int sig;	/* the shutdown signal once one came */
};

/* Polled between load pieces: a SIGTERM/SIGINT during the load cancels it. */
static bool load_cancelled(void *arg)
{
	struct sigctx *s = arg;
	struct signalfd_siginfo si;

	while (!s->sig && read(s->fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGHUP)
			hlog_reopen();
		else
			s->sig = (int)si.ssi_signo;
	}
	return s->sig != 0;
}

/*
 * Double fork: the parent stays until the daemon says it is serving (or
 * failed) on a pipe, so `hybd` returns 0 only when the model is ready.
 */
static int daemonise(int *notify_fd, const char *log_path)
{
	int p[2], devnull;
	char msg[1024] = "";
	ssize_t n;
	pid_t pid;

	if (pipe(p))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid > 0) {
		/* 'R' when serving; 'F' and the reason when not (or nothing: it died) */
		close(p[1]);
		do
			n = read(p[0], msg, sizeof(msg) - 1);
		while (n < 0 && errno == EINTR);
		msg[n > 0 ? n : 0] = 0;
		if (msg[0] == 'R')
			_exit(0);
		fprintf(stderr, "hybd: did not start: %s (log: %s)\n",
			msg[0] == 'F' && msg[1] ? msg + 1 : "it exited", log_path);
		_exit(1);
	}
	close(p[0]);
	if (setsid() < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid > 0)
		_exit(0);
	if (chdir("/"))
		return -1;
	umask(022);
	devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (devnull >= 0) {
		dup2(devnull, STDIN_FILENO);
		dup2(devnull, STDOUT_FILENO);
		dup2(devnull, STDERR_FILENO);
		if (devnull > STDERR_FILENO)
			close(devnull);
	}
	*notify_fd = p[1];
	return 0;
}

/* Tell the waiting parent: 'R' ready, or 'F' followed by the reason. */
static void notify(int *fd, char c, const char *why)
{
	char buf[1024];
	int n;

	if (*fd < 0)
		return;
	n = snprintf(buf, sizeof(buf), "%c%s", c, why ? why : "");
	if (write(*fd, buf, (size_t)(n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1)) < 0) {
		/* the parent is gone: nothing to tell */
	}
	close(*fd);
	*fd = -1;
}

/* Relative paths would break after the daemon's chdir("/"): make them absolute. */
static void absolute(char *path, size_t len)
{
	char cwd[PATH_MAX], buf[2 * PATH_MAX];

	if (!path[0] || path[0] == '/' || !strcmp(path, "-") || !getcwd(cwd, sizeof(cwd)))
		return;
	snprintf(buf, sizeof(buf), "%s/%s", cwd, path);
	if (strlen(buf) < len)
		snprintf(path, len, "%s", buf);
}

static int write_pid_file(const char *path, char *err, size_t errlen)
{
	char buf[32];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	if (fd < 0 || write(fd, buf, (size_t)n) != n) {
		snprintf(err, errlen, "pid file %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* The command line: flags, -o KEY=VALUE settings in order, the config file to read. */
struct args {
	const char *config;
	bool check;
	int nsets;
	char sets[MAX_SETS][2][PATH_MAX];
};

/* -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct hybd_config *cfg, struct args *a)
{
	static const struct option opts[] = {
		{ "foreground", 0, 0, 'f' }, { "config", 1, 0, 'c' }, { "model", 1, 0, 'm' },
		{ "backend", 1, 0, 'b' }, { "name", 1, 0, 'n' }, { "placement", 1, 0, 'p' },
		{ "queue", 1, 0, 'q' }, { "set", 1, 0, 'o' }, { "check", 0, 0, 'C' },
		{ "help", 0, 0, 'h' }, { "version", 0, 0, 'V' }, { "split-experts", 0, 0, 'S' },
		{ 0, 0, 0, 0 },
	};
	const char *key, *val;
	int c;

	while ((c = getopt_long(argc, argv, "fc:m:b:n:p:q:o:hV", opts, NULL)) != -1) {
		char *eq;

		key = NULL;
		val = optarg;
		switch (c) {
		case 'f': cfg->foreground = true; continue;
		case 'c': a->config = optarg; continue;
		case 'C': a->check = true; continue;
		case 'm': key = "model"; break;
		case 'b': key = "backend"; break;
		case 'n': key = "name"; break;
		case 'p': key = "placement"; break;
		case 'q': key = "queue"; break;
		case 'S': key = "split_experts"; val = "yes"; break;
		case 'o':
			eq = strchr(optarg, '=');
			if (!eq || eq == optarg) {
				fprintf(stderr, "hybd: -o '%s': expected KEY=VALUE\n", optarg);
				return 2;
			}
			*eq = 0;
			key = optarg;
			val = eq + 1;
			break;
		case 'h':
			printf("%s\n%s", usage, hybd_config_help);
			return 0;
		case 'V':
			printf("hybd %s\n", HYBD_VERSION);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
		if (a->nsets == MAX_SETS || strlen(key) >= PATH_MAX || strlen(val) >= PATH_MAX) {
			fprintf(stderr, "hybd: too many or too long options\n");
			return 2;
		}
		snprintf(a->sets[a->nsets][0], PATH_MAX, "%s", key);
		snprintf(a->sets[a->nsets][1], PATH_MAX, "%s", val);
		a->nsets++;
	}
	if (optind < argc) {
		fprintf(stderr, "hybd: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	return -1;
}

/* The config file first, flags over it, whatever their order on the command line. */
static int configure(struct hybd_config *cfg, const struct args *a)
{
	char err[2 * PATH_MAX];

	if (a->config && hybd_config_load(cfg, a->config, err, sizeof(err))) {
		fprintf(stderr, "hybd: %s\n", err);
		return 2;
	}
	for (int i = 0; i < a->nsets; i++) {
		if (hybd_config_set(cfg, a->sets[i][0], a->sets[i][1], err, sizeof(err))) {
			fprintf(stderr, "hybd: option %s: %s\n", a->sets[i][0], err);
			return 2;
		}
	}
	if (hybd_config_check(cfg, err, sizeof(err))) {
		fprintf(stderr, "hybd: %s\n", err);
		return 2;
	}
	if (a->check) {
		hybd_config_print(cfg, stdout);
		return 0;
	}
	return -1;
}

/* The state folder, the log and pid file paths; the log opened, then daemonised. */
static int setup_process(struct hybd_config *cfg, char *log_path, size_t log_len,
			 char *pid_path, size_t pid_len, int *notify_fd)
{
	char err[2 * PATH_MAX];

	if (!cfg->foreground) {
		absolute(cfg->model, sizeof(cfg->model));
		absolute(cfg->state_dir, sizeof(cfg->state_dir));
		absolute(cfg->log_file, sizeof(cfg->log_file));
		absolute(cfg->pid_file, sizeof(cfg->pid_file));
	}
	if (hybd_mkdirs(cfg->state_dir)) {
		fprintf(stderr, "hybd: state_dir %s: %s\n", cfg->state_dir, strerror(errno));
		return 1;
	}
	if (cfg->log_file[0])
		snprintf(log_path, log_len, "%s", cfg->log_file);
	else if (cfg->foreground)
		snprintf(log_path, log_len, "-");
	else
		snprintf(log_path, log_len, "%s/%s.log", cfg->state_dir, cfg->name);
	if (cfg->pid_file[0])
		snprintf(pid_path, pid_len, "%s", cfg->pid_file);
	else
		snprintf(pid_path, pid_len, "%s/%s.pid", cfg->state_dir, cfg->name);
	/* open the log before daemonising: a bad path is reported on the terminal */
	if (hlog_open(log_path, cfg->log_format, cfg->log_level, err, sizeof(err))) {
		fprintf(stderr, "hybd: %s\n", err);
		return 1;
	}
	if (!cfg->foreground && daemonise(notify_fd, log_path)) {
		fprintf(stderr, "hybd: cannot daemonise: %s\n", strerror(errno));
		return 1;
	}
	if (!cfg->foreground && !strcmp(log_path, "-"))
		hlog_close();	/* stderr is /dev/null now */
	return -1;
}

/* Every thread started from here inherits the mask: only the signalfd sees the signals. */
static int block_signals(struct sigctx *sc)
{
	sigset_t mask;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	signal(SIGPIPE, SIG_IGN);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) ||
	    (sc->fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	static struct hybd_config cfg;
	static struct args a;
	char err[2 * PATH_MAX], log_path[PATH_MAX + 64], pid_path[PATH_MAX + 64];
	struct sigctx sc = { .fd = -1 };
	int rc, notify_fd = -1, sig;
	struct hybd *d;

	hybd_config_defaults(&cfg);
	if ((rc = parse_args(argc, argv, &cfg, &a)) >= 0 || (rc = configure(&cfg, &a)) >= 0 ||
	    (rc = setup_process(&cfg, log_path, sizeof(log_path), pid_path, sizeof(pid_path),
				&notify_fd)) >= 0)
		return rc;
	if (block_signals(&sc)) {
		hlog_msg(HLOG_ERROR, "error", "signalfd: %s", strerror(errno));
		notify(&notify_fd, 'F', "signalfd failed");
		return 1;
	}
	if (write_pid_file(pid_path, err, sizeof(err)))
		hlog_msg(HLOG_WARN, "pid_file", "%s", err);

	if (hybd_start(&cfg, load_cancelled, &sc, &d, err, sizeof(err))) {
		unlink(pid_path);
		if (sc.sig) {
			hlog_msg(HLOG_INFO, "stopped", "%s during the load: nothing published",
				 strsignal(sc.sig));
			notify(&notify_fd, 'F', "stopped by a signal during the load");
			return 0;
		}
		if (cfg.foreground && strcmp(log_path, "-"))
			fprintf(stderr, "hybd: %s\n", err);
		notify(&notify_fd, 'F', err);
		return 1;
	}
	notify(&notify_fd, 'R', NULL);
	sig = sc.sig ? sc.sig : hybd_serve(d, sc.fd);
	hybd_stop(d, sig == SIGINT ? "SIGINT" : "SIGTERM");
	unlink(pid_path);
	close(sc.fd);
	hlog_close();
	return 0;
}
