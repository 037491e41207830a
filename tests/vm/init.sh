#!/bin/busybox sh
# SPDX-License-Identifier: MIT
#
# /init of the VM bench (tests/vm/run.sh packs it with busybox, hybpool.ko,
# hybtest and hybfuzz). Every result is one "HYBVM PASS|FAIL <name>" line on
# the serial console; "HYBVM DONE" ends the run, then the VM powers off.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
export PATH=/bin

FUZZ=20
TESTS="basic numa rofault share queue prio death memory cap perm migrate ctlmove memcg pidns auth linger
	killfault undo numascan compat mempool box ioerr"
for a in $(cat /proc/cmdline); do
	case $a in
	hybvm.fuzz=*) FUZZ=${a#hybvm.fuzz=} ;;
	hybvm.only=*) TESTS=$(echo "${a#hybvm.only=}" | tr ',' ' ') ;;
	esac
done

echo "HYBVM BOOT $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpus, $(ls -d /sys/devices/system/node/node[0-9]* | wc -l) NUMA nodes"
FAILED=0
pass() { echo "HYBVM PASS $*"; }
fail() { echo "HYBVM FAIL $*"; FAILED=1; }

# Kill every user process but init (a failed or hung test may leave
# children holding the device); print what was killed. The filter uses the
# shell's own read (it drops the NULs between arguments): a fork per process
# costs tens of ms under TCG, seconds for the ~100 kernel threads per test.
reap_strays() {
	for d in /proc/[0-9]*; do
		p=${d#/proc/}
		[ "$p" = 1 ] && continue
		c=
		{ read -r c <"$d/cmdline"; } 2>/dev/null
		case $c in
		"" | timeout*) continue ;;	# kernel threads; busybox timeout's watcher
		esac
		c=$( { tr '\000' ' ' <"$d/cmdline"; } 2>/dev/null)
		kill -9 "$p" 2>/dev/null && echo "$p:$c"
	done
}

# run NAME SECONDS CMD...: one test in its own process with a time limit.
run() {
	name=$1
	secs=$2
	shift 2
	timeout -s KILL "$secs" "$@"
	rc=$?
	reap_strays >/tmp/strays
	strays=$(cat /tmp/strays)
	if [ $rc -ne 0 ]; then
		fail "$name (exit $rc)"
	elif [ -n "$strays" ]; then
		fail "$name (left processes behind: $strays)"
	else
		pass "$name"
	fi
}

if insmod /hybpool.ko max_pinned_mb=384; then
	pass "insmod"
else
	fail "insmod"
fi
i=0
while [ ! -c /dev/hybpool ] && [ $i -lt 50 ]; do
	sleep 0.1
	i=$((i + 1))
done
# What the udev rule does on a real box: group hyb, mode 0660.
chgrp hyb /dev/hybpool
mode=$(stat -c %a /dev/hybpool 2>/dev/null)
if [ "$mode" = "660" ]; then
	pass "devnode (/dev/hybpool 0660 root:hyb)"
else
	fail "devnode (mode '$mode', want 660)"
fi

# libhyb's pool and queue backends (tests/unit/test_mempool.c, the checks the
# host runs): kmod against the module, then local on this two-node kernel with
# huge pages reserved; bench_queue times the round trip through libhyb.
HP=/sys/devices/system/node/node*/hugepages/hugepages-2048kB/nr_hugepages
mempool() {
	run "libhyb kmod backend" 150 sh -c 'HYB_REQUIRE_KMOD=1 /hybmempool _kmod >/tmp/mp.log 2>&1;
		rc=$?; sed "s/^/  /" /tmp/mp.log; exit $rc'
	for f in $HP; do echo 24 >"$f"; done
	run "libhyb local backend (reserved huge pages, 2 nodes)" 120 sh -c '/hybmempool _local \
		>/tmp/mp.log 2>&1; rc=$?; sed "s/^/  /" /tmp/mp.log; exit $rc'
	for f in $HP; do echo 0 >"$f"; done
	THP=/sys/kernel/mm/transparent_hugepage/shmem_enabled
	if [ -w $THP ] && echo advise >$THP; then
		run "libhyb local backend (shmem THP)" 60 sh -c '/hybmempool backing_local \
			move_local share_fork_local ro_others_local >/tmp/mp.log 2>&1; rc=$?;
			sed "s/^/  /" /tmp/mp.log; exit $rc'
		echo never >$THP
	fi
	run "libhyb queue bench (kmod)" 90 sh -c '/bench_queue --backend kmod -n 300 --pool-mib 64 \
		>/tmp/bq.log 2>&1; rc=$?; grep -E "^(queue|pool)_" /tmp/bq.log |
		sed "s/^/HYBVM METRIC libhyb_kmod_/"; grep -vE "^(queue|pool)_" /tmp/bq.log |
		sed "s/^/  /"; exit $rc'
}

