// racecheck_async_probe.cu: which ways of filling a shared buffer from global memory does
// compute-sanitizer's racecheck follow when mbarriers order everything else? tc_grid_kernel
// (kernels/int_gru_grid.cuh) copies each half's h rows with cp.async; its mbarrier version (pp10,
// bench/cuda_int_gru.md) left racecheck reporting those copies' writes against the ldmatrix reads.
// The pattern here is tc_grid_kernel's ping-pong in small: producers (warps 0-7) fill buffer x
// (4 KB) from global memory, wait until it has landed, read another thread's chunk, pass an
// internal barrier, write a tile over the buffer and signal "tiles ready" (mt[x]); consumers
// (warps 8-15) wait on mt[x], read the tile and signal "buffer free" (mf[x]), which the producers
// wait on before the next fill of buffer x. Modes (the fill and its "landed" wait):
//   0: cp.async 16 B a thread, cp.async.wait_all, a 256-arrival mbarrier (arrive, wait);
//   1: cp.async 16 B a thread, cp.async.mbarrier.arrive.noinc on a 256-arrival mbarrier, wait;
//   2: one thread: mbarrier.arrive.expect_tx then cp.async.bulk (TMA, 4 KB) completing on it;
//   3: mode 0 with one arrival per warp (__syncwarp, lane 0) on every mbarrier (pp10's form);
//   4: mode 2 with one arrival per warp on the other mbarriers.
// Build and run: nvcc -arch=sm_90 -O2 -lineinfo bench/racecheck_async_probe.cu -o probe3 &&
//   for m in 0 1 2 3 4; do compute-sanitizer --tool racecheck ./probe3 $m; done
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include "../kernels/mbarrier.cuh"   /* mb_init, mb_arrive, mb_wait: the library's */
__device__ __forceinline__ uint32_t sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_expect_tx(uint64_t *m, int bytes) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(sa(m)), "r"(bytes) : "memory");
}
// arrive: every thread (per_warp 0) or lane 0 after __syncwarp (per_warp 1)
__device__ __forceinline__ void arrive(uint64_t *m, bool per_warp) {
  if (!per_warp) { mb_arrive(m); return; }
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mb_arrive(m);
}
__global__ void k(int mode, int iters, const int *src, int *out) {
  __shared__ __align__(128) int buf[2][1024];   // 4 KB each: the fill, then the tile over its first 256 ints
  __shared__ uint64_t mc[2], mp, mt[2], mf[2];
  const int tid = threadIdx.x;
  const bool prod = tid < 256, pw = mode == 3 || mode == 4;
  const int nprod = pw ? 8 : 256;
  if (tid == 0) {
    for (int x = 0; x < 2; x++) {
      mb_init(&mc[x], mode == 2 || mode == 4 ? 1 : nprod);
      mb_init(&mt[x], nprod);
      mb_init(&mf[x], pw ? 8 : 256);
    }
    mb_init(&mp, nprod);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  int acc = 0, pph = 0;
  for (int it = 0; it < iters; it++) {
    const int x = it & 1, use = it >> 1;
    if (prod) {
      if (use > 0) mb_wait(&mf[x], (use - 1) & 1);
      const int *g = src + (size_t)it * 1024;
      if (mode == 2 || mode == 4) {
        if (tid == 0) {
          mb_expect_tx(&mc[x], 4096);
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 4096, [%2];" ::"r"(sa(buf[x])), "l"(g),
                       "r"(sa(&mc[x]))
                       : "memory");
        }
      } else {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(&buf[x][4 * tid])), "l"(g + 4 * tid) : "memory");
        if (mode == 1) {
          cp_async_mb_arrive(&mc[x]);
        } else {
          asm volatile("cp.async.wait_all;" ::: "memory");
          arrive(&mc[x], pw);
        }
      }
      mb_wait(&mc[x], use & 1);
      const int v = buf[x][4 * ((tid + 1) & 255)];   // another thread's chunk
      arrive(&mp, pw);
      mb_wait(&mp, pph);
      pph ^= 1;
      buf[x][tid] = v + it;   // the tile, over other threads' chunks
      arrive(&mt[x], pw);
    } else {
      mb_wait(&mt[x], use & 1);
      acc += buf[x][tid - 256];
      arrive(&mf[x], pw);
    }
  }
  if (!prod) out[blockIdx.x * 256 + tid - 256] = acc;
}
int main(int argc, char **argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0, iters = 8, blocks = 4;
  int *hs = (int *)malloc(iters * 4096), *src, *out, ho[blocks * 256];
  for (int it = 0; it < iters; it++)
    for (int i = 0; i < 1024; i++) hs[it * 1024 + i] = it * 1000 + i;
  cudaMalloc(&src, iters * 4096);
  cudaMalloc(&out, sizeof ho);
  cudaMemcpy(src, hs, iters * 4096, cudaMemcpyHostToDevice);
  k<<<blocks, 512>>>(mode, iters, src, out);
  cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(ho, out, sizeof ho, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int b = 0; b < blocks; b++)
    for (int c = 0; c < 256; c++) {
      int want = 0;
      for (int it = 0; it < iters; it++) want += it * 1000 + 4 * ((c + 1) & 255) + it;
      bad += ho[b * 256 + c] != want;
    }
  printf("mode %d: %s, %d wrong sums of %d\n", mode, cudaGetErrorString(e), bad, blocks * 256);
  return e != cudaSuccess || bad != 0;
}
