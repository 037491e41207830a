#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# VM bench for hybpool.ko. Builds the module against the Debian kernel
# headers (W=1, and sparse when installed), builds the static test programs,
# packs them with busybox into an initramfs, boots the matching Debian kernel
# under qemu (TCG) with two NUMA nodes, and reads the results back from the
# serial console. Prints PASS/FAIL per test; exits 0 when all pass, 1 on any
# failure, 77 (skip) only when qemu cannot run a VM at all here.
#
# Environment: HYB_VM_OUT (work dir, default build/vm), HYB_VM_TIMEOUT (s, VM
# wall limit, default 420), HYB_VM_FUZZ (fuzzer seconds, default 20),
# HYB_VM_ACCEL (tcg|kvm, default tcg), HYB_VM_KVER (kernel version to use;
# `run.sh --kernels` lists those `make test` boots, installing 6.1 and 6.12),
# HYB_VM_ONLY (comma-separated hybtest names to run, default all), HYB_VM_BUILD
# (where `make` put libhyb.a and the hybctl objects, default build).
#
# Box mode's drives: the model on an ext4 image as NVMe drive hyb0001, and a
# copy behind QEMU's blkdebug as hyb0bad, whose reads of one sector of the
# tensor data fail (the ioerr test).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$(realpath -m "${HYB_VM_OUT:-$ROOT/build/vm}")  # absolute: a step runs in a subshell elsewhere
VM_TIMEOUT=${HYB_VM_TIMEOUT:-420}
FUZZ=${HYB_VM_FUZZ:-20}
ACCEL=${HYB_VM_ACCEL:-tcg}
NICE="nice -n 19"

say() { echo "hyb-vm: $*"; }
fail() { say "FAIL: $*"; exit 1; }
skip() { say "SKIP: $*"; exit 77; }

mkdir -p "$OUT" || fail "cannot create $OUT"
# One bench at a time per work dir (other `make test` runs may share it).
exec 9>"$OUT/.lock"
flock 9

# -- 1. what the bench needs ------------------------------------------------
kver_pick() {
	local v best=
	for v in $(ls /boot/vmlinuz-*-amd64 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -V); do
		[ -d "/usr/src/linux-headers-$v" ] && best=$v
	done
	echo "$best"
}
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" ||
	need+=(busybox-static)
command -v sparse >/dev/null || need+=(sparse)
[ -n "$(kver_pick)" ] || need+=(linux-image-amd64 linux-headers-amd64)
# --kernels: every kernel `make test` boots, one per line, newest first:
# each image + headers pair installed, after installing Debian 12's default
# (6.1) and the newest 6.12 the archive has (bookworm-security ships it, and
# it is Debian 13's default) when they are missing.
if [ "${1:-}" = --kernels ]; then
	k612=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' 2>/dev/null |
	       awk '{ print $1 }' | sed 's/^linux-image-//' | sort -V | tail -n 1)
	if [ -n "$k612" ] && ! ls /boot/vmlinuz-6.12.* >/dev/null 2>&1; then
		need+=("linux-image-$k612" "linux-headers-$k612")
	fi
	dpkg-query -W -f='${Status}' linux-image-amd64 2>/dev/null | grep -q "install ok installed" ||
		ls /boot/vmlinuz-6.1.* >/dev/null 2>&1 || need+=(linux-image-amd64 linux-headers-amd64)