# The NVMe drives of box mode: their modules (once), then the namespace of
# the drive with serial $1 (run.sh: hyb0001 the model, hyb0bad a copy whose
# reads fail at one sector). The drives probe asynchronously: names vary.
KMODS=
kmods_up() {
	[ -n "$KMODS" ] && return "$KMODS"
	KMODS=0
	for k in $(cat /kmods/order); do
		if ! insmod "/kmods/$k" 2>/tmp/insmod.err && ! grep -q "File exists" /tmp/insmod.err
		then
			echo "  insmod $k: $(cat /tmp/insmod.err)"
			KMODS=1
		fi
	done
	return "$KMODS"
}
nvme_dev() {
	i=0
	while [ $i -lt 100 ]; do
		for d in /sys/block/nvme*; do
			s=
			{ read -r s <"$d/device/serial"; } 2>/dev/null
			[ "$s" = "$1" ] && [ -b "/dev/${d##*/}" ] && echo "/dev/${d##*/}" && return 0
		done
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}

# Box mode end to end (tests/vm/hybbox.c): the model on an
# emulated NVMe drive (ext4, mounted read-only), embedded mode's ids as the
# reference, then hybd as its own process loading into pools on both nodes
# and the app generating from them; SIGTERM and SIGKILL of hybd mid-run.
box() {
	if [ ! -x /hybbox ] || [ ! -x /hybd ]; then
		echo "HYBVM NOTE box mode not run: no static hybd/hybbox (run.sh links them" \
			"from make's build/libhyb.a, build/daemon/hybd.o and build/hybctl)"
		return
	fi
	t0=$(cut -d' ' -f1 /proc/uptime)
	ok=1
	kmods_up || ok=0
	dev=$(nvme_dev hyb0001)
	mkdir -p /mnt
	if [ $ok = 1 ] && [ -n "$dev" ] && mount -t ext4 -o ro "$dev" /mnt &&
		[ -r /mnt/model.gguf ]; then
		pass "box: model on an emulated NVMe drive ($(wc -l </kmods/order) modules, ext4 read-only)"
	else
		fail "box: NVMe drive (modules ok: $ok; $(ls /dev/nvme* 2>&1 | tr '\n' ' '))"
		return
	fi
	run "box: embedded mode generates from NVMe (reference ids)" 120 sh -c \
		'/hybbox gen /mnt/model.gguf 16 >/tmp/box.ids 2>/tmp/box.err; rc=$?;
		sed "s/^/  /" /tmp/box.ids /tmp/box.err; exit $rc'
	# the host's ids: informative only (its CPU kernels may sum in another order)
	if [ -r /box.host_ids ]; then
		if cmp -s /box.host_ids /tmp/box.ids; then
			echo "HYBVM NOTE box: the host generated the same ids"
		else
			echo "HYBVM NOTE box: the host's ids differ: $(cat /box.host_ids)"
		fi
	fi
	hyb=
	[ -x /hyb ] && hyb=hyb=/hyb	# `hyb run --manifest` as a second app
	run "box: hybd loads into pools on 2 nodes, app ids == embedded, SIGTERM clean" 120 \
		/hybbox box /hybd /etc/hybd.conf /mnt/model.gguf /tmp/box.ids $hyb
	run "box: hybd SIGKILLed mid-run: app stops with -EPIPE, no hang" 120 \
		/hybbox box /hybd /etc/hybd.conf /mnt/model.gguf /tmp/box.ids kill $hyb
	if [ -x /mnt/dyn/hyb-serve ] && [ -x /hyb ]; then
		ip link set lo up	# the HTTP test talks over loopback
		run "box: hyb serve --manifest answers as hyb run; hybd stops: the stream finishes, exit 3" \
			180 /hybbox serve /hybd /etc/hybd.conf /mnt/dyn/hyb-serve /hyb
	else
		echo "HYBVM NOTE box: hyb serve --manifest not run (no dynamic build/hyb on the drive)"
	fi
	if [ -r /mnt/moe.gguf ]; then
		run "box: MoE reference ids (embedded mode)" 120 sh -c \
			'/hybbox gen /mnt/moe.gguf 16 >/tmp/moe.ids 2>/tmp/moe.err; rc=$?;
			sed "s/^/  /" /tmp/moe.ids /tmp/moe.err; exit $rc'
		run "box: experts split by rows across 2 nodes, a thread per node, ids == embedded" \
			120 /hybbox split /hybd /etc/hybd.conf /mnt/moe.gguf /tmp/moe.ids
	else
		fail "box: no MoE model on the NVMe drive (run.sh)"
	fi
	if [ -r /mnt/plan.gguf ]; then
		run "box: hybrid decoding on hybd's cache, loads through its queue, one app" 240 \
			/hybbox hybrid /hybd /etc/hybd.conf /mnt/plan.gguf $hyb
	else
		fail "box: no plan model on the NVMe drive (run.sh)"
	fi
	umount /mnt
	echo "HYBVM METRIC box_mode_tests_s $(awk -v t0="$t0" '{ print $1 - t0 }' /proc/uptime) s"
}

