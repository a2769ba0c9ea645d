#!/usr/bin/env bash
# Installs what meshtrain needs on Debian/Ubuntu (as root; otherwise prints the exact apt-get line and
# stops), then configures and builds into build/. Sourced by scripts/demo.sh and scripts/test.sh.
# SPDX-License-Identifier: MIT
set -euo pipefail
MT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT_BUILD=${MT_BUILD:-$MT_ROOT/build}

MT_PACKAGES=(build-essential cmake ninja-build pkg-config git openmpi-bin libopenmpi-dev hwloc libhwloc-dev
             libopenblas-dev libdnnl-dev gnuplot-nox python3
             slurm-wlm munge libpmix-dev iproute2 util-linux)  # the last line: the cluster tests (tests/cluster)

mt_missing_packages() {
    local missing=()
    for p in "${MT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    echo "${missing[@]:-}"
}

mt_install_deps() {
    local missing
    missing=$(mt_missing_packages)
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "meshtrain: missing packages. Run this, then run this script again:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y $missing" >&2
        exit 1
    fi
    echo "meshtrain: installing $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

mt_build() {
    local werror=${MT_WERROR:-OFF}
    cmake -S "$MT_ROOT" -B "$MT_BUILD" -G Ninja -DMT_WERROR="$werror" ${MT_CMAKE_ARGS:-} >/dev/null
    cmake --build "$MT_BUILD" -j "$(nproc)"
}

# Open MPI as root and with more ranks than cores (see docs/launching.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
# More ranks than cores here: OpenMP workers must sleep, not spin, between parallel regions.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

mt_install_deps
mt_build
