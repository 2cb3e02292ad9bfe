#!/usr/bin/env bash
# Finish the reference regeneration once `continue.sh` has every row (reference-run/README.md):
# publish the encoders, move the rows into leaderboard/, render the board there, draw the learning
# curves, and regenerate the README's generated sections. `zoo publish` refuses (one line, exit 2)
# while an entry's rows are incomplete, before anything is moved.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
ckpts=reference-run/checkpoints board=reference-run/board
models=robustbench_nacl/files/published/fashion-mnist/models

# 1. where each entry stands, then publish: weights, manifests, learning curves, cards, heads and
#    one row pack into the package; the zoo manifests pinned to the weights
robustbench-nacl zoo status --zoo fashion-mnist --out "$ckpts" --leaderboard "$board" | tail -3
robustbench-nacl zoo publish --zoo fashion-mnist --out "$ckpts" --leaderboard "$board"
robustbench-nacl zoo verify --zoo fashion-mnist --out /nonexistent   # the published copies

# 2. the rows become leaderboard/rows (the first protocol's rows are replaced: git keeps them)
git rm -rq leaderboard/rows
cp -r "$board"/rows leaderboard/rows
git mv -k reference-run/pilot leaderboard/pilot
cp reference-run/leaderboard-README.md leaderboard/README.md   # the prose; step 5 fills its sections

# 3. render (every entry's rows are present: nothing is trained or evaluated, the board is drawn)
ROBUSTBENCH_NACL_WRITE_REFERENCE=1 robustbench-nacl zoo run --zoo fashion-mnist \
    --out robustbench_out/reference --leaderboard leaderboard --workers 2 --rank-by worst_case@0.032
python - <<'EOF'
from robustbench_nacl.io import write_json_atomic
from robustbench_nacl.published import coverage
cover = {k: v for k, v in coverage("fashion-mnist").items() if k != "models"}
note = "the presets the committed rows cover; a preset added later is listed as not in the reference yet"
write_json_atomic("leaderboard/coverage.json", {**cover, "note": note})
EOF

# 4. Fig. S3: the learning curves of SimCLR, ACL and IntCl (3 seeds each), from the published logs
ids=""
for f in simclr acl intcl; do for s in 0 1 2; do ids="$ids convnet_small.${f}_fashion-mnist-0-4_s$s"; done; done
ROBUSTBENCH_NACL_WRITE_REFERENCE=1 robustbench-nacl zoo curves $ids --out "$models" --leaderboard leaderboard

# 5. the README's generated sections (claims, targets, beside the claims)
python -m robustbench_nacl.report.readme leaderboard "$models"

# 6. the mechanical hand steps: the reference test into tests/, tests/test_claims.py without its checks
#    of the first board's hand-written paragraph, the leaderboard README's two sizes
python reference-run/finish_hand.py
ruff check --fix -q tests/test_claims.py