# A drive that fails reads (hybbox ioerr): the model on an
# NVMe drive whose reads of one sector in blk.1.ffn_up.weight fail in QEMU's
# block layer (blkdebug). Embedded mode (O_DIRECT and buffered), `hyb run`,
# and hybd (foreground and daemonised) must each fail in bounded time naming
# the file, a failed read and the 4096-byte block holding that byte, and
# publish nothing; hybd serving with that tensor on storage fails an app's
# LOAD of it with -EIO and goes on. The kernel log must show the drive's
# errors (a real failed read, not a simulated one).
ioerr() {
	if [ ! -x /hybbox ] || [ ! -x /hybd ] || [ ! -r /ioerr.off ]; then
		echo "HYBVM NOTE ioerr not run: no static hybd/hybbox or failing drive (run.sh)"
		return
	fi
	t0=$(cut -d' ' -f1 /proc/uptime)
	dev=
	kmods_up && dev=$(nvme_dev hyb0bad)
	mkdir -p /bad
	if [ -z "$dev" ] || ! mount -t ext4 -o ro "$dev" /bad; then
		fail "ioerr: the failing NVMe drive (hyb0bad: '$dev'; $(ls /dev/nvme* 2>&1 |
			tr '\n' ' '))"
		return
	fi
	n0=$(dmesg | grep "${dev#/dev/}" | grep -ci error)
	hyb=
	[ -x /hyb ] && hyb=hyb=/hyb
	what="ioerr: a drive failing reads in a tensor: embedded mode, hyb run and hybd name"
	what="$what the file and the bad block, publish nothing; a LOAD over it gets -EIO"
	run "$what" 120 /hybbox ioerr /hybd /etc/hybd.conf /bad/model.gguf "$(cat /ioerr.off)" $hyb
	n1=$(dmesg | grep "${dev#/dev/}" | grep -ci error)
	if [ "$n1" -gt "$n0" ]; then
		pass "ioerr: the kernel saw the drive fail ($((n1 - n0)) error lines, e.g." \
			"\"$(dmesg | grep "${dev#/dev/}" | grep -i error | tail -1 | cut -c1-160)\")"
	else
		fail "ioerr: no error of $dev in the kernel log: the reads did not reach the drive"
	fi
	umount /bad
	echo "HYBVM METRIC ioerr_tests_s $(awk -v t0="$t0" '{ print $1 - t0 }' /proc/uptime) s"
}

# A 32-bit process (tests/vm/hyb32.c): open, ioctl on a file a 64-bit
# process opened, and mmap2 all fail with EOPNOTSUPP (exit 0).
compat() {
	if [ ! -x /hyb32 ]; then
		echo "HYBVM NOTE compat not run: no 32-bit test program (gcc -m32)"
		return
	fi
	/hyb32 3</dev/hybpool
	rc=$?
	case $rc in
	0) pass "compat: a 32-bit process gets EOPNOTSUPP from open, ioctl and mmap2" ;;
	126 | 127) echo "HYBVM NOTE compat not run: this kernel runs no 32-bit programs" ;;
	*) fail "compat: hyb32 exit $rc (1 open, 2 ioctl, 3 mmap2 did not fail with EOPNOTSUPP)" ;;
	esac
}

for t in $TESTS; do
	case $t in
	mempool) mempool ;;
	compat) compat ;;
	box) box ;;
	ioerr) ioerr ;;
	*) run "$t" 90 /hybtest "$t" ;;
	esac
done
[ "$FUZZ" -gt 0 ] && run "fuzz (${FUZZ}s)" $((FUZZ + 30)) /hybfuzz "$FUZZ"
run "idle (nothing left behind)" 20 /hybtest idle

if rmmod hybpool; then
	pass "rmmod"
else
	fail "rmmod"
fi

# The kernel log must be clean. kmemleak only if this kernel has it (Debian's
# does not); slub_debug=FZPU and page_poison=1 on the command line catch
# use-after-free and overruns, the module reports its own leaks at unload.
if [ -e /sys/kernel/debug/kmemleak ]; then
	echo scan >/sys/kernel/debug/kmemleak
	sleep 6
	echo scan >/sys/kernel/debug/kmemleak
	if [ -s /sys/kernel/debug/kmemleak ]; then
		head -40 /sys/kernel/debug/kmemleak
		fail "kmemleak"
	else
		pass "kmemleak"
	fi
else
	echo "HYBVM NOTE kmemleak not in this kernel; relying on slub_debug, page_poison and the module's unload accounting"
fi
dmesg >/tmp/dmesg
PAT='BUG|WARNING|Oops|Call Trace|general protection|leak|Bad page|bad_page|UBSAN|corruption|Poison overwritten|Redzone|Object padding|refcount_t|list_add|list_del|soft lockup|hung task|blocked for more than'
if grep -E "$PAT" /tmp/dmesg; then
	fail "dmesg (see the lines above)"
else
	pass "dmesg clean (no BUG, WARNING, Oops or leak)"
fi
echo "HYBVM DONE failed=$FAILED"
poweroff -f
