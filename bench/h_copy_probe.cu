// h_copy_probe.cu: how fast can a block of tc_grid_kernel (kernels/int_gru_grid.cuh) bring one
// half's h rows into shared memory once the other blocks of its batch group have written them?
// The grid kernel's timeline (bench/cuda_int_gru.md, session 31) has that copy at about 2 us of a
// 9-us step at T100 N256 C512 H1024; giving every block but one of a group nothing to copy did not
// shorten the step (session 32), so L2's fan-out is not what bounds it. This probe repeats the
// exchange alone: the grid kernel's grid (32 unit blocks x 4 batch groups, one block of 512
// threads a multiprocessor, its shared memory), per (step, half) every block stores its 32 units'
// codes of the half's 32 rows into the global h plane, a named barrier, one red.release.gpu on the
// group's counter, one thread polls the counter with ld.acquire.gpu until the group's 32 blocks
// have arrived (stamp t0), then the block copies the half's 32 rows (32 KB) into shared memory by
// one of these methods and waits until they have landed (stamp t1):
//   0: cp.async 16 B, 256 threads x 8, landing on an mbarrier by cp.async.mbarrier.arrive (the
//      grid kernel's copy);
//   1: the same with 512 threads x 4;
//   2: bulk copies (cp.async.bulk, the TMA engine), one 1-KB row a lane of one warp, into padded
//      rows (Kp + 16 bytes: the grid kernel's conflict-free layout), complete_tx on an mbarrier;
//   3: bulk copies of 8 rows (8 KB) each, unpadded;
//   4: one bulk copy of the 32 KB;
//   5: ld.global.v4 x 8 a thread (256 threads) then st.shared and __syncthreads;
//   6: no copy (the exchange's own cost).
// Printed: medians over blocks and steps 10..S-10 of t1 - t0 (the copy), of the step period, and
// a checksum of the copied bytes against the expected (a wrong copy fails the run).
// H200, CUDA 13 (bench/gpu_runs/s32_h_copy_probe_h200.log, 5 launches of 100 steps; no wrong
// byte): cp.async 1280 ns (512 threads: 1312), bulk copies of one row 1408, of 8 rows or all 32 KB
// 544, register loads 544, no copy 96. In the grid kernel the register loads did not pay
// (bench/attempts/grid_h_copy_ld.patch: the layer 1.067 -> 1.086-1.105 ms).
// Build and run: nvcc -arch=sm_90 -O3 -lineinfo bench/h_copy_probe.cu -o h_copy_probe && ./h_copy_probe
//   (or the bench_programs test's target bench_h_copy_probe)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "../kernels/mbarrier.cuh"
#include "../kernels/ptx.cuh"

enum { GX = 32, GY = 4, THREADS = 512, HALF = 32, KP = 1024, RLD = KP + 16, S = 100 };

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint64_t *mb) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
               "r"(bytes), "r"(smem_addr(mb))
               : "memory");
}

