#!/bin/sh
# SPDX-License-Identifier: MIT
# Sourced on the GPU machine (no package registry), in the project root:
#   . tests/gpu/setup.sh
# unpacks the libraries tests/gpu/carry.sh downloaded into .debs/ into a
# prefix of their own, .debs/root (never into /, where Debian 12's files could
# replace the image's own libraries), and points the compiler, the linker and
# the loader at it.
if [ ! -d .debs ]; then
	echo "setup.sh: no .debs/ (run tests/gpu/carry.sh first and carry it)" >&2
	return 1 2>/dev/null || exit 1
fi
hyb_prefix=$PWD/.debs/root
mkdir -p "$hyb_prefix"
for f in .debs/*.deb; do
	dpkg -x "$f" "$hyb_prefix" || { echo "setup.sh: cannot unpack $f" >&2; return 1 2>/dev/null || exit 1; }
done
hyb_lib=$hyb_prefix/usr/lib/x86_64-linux-gnu
export CPATH="$hyb_prefix/usr/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$hyb_lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$hyb_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$hyb_lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
