#!/usr/bin/env bash
# Builds what bench/gpu_check.sh runs, here, and packs the run-time libraries it needs that a bare GPU machine
# may lack (Open MPI with its plugins and help files, PMIx, hwloc, OpenBLAS, libgfortran, the CUDA runtime),
# so that a GPU machine with only a driver, cuBLAS and NCCL can run `MT_GPU_CHECK_PREBUILT=1 gpu_check.sh`
# without compilers or MPI headers. glibc, libstdc++ and the large CUDA libraries (cuBLAS, cuBLASLt, NCCL,
# the driver) are not packed: gpu_check finds them on the GPU machine.
#   usage: bench/gpu_pack.sh
#   output: build-gpu-check/ (Release, sm_90) and build-gpu-deps/mtdeps.tar.xz, both under the source tree
#   and ignored by git; docs/gpu.md "Running gpu_check on a machine without MPI".
# SPDX-License-Identifier: MIT
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MT_GPU_CHECK_BUILD:-$SRC/build-gpu-check}
OUTDIR=$SRC/build-gpu-deps
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DMT_WERROR=OFF \
    >"$OUTDIR.configure.log" 2>&1 || {
    echo "gpu_pack: configure failed, see $OUTDIR.configure.log" >&2
    exit 1
}
grep -q "CUDA=1" "$OUTDIR.configure.log" || {
    echo "gpu_pack: this configure did not enable CUDA (nvcc not found?), see $OUTDIR.configure.log" >&2
    exit 1
}
# the same list as gpu_check.sh
cmake --build "$BUILD" -j "$(nproc)" --target test_cuda_alloc test_gpu_ops test_cuda_alloc_device test_nvml \
    test_gpt2_cuda test_job_cuda test_tensor_cuda test_device_cuda test_coll_nccl gpu_bench meshtrain

ORTERUN=$(command -v orterun || true)
[ -n "$ORTERUN" ] || {
    echo "gpu_pack: no orterun on PATH: the packed runtime is Open MPI's (apt-get install openmpi-bin)" >&2
    exit 1
}
OMPI_LIBDIR=$(ompi_info --path libdir --parsable | sed -n 's/^path:libdir://p')
OMPI_PKGLIB=$(ompi_info --path pkglibdir --parsable | sed -n 's/^path:pkglibdir://p')
OMPI_PKGDATA=$(ompi_info --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p')
OMPI_PREFIX=$(ompi_info --path prefix --parsable | sed -n 's/^path:prefix://p')
PMIX_PLUGINS=$(ldd "$OMPI_PKGLIB"/mca_pmix_ext3x.so 2>/dev/null | awk '/libpmix/ { print $3 }' || true)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/mtdeps
mkdir -p "$R/lib"

# Open MPI's tree under its own prefix (relocated on the GPU machine with OPAL_PREFIX), PMIx's plugins and help
copy_tree() { # copy_tree DIR: DIR (absolute) into the stage under the same path, links followed
    [ -d "$1" ] || return 0
    mkdir -p "$R$(dirname "$1")"
    cp -rL "$1" "$R$1"
}
copy_tree "$OMPI_LIBDIR"
copy_tree "$OMPI_PKGLIB"
copy_tree "$OMPI_PKGDATA"
mkdir -p "$R$OMPI_PREFIX/bin"
cp -L "$ORTERUN" "$R$OMPI_PREFIX/bin/orterun"
ln -sf orterun "$R$OMPI_PREFIX/bin/mpiexec"
[ -x "$OMPI_PREFIX/bin/orted" ] && cp -L "$OMPI_PREFIX/bin/orted" "$R$OMPI_PREFIX/bin/orted"
PMIX_PLUGIN_DIR=
if [ -n "$PMIX_PLUGINS" ]; then
    PMIX_PLUGIN_DIR=$(dirname "$(readlink -f "$PMIX_PLUGINS")")/pmix
    [ -d "$PMIX_PLUGIN_DIR" ] || PMIX_PLUGIN_DIR=
    [ -n "$PMIX_PLUGIN_DIR" ] && copy_tree "$PMIX_PLUGIN_DIR"
    [ -d /usr/share/pmix ] && copy_tree /usr/share/pmix
fi

# every shared library the binaries and the plugins load, but glibc's own, the C++ runtime and the CUDA
# libraries the GPU machine has (its driver's libcuda, cuBLAS, NCCL)
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so'
SKIP+='|libstdc\+\+|libgcc_s|libcuda\.so|libcublas|libcublasLt|libnccl|libnvidia)'
OBJS=("$BUILD/meshtrain" "$BUILD/bench/gpu_bench" "$ORTERUN")
while IFS= read -r f; do OBJS+=("$f"); done < <(find "$BUILD/tests" -maxdepth 2 -type f -perm -u+x -name 'test_*')
while IFS= read -r f; do OBJS+=("$f"); done < <(find "$R" -name '*.so' -type f)
for o in "${OBJS[@]}"; do
    ldd "$o" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    if [[ ! $name =~ $SKIP ]]; then cp -L "$path" "$R/lib/$name"; fi
done
# the OpenBLAS the binaries link is often an alternatives link: the file it resolves to was copied above

cat >"$R/env.sh" <<EOF
# sourced by gpu_check.sh: the packed runtime, relocated to the directory this file is in
MT_PACKED=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=\$MT_PACKED$OMPI_PREFIX
export PMIX_INSTALL_PREFIX=\$MT_PACKED$OMPI_PREFIX
${PMIX_PLUGIN_DIR:+export PMIX_MCA_mca_base_component_path=\$MT_PACKED$PMIX_PLUGIN_DIR}
export LD_LIBRARY_PATH=\$MT_PACKED/lib:\$MT_PACKED$OMPI_LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PATH=\$MT_PACKED$OMPI_PREFIX/bin:\$PATH
export OMPI_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
export MT_PACKED_MPIEXEC=\$MT_PACKED$OMPI_PREFIX/bin/orterun
EOF
mkdir -p "$OUTDIR"
tar -C "$STAGE" -cJf "$OUTDIR/mtdeps.tar.xz" mtdeps
echo "gpu_pack: $BUILD ($(du -sh "$BUILD" | cut -f1)), $OUTDIR/mtdeps.tar.xz ($(du -sh "$OUTDIR/mtdeps.tar.xz" |
    cut -f1), $(find "$R/lib" -type f | wc -l) libraries)"
