#!/usr/bin/env bash
# The whole test suite N times in a row (default 5), each on a fresh clone of this repository's HEAD, while another
# process keeps one core busy (the suite must pass on a busy machine). One line per run goes to SUMMARY.
#
#   scripts/suite_busy_core.sh [N] [SUMMARY]      # e.g. scripts/suite_busy_core.sh 5 /tmp/suite.summary
#
# The clones reuse this checkout's .venv (LAZYBATCH_VENV): scripts/test.sh reinstalls lazybatch into it from the
# clone, so run `.venv/bin/python -m pip install -e .` here afterwards. ../shared must sit beside the clones' parent
# where the tests need it (a link to this checkout's ../shared is made).
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
n="${1:-5}"
summary="${2:-/tmp/suite_busy_core.summary}"
work="$(mktemp -d)"
[ -s "$summary" ] || printf '%s\n' \
  "# The whole suite under a busy core (scripts/suite_busy_core.sh: a fresh clone per run, another process spinning on one of the two cores)" \
  "# one line per run: commit, exit status, wall time, pytest's last line" > "$summary"
[ -e "$here/../shared" ] && ln -s "$(cd "$here/../shared" && pwd)" "$work/shared"
for i in $(seq 1 "$n"); do
  rm -rf "$work/clone" && git clone -q "$here" "$work/clone"
  timeout 1500 sh -c 'while :; do :; done' &
  busy=$!
  start=$(date +%s)
  (cd "$work/clone" && LAZYBATCH_VENV="$here/.venv" timeout 1400 bash scripts/test.sh -q -p no:cacheprovider \
    > "$work/run_$i.log" 2>&1)
  rc=$?
  kill "$busy"
  echo "run $i commit=$(git -C "$work/clone" rev-parse --short HEAD) rc=$rc took=$(( $(date +%s) - start ))s" \
    "$(tail -1 "$work/run_$i.log")" >> "$summary"
done
echo "logs in $work; summary in $summary"
