/*
 * xs_grid_proto.cu: a prototype of the per-step exchange and product of a fused persistent strict
 * STE backward (bench/cuda_int_gru.md, "what a fused persistent strict backward would move"); not
 * the library's code. It measures what such a kernel's step costs besides the cell, at the large
 * bench shape (N 256, H 1024):
 *   grid = (H / XP_U) unit blocks x (N / XP_R) row blocks, one CTA per multiprocessor, all resident
 *   (cooperative launch). CTA (u, b) keeps R's codes for its XP_U units and all 3H rows in shared
 *   memory (K in chunk order, below; 16-byte pieces swizzled by the unit so that ldmatrix reads 8
 *   units from distinct banks). Step s:
 *     1. a stand-in cell: dq[n][g H + i] = dh[n][i] c_g 2^-12 for its XP_R rows and XP_U units
 *        (the real cell reads the saved state; only the data dependency on dh is kept);
 *     2. its chunk of dq (the 3 XP_U columns its units own) as DIG base-256 digits, the shift per
 *        row from the chunk's own largest value (so no reduction across CTAs), with the rows'
 *        corrections (sum of the fixed-point values times the zero-point offsets; zero here, but
 *        computed), into a global buffer of the step's parity; one red.release.gpu on the row
 *        block's counter;
 *     3. one thread waits (ld.acquire) for the row block's H / XP_U CTAs; the chunks stream from
 *        L2 in halves through a two-stage cp.async ring; PW product warps (16 rows x all digits x
 *        NT n8 tiles of units each) multiply them on mma.sync m16n8k32 and, after each chunk,
 *        combine its digit sums exactly in int64 and then in double with the chunk's shift
 *        (chunks in a fixed order: deterministic);
 *     4. dh of the next step (float) into shared memory.
 * mode 1 leaves out the products (loads and combines only), mode 2 the chunks' loads as well.
 * First one step is checked against an fp64 product of the same dq on the host; then T steps are
 * timed (CUDA events around the cooperative launch, median of 9 after 3).
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 -Ibench -Ikernels bench/xs_grid_proto.cu -o xs_grid_proto
 */
#include "cuda_bench.cuh"
#include "xs_proto.cuh"   /* inputs and the fp64 check, shared with the other prototype */
#include "ptx.cuh"   /* mma_s8, ldsm_x4, cp_async16_s, cp_async_commit / wait, ld_acquire_gpu, red_release_gpu */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

enum { XP_N = 256, XP_H = 1024, XP_K = 3 * XP_H, XP_R = 32, XP_U = 64, XP_KC = 3 * XP_U, XP_KH = XP_KC / 2, XP_LD = XP_KH + 16,
       XP_UB = XP_H / XP_U, XP_RB = XP_N / XP_R, XP_THREADS = 256 };
static_assert(XP_KH % 32 == 0 && XP_R == 32 && XP_U == 64, "the thread mappings below");

/* bytes of one stage of the ring: [DIG][XP_R][XP_LD] */
template <int DIG> __host__ __device__ constexpr int stage_bytes() { return DIG * XP_R * XP_LD; }
template <int DIG> __host__ __device__ constexpr int smem_bytes() { return XP_U * XP_K + 2 * stage_bytes<DIG>(); }



struct xp_args {
  const int8_t *RT;    /* [H][3H] R's codes, K contiguous per unit */
  const float *dh0;    /* [N][H] */
  float *out;          /* [N][H] dh after the last step */
  int8_t *G;           /* [2][RB][UB][DIG][XP_R][XP_KC] digit chunks by step parity */
  int *Gs;             /* [2][RB][UB][XP_R] shifts */
  long long *Gc;       /* [2][RB][UB][XP_R] corrections */
  int *cnt;            /* [RB] arrivals, zero at launch */
  int T, mode;
};

