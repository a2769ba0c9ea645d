#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the default training job
# (launch/configs/demo.toml, embedded in the binary) on 4 ranks of this machine.
# SPDX-License-Identifier: MIT
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$MT_ROOT"
np=${MT_DEMO_RANKS:-4}
echo "meshtrain: running the default job on $np ranks: mpirun -np $np build/meshtrain train"
mpirun -np "$np" --oversubscribe --bind-to none build/meshtrain train "$@"
