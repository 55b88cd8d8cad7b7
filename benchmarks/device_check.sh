#!/usr/bin/env bash
# One short GPU check of gtopk-lab, for a single call of the workplace's device tool
# (one NVIDIA H200, 16 cores, no internet), run from the repository root:
#
#     bash benchmarks/device_check.sh            # with carry [".whl"]; logs into $OUT
#
# Stages, each under `timeout`, continuing past failures, everything logged to
# $OUT/device_check.log (default OUT=/tmp/out):
#   wheels   install the carried wheels of .whl/ (dask, distributed, tornado, ... which the
#            machine lacks) into /tmp/site; PYTHONPATH=/tmp/site:<repo> (gtopk_lab is not
#            pip-installed there)
#   info     nvidia-smi, python / torch / package versions, cores
#   net-1g   `benchmarks/collectives.py collectives --workers 2,4,8 --numel 25M --density 0.001
#            --bandwidth 1Gbps --repeats 9`: issue 3's model fidelity with ranks <= cores (gloo
#            on CPU); NET_RUNS (default 2) runs of it, to show the run-to-run spread
#   net-1gbe the same on the paper's 1GbE constants (--bandwidth 1GbE)
#   header   benchmarks/header_latency.py --delay 1ms --workers 2,4 --k 1000: count header vs
#            exact-k rounds under tc netem in a network namespace (skipped without unshare/tc)
#   pytest   tests/test_merge.py tests/test_selection.py (they hold the CUDA-only tests;
#            fails when CUDA is present but the CUDA tests were skipped)
#   select   benchmarks/gpu_selection.py: torch.topk vs every selector, merge_sparse (gamma),
#            25M and 100M at density 0.001 -> $OUT/gpu_selection.json
#   smoke    benchmarks/gpu_nccl_smoke.py: NCCL P=1, gloo P=2/4 with cuda:0 inputs, NCCL P=2
#            on one GPU (reported only) -> $OUT/gpu_nccl_smoke.json
#   dask-gpu `gtopk-lab run --device cuda --workers 1` on an embedded LocalCluster (NCCL, P=1)
#            -> $OUT/gpu_run/<run_id>/ (--device cuda gives the embedded workers a GPU resource)
#   net-cal  `gtopk-lab calibrate` (gloo, 2 ranks), then the same benchmark on the fitted link
#   dask-cpu the same with --device cpu --workers 4 (gloo) -> $OUT/cpu_run_summary.json
#
# STAGES (default: all, in the order below) picks stages by name, e.g. STAGES="info pytest
# net-1g"; wheels always runs.
#
# Without CUDA the GPU stages say so and run as CPU dry runs of the scripts, or are skipped.
# The whole script keeps to BUDGET_S seconds (default 480): each stage's timeout is cut to
# what is left, and a stage is skipped when under 15 s are left. Exit code 1 when a stage
# failed, else 0. At most 7 files are written under $OUT (the device tool returns 8).
set -u -o pipefail

OUT="${OUT:-/tmp/out}"
BUDGET_S="${BUDGET_S:-480}"
STAGES="${STAGES:-info pytest select smoke dask-gpu net-1g net-1gbe header net-cal dask-cpu}"
NET_RUNS="${NET_RUNS:-2}"
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.." || exit 1
REPO="$PWD"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
SUMMARY=()
FAILED=0

elapsed() { echo $(( $(date +%s) - T0 )); }

# stage NAME TIMEOUT_S CMD...: run CMD under timeout (cut to the budget left), record the outcome
stage() {
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  local left=$(( BUDGET_S - $(elapsed) ))
  echo
  echo "===== [$name] t=$(elapsed)s, limit ${limit}s, budget left ${left}s: $*"
  if (( left < 15 )); then
    echo "----- [$name] SKIP: under 15 s of the ${BUDGET_S} s budget left"
    SUMMARY+=("$(printf '%-9s %-5s %5s  %s' "$name" SKIP - "budget spent")")
    return 0
  fi
  (( limit > left )) && limit=$left
  local s
  s=$(date +%s)
  # bash -c: the command may be one of the exported functions below; timeout signals the
  # whole process group (spawned ranks and Dask workers included)
  timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@"
  local rc=$?
  local took=$(( $(date +%s) - s )) status=ok
  if (( rc == 124 || rc == 137 )); then status=TIMEOUT; FAILED=1
  elif (( rc != 0 )); then status=FAIL; FAILED=1; fi
  echo "----- [$name] $status (rc=$rc) in ${took}s"
  SUMMARY+=("$(printf '%-9s %-7s %5ss  rc=%s' "$name" "$status" "$took" "$rc")")
}

