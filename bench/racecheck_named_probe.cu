// racecheck_named_probe.cu: does compute-sanitizer's racecheck follow named barriers with a thread
// count (bar.sync id, n), which tc_grid_kernel's warp roles use (kernels/int_gru_grid.cuh)? A
// warp-specialized ping-pong on a pattern whose order is plain. Mode 0: producers (warps 0-7) write buffer it&1 in two passes separated by a named
// barrier among themselves (bar.sync 1, 256), consumers (warps 8-15) read buffer (it-1)&1; one
// __syncthreads per iteration in common code. Mode 1: the same without the producers' named barrier
// (the second pass writes other addresses). Mode 2: mode 0 with consumers also syncing on a named
// barrier of their own (bar.sync 2, 256) once per iteration.
#include <cstdio>
#include <cstdlib>
__device__ __forceinline__ void nsync_aligned(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nsync_any(int id, int n) { asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// modes 3 and 4: modes 0 and 2 with the non-aligned form (barrier.sync id, n: the threads of the
// block may reach it from different code, which bar.sync = barrier.sync.aligned does not allow)
__device__ __forceinline__ void nsync(int mode, int id, int n) { if (mode >= 3) nsync_any(id, n); else nsync_aligned(id, n); }
__global__ void k(int mode, int iters, int *out) {
  __shared__ int buf[2][256];
  const int tid = threadIdx.x;
  const bool prod = tid < 256;
  int acc = 0;
  for (int it = 0; it <= iters; it++) {
    if (prod) {
      if (it < iters) {
        int *b = buf[it & 1];
        b[tid] = it + tid;                       // pass 0
        if (mode != 1) nsync(mode, 1, 256);
        if (mode != 1) b[(tid + 1) & 255] += 1;   // pass 1: another thread's element
        else b[tid] += 1;
      }
    } else if (it > 0) {
      const int *b = buf[(it - 1) & 1];
      acc += b[tid - 256];
      if (mode == 2 || mode == 4) nsync(mode, 2, 256);
    }
    __syncthreads();
  }
  if (!prod) out[tid - 256] = acc;
}
// Build and run: nvcc -arch=sm_90 -O2 -lineinfo bench/racecheck_named_probe.cu -o probe &&
//   for m in 0 1 2 3 4; do compute-sanitizer --tool racecheck ./probe $m; done
// H200, CUDA 13 (bench/gpu_runs/racecheck_named_probe_h200.log): modes 0 and 2 "Race reported" on
// the ordered writes, mode 1 0 hazards: racecheck does not honour bar.sync 1, 256.
int main(int argc, char **argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  int *out; cudaMalloc(&out, 256 * 4);
  k<<<4, 512>>>(mode, 8, out);
  cudaError_t e = cudaDeviceSynchronize();
  int h[256]; cudaMemcpy(h, out, 1024, cudaMemcpyDeviceToHost);
  printf("mode %d: %s, out[0] = %d\n", mode, cudaGetErrorString(e), h[0]);
  return 0;
}
