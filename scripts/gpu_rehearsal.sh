#!/usr/bin/env bash
# The GPU machine's software, here, on the CPU: the GPU session then only repeats it (docs/guides/gpu.md).
#
#   bash scripts/gpu_rehearsal.sh                  # the documented command, --device cpu, the default budget
#   bash scripts/gpu_rehearsal.sh --save           # ... and copy its summary and small JSONs into
#                                                  #     benchmarks/results/rehearsal/
#   bash scripts/gpu_rehearsal.sh -- --tiny        # anything after -- goes to gpu_suite.py
#
# 1. Once (cached under $GPU_REHEARSAL_CACHE, default /tmp/dgl-oac-gpu-rehearsal): a venv like the GPU machine's,
#    pyenv's Python 3.12 with torch==2.11.0 (the registry's build of that version is the CUDA one, several GB; it
#    runs on a CPU; it is allowed in this throwaway venv only) and that machine's preinstalled packages.
# 2. The wheel folder at the repository root (git-ignored), made exactly as the guide says, unless it is there.
# 3. The suite, as the GPU command runs it, in a clean environment (env -i): a fresh empty HOME (no cached DGL
#    config), a fresh site folder, --out outside the repository, the default budget, plus --device cpu.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${GPU_REHEARSAL_CACHE:-/tmp/dgl-oac-gpu-rehearsal}
VENV=$CACHE/venv
SAVE=0
if [[ ${1:-} == --save ]]; then SAVE=1; shift; fi
if [[ ${1:-} == -- ]]; then shift; fi
if [[ $# -gt 0 && $1 != --* ]]; then echo "usage: $0 [--save] [-- gpu_suite.py arguments]" >&2; exit 2; fi

# -- 1. the venv -------------------------------------------------------------------------------------------------
MACHINE_PACKAGES=(numpy scipy networkx tqdm psutil pandas requests pytest hypothesis matplotlib torch-geometric)
if [[ ! -f $VENV/.built ]]; then
    mkdir -p "$CACHE"
    PY=$(pyenv root)/versions/3.12.1/bin/python3.12
    [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
    # /etc/xdg/pip caps torch's version for this machine; if the cap refuses 2.11.0, this venv alone skips it
    "$VENV/bin/python" -m pip install -q torch==2.11.0 ||
        PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q torch==2.11.0
    "$VENV/bin/python" -m pip install -q "${MACHINE_PACKAGES[@]}"
    touch "$VENV/.built"
fi

# -- 2. the wheel folder -----------------------------------------------------------------------------------------
WHEELS=$REPO/wheels
if ! compgen -G "$WHEELS/dgl-1.1.3-*.whl" >/dev/null || ! compgen -G "$WHEELS/ogb-1.3.6-*.whl" >/dev/null; then
    mkdir -p "$WHEELS"
    "$VENV/bin/python" -m pip download -q dgl==1.1.3 --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux1_x86_64 -d "$WHEELS"
    "$VENV/bin/python" -m pip download -q ogb==1.3.6 outdated littleutils --no-deps -d "$WHEELS"
fi
echo "wheel folder: $(du -sh "$WHEELS" | cut -f1) (the device tool carries at most 64 MiB with the tree)"

# -- 3. the suite ------------------------------------------------------------------------------------------------
RUN=$(mktemp -d /tmp/dgl-oac-gpu-rehearsal-run.XXXXXX)
mkdir "$RUN/home"
OUT=$RUN/gpu
cd "$REPO"
start=$(date +%s)
rc=0
env -i HOME="$RUN/home" PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 \
    DGLBACKEND=pytorch python3 scripts/gpu_suite.py --wheels wheels --out "$OUT" --site "$RUN/site" \
    --device cpu "$@" || rc=$?
wall=$(( $(date +%s) - start ))
echo "rehearsal: the suite exited $rc after $wall s (the documented timeout_s is 400); its files: $OUT"

if [[ $SAVE == 1 ]]; then  # everything but the log (its tail per step is in summary.json)
    DEST=$REPO/benchmarks/results/rehearsal
    mkdir -p "$DEST"
    rm -f "$DEST"/*.json "$DEST"/*.jsonl
    for f in "$OUT"/*.json "$OUT"/*.jsonl; do cp "$f" "$DEST/"; done
    "$VENV/bin/python" scripts/gpu/normalize_paths.py "$DEST"  # this machine's paths as placeholders
    printf '{"wall_s": %d, "suite_rc": %d, "args": "%s"}\n' "$wall" "$rc" "$*" > "$DEST/rehearsal.json"
    echo "saved: $(ls "$DEST")"
fi
exit $rc