fi
if [ ${#need[@]} -gt 0 ]; then
	say "installing ${need[*]}"
	SUDO=
	[ "$(id -u)" -ne 0 ] && SUDO=sudo
	if ! { DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq &&
	       DEBIAN_FRONTEND=noninteractive $NICE $SUDO apt-get install -y -qq \
		       --no-install-recommends "${need[@]}"; } >"$OUT/apt.log" 2>&1; then
		tail -5 "$OUT/apt.log"
		fail "could not install ${need[*]} (log: $OUT/apt.log)"
	fi
fi
if [ "${1:-}" = --kernels ]; then
	for v in $(ls /boot/vmlinuz-*-amd64 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -rV); do
		[ -d "/usr/src/linux-headers-$v" ] && echo "$v"
	done
	exit 0
fi
KVER=${HYB_VM_KVER:-$(kver_pick)}
KDIR=/usr/src/linux-headers-$KVER
VMLINUZ=/boot/vmlinuz-$KVER
[ -d "$KDIR" ] && [ -r "$VMLINUZ" ] || fail "no kernel image + headers pair (want $VMLINUZ and $KDIR)"
BUSYBOX=/bin/busybox	# busybox-static's, so the initramfs needs no libraries
[ -x "$BUSYBOX" ] || fail "no $BUSYBOX (package busybox-static)"

# qemu itself must be able to start a machine; that is the only skip.
if ! probe=$(qemu-system-x86_64 -accel "$ACCEL" -machine none -display none -S \
		-monitor none -serial none -daemonize -pidfile "$OUT/probe.pid" 2>&1); then
	skip "qemu-system-x86_64 cannot start a $ACCEL machine here: ${probe:-no message}"
fi
kill "$(cat "$OUT/probe.pid" 2>/dev/null)" 2>/dev/null
rm -f "$OUT/probe.pid"

# -- 2. build -------------------------------------------------------------------
rc=0
rm -rf "$OUT/src" && mkdir -p "$OUT/src" && cp "$ROOT/Kbuild" "$OUT/src/" &&
	cp -r "$ROOT/kmod" "$OUT/src/" || fail "cannot stage the module sources"
find "$OUT/src" \( -name '*.o' -o -name '*.ko' -o -name '*.mod*' -o -name '.*.cmd' \) -delete
CHECK=
command -v sparse >/dev/null && CHECK="C=1"
$NICE make -C "$KDIR" M="$OUT/src" W=1 $CHECK modules >"$OUT/build.log" 2>&1 || rc=$?
KO=$OUT/src/kmod/hybpool.ko
if [ $rc -ne 0 ] || [ ! -f "$KO" ]; then
	grep -E "error|warning" "$OUT/build.log" | head -20
	fail "module build against $KDIR failed (log: $OUT/build.log)"
fi
if grep -E "warning:|error:|: sparse:" "$OUT/build.log" | grep -v "Skipping BTF"; then
	say "FAIL build: warnings from W=1 ${CHECK:+/ sparse} (log: $OUT/build.log)"
	BUILD_WARN=1
else
	say "PASS build: hybpool.ko for $KVER, W=1${CHECK:+ and sparse} clean"
	BUILD_WARN=0
fi
CFLAGS="-std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -static -I$ROOT/kmod/include/uapi"
for prog in hybtest hybfuzz; do
	$NICE gcc $CFLAGS "$ROOT/tests/vm/$prog.c" -o "$OUT/$prog" >>"$OUT/build.log" 2>&1 ||
		{ tail -20 "$OUT/build.log"; fail "cannot build tests/vm/$prog.c"; }
done
# A 32-bit process against the device (freestanding i386, no 32-bit libc
# needed); without a compiler for it the compat check says it was skipped.
rm -f "$OUT/hyb32"
$NICE gcc -m32 -std=c11 -O2 -Wall -Wextra -Werror -ffreestanding -fno-pic -fno-stack-protector \
	-nostdlib -static "$ROOT/tests/vm/hyb32.c" -o "$OUT/hyb32" >>"$OUT/build.log" 2>&1 ||
	rm -f "$OUT/hyb32"
# libhyb's pool/queue backends: the host's conformance tests and queue bench.
MP_SRCS="$ROOT/libhyb/box/lat_hist.c $ROOT/libhyb/box/mempool.c $ROOT/libhyb/box/mempool_kmod.c
	 $ROOT/libhyb/box/mempool_local.c $ROOT/libhyb/box/rq_local.c $ROOT/libhyb/util/error.c"
MP_FLAGS="$CFLAGS -pthread -I$ROOT/libhyb/include -I$ROOT/libhyb"
{ $NICE gcc $MP_FLAGS "$ROOT/tests/unit/runner.c" "$ROOT/tests/unit/test_mempool.c" $MP_SRCS \
	-lnuma -o "$OUT/hybmempool" &&
  $NICE gcc $MP_FLAGS "$ROOT/tests/bench/bench_queue.c" $MP_SRCS -lnuma -o "$OUT/bench_queue"
} >"$OUT/build-mempool.log" 2>&1 ||
	{ tail -20 "$OUT/build-mempool.log"; fail "cannot build the libhyb pool tests"; }

# hybctl, linked statically from the objects `make` built (make test builds
# them first), for the `hybctl numa --move` test; without them that test
# says it skipped. Debian has no static METIS: tests/vm/metis_stub.c stands
# in (nothing in the VM partitions graphs).
HB=${HYB_VM_BUILD:-$ROOT/build}
STATIC_LIBS="-lm -pthread -lnuma -luring -lutf8proc"
rm -f "$OUT/hybctl" "$OUT/hybd" "$OUT/hybbox" "$OUT/hyb" "$OUT/nvme.img" "$OUT/nvme-bad.img" \
	"$OUT/ioerr.off"
if [ -f "$HB/libhyb.a" ]; then
	$NICE gcc -std=c11 -O2 -Wall -Wextra -Werror -c "$ROOT/tests/vm/metis_stub.c" \
		-o "$OUT/metis_stub.o" >"$OUT/build-hybctl.log" 2>&1 ||
		{ tail -5 "$OUT/build-hybctl.log"; fail "cannot build tests/vm/metis_stub.c"; }
fi
if [ -f "$HB/libhyb.a" ] && ls "$HB"/tools/hybctl/*.o >/dev/null 2>&1; then
	$NICE gcc -static "$HB"/tools/hybctl/*.o "$OUT/metis_stub.o" "$HB/libhybplan.a" \
		"$HB/libhyb.a" $STATIC_LIBS \
		-o "$OUT/hybctl" >>"$OUT/build-hybctl.log" 2>&1 ||
		{ tail -5 "$OUT/build-hybctl.log"; fail "cannot link a static hybctl from $HB"; }
fi

# Box mode: hybd (libhybd.a) and the app (tests/vm/hybbox.c) linked
# statically against libhyb.a; a small synthetic model (hybctl synth) on an
# ext4 image that the VM sees as an NVMe drive; the nvme and ext4 modules of
# the same Debian kernel (and what they depend on) for the initramfs.
BOX=0
if [ -f "$HB/libhyb.a" ] && [ -f "$HB/libhybd.a" ] && [ -f "$HB/daemon/hybd.o" ] &&
   [ -x "$HB/hybctl" ]; then
	BOX=1
	{ $NICE gcc -static "$HB/daemon/hybd.o" "$HB/libhybd.a" "$HB/libhyb.a" $STATIC_LIBS \
		-o "$OUT/hybd" &&
	  $NICE gcc $CFLAGS -pthread -I"$ROOT/libhyb/include" -I"$ROOT/kernels/cpu" \
		"$ROOT/tests/vm/hybbox.c" \
		"$HB/libhyb.a" $STATIC_LIBS -ljansson -o "$OUT/hybbox"
	} >"$OUT/build-box.log" 2>&1 ||
		{ tail -20 "$OUT/build-box.log"; fail "cannot link static hybd/hybbox from $HB"; }
	# `hyb run --manifest` as a second app (tools/hyb/cli_manifest.c)
	rm -f "$OUT/hyb"
	# without hyb serve, whose HTTP library has no static build (serve_stub.c)
	if ls "$HB"/tools/hyb/*.o >/dev/null 2>&1; then
		$NICE gcc -static $(ls "$HB"/tools/hyb/*.o | grep -v -e /serve_ -e /cmd_serve.o) \
			"$ROOT/tests/vm/serve_stub.c" "$HB/libhyb.a" \
			$STATIC_LIBS -o "$OUT/hyb" >>"$OUT/build-box.log" 2>&1 ||
			{ tail -20 "$OUT/build-box.log"; fail "cannot link a static hyb from $HB"; }
	fi
	rm -rf "$OUT/nvme-root" && mkdir -p "$OUT/nvme-root"
	# hyb serve as make built it (dynamically linked: its HTTP library has no
	# static build), stripped, with the libraries it loads (ldd) and their
	# loader, on the drive rather than in the initramfs (whose memory the
	# pool tests need); dyn/hyb-serve runs it (hybbox serve)
	if [ -x "$HB/hyb" ] && ldd "$HB/hyb" >"$OUT/hyb.ldd" 2>&1 &&
	   grep -q libmicrohttpd "$OUT/hyb.ldd"; then
		d=$OUT/nvme-root/dyn
		mkdir -p "$d/lib" && strip -o "$d/hyb" "$HB/hyb" &&
		awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' "$OUT/hyb.ldd" |
			while read -r lib; do cp -L "$lib" "$d/lib/" || exit 1; done &&
		printf '#!/bin/sh\nexec /mnt/dyn/lib/%s --library-path /mnt/dyn/lib /mnt/dyn/hyb "$@"\n' \
			"$(basename "$(awk '$1 ~ /^\// { print $1 }' "$OUT/hyb.ldd")")" >"$d/hyb-serve" &&
		chmod 755 "$d/hyb-serve" ||
			fail "cannot stage hyb serve and its libraries ($OUT/hyb.ldd)"
	fi
	"$HB/hybctl" synth -o "$OUT/nvme-root/model.gguf" --hidden 256 --ffn 768 --layers 2 \
		--vocab 512 --type Q8_0 --seed 7 >"$OUT/box-synth.log" 2>&1 ||
		{ tail -5 "$OUT/box-synth.log"; fail "hybctl synth failed"; }
	# a mixture of experts whose expert tensors hybd splits across the nodes (hybbox split)
	"$HB/hybctl" synth -o "$OUT/nvme-root/moe.gguf" --arch qwen3moe --experts 8 \
		--experts-used 2 --expert-ffn 128 --hidden 256 --heads 4 --layers 2 --vocab 512 \
		--type Q8_0 --seed 9 >>"$OUT/box-synth.log" 2>&1 ||
		{ tail -5 "$OUT/box-synth.log"; fail "hybctl synth (MoE) failed"; }
	# a plan model for hybrid decoding on hybd's cache (hybbox hybrid)
	{ "$HB/hybctl" synth -o "$OUT/plan-src.gguf" --hidden 256 --ffn 1024 --layers 3 \
		--heads 4 --vocab 512 --act relu --type Q8_0 -t 1 &&
	  "$HB/hybctl" profile "$OUT/plan-src.gguf" -o "$OUT/plan-prof.gguf" --gen 48 -t 1 &&
	  "$HB/hybctl" plan "$OUT/plan-src.gguf" --profile "$OUT/plan-prof.gguf" \
		--gpu-budget 4M -o "$OUT/nvme-root/plan.gguf" -t 1
	} >>"$OUT/box-synth.log" 2>&1 ||
		{ tail -5 "$OUT/box-synth.log"; fail "hybctl synth/profile/plan failed"; }
	# the same program on the host, for a note on host vs VM (ISA) agreement
	"$OUT/hybbox" gen "$OUT/nvme-root/model.gguf" 16 >"$OUT/box.host_ids" 2>/dev/null ||
		rm -f "$OUT/box.host_ids"
	command -v mke2fs >/dev/null || PATH=$PATH:/sbin:/usr/sbin
	mke2fs -q -F -t ext4 -O ^has_journal -E root_owner=0:0 -d "$OUT/nvme-root" \
		"$OUT/nvme.img" 48M >"$OUT/box-mkfs.log" 2>&1 ||
		{ cat "$OUT/box-mkfs.log"; fail "cannot make the NVMe image (mke2fs -d, e2fsprogs)"; }
	# A drive that fails reads: a copy of the image behind
	# QEMU's blkdebug, which fails (EIO) every read covering the sector that
	# holds byte BAD_OFF of the model, the middle of blk.1.ffn_up.weight. The
	# ext4 metadata reads fine, so the file opens and the loaders meet the
	# error in the tensor data. The sector: debugfs bmap of the file block,
	# checked against the bytes there.
	read -r t_off t_len < <("$OUT/hybbox" offset "$OUT/nvme-root/model.gguf" \
		blk.1.ffn_up.weight 2>/dev/null)
	BAD_OFF=$((${t_off:-0} + ${t_len:-0} / 2))
	bs=$(dumpe2fs -h "$OUT/nvme.img" 2>/dev/null | awk -F: '/^Block size/ { print $2 + 0 }')
	pblk=$(debugfs -R "bmap /model.gguf $((BAD_OFF / ${bs:-1}))" "$OUT/nvme.img" 2>/dev/null)
	[ -n "$t_len" ] && [ -n "$bs" ] && [ "${pblk:-0}" -gt 0 ] 2>/dev/null ||
		fail "cannot find the sector of byte $BAD_OFF of the model (hybbox offset, debugfs)"
	BAD_SECTOR=$(((pblk * bs + BAD_OFF % bs) / 512))
	cmp -s <(dd if="$OUT/nvme.img" bs=512 skip=$BAD_SECTOR count=1 status=none) \
		<(dd if="$OUT/nvme-root/model.gguf" bs=512 skip=$((BAD_OFF / 512)) count=1 \
		  status=none) || fail "sector $BAD_SECTOR of the image does not hold byte $BAD_OFF"
	cp --sparse=always "$OUT/nvme.img" "$OUT/nvme-bad.img" || fail "cannot copy the image"
	printf '[inject-error]\nevent = "read_aio"\nerrno = "5"\nsector = "%s"\n' \
		"$BAD_SECTOR" >"$OUT/blkdebug.conf"
	echo "$BAD_OFF" >"$OUT/ioerr.off"
	# insmod order for nvme and ext4 (the generic crc32c/crct10dif, not the
	# CPU-specific ones a TCG CPU may lack)
	rm -rf "$OUT/kmods" && mkdir -p "$OUT/kmods"
	modprobe -a --show-depends -S "$KVER" nvme ext4 crc32c_generic 2>"$OUT/box-mods.log" |
		awk '$1 == "insmod" && $2 !~ /arch\/x86\/crypto/ && !seen[$2]++ { print $2 }' \
		>"$OUT/kmods.list"
	grep -q "/nvme.ko" "$OUT/kmods.list" && grep -q "/ext4.ko" "$OUT/kmods.list" ||
		{ cat "$OUT/box-mods.log"; fail "no nvme/ext4 modules for $KVER (modprobe --show-depends)"; }
	while read -r k; do
		cp "$k" "$OUT/kmods/" && basename "$k" >>"$OUT/kmods/order" ||
			fail "cannot copy $k"
	done <"$OUT/kmods.list"
fi

# -- 3. initramfs ---------------------------------------------------------------
IR=$OUT/initramfs
rm -rf "$IR" && mkdir -p "$IR"/{bin,dev,proc,sys,tmp,etc}
cp "$BUSYBOX" "$IR/bin/busybox"
cp "$KO" "$OUT/hybtest" "$OUT/hybfuzz" "$OUT/hybmempool" "$OUT/bench_queue" "$IR/"
[ -x "$OUT/hybctl" ] && cp "$OUT/hybctl" "$IR/"
[ -x "$OUT/hyb32" ] && cp "$OUT/hyb32" "$IR/"
if [ "$BOX" = 1 ]; then
	[ -x "$OUT/hyb" ] && cp "$OUT/hyb" "$IR/"
	cp "$OUT/hybd" "$OUT/hybbox" "$IR/" && cp -r "$OUT/kmods" "$IR/kmods" &&
		cp "$ROOT/tests/vm/hybd.conf" "$IR/etc/hybd.conf" || fail "cannot stage box mode"
	[ -f "$OUT/box.host_ids" ] && cp "$OUT/box.host_ids" "$IR/box.host_ids"
	cp "$OUT/ioerr.off" "$IR/ioerr.off" || fail "cannot stage the failing drive's offset"
fi
cp "$ROOT/tests/vm/init.sh" "$IR/init"
chmod 755 "$IR/init"
printf 'root:x:0:0:root:/:/bin/sh\nuser:x:1000:990::/:/bin/sh\nother:x:1001:1001::/:/bin/sh\n' \
	>"$IR/etc/passwd"
printf 'root:x:0:\nhyb:x:990:user\nother:x:1001:\n' >"$IR/etc/group"
(cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) >"$OUT/initramfs.gz" ||
	fail "cannot pack the initramfs"

# -- 4. boot ----------------------------------------------------------------------
NVME=()
[ "$BOX" = 1 ] && NVME=(-drive "file=$OUT/nvme.img,if=none,id=nv,format=raw"
			-device nvme,serial=hyb0001,drive=nv
			-drive "file=blkdebug:$OUT/blkdebug.conf:$OUT/nvme-bad.img,format=raw,$(
				)if=none,id=nvbad" -device nvme,serial=hyb0bad,drive=nvbad)
say "booting $KVER under qemu ($ACCEL, 2 NUMA nodes, 2 vCPUs, 1 GiB), fuzzing ${FUZZ}s"
t0=$(date +%s)
$NICE timeout "$VM_TIMEOUT" qemu-system-x86_64 -accel "$ACCEL" -cpu max -smp 2,sockets=2 -m 1024 \
	-object memory-backend-ram,id=m0,size=512M -object memory-backend-ram,id=m1,size=512M \
	-numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1 \
	"${NVME[@]}" \
	-kernel "$VMLINUZ" -initrd "$OUT/initramfs.gz" \
	-append "console=ttyS0 loglevel=4 panic=-1 slub_debug=FZPU page_poison=1 hybvm.fuzz=$FUZZ${HYB_VM_ONLY:+ hybvm.only=$HYB_VM_ONLY}" \
	-display none -serial "file:$OUT/console.log" -monitor none -net none -no-reboot \
	>"$OUT/qemu.log" 2>&1
qrc=$?
secs=$(($(date +%s) - t0))
tr -d '\r' <"$OUT/console.log" >"$OUT/console.txt" 2>/dev/null

if ! grep -q "^HYBVM BOOT" "$OUT/console.txt" 2>/dev/null; then
	if [ $qrc -ne 124 ] && [ ! -s "$OUT/console.txt" ]; then
		skip "qemu could not run the VM: $(head -3 "$OUT/qemu.log" | tr '\n' ' ')"
	fi
	tail -30 "$OUT/console.txt"
	fail "the VM did not reach its init (qemu exit $qrc after ${secs}s; console: $OUT/console.txt)"
fi

# -- 5. results ---------------------------------------------------------------
grep -aE "^(HYBVM (PASS|FAIL|NOTE)|  )" "$OUT/console.txt" | grep -v "^HYBVM METRIC" |
	sed -e 's/^HYBVM /hyb-vm: /'
grep "^HYBVM METRIC" "$OUT/console.txt" | sed 's/^HYBVM METRIC //' >"$OUT/metrics.txt"
npass=$(grep -c "^HYBVM PASS" "$OUT/console.txt")
nfail=$(grep -c "^HYBVM FAIL" "$OUT/console.txt")
if ! grep -q "^HYBVM DONE" "$OUT/console.txt"; then
	tail -40 "$OUT/console.txt"
	fail "the VM did not finish (qemu exit $qrc after ${secs}s; timeout ${VM_TIMEOUT}s)"
fi
if [ -s "$OUT/metrics.txt" ]; then
	say "measured (TCG-emulated, not real-hardware speed):"
	sed 's/^/hyb-vm:   /' "$OUT/metrics.txt"
fi
if [ "$nfail" -gt 0 ] || [ "$BUILD_WARN" -ne 0 ]; then
	say "$nfail VM test(s) failed, $npass passed (console: $OUT/console.txt)"
	exit 1
fi
say "all $npass VM tests passed in ${secs}s"
exit 0
