/* CUDA tensors (runtime/tensor.c) come from the caching device allocator: a tensor's block is accounted
 * under its category in the allocator's statistics and in mt_mem_stats(MT_MEM_DEVICE), is usable device
 * memory, goes back to the cache on mt_tensor_free, and the next tensor of that size is served from the
 * cache without a cudaMalloc. Built against the CUDA runtime (label gpu; exits 77 printing "skipped: no CUDA
 * device" without one) and against the CPU emulator (labels unit;emu).
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include <cuda_runtime_api.h>

#include "models/cuda/mt_cuda.h"
#include "runtime/cuda_alloc.h"
#include "runtime/tensor.h"
#include "testutil.h"

int main(void) {
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return MT_TEST_SKIP;
    }
    mt_cuda_alloc_t a;
    CHECK_OK(mt_cuda_alloc_default(&a));
    mt_cuda_alloc_stats_t s0, s1, s2, s3;
    mt_mem_stats_t m0, m1, m2;
    mt_cuda_alloc_get_stats(a, &s0);
    mt_mem_stats(MT_MEM_DEVICE, &m0);

    mt_tensor_t t;
    int64_t shape[2] = {10, 100};
    CHECK_OK(mt_tensor_alloc(&t, MT_F32, MT_DEV_CUDA, 2, shape, MT_MEM_GRADS, "test grads"));
    size_t blk = mt_cuda_alloc_block_size(a, t.data);
    CHECK(blk >= 4000 && blk % MT_CUDA_ALLOC_ROUND == 0, "the tensor is a block of the allocator (%zu bytes)", blk);
    mt_cuda_alloc_get_stats(a, &s1);
    mt_mem_stats(MT_MEM_DEVICE, &m1);
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        int64_t want = c == MT_MEM_GRADS ? (int64_t)blk : 0;
        CHECK(s1.allocated_by_cat[c] - s0.allocated_by_cat[c] == want, "allocator %s: +%lld, want +%lld",
              mt_mem_cat_name((mt_mem_cat_t)c), (long long)(s1.allocated_by_cat[c] - s0.allocated_by_cat[c]),
              (long long)want);
        CHECK(m1.current[c] - m0.current[c] == want, "mt_mem_stats(DEVICE) %s: +%lld, want +%lld",
              mt_mem_cat_name((mt_mem_cat_t)c), (long long)(m1.current[c] - m0.current[c]), (long long)want);
    }
    /* usable device memory: a round trip */
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++) {
        in[i] = (float)i * 0.5f;
    }
    CHECK(cudaMemcpy(t.data, in, sizeof(in), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(out, t.data, sizeof(out), cudaMemcpyDeviceToHost) == cudaSuccess &&
              !memcmp(in, out, sizeof(in)),
          "device round trip");
    mt_tensor_free(&t);
    CHECK(t.data == NULL, "cleared");
    mt_cuda_alloc_get_stats(a, &s2);
    mt_mem_stats(MT_MEM_DEVICE, &m2);
    CHECK(s2.allocated_by_cat[MT_MEM_GRADS] == s0.allocated_by_cat[MT_MEM_GRADS] &&
              m2.current[MT_MEM_GRADS] == m0.current[MT_MEM_GRADS] && s2.n_frees == s1.n_frees + 1,
          "freed: grads back to %lld (allocator %lld)", (long long)m0.current[MT_MEM_GRADS],
          (long long)s2.allocated_by_cat[MT_MEM_GRADS]);
    CHECK(s2.reserved_bytes == s1.reserved_bytes && s2.n_raw_frees == s1.n_raw_frees,
          "the block stays in the cache (no cudaFree)");
    /* the same size again, under another category: served from the cache */
    CHECK_OK(mt_tensor_alloc(&t, MT_BF16, MT_DEV_CUDA, 1, (int64_t[]){2000}, MT_MEM_ACTIVATIONS, "test acts"));
    mt_cuda_alloc_get_stats(a, &s3);
    CHECK(s3.n_raw_allocs == s2.n_raw_allocs, "second tensor from the cache: %lld cudaMalloc calls, was %lld",
          (long long)s3.n_raw_allocs, (long long)s2.n_raw_allocs);
    CHECK(s3.allocated_by_cat[MT_MEM_ACTIVATIONS] - s2.allocated_by_cat[MT_MEM_ACTIVATIONS] ==
              (int64_t)mt_cuda_alloc_block_size(a, t.data),
          "activations accounted");
    mt_tensor_free(&t);
    /* a view is never freed */
    float buf[4] = {1, 2, 3, 4};
    mt_tensor_t v = mt_tensor_view(buf, MT_F32, MT_DEV_CUDA, 1, (int64_t[]){4});
    mt_tensor_free(&v);
    mt_cuda_alloc_get_stats(a, &s3);
    CHECK(s3.n_frees == s2.n_frees + 1 && buf[3] == 4.0f, "views untouched by mt_tensor_free");
    return mt_test_finish("test_tensor_cuda");
}
