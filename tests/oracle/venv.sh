#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Creates or updates .venv at the repository root with the test oracle's
# Python packages (tests/oracle/requirements.txt). Idempotent: when .venv
# already matches the requirements it returns at once, printing nothing.
# Exit 0: ready (.venv/bin/python works); 3: the environment cannot be
# built here (no python3/venv, or PyPI unreachable) -- callers skip their
# oracle tests then; anything else: a bug.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv="$root/.venv"
req="$root/tests/oracle/requirements.txt"
stamp="$venv/.hyb-oracle-requirements"

ready() {
	[ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"
}
ready && exit 0

# One builder at a time (parallel test runs share .venv).
lock="${TMPDIR:-/tmp}/hyb-oracle-venv.$(id -u).lock"
exec 9>"$lock" || { echo "venv.sh: cannot create $lock" >&2; exit 3; }
flock 9
ready && exit 0

# After a failed install, do not retry for 10 minutes: a test run calls this
# once per oracle test and should not wait on an unreachable index each time.
failed="$venv/.hyb-oracle-failed"
if [ -f "$failed" ] && [ -n "$(find "$failed" -mmin -10 2>/dev/null)" ]; then
	echo "venv.sh: $(cat "$failed") (cached; remove $failed to retry)" >&2
	exit 3
fi

py=$(command -v python3) || { echo "venv.sh: python3 not found (install python3 python3-venv)" >&2; exit 3; }
log=$(mktemp) || exit 3
trap 'rm -f "$log"' EXIT
if [ ! -x "$venv/bin/python" ]; then
	rm -rf "$venv"
	if ! "$py" -m venv "$venv" >"$log" 2>&1; then
		echo "venv.sh: '$py -m venv' failed (Debian needs python3-venv):" >&2
		tail -n 3 "$log" >&2
		rm -rf "$venv"
		exit 3
	fi
fi
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q --no-input \
		--retries 1 --timeout 20 -r "$req" >"$log" 2>&1; then
	echo "pip could not install tests/oracle/requirements.txt (PyPI unreachable?)" >"$failed"
	echo "venv.sh: $(cat "$failed"):" >&2
	tail -n 3 "$log" >&2
	exit 3
fi
rm -f "$failed"
if ! "$venv/bin/python" -c "import numpy, gguf, openai" >"$log" 2>&1; then
	echo "venv.sh: numpy/gguf/openai installed but do not import:" >&2
	tail -n 3 "$log" >&2
	exit 3
fi
cp "$req" "$stamp"
