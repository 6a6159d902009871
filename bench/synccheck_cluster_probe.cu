// synccheck_cluster_probe.cu: the cluster forward's h exchange (persistent_kernel, kernels/int_gru_cluster.cuh)
// alone, to find what compute-sanitizer's synccheck reports as "Missing wait" at the first arming
// of its mbarrier in 4 of the GPU tests (bench/sanitize.md, run 45). Each CTA of a cluster of CS
// owns two mbarriers hb[0..1] counting the bytes its peers store into its buffers by st.async:
// thread 0 arms hb[1] (h_1) and hb[0] (h_2) before a cluster barrier; at step s >= 1 every thread
// waits for h_s on hb[s & 1] by parity, thread 0 re-arms it for h_{s+2}; then the CTA pushes its
// word of h_{s+1} into every peer. The kernel's library helpers (mbarrier.cuh, ptx.cuh) are used.
// Arguments: CS clusters T threads smem_kb [launches] [mode]; mode 0 as the library, 1 with every
// barrier invalidated after the last cluster barrier. Prints the sum every CTA read (checked).
// Found (session 45, H100, CUDA 13.0's compute-sanitizer; bench/gpu_runs/s45_synccheck_cluster_probe_h100.txt):
// synccheck reports "Missing wait" at the first arming, as in the library's tests, only with clusters
// of 16 (the non-portable size) when 9 of them (144 CTAs) are resident at once, and only from CTAs
// of rank 8 and above; clusters of 2 to 12 in grids of up to 240 CTAs, resident or in waves, and 16
// with 1, 2 or 4 clusters or in waves, report nothing; the invalidation changes nothing; without
// the tool every CTA's sums are right (50 of 50 launches of each reporting shape).
// Build and run: nvcc -arch=sm_90 -O2 -lineinfo -std=c++17 bench/synccheck_cluster_probe.cu -o scp &&
//   compute-sanitizer --tool synccheck ./scp 16 9 5 256 60
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cooperative_groups.h>
#include "../kernels/mbarrier.cuh"
#include "../kernels/ptx.cuh"
namespace cg = cooperative_groups;

__global__ void exchange_kernel(int T, int mode, long long *out) {
  extern __shared__ __align__(16) unsigned char smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int CS = (int)cluster.num_blocks(), rank = (int)cluster.block_rank(), tid = threadIdx.x;
  uint64_t *hb = (uint64_t *)smem;
  uint32_t *buf = (uint32_t *)(smem + 16);   /* [2][CS] words: peer r's word of h at slot r */
  const uint32_t tx = (uint32_t)(4 * CS);
  if (tid == 0) {
    mb_init(&hb[0], 1);
    mb_init(&hb[1], 1);
    mb_init_fence_cluster();
  }
  for (int e = tid; e < 2 * CS; e += blockDim.x) buf[e] = 0;
  __syncthreads();
  if (tid == 0) {
    if (T > 1) mb_arrive_expect_tx(&hb[1], tx);
    if (T > 2) mb_arrive_expect_tx(&hb[0], tx);
  }
  cluster.sync();
  long long acc = 0;
  for (int s = 0; s < T; s++) {
    const int cur = s & 1, nxt = cur ^ 1;
    if (s > 0) {
      mb_wait(&hb[cur], ((s - 1) >> 1) & 1);
      if (tid == 0 && s + 2 < T) mb_arrive_expect_tx(&hb[cur], tx);
      __syncthreads();
    }
    if (tid == 0)
      for (int r = 0; r < CS; r++) acc += buf[cur * CS + r];
    if (s + 1 < T && tid < CS) {
      const uint32_t v = (uint32_t)(1000 * (s + 1) + rank);
      st_async_b32(mapa_shared(smem_addr(&buf[nxt * CS + rank]), tid), v, mapa_shared(smem_addr(&hb[nxt]), tid));
    }
  }
  cluster.sync();
  if (mode == 1 && tid == 0) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_addr(&hb[0])) : "memory");
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_addr(&hb[1])) : "memory");
  }
  if (tid == 0) out[blockIdx.x] = acc;
}

int main(int argc, char **argv) {
  if (argc < 6) { fprintf(stderr, "usage: %s CS clusters T threads smem_kb [launches] [mode]\n", argv[0]); return 2; }
  const int CS = atoi(argv[1]), ncl = atoi(argv[2]), T = atoi(argv[3]), thr = atoi(argv[4]), kb = atoi(argv[5]);
  const int launches = argc > 6 ? atoi(argv[6]) : 1, mode = argc > 7 ? atoi(argv[7]) : 0;
  const int grid = CS * ncl;
  const size_t smem = (size_t)kb * 1024;
  long long *d;
  cudaMalloc(&d, grid * sizeof(long long));
  cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = CS; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid); cfg.blockDim = dim3(thr); cfg.dynamicSmemBytes = smem; cfg.attrs = at; cfg.numAttrs = 1;
  int active = 0;
  cudaOccupancyMaxActiveClusters(&active, exchange_kernel, &cfg);
  for (int l = 0; l < launches; l++) cudaLaunchKernelEx(&cfg, exchange_kernel, T, mode, d);
  cudaError_t e = cudaDeviceSynchronize();
  long long *h = (long long *)malloc(grid * sizeof(long long));
  cudaMemcpy(h, d, grid * sizeof(long long), cudaMemcpyDeviceToHost);
  /* every CTA reads, at steps 1..T-1, 1000 s CS + sum of ranks */
  long long want = 0;
  for (int s = 1; s < T; s++) want += 1000LL * s * CS + (long long)CS * (CS - 1) / 2;
  int bad = 0;
  for (int b = 0; b < grid; b++) bad += h[b] != want;
  printf("CS %d clusters %d (%d co-resident) T %d threads %d smem %d KB launches %d mode %d: %s, %s\n", CS, ncl, active, T, thr, kb,
         launches, mode, cudaGetErrorString(e), bad ? "WRONG SUMS" : "sums ok");
  return e != cudaSuccess || bad;
}