template <int DIG, int PW>
__global__ void __launch_bounds__(XP_THREADS, 1) xs_grid_proto_kernel(const __grid_constant__ xp_args a) {
  constexpr int FRAC = 8 * DIG - 2, NT = XP_U / (PW / 2) / 8, SB = stage_bytes<DIG>();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(16) int s_sh[2][XP_R];
  __shared__ __align__(16) long long s_co[2][XP_R];
  __shared__ float s_mx[2][XP_R];
  __shared__ long long s_cs[2][XP_R];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ub = blockIdx.x, rb = blockIdx.y;
  const uint32_t rs = (uint32_t)__cvta_generic_to_shared(smem), ring = rs + XP_U * XP_K;
  float *dh_s = (float *)(smem + XP_U * XP_K);   /* [XP_R][XP_U], aliasing the ring between the products and the cells */

  xs_proto_load_r<XP_H, XP_U, XP_THREADS>(rs, a.RT, ub);
  for (int e = tid; e < XP_R * XP_U; e += XP_THREADS) dh_s[e] = a.dh0[(rb * XP_R + e / XP_U) * XP_H + ub * XP_U + e % XP_U];
  __syncthreads();

  const int j = tid & 63, ra = tid >> 6;   /* cells: unit j, rows ra + 4 q */
  const float cg[3] = {0.5f, -0.25f, 0.375f};
  for (int step = 0; step < a.T; step++) {
    const int par = step & 1;
    /* 1-2: the stand-in cell, the chunk's row maxima, digits, corrections */
    float v[8][3];
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const float d = dh_s[(ra + 4 * q) * XP_U + j];
#pragma unroll
      for (int g = 0; g < 3; g++) v[q][g] = (d * cg[g]) * 0x1p-12f;
    }
#pragma unroll
    for (int q = 0; q < 8; q++) {
      float m = fmaxf(fabsf(v[q][0]), fmaxf(fabsf(v[q][1]), fabsf(v[q][2])));
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) s_mx[warp & 1][ra + 4 * q] = m;
    }
    __syncthreads();   /* also: every thread done reading dh_s (the ring's first stage) */
    int8_t *gch = a.G + ((size_t)(par * XP_RB + rb) * XP_UB + ub) * DIG * XP_R * XP_KC;
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const int r = ra + 4 * q;
      const float m = fmaxf(s_mx[0][r], s_mx[1][r]);
      int ex = 0;
      if (m > 0) frexpf(m, &ex);
      const int sh = m > 0 ? FRAC - ex : 0;
      const float p2 = __int_as_float((127 + sh) << 23);   /* 2^sh: sh within [-126, 127] for these values */
      long long cs = 0;
#pragma unroll
      for (int g = 0; g < 3; g++) {
        const int x = __float2int_rn(v[q][g] * p2);
        cs += (long long)x * 0;   /* the zero-point offset (off - z_k): 0 for a symmetric R */
        int8_t dig[DIG];
        xs_proto_digits<DIG>(x, dig);
#pragma unroll
        for (int d = 0; d < DIG; d++) gch[(d * XP_R + r) * XP_KC + g * XP_U + j] = dig[d];
      }
      for (int o = 16; o > 0; o >>= 1) cs += __shfl_xor_sync(0xffffffffu, cs, o);
      if (lane == 0) s_cs[warp & 1][r] = cs;
      if (j == 0) a.Gs[((par * XP_RB + rb) * XP_UB + ub) * XP_R + r] = sh;
    }
    __syncthreads();
    if (tid < XP_R) a.Gc[((par * XP_RB + rb) * XP_UB + ub) * XP_R + tid] = s_cs[0][tid] + s_cs[1][tid];
    __syncthreads();
    if (tid == 0) {
      red_release_gpu(a.cnt + rb, 1);
      while (ld_acquire_gpu(a.cnt + rb) < XP_UB * (step + 1)) {}
    }
    __syncthreads();

    /* 3: the row block's chunks (c = 0 .. UB - 1, each in two halves of XP_KH columns) */
    const int8_t *gsrc = a.G + (size_t)(par * XP_RB + rb) * XP_UB * DIG * XP_R * XP_KC;
    auto issue = [&](int h) {   /* half h into stage h & 1, with the chunk's shifts and corrections at its first half */
      const int c = h >> 1, hh = h & 1;
      if (a.mode < 2) {
        const int8_t *src = gsrc + (size_t)c * DIG * XP_R * XP_KC + hh * XP_KH;
        const uint32_t dst = ring + (h & 1) * SB;
        for (int e = tid; e < DIG * XP_R * (XP_KH / 16); e += XP_THREADS) {
          const int dr = e / (XP_KH / 16), p = e % (XP_KH / 16);
          cp_async16_s(dst + dr * XP_LD + p * 16, src + (size_t)dr * XP_KC + p * 16);
        }
      }
      if (hh == 0 && tid < XP_R / 4 + XP_R / 2) {   /* 8 pieces of shifts, 16 of corrections */
        const int base = ((par * XP_RB + rb) * XP_UB + c) * XP_R;
        if (tid < XP_R / 4) cp_async16_s((uint32_t)__cvta_generic_to_shared(&s_sh[c & 1][tid * 4]), a.Gs + base + tid * 4);
        else cp_async16_s((uint32_t)__cvta_generic_to_shared(&s_co[c & 1][(tid - XP_R / 4) * 2]), a.Gc + base + (tid - XP_R / 4) * 2);
      }
      cp_async_commit();
    };
    const int rh = warp & 1, ug = warp >> 1, g4 = lane >> 2, tq = lane & 3, r8 = lane & 7, mi = lane >> 3;
    int32_t acc[DIG][NT][4];
    double dacc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        dacc[nt][e] = 0;