# wanted NAME: NAME is in STAGES (wheels always is)
wanted() {
  [[ $1 == wheels || " $STAGES " == *" $1 "* ]]
}

skip() {
  wanted "$1" || return 0
  echo
  echo "===== [$1] SKIP: $2"
  SUMMARY+=("$(printf '%-9s %-7s %5s  %s' "$1" SKIP - "$2")")
}

# ------------------------------------------------------------------------------------------
install_wheels() {
  shopt -s nullglob
  local wheels=(.whl/*.whl)
  shopt -u nullglob
  if (( ${#wheels[@]} == 0 )); then
    echo "no .whl/*.whl here: using the packages the machine has"
    return 0
  fi
  printf '  %s\n' "${wheels[@]##*/}"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "${wheels[@]}"
}

info() {
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cores (nproc): $(nproc)  uname -m: $(uname -m)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  else
    echo "nvidia-smi: not on PATH (no NVIDIA driver here)"
  fi
  echo "python3: $(command -v "$PY")"
  "$PY" - <<'EOF'
import importlib, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuda available", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
      "| NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "-",
      "| torch threads", torch.get_num_threads())
for name in ("numpy", "pandas", "pyarrow", "dask", "distributed", "tornado", "msgpack", "cloudpickle",
             "zict", "tblib", "mnist1d", "sklearn", "pytest", "gtopk_lab"):
    try:
        mod = importlib.import_module(name)
        print(f"  {name:<12} {getattr(mod, '__version__', '?'):<14} {getattr(mod, '__file__', '')}")
    except Exception as exc:  # noqa: BLE001
        print(f"  {name:<12} MISSING        {type(exc).__name__}: {exc}")
EOF
}

run_pytest() {
  local tmp
  tmp=$(mktemp)
  "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_merge.py tests/test_selection.py 2>&1 | tee "$tmp"
  local rc=$?
  if (( rc == 0 && HAVE_CUDA == 1 )) && grep -q "needs CUDA" "$tmp"; then
    echo "CUDA is available but the CUDA tests were skipped"
    rc=1
  fi
  rm -f "$tmp"
  return $rc
}

# check_run SUMMARY_JSON DEVICE BACKEND: the run completed on the expected device and backend
check_run() {
  "$PY" - "$@" <<'EOF'
import json, sys
path, device, backend = sys.argv[1:4]
s = json.load(open(path))
keys = ("status", "device", "backend", "workers", "iterations", "final_train_loss", "final_test_accuracy",
        "wall_time_s", "samples_per_s_wall", "bytes_sent_per_rank_per_iter")
print("summary:", {k: s.get(k) for k in keys})
ok = s.get("status") == "completed" and str(s.get("device", "")).startswith(device) and s.get("backend") == backend
if s.get("error"):
    print("error:", str(s["error"])[:2000])
print("run check:", "ok" if ok else f"FAILED (expected status completed, device {device}, backend {backend})")
sys.exit(0 if ok else 1)
EOF
}

run_select() {
  "$PY" benchmarks/gpu_selection.py --device cuda --numel 25M,100M --density 0.001 --repeats 5 \
      --json >"$OUT/gpu_selection.json" || { local rc=$?; cat "$OUT/gpu_selection.json"; return $rc; }
  "$PY" - "$OUT/gpu_selection.json" <<'EOF'
import json, sys
sys.path.insert(0, "benchmarks")
from gpu_selection import print_table
data = json.load(open(sys.argv[1]))
print_table(data["meta"], data["rows"])
EOF
}

