/* The caching allocator on a real device: blocks are usable device memory, a training-like loop reaches a
 * steady state without cudaMalloc/cudaFree, device accounting by category matches, empty_cache returns
 * memory to the driver, and an impossible request fails with MT_ERR_OOM and a report instead of aborting.
 * Exits 77 printing "skipped: no CUDA device" without a device.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include <cuda_runtime_api.h>

#include "models/cuda/mt_cuda.h"
#include "runtime/cuda_alloc.h"
#include "testutil.h"

int main(void) {
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return MT_TEST_SKIP;
    }
    mt_cuda_alloc_t a;
    CHECK_OK(mt_cuda_alloc_default(&a));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
    static const size_t sizes[] = {4096, 3 << 20, 77 << 20, 123, 1 << 20, 300 << 20};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    void *p[NS];
    mt_cuda_alloc_stats_t st;
    int64_t raw_after_first = 0;
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < NS; i++) {
            CHECK_OK(mt_cuda_alloc_malloc(a, &p[i], sizes[i], (mt_mem_cat_t)(i % MT_MEM_NCAT), "loop", s));
            CHECK(cudaMemsetAsync(p[i], i + 1, sizes[i], s) == cudaSuccess, "block %d is device memory", i);
        }
        unsigned char probe = 0;
        CHECK(cudaMemcpyAsync(&probe, (char *)p[2] + sizes[2] - 1, 1, cudaMemcpyDeviceToHost, s) == cudaSuccess, "rd");
        CHECK(cudaStreamSynchronize(s) == cudaSuccess && probe == 3, "last byte of block 2 written (%u)", probe);
        for (int i = 0; i < NS; i++) {
            mt_cuda_alloc_free(a, p[i]);
        }
        mt_cuda_alloc_get_stats(a, &st);
        if (step == 0) {
            raw_after_first = st.n_raw_allocs;
        }
    }
    CHECK(st.n_raw_allocs == raw_after_first && st.n_raw_frees == 0,
          "steady state: no cudaMalloc/cudaFree after step 1");
    mt_mem_stats_t ms;
    mt_mem_stats(MT_MEM_DEVICE, &ms);
    CHECK(ms.total_current == 0 && ms.total_peak >= (int64_t)(381 << 20), "device accounting: %lld now, peak %lld",
          (long long)ms.total_current, (long long)ms.total_peak);
    size_t fr0 = 0, fr1 = 0, tot = 0;
    CHECK(cudaMemGetInfo(&fr0, &tot) == cudaSuccess, "meminfo");
    size_t released = mt_dev_empty_cache();
    CHECK(cudaMemGetInfo(&fr1, &tot) == cudaSuccess, "meminfo");
    CHECK(released == (size_t)st.reserved_bytes && fr1 >= fr0 + released / 2, "empty_cache gave %zu bytes back",
          released);
    void *huge = NULL;
    mt_status_t r = mt_cuda_alloc_malloc(a, &huge, (size_t)1 << 50, MT_MEM_ACTIVATIONS, "impossible", s);
    CHECK(r == MT_ERR_OOM && huge == NULL, "1 PiB: MT_ERR_OOM (%s)", mt_status_str(r));
    CHECK(strstr(mt_last_error_msg(), "impossible") && strstr(mt_last_error_msg(), "activations"),
          "report names the request: %s", mt_last_error_msg());
    CHECK(cudaGetLastError() == cudaSuccess, "the failed cudaMalloc left no sticky error");
    CHECK_OK(mt_cuda_alloc_validate(a));
    cudaStreamDestroy(s);
    return mt_test_finish("test_cuda_alloc_device");
}
