#!/usr/bin/env bash
# The README's test command: installs what is missing, builds with warnings as errors, runs the whole
# test suite through ctest, then the same suite under ASan + UBSan and each libFuzzer harness for a
# bounded time (scripts/ci-extra.sh). .ci/run calls exactly this. MT_TEST_QUICK=1 stops after the
# first suite; extra arguments go to that ctest run (e.g. -L unit, -R coll).
# SPDX-License-Identifier: MIT
set -euo pipefail
MT_WERROR=ON
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$MT_BUILD"
ctest --output-on-failure -j 2 "$@"
if [ "${MT_TEST_QUICK:-0}" != 1 ]; then
    bash "$MT_ROOT/scripts/ci-extra.sh" all
fi
