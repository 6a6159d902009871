// racecheck_mbarrier_probe.cu: the ordered pattern of racecheck_named_probe.cu with mbarriers, the
// synchronization tc_grid_kernel's warp roles use (kernels/int_gru_grid.cuh): the producers'
// internal barrier as an mbarrier with a common __syncthreads (mode 3), and a ping-pong on
// mbarriers only (mode 4: producers -> consumers "tiles ready", consumers -> producers "buffer
// free"). H200, CUDA 13 (bench/gpu_runs/racecheck_mbarrier_probe_h200.log): racecheck 0 hazards
// and synccheck 0 errors in both modes, the right sums.
// Build and run: nvcc -arch=sm_90 -O2 -lineinfo bench/racecheck_mbarrier_probe.cu -o probe2 &&
//   for m in 3 4; do compute-sanitizer --tool racecheck ./probe2 $m; done
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include "../kernels/mbarrier.cuh"   /* mb_init, mb_arrive, mb_wait: the library's */
__global__ void k(int mode, int iters, int *out) {
  __shared__ int buf[2][256];
  __shared__ uint64_t mp, mt[2], mf[2];
  const int tid = threadIdx.x;
  const bool prod = tid < 256;
  if (tid == 0) { mb_init(&mp, 256); mb_init(&mt[0], 256); mb_init(&mt[1], 256); mb_init(&mf[0], 256); mb_init(&mf[1], 256); }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  int acc = 0, pph = 0;
  if (mode == 3) {
    for (int it = 0; it <= iters; it++) {
      if (prod) {
        if (it < iters) {
          int *b = buf[it & 1];
          b[tid] = it + tid;
          mb_arrive(&mp); mb_wait(&mp, pph); pph ^= 1;
          b[(tid + 1) & 255] += 1;
        }
      } else if (it > 0) {
        acc += buf[(it - 1) & 1][tid - 256];
      }
      __syncthreads();
    }
  } else {
    // producers: write buffer x (two passes, mbarrier mp between), then arrive on mt[x];
    // consumers: wait mt[x], read, arrive mf[x]; producers wait mf[x] before reusing buffer x
    for (int it = 0; it < iters; it++) {
      const int x = it & 1, use = it >> 1;   // use-th use of buffer x
      if (prod) {
        if (use > 0) mb_wait(&mf[x], (use - 1) & 1);
        int *b = buf[x];
        b[tid] = it + tid;
        mb_arrive(&mp); mb_wait(&mp, pph); pph ^= 1;
        b[(tid + 1) & 255] += 1;
        mb_arrive(&mt[x]);
      } else {
        mb_wait(&mt[x], use & 1);
        acc += buf[x][tid - 256];
        mb_arrive(&mf[x]);
      }
    }
  }
  if (!prod) out[tid - 256] = acc;
}
int main(int argc, char **argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 3;
  int *out; cudaMalloc(&out, 256 * 4);
  k<<<4, 512>>>(mode, 8, out);
  cudaError_t e = cudaDeviceSynchronize();
  int h[256]; cudaMemcpy(h, out, 1024, cudaMemcpyDeviceToHost);
  printf("mode %d: %s, out[0] = %d, out[5] = %d\n", mode, cudaGetErrorString(e), h[0], h[5]);
  return 0;
}
