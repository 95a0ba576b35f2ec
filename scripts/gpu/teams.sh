#!/usr/bin/env bash
# The second GPU command of a session (after scripts/gpu_suite.py, on the warm machine): the equality repeat
# with the default sampling (num_workers=0), then the background threads' OpenMP teams
# (dgl_oac.engine.runtime.background_team) raced against each other on the node workload, and on the KG one last.
#   run: bash scripts/gpu/teams.sh          (carry wheels; $OUT set by the device machine)
#   rehearsal: DEVICE=cpu QUICK=1 OUT=/tmp/teams bash scripts/gpu/teams.sh
# Every result streams into $OUT (7 files); each part has its own time limit, so a slow part never starves the
# first ones.
set -u
OUT=${OUT:?set OUT}
DEVICE=${DEVICE:-cuda}
export DGLBACKEND=pytorch PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
log "set-up"
python3 scripts/gpu_suite.py --wheels "${WHEELS:-wheels}" --device "$DEVICE" --out /tmp/teams-setup --only pipeline_model \
    --budget 60 > /tmp/teams-setup.log 2>&1
tail -3 /tmp/teams-setup.log >> "$OUT/log.txt"
export PYTHONPATH=/tmp/dgl-oac-gpu-site:$PWD:$PWD/scripts DGL_FFI=ctypes
if [ -n "${QUICK:-}" ]; then
    REPEATS=1; SIZE=(--quick)
else
    REPEATS=6; SIZE=(--prefetch 4 --target-prefetch 4 --priorities auto --steps 24 --warmup 72)
fi
log "equality repeat: sync and oac@4, default loader (num_workers=0), $REPEATS each"
timeout 60 python3 scripts/gpu/equality_repeat.py --device "$DEVICE" --repeats "$REPEATS" --variants sync,oac4 \
    --out "$OUT/repeat.jsonl" > "$OUT/repeat.log" 2>&1; log "rc $?"
B=(python3 benchmarks/bench_modes.py --device "$DEVICE" --no-progress --no-dgl "${SIZE[@]}")
log "node: threads 8 (background teams of 4) and 16 (torch's default: teams of 1)"
timeout 120 "${B[@]}" --workload node-adam-128 --threads 8,16 --rounds 2 --modes sync,async,oac,resident \
    --out /tmp/teams-node.json --stream "$OUT/node_teams.jsonl" >> "$OUT/log.txt" 2>&1; log "rc $?"
log "node: threads 8, DGL_OAC_BACKGROUND_THREADS=1 (the old single thread)"
DGL_OAC_BACKGROUND_THREADS=1 timeout 70 "${B[@]}" --workload node-adam-128 --threads 8 --rounds 2 \
    --modes sync,async,oac --out /tmp/teams-node-bg1.json --stream "$OUT/node_bg1.jsonl" >> "$OUT/log.txt" 2>&1
log "rc $?"
log "node: threads 16, DGL_OAC_BACKGROUND_THREADS=4 (more threads than cores)"
DGL_OAC_BACKGROUND_THREADS=4 timeout 70 "${B[@]}" --workload node-adam-128 --threads 16 --rounds 2 \
    --modes sync,async,oac --out /tmp/teams-node-t16bg4.json --stream "$OUT/node_t16_bg4.jsonl" >> "$OUT/log.txt" 2>&1
log "rc $?"
KG=kg-complex-256-10m
log "KG: threads 8, DGL_OAC_BACKGROUND_THREADS=1 (against the suite's run at teams of 4)"
DGL_OAC_BACKGROUND_THREADS=1 timeout 90 "${B[@]}" --workload "$KG" --threads 8 --rounds 1 --modes oac,async \
    --out /tmp/teams-kg-bg1.json --stream "$OUT/kg_bg1.jsonl" >> "$OUT/log.txt" 2>&1; log "rc $?"
log "done"