#pragma unroll
        for (int d = 0; d < DIG; d++) acc[d][nt][e] = 0;
      }
    issue(0);
    for (int h = 0; h < 2 * XP_UB; h++) {
      if (h + 1 < 2 * XP_UB) { issue(h + 1); cp_async_wait<1>(); } else cp_async_wait<0>();
      __syncthreads();
      const int c = h >> 1, hh = h & 1;
      if (warp < PW) {
        if (a.mode == 0) {
          const uint32_t st = ring + (h & 1) * SB;
#pragma unroll
          for (int ks = 0; ks < XP_KH / 32; ks++) {
            uint32_t af[DIG][4], bf[NT][2];
#pragma unroll
            for (int d = 0; d < DIG; d++)
              ldsm_x4(af[d][0], af[d][1], af[d][2], af[d][3],
                      st + (d * XP_R + 16 * rh + r8 + (mi & 1) * 8) * XP_LD + ks * 32 + (mi >> 1) * 16);
            const int kc = (c * XP_KC + hh * XP_KH + ks * 32) / 16 + (mi & 1);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
              const int u = ug * (8 * NT) + np * 16 + (mi >> 1) * 8 + r8;
              ldsm_x4(bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1], xs_proto_r_addr<XP_K>(rs, u, kc));
            }
#pragma unroll
            for (int d = 0; d < DIG; d++)
#pragma unroll
              for (int nt = 0; nt < NT; nt++) mma_s8(acc[d][nt], af[d], bf[nt]);
          }
        }
        if (hh == 1) {   /* chunk c complete: S = sum_d 256^d P_d + corr, exact in int64; times 2^-shift in double */
#pragma unroll
          for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int r = 16 * rh + g4 + (e >> 1) * 8;
              long long S = s_co[c & 1][r];
#pragma unroll
              for (int d = 0; d < DIG; d++) S += (long long)acc[d][nt][e] << (8 * d);
              dacc[nt][e] += (double)S * __longlong_as_double((long long)(1023 - s_sh[c & 1][r]) << 52);
#pragma unroll
              for (int d = 0; d < DIG; d++) acc[d][nt][e] = 0;
            }
        }
      }
      __syncthreads();   /* the stage is free for the load two halves on */
    }
    /* 4: dh of the next step (row 16 rh + g4 (+ 8), unit 8 NT ug + 8 nt + 2 tq (+ 1)) */
    if (warp < PW) {
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = 16 * rh + g4 + (e >> 1) * 8, u = ug * (8 * NT) + nt * 8 + 2 * tq + (e & 1);
          const float f = (float)dacc[nt][e];
          dh_s[r * XP_U + u] = f;
          if (step == a.T - 1) a.out[(rb * XP_R + r) * XP_H + ub * XP_U + u] = f;
        }
    }
    __syncthreads();
  }
}

