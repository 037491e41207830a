#!/bin/sh
# SPDX-License-Identifier: MIT
# Run here (a machine with Debian's package registry), in the project root,
# before a session on a GPU machine: downloads the libraries hyb links against
# into .debs/ (git-ignored) for the device tool to carry (carry: [".debs"]).
# On the GPU machine: sh tests/gpu/setup.sh && make test-gpu && make bench-gpu
#
# With the device tool (a session has about 15 minutes of device time, start-up
# included, and at most 10 a call), all of it in one call:
#   timeout 590 sh tests/gpu/device_run.sh      (carry .debs; logs in $OUT)
# and, if time is left, a second budget on the model the first call made:
#   HYBRID_BUDGET=60% REPS=2 make bench-gpu
set -e
mkdir -p .debs
cd .debs
apt-get download liburing2 liburing-dev libnuma1 libnuma-dev libmetis5 libmetis-dev \
	libutf8proc2 libutf8proc-dev
ls -la