__global__ void __launch_bounds__(THREADS, 1) probe_kernel(int method, int8_t *hp, int32_t *bar, unsigned long long *st,
                                                            unsigned *bad) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t mb;
  const int tid = threadIdx.x, bx = blockIdx.x, by = blockIdx.y;
  int8_t *buf = (int8_t *)smem + 96 * RLD;   // after where the grid kernel keeps R
  if (tid == 0) mb_init(&mb, method <= 1 ? (method == 0 ? 256 : 512) : 1);
  __syncthreads();
  unsigned wrong = 0;
  for (int s = 0; s < S; s++)
    for (int x = 0; x < 2; x++) {
      const int it = 2 * s + x, cur = it & 1;
      int8_t *plane = hp + (size_t)cur * 256 * KP;
      // every block stores its 32 units of the half's 32 rows (value: a function of step, row, column)
      for (int rr = tid / 32; rr < HALF; rr += THREADS / 32) {   // thread: unit tid % 32, 16 rows a pass
        const int row = by * 64 + x * HALF + rr, col = bx * 32 + tid % 32;
        plane[(size_t)row * KP + col] = (int8_t)(it * 7 + row * 3 + col);
      }
      __syncthreads();
      if (tid == 0) red_release_gpu(bar + by * 2 + x, 1);
      unsigned long long t0 = 0;
      if (tid == 0) {
        const int32_t want = (s + 1) * GX;
        while (ld_acquire_gpu(bar + by * 2 + x) < want) {
        }
        t0 = now_ns();
      }
      __syncthreads();
      const int8_t *src = plane + (size_t)(by * 64 + x * HALF) * KP;
      const uint32_t dst = smem_addr(buf);
      const int ph = it & 1;
      if (method == 0 || method == 1) {
        const int nt = method == 0 ? 256 : 512;
        if (tid < nt) {
          const int per = KP / 16 / (nt / HALF);   // 16-byte chunks a thread of its row
          const int row = tid / (nt / HALF), c0 = tid % (nt / HALF);
          for (int j = 0; j < per; j++) {
            const int cv = c0 + j * (nt / HALF);
            cp_async16_s(dst + row * RLD + cv * 16, src + (size_t)row * KP + cv * 16);
          }
          cp_async_mb_arrive(&mb);
          mb_wait(&mb, ph);
        }
      } else if (method >= 2 && method <= 4) {
        if (tid < 32) {
          if (tid == 0) mb_arrive_expect_tx(&mb, HALF * KP);
          __syncwarp();
          if (method == 2) bulk_g2s(dst + tid * RLD, src + (size_t)tid * KP, KP, &mb);
          else if (method == 3 && tid < 4) bulk_g2s(dst + tid * 8 * KP, src + (size_t)tid * 8 * KP, 8 * KP, &mb);
          else if (method == 4 && tid == 0) bulk_g2s(dst, src, HALF * KP, &mb);
          mb_wait(&mb, ph);
        }
      } else if (method == 5) {
        if (tid < 256) {
          const int row = tid / 8, c0 = tid % 8;
          uint4 v[8];
#pragma unroll
          for (int j = 0; j < 8; j++)
            asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                         : "l"(src + (size_t)row * KP + (c0 + 8 * j) * 16));
#pragma unroll
          for (int j = 0; j < 8; j++) *(uint4 *)(buf + row * RLD + (c0 + 8 * j) * 16) = v[j];
        }
      }
      __syncthreads();
      if (tid == 0) {
        const unsigned long long t1 = now_ns();
        const size_t b = (size_t)by * GX + bx;
        st[(b * S + s) * 4 + x * 2 + 0] = t0;
        st[(b * S + s) * 4 + x * 2 + 1] = t1;
      }
      // check a few bytes of what landed (the padded layout for methods 0-2 and 5, unpadded for 3-4)
      if (method != 6 && tid < HALF) {
        const int row = tid, col = (s * 37 + tid * 11) % KP;
        const int grow = by * 64 + x * HALF + row;
        const int8_t want = (int8_t)(it * 7 + grow * 3 + col);
        const int8_t got = (method == 3 || method == 4) ? buf[row * KP + col] : buf[row * RLD + col];
        if (got != want) wrong++;
      }
      __syncthreads();   // the buffer is read before the next copy
    }
  if (wrong) atomicAdd(bad, wrong);
}

int main(int argc, char **argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 5;
  int8_t *hp;
  int32_t *bar;
  unsigned long long *st;
  unsigned *bad;
  const size_t nst = (size_t)GX * GY * S * 4;
  cudaMalloc(&hp, 2 * 256 * KP);
  cudaMalloc(&bar, GY * 2 * sizeof(int32_t));
  cudaMalloc(&st, nst * 8);
  cudaMalloc(&bad, 4);
  const size_t smem = 96 * RLD + 2 * HALF * RLD + 4096;
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  std::vector<unsigned long long> h(nst);
  const char *names[] = {"cp.async 256 thr x 8", "cp.async 512 thr x 4", "bulk 32 x 1 KB (padded rows)", "bulk 4 x 8 KB",
                         "bulk 1 x 32 KB", "ld.v4 + st.shared", "no copy"};
  for (int m = 0; m <= 6; m++) {
    std::vector<double> cp, per;
    unsigned nbad = 0;
    for (int r = 0; r < reps; r++) {
      cudaMemset(bar, 0, GY * 2 * sizeof(int32_t));
      cudaMemset(bad, 0, 4);
      int method = m;
      void *args[] = {&method, &hp, &bar, &st, &bad};
      cudaError_t e = cudaLaunchCooperativeKernel((void *)probe_kernel, dim3(GX, GY), dim3(THREADS), args, smem, 0);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      if (e != cudaSuccess) {
        printf("method %d: %s\n", m, cudaGetErrorString(e));
        return 1;
      }
      unsigned b;
      cudaMemcpy(&b, bad, 4, cudaMemcpyDeviceToHost);
      nbad += b;
      cudaMemcpy(h.data(), st, nst * 8, cudaMemcpyDeviceToHost);
      for (int blk = 0; blk < GX * GY; blk++)
        for (int s = 10; s < S - 10; s++) {
          const unsigned long long *q = &h[((size_t)blk * S + s) * 4];
          cp.push_back((double)(q[1] - q[0]));
          cp.push_back((double)(q[3] - q[2]));
          per.push_back((double)(h[((size_t)blk * S + s + 1) * 4] - q[0]));
        }
    }
    std::sort(cp.begin(), cp.end());
    std::sort(per.begin(), per.end());
    printf("method %d %-30s copy median %.0f ns (p10 %.0f, p90 %.0f), step period median %.0f ns, wrong bytes %u\n", m, names[m],
           cp[cp.size() / 2], cp[cp.size() / 10], cp[cp.size() * 9 / 10], per[per.size() / 2], nbad);
  }
  return 0;
}