template <int DIG, int PW>
static void run(const char *name, int mode, const std::vector<int8_t> &RT, const std::vector<float> &dh0) {
  const size_t gbytes = (size_t)2 * XP_RB * XP_UB * DIG * XP_R * XP_KC, gn = (size_t)2 * XP_RB * XP_UB * XP_R;
  int8_t *dR, *dG;
  float *ddh, *dout;
  int *dGs, *dcnt;
  long long *dGc;
  CK(cudaMalloc(&dR, RT.size())); CK(cudaMemcpy(dR, RT.data(), RT.size(), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&ddh, dh0.size() * 4)); CK(cudaMemcpy(ddh, dh0.data(), dh0.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&dout, dh0.size() * 4)); CK(cudaMalloc(&dG, gbytes)); CK(cudaMalloc(&dGs, gn * 4)); CK(cudaMalloc(&dGc, gn * 8));
  CK(cudaMalloc(&dcnt, XP_RB * 4));
  auto k = xs_grid_proto_kernel<DIG, PW>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<DIG>()));
  int per_sm = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, XP_THREADS, smem_bytes<DIG>()));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (per_sm * sms < XP_UB * XP_RB) { printf("%s: %d CTAs do not fit (%d a multiprocessor)\n", name, XP_UB * XP_RB, per_sm); exit(1); }
  xp_args a = {dR, ddh, dout, dG, dGs, dGc, dcnt, 1, mode};
  auto launch = [&](int T) {
    a.T = T;
    CK(cudaMemsetAsync(dcnt, 0, XP_RB * 4, 0));
    void *args[] = {&a};
    CK(cudaLaunchCooperativeKernel((const void *)k, dim3(XP_UB, XP_RB), dim3(XP_THREADS), args, smem_bytes<DIG>(), 0));
  };
  double err = -1;
  if (mode == 0) {   /* one step against fp64: dq = (dh c_g) 2^-12 as the kernel forms it */
    err = xs_proto_check_step(launch, dout, RT, dh0, XP_N, XP_H, 0x1p-12f);
  }
  std::vector<float> t;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int r = 0; r < 12; r++) {
    CK(cudaEventRecord(e0, 0)); launch(100); CK(cudaEventRecord(e1, 0)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3) t.push_back(ms);
  }
  const float ms = median(t);
  printf("%-28s mode %d: %8.3f ms / 100 steps = %6.2f us a step", name, mode, ms, ms * 10.0f);
  if (err >= 0) printf("; one step vs fp64: largest |error| / largest |value| %.2e", err);
  printf("\n");
  CK(cudaFree(dR)); CK(cudaFree(ddh)); CK(cudaFree(dout)); CK(cudaFree(dG)); CK(cudaFree(dGs)); CK(cudaFree(dGc)); CK(cudaFree(dcnt));
}

int main() {
  std::vector<int8_t> RT;
  std::vector<float> dh0;
  xs_proto_inputs(XP_N, XP_H, RT, dh0);
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  printf("xs_grid_proto on %s: N %d H %d, %d x %d CTAs of %d threads, %d + %d bytes of shared memory\n", pr.name, XP_N, XP_H, XP_UB, XP_RB,
         XP_THREADS, XP_U * XP_K, 2 * stage_bytes<4>());
  for (int mode = 0; mode < 3; mode++) run<4, 4>("4 digits, 4 product warps", mode, RT, dh0);
  run<4, 8>("4 digits, 8 product warps", 0, RT, dh0);
  run<3, 4>("3 digits, 4 product warps", 0, RT, dh0);
  run<3, 8>("3 digits, 8 product warps", 0, RT, dh0);
  return 0;
}
