#!/usr/bin/env bash
# kill -9 of one of 4 ranks mid-step (the fault knob: rank 2 dies at step 4) in a job that checkpoints
# every step: the job ends within the limit and names rank 2, the checkpoint of step 3 is complete and
# `latest`, and the same command resumes from it and finishes.
#   kill_resume.sh MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/train_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../jobs/train_lib.sh"
train_setup kill_resume "$@"
args=(train --parallel.tp=1 --train.steps=6 --train.eval_every=0 --metrics.jsonl= --checkpoint.dir="$dir/ck"
      --checkpoint.every=1 --checkpoint.resume=auto --runtime.watchdog_s=20)
status=0
start=$(date +%s)
MESHTRAIN_TEST_KILL_STEP=4 MESHTRAIN_TEST_FAULT_RANK=2 timeout 60 "$mpiexec" -n 4 "${flags[@]}" "$bin" "${args[@]}" \
    >"$dir/out1" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
grep -v " = " "$dir/out1" | tail -n 15
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "kill_resume: the killed job exited $rc (expected a failure, not a hang)"; status=1
fi
if ! grep -Eq "process rank 2 |Process name: .*,2.$|rank 2 kills itself" "$dir/out1"; then
    echo "kill_resume: the output does not name rank 2"; status=1
fi
[ "$elapsed" -le 30 ] || { echo "kill_resume: took ${elapsed}s"; status=1; }
if [ "$(cat "$dir/ck/latest" 2>/dev/null)" != "step-00000003" ]; then
    echo "kill_resume: latest is '$(cat "$dir/ck/latest" 2>/dev/null)', expected step-00000003"; status=1
fi
timeout 60 "$mpiexec" -n 4 "${flags[@]}" "$bin" "${args[@]}" >"$dir/out2" 2>&1
rc2=$?
grep -v " = " "$dir/out2" | tail -n 8
[ "$rc2" -eq 0 ] || { echo "kill_resume: the resumed job exited $rc2"; status=1; }
grep -q "resumed from checkpoint $dir/ck/step-00000003 (after step 3)" "$dir/out2" \
    || { echo "kill_resume: did not resume from step 3"; status=1; }
grep -q "^done: 6 steps" "$dir/out2" || { echo "kill_resume: the resumed job did not finish 6 steps"; status=1; }
echo "kill_resume: killed job ${elapsed}s, exit $rc; resumed exit $rc2: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