dask_gpu() {
  rm -rf "$OUT/gpu_run"
  "$PY" -m gtopk_lab.cli run --device cuda --workers 1 \
      --method gtopk --model cnn_wide --density 0.01 --epochs 1 --max-iterations 60 \
      --out "$OUT/gpu_run" --no-progress --timeout 60 --json || return $?
  local summary
  summary=$(ls -t "$OUT"/gpu_run/*/summary.json | head -1)
  check_run "$summary" cuda nccl
}

dask_cpu() {
  local out=/tmp/device_check_cpu_run
  rm -rf "$out"
  "$PY" -m gtopk_lab.cli run --device cpu --workers 4 \
      --method gtopk --model cnn_wide --density 0.01 --epochs 1 --max-iterations 40 \
      --out "$out" --no-progress --timeout 60 --json
  local rc=$? summary
  summary=$(ls -t "$out"/*/summary.json 2>/dev/null | head -1)
  [[ -n "$summary" ]] && cp "$summary" "$OUT/cpu_run_summary.json"
  (( rc != 0 )) && return $rc
  check_run "$summary" cpu gloo
}

# issue 3's model-fidelity benchmark where ranks <= cores (16 here vs 2 on the dev boxes)
net_1g() {
  local run rc=0
  for (( run = 1; run <= NET_RUNS; run++ )); do
    echo "--- run $run of $NET_RUNS"
    "$PY" benchmarks/collectives.py collectives --workers 2,4,8 --numel 25M --density 0.001 \
        --bandwidth 1Gbps --repeats 9 || rc=$?
  done
  return $rc
}

net_1gbe() {
  "$PY" benchmarks/collectives.py collectives --workers 2,4,8 --numel 25M --density 0.001 \
      --bandwidth 1GbE --repeats 9
}

# count header vs exact-k rounds on a loopback with real latency (netem, own network namespace)
header() {
  "$PY" benchmarks/header_latency.py --delay 1ms --workers 2,4 --k 1000 --repeats 9
}

net_cal() {
  "$PY" -m gtopk_lab.cli calibrate --workers 2 --repeats 20 --out /tmp/device_cal.json || return $?
  "$PY" benchmarks/collectives.py collectives --workers 2,4,8 --numel 25M --density 0.001 \
      --bandwidth /tmp/device_cal.json --repeats 5
}

export -f install_wheels info run_pytest check_run run_select dask_gpu dask_cpu net_1g net_1gbe header net_cal
export OUT PY REPO NET_RUNS

# ------------------------------------------------------------------------------------------
main() {
  local commit
  commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "? (no .git)")
  echo "gtopk-lab device check: repo $REPO, commit $commit, OUT=$OUT, budget ${BUDGET_S}s, stages: $STAGES"
  stage wheels 60 install_wheels
  if [[ -d /tmp/site ]] && compgen -G ".whl/*.whl" >/dev/null; then
    export PYTHONPATH="/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  fi
  echo "PYTHONPATH=$PYTHONPATH"
  stage info 60 info
  if timeout 60 "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    export HAVE_CUDA=1
  else
    export HAVE_CUDA=0
    echo
    echo "!!!!! no CUDA device visible to torch: the GPU stages run as CPU dry runs or are skipped"
  fi
  stage pytest 150 run_pytest
  if (( HAVE_CUDA )); then
    stage select 150 run_select
    stage smoke 200 "$PY" benchmarks/gpu_nccl_smoke.py --json "$OUT/gpu_nccl_smoke.json"
    stage dask-gpu 150 dask_gpu
  else
    stage select 60 "$PY" benchmarks/gpu_selection.py --device cpu --numel 1M --repeats 2
    stage smoke 120 "$PY" benchmarks/gpu_nccl_smoke.py --device cpu --numel 20000 \
        --json "$OUT/gpu_nccl_smoke.json"
    skip dask-gpu "no CUDA device"
  fi
  stage net-1g $(( 120 * NET_RUNS )) net_1g
  stage net-1gbe 120 net_1gbe
  if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null && command -v tc >/dev/null; then
    stage header 90 header
  else
    skip header "needs root, unshare and tc (iproute2)"
  fi
  stage net-cal 120 net_cal
  stage dask-cpu 150 dask_cpu
  echo
  echo "===== summary (total $(elapsed)s; HAVE_CUDA=$HAVE_CUDA)"
  printf '%s\n' "${SUMMARY[@]}"
  echo "files in $OUT:"
  (cd "$OUT" && find . -type f | sort)
  return $FAILED
}

export HAVE_CUDA=0
main 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
