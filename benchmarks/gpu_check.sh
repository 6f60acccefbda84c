#!/usr/bin/env bash
# The GPU check: with a CUDA device, every CUDA test (pytest -m cuda), the ImageNet-size
# probe (benchmarks/bench_probe_imagenet.py), bench_fit.py (the GPU rows and the CPU peer),
# bench_cv.py (where it exists), bench_cosine.py (the cosine head's two solvers),
# bench_extract.py (timm; open_clip too where it is installed), each under its own time limit and 5 minutes in all (a rerun fits in a
# 15-minute device lease with the machine's start), collected into one JSON file. Without
# CUDA it says so, writes why into that file and exits 0; an interpreter that cannot
# import torch exits 1. Run it from anywhere; the project need not be installed
# (PYTHONPATH is set):
#
#     bash benchmarks/gpu_check.sh                    # writes runs/gpu_check.json
#     bash benchmarks/gpu_check.sh /tmp/check.json    # another file
#
# PYTHON picks the interpreter (default: .venv/bin/python if it imports torch, else
# python3); BENCH_CV_ARGS replaces bench_cv.py's arguments (default: the GPU rows alone);
# GPU_CHECK_COMMIT names the commit where the tree has no .git (a copy on another
# machine). Logs and each section's own JSON go to runs/gpu_check/. Exit status: 0 when
# every section that ran succeeded and a CUDA test passed, 1 otherwise.
set -uo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../runs/gpu_check.json}")
cd "$(dirname "$0")/.."
root=$PWD
if [[ -z "${PYTHON:-}" ]]; then
    # A virtual environment made on another machine may not run here: python3 then.
    PYTHON=python3
    if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null; then
        PYTHON=.venv/bin/python
    fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

no_check() { # reason exit_status: say why nothing ran, in the results file too
    echo "gpu_check: $1; nothing to run."
    local reason=${1//[$'\t\n\r']/ } # JSON: no control characters, \ and " escaped
    reason=${reason//\\/\\\\}
    mkdir -p "$(dirname "$out")"
    printf '{"ran": false, "ok": false, "reason": "%s"}\n' "${reason//\"/\\\"}" >"$out"
    exit "$2"
}

"$PYTHON" -c "
import sys
try:
    import torch
except ImportError:
    sys.exit(3)
sys.exit(0 if torch.cuda.is_available() else 4)" 2>/dev/null
case $? in
    0) ;;
    4) no_check "no CUDA device found (torch.cuda.is_available() is False)" 0 ;;
    3) no_check "$PYTHON cannot import torch" 1 ;;
    *) no_check "$PYTHON does not run" 1 ;;
esac
if ! "$PYTHON" -c "import mr2_probe, extract"; then
    no_check "cannot import mr2_probe and extract from $root with $PYTHON" 1
fi

logs=runs/gpu_check
rm -rf "$logs" && mkdir -p "$logs"
sections=$logs/sections.tsv
: >"$sections"
total_limit=300 # seconds: 5 minutes, so that a rerun fits in a 15-minute device lease
start=$SECONDS

skip() { # name reason
    echo "== $1: skipped: $2"
    printf '%s\tskipped\t\t\t\t\t\t%s\n' "$1" "$2" >>"$sections"
}

section() { # name limit_s json_path command...
    local name=$1 limit=$2 json=$3
    shift 3
    local left=$((total_limit - (SECONDS - start)))
    if ((left < 15)); then
        skip "$name" "no time left of the check's ${total_limit} s"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit status $rc after $((SECONDS - t0)) s"
    printf '%s\tran\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" \
        "$json" "$logs/$name.log" "$*" >>"$sections"
}

section pytest_cuda 90 "" "$PYTHON" -m pytest -m cuda -q -rfEs -p no:cacheprovider \
    --continue-on-collection-errors --junitxml="$logs/pytest_cuda.xml"
section probe_imagenet 60 "$logs/probe_imagenet.json" \
    "$PYTHON" benchmarks/bench_probe_imagenet.py --json "$logs/probe_imagenet.json"
# The GPU rows and their CPU peer (scikit-learn); the CPU rows of MR2 come from the CPU
# machine (docs/speed.md). The JSON is written after each row.
section bench_fit 100 "$logs/bench_fit.json" "$PYTHON" benchmarks/bench_fit.py \
    --n-samples 20000 --repeat 1 --tilts 5 --devices cuda --json "$logs/bench_fit.json"
if [[ -f benchmarks/bench_cv.py ]]; then
    # The GPU rows alone (batched and fold by fold) at the script's default size; the CPU
    # peers' figures come from the CPU machine (docs/speed.md).
    # shellcheck disable=SC2086 # BENCH_CV_ARGS is a list of words
    section bench_cv 45 "$logs/bench_cv.json" \
        "$PYTHON" benchmarks/bench_cv.py ${BENCH_CV_ARGS:---skip lrcv --skip grid --skip cpu} \
        --json "$logs/bench_cv.json"
else
    skip bench_cv "benchmarks/bench_cv.py does not exist in this tree"
fi
# The cosine head on the GPU: its L-BFGS on the unit spheres (which the estimator takes on
# a CPU only, until measured here) against the rounds of torch's L-BFGS, beside the linear
# head and scikit-learn (CPU).
section bench_cosine 40 "$logs/bench_cosine.json" "$PYTHON" benchmarks/bench_cosine.py \
    --device cuda --spheres --n-features 1024 --no-before --no-equivalent \
    --json "$logs/bench_cosine.json"
# Folder and Parquet (the device's image has no webdataset package to write shards with).
section extract_timm 60 "$logs/extract_timm.json" "$PYTHON" benchmarks/bench_extract.py \
    --backbone timm:resnet50@random --image-size 224 --source-size 256 --n-images 512 \
    --batch-size 128 --workers 4 --sources folder,parquet --json "$logs/extract_timm.json"
if "$PYTHON" -c "import open_clip" 2>/dev/null; then
    section extract_open_clip 45 "$logs/extract_open_clip.json" \
        "$PYTHON" benchmarks/bench_extract.py --backbone open_clip:ViT-B-32@random \
        --image-size 224 --source-size 256 --n-images 512 --repeats 1 --batch-size 128 \
        --workers 4 --sources folder --json "$logs/extract_open_clip.json"
else
    skip extract_open_clip "open_clip is not installed: the open_clip extraction benchmark is skipped"
fi

"$PYTHON" benchmarks/gpu_check_report.py "$sections" "$logs/pytest_cuda.xml" "$out" \
    "$((SECONDS - start))"
