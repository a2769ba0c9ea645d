#!/usr/bin/env bash
# The README's test command: installs what is missing, builds with warnings as errors, and runs the
# whole test suite through ctest. .ci/run calls exactly this.
# SPDX-License-Identifier: MIT
set -euo pipefail
MT_WERROR=ON
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$MT_BUILD"
ctest --output-on-failure -j 2 "$@"
