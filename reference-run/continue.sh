#!/usr/bin/env bash
# Resume the reference regeneration (reference-run/README.md): train what is not trained, evaluate what
# is not evaluated (SLF for every encoder first, then ALF, then AFF), render the board. Safe to kill and
# rerun: finished checkpoints and rows are kept. Run it from a non-editable install in a venv of its own
# (python -m venv V && V/bin/pip install . && PATH=V/bin:$PATH reference-run/continue.sh): the worker
# processes import the package when they start, and an editable install would hand them whatever the
# checkout holds at that moment.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
exec robustbench-nacl zoo run --zoo fashion-mnist --out reference-run/checkpoints \
    --leaderboard reference-run/board --workers 2 --rank-by worst_case@0.032 "$@"
