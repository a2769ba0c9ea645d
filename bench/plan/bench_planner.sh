#!/bin/bash
# The planner's timing validation on this machine (docs/PERFORMANCE.md, "Planner"): for each layout of
# bench/plan/gpt2-cpu.toml, run `meshtrain train` REPS times, take the median step time (steps 6-20 of each
# run, then the median over runs), and compare with `meshtrain plan --cluster launch/clusters/cpu-dev.toml`'s
# prediction for that layout. Prints one row per layout and the predicted best against the measured best.
#   bench/plan/bench_planner.sh [REPS]        (from the repository root, after building into build/)
# The machine is shared with other work: repeat, read medians, and expect noise.
set -euo pipefail
REPS=${1:-3}
BIN=./build/meshtrain
JOB=bench/plan/gpt2-cpu.toml
CLUSTER=launch/clusters/cpu-dev.toml
export OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# layouts: "world | overrides" (world 1 runs without mpirun)
LAYOUTS=(
  "1|--train.micro_batch=1"
  "1|--train.micro_batch=2"
  "1|--train.micro_batch=4"
  "1|--train.micro_batch=8"
  "1|--train.micro_batch=16"
  "1|--train.micro_batch=2 --model.attn_recompute=true"
  "1|--train.micro_batch=8 --model.attn_recompute=true"
  "1|--train.micro_batch=16 --model.attn_recompute=true"
  "1|--train.micro_batch=2 --model.recompute=block"
  "1|--train.micro_batch=8 --model.recompute=block"
  "1|--train.micro_batch=16 --model.recompute=block"
  "1|--train.micro_batch=16 --model.recompute=block --model.attn_recompute=true"
)
if [ -n "${PLAN_BENCH_MULTI:-}" ]; then # multi-rank layouts (need a build whose train runs dp/tp/pp > 1)
  LAYOUTS+=(
    "2|--parallel.engine=ddp --train.micro_batch=8"
    "2|--parallel.engine=zero --parallel.zero_stage=1 --train.micro_batch=8"
    "4|--parallel.engine=ddp --train.micro_batch=4"
    "2|--parallel.tp=2 --train.micro_batch=16 --optimizer.grad_clip=0"
    "2|--parallel.pp=2 --train.micro_batch=4 --optimizer.grad_clip=0"
  )
fi

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

printf "%-70s %12s %12s %8s\n" "layout (world | overrides)" "predicted ms" "measured ms" "error"
best_pred="" best_pred_ms=1e30 best_meas="" best_meas_ms=1e30
declare -A MEAS PRED
for L in "${LAYOUTS[@]}"; do
  world=${L%%|*}; ov=${L#*|}
  runs=()
  for r in $(seq "$REPS"); do
    if [ "$world" = 1 ]; then
      $BIN train $JOB $ov --train.log_every=1 > "$OUT/run.txt" 2>&1
    else
      mpirun -np "$world" --oversubscribe --bind-to none $BIN train $JOB $ov --train.log_every=1 > "$OUT/run.txt" 2>&1
    fi
    runs+=("$(grep -E '^step +[0-9]+/' "$OUT/run.txt" | grep -v 'val loss' | awk -F'|' 'NR>5 {print $(NF-1)}' \
              | sed 's/ ms//' | median)")
  done
  meas=$(printf "%s\n" "${runs[@]}" | median)
  pred=$($BIN plan $JOB $ov --cluster $CLUSTER --world "$world" --json --top 100000 | python3 -c '
import json, sys
want = dict(kv.lstrip("-").split("=", 1) for kv in sys.argv[1].split())
d = json.load(sys.stdin)
b = int(want.get("train.micro_batch", 0))
rc = ("block" if want.get("model.recompute") == "block" else "") 
attn = want.get("model.attn_recompute") == "true"
rcname = {("", False): "none", ("", True): "attn", ("block", False): "block", ("block", True): "block+attn"}[(rc, attn)]
tp = int(want.get("parallel.tp", 1)); pp = int(want.get("parallel.pp", 1))
eng = want.get("parallel.engine", "ddp")
if eng == "zero": eng = "zero-" + want.get("parallel.zero_stage", "1")
if tp > 1 or pp > 1: eng = "allreduce"
for l in d["layouts"]:
    if l["micro_batch"] == b and l["recompute"] == rcname and l["tp"] == tp and l["pp"] == pp and l["engine"] == eng \
       and not l["sequence_parallel"] and l["schedule"] == "1f1b":
        print("%.3f" % l["time_ms"]["step"]); break
' "$ov")
  err=$(python3 -c "print('%+.1f%%' % (100*($pred-$meas)/$meas))")
  printf "%-70s %12s %12s %8s\n" "$world | $ov" "$pred" "$meas" "$err"
  if python3 -c "import sys; sys.exit(0 if $pred < $best_pred_ms else 1)"; then best_pred_ms=$pred; best_pred="$world | $ov"; fi
  if python3 -c "import sys; sys.exit(0 if $meas < $best_meas_ms else 1)"; then best_meas_ms=$meas; best_meas="$world | $ov"; fi
  MEAS["$world | $ov"]=$meas
done
echo "predicted best: $best_pred (predicted $best_pred_ms ms, measured ${MEAS[$best_pred]} ms)"
echo "measured best:  $best_meas ($best_meas_ms ms); the predicted best is $(python3 -c "print('%+.1f%%' % (100*(${MEAS[$best_pred]}-$best_meas_ms)/$best_meas_ms))") slower"
