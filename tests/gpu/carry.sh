#!/bin/sh
# SPDX-License-Identifier: MIT
# Run here (a machine with Debian's package registry), in the project root,
# before a session on a GPU machine: downloads the libraries hyb links against
# into .debs/ (git-ignored) for the device tool to carry (carry: [".debs"]).
# On the GPU machine: sh tests/gpu/setup.sh && make test-gpu && make bench-gpu
#
# With the device tool (10 minutes a call; the machine is handed back after
# 30 s idle, and with it models/ and build/), in back-to-back calls:
#   1. sh tests/gpu/setup.sh && make -j16 test-gpu          (carry .debs)
#   2. HYBRID_BUDGET=40% REPS=2 make bench-gpu    (synth, profile and plan
#      the 32-layer model first: 760 + 402 s on 2 cores here, so expect a
#      few minutes on 16; a call cut short resumes at the missing file)
#   3. HYBRID_BUDGET=60% REPS=2 make bench-gpu    (the model is there now)
set -e
mkdir -p .debs
cd .debs
apt-get download liburing2 liburing-dev libnuma1 libnuma-dev libmetis5 libmetis-dev \
	libutf8proc2 libutf8proc-dev
ls -la
