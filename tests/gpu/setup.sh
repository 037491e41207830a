#!/bin/sh
# SPDX-License-Identifier: MIT
# Run on the GPU machine (no package registry), in the project root: unpacks
# the libraries tests/gpu/carry.sh downloaded into .debs/.
set -e
[ -d .debs ] || { echo "setup.sh: no .debs/ (run tests/gpu/carry.sh first and carry it)" >&2; exit 1; }
for f in .debs/*.deb; do dpkg -x "$f" /; done
ldconfig
nvidia-smi -L || true
