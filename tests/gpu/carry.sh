#!/bin/sh
# SPDX-License-Identifier: MIT
# Run here (a machine with Debian's package registry), in the project root,
# before a session on a GPU machine: downloads the libraries hyb links against
# into .debs/ (git-ignored) for the device tool to carry (carry: [".debs"]).
# On the GPU machine: sh tests/gpu/setup.sh && make test-gpu && make bench-gpu
set -e
mkdir -p .debs
cd .debs
apt-get download liburing2 liburing-dev libnuma1 libnuma-dev libmetis5 libmetis-dev \
	libutf8proc2 libutf8proc-dev
ls -la
