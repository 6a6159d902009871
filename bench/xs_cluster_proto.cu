/*
 * xs_cluster_proto.cu: a second prototype of the per-step exchange and product of a fused
 * persistent strict STE backward (bench/cuda_int_gru.md, session 23), after xs_grid_proto.cu
 * (session 22: digits through L2, 27.4 us a step before any cell). Not the library's code. Here the
 * digits never leave the chip: a row block's 16 CTAs form one thread-block cluster and read each
 * other's digit chunks from distributed shared memory. At the large bench shape (N 256, H 1024):
 *   grid = 16 unit blocks (the cluster, XC_U = 64 units each) x 8 row blocks (XC_R = 32 rows), one
 *   CTA a multiprocessor; row blocks never wait for each other. CTA (u, b) keeps R's codes for its
 *   64 units and all 3H rows in shared memory (196,608 bytes, K in chunk order: chunk c = the 192
 *   gate columns of cluster rank c's units), and its own chunk of the step's dq as DIG base-256
 *   digits (DIG x 32 rows x 192 columns, 24,576 bytes with 4 digits) stored in mma fragment order:
 *   each 512-byte block is one m16 x k32 A tile, lane l's 16 bytes its four fragment registers, so
 *   a peer reads a whole fragment with one 16-byte load. Step s:
 *     1. a stand-in cell: dq[n][g H + i] = dh[n][i] c_g 2^-11 for its 32 rows and 64 units (the
 *        real cell reads the saved state; only the data dependency on dh is kept);
 *     2. the rows' largest |dq| over the CTA's 192 columns into shared memory; cluster barrier;
 *        each row's maximum over the cluster's 16 partial maxima (distributed shared memory), the
 *        shift of the whole 3H-wide row from it (as the library's xs_rows_kernel: |Xi| <= 2^30
 *        with 4 digits), the digits into the CTA's chunk; cluster barrier;
 *     3. 8 product warps (warp w: digit w % 4 of both 16-row halves, units 32 (w / 4) .. + 31):
 *        for each of the 16 chunks (starting at the CTA's own rank), the A fragments by 16-byte
 *        loads from that CTA's shared memory (all 12 of a chunk issued before its mma; the next
 *        chunk's issued before this one's mma), R's B fragments by ldmatrix from the CTA's own
 *        shared memory, mma.sync m16n8k32 s8 into int32 (exact: K 3H 2^14 < 2^31, one shift per
 *        row, so no per-chunk combine);
 *     4. the exact combine S = sum_d 256^d P_d in int64, times 2^-shift in double, rounded once to
 *        float: through an 8-KB scratch in four passes of 8 rows, each thread keeping its 8 (row,
 *        unit) values of dh in registers for the next step's cell.
 *   The next step's first cluster barrier also tells a CTA that every peer has finished reading
 *   its chunk, so two cluster barriers a step suffice.
 * mode 1 leaves out the mma (the loads stay, folded into the accumulators), mode 2 the remote loads
 * (A fragments from the CTA's own chunk instead), mode 3 both (cell, digits, barriers, combine),
 * mode 4 the digits and the combine as well (the stand-in cell, the row maxima, the two barriers).
 * A 16-CTA cluster of one CTA a multiprocessor does not fit every GPC: an H200 holds 7 of the 8
 * row blocks' clusters at once, so the timed launches run the row blocks that fit (one wave); the
 * fp64 check runs all 8.
 * First one step is checked against an fp64 product of the same dq on the host; then T = 100
 * steps are timed (CUDA events around the cluster launch, median of 9 after a 0.3-s warm-up).
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 -Ibench -Ikernels bench/xs_cluster_proto.cu -o xs_cluster_proto
 */
#include "cuda_bench.cuh"
#include "xs_proto.cuh"   /* inputs and the fp64 check, shared with the other prototype */
#include "ptx.cuh"   /* mma_s8, ldsm_x4 */

#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

enum { XC_N = 256, XC_H = 1024, XC_K = 3 * XC_H, XC_R = 32, XC_U = 64, XC_KC = 3 * XC_U, XC_UB = XC_H / XC_U, XC_RB = XC_N / XC_R,
       XC_THREADS = 256, XC_KS = XC_KC / 32 };
static_assert(XC_UB == 16 && XC_R == 32 && XC_U == 64 && XC_THREADS == 256, "the thread mappings below");

/* bytes of the CTA's digit chunk: [DIG][2 m16 tiles][XC_KS k32 steps] blocks of 512 */
template <int DIG> __host__ __device__ constexpr int chunk_bytes() { return DIG * 2 * XC_KS * 512; }
template <int DIG> __host__ __device__ constexpr int smem_bytes() { return XC_U * XC_K + chunk_bytes<DIG>() + DIG * 8 * XC_U * 4; }


/* The shift of a row whose largest |value| is m: |rne(v 2^sh)| <= 2^frac (0 for m = 0; kept within
 * the range of a float power of two, which the stand-in cell's values never leave) */
__device__ __forceinline__ int row_shift(float m, int frac) {
  if (!(m > 0)) return 0;
  int ex;
  frexpf(m, &ex);
  const int sh = frac - ex;
  return sh < -126 ? -126 : sh > 127 ? 127 : sh;
}

/* Byte offset in a chunk of digit d's element (row r, chunk column k): the m16 x k32 tile's block,
 * then the lane (g4 = r % 8, tq = (k % 16) / 4) and its register (r / 8 % 2 + 2 (k % 32 / 16)). */
__device__ __forceinline__ int frag_offset(int d, int r, int k) {
  const int mt = r >> 4, rr = r & 15, ks = k >> 5, kk = k & 31;
  const int lane = (rr & 7) * 4 + ((kk & 15) >> 2), reg = (rr >> 3) + 2 * (kk >> 4);
  return ((d * 2 + mt) * XC_KS + ks) * 512 + lane * 16 + reg * 4 + (kk & 3);
}

struct xc_args {
  const int8_t *RT;    /* [H][3H] R's codes, K contiguous per unit */
  const float *dh0;    /* [N][H] */
  float *out;          /* [N][H] dh after the last step */
  int T, mode;
};

template <int DIG>
__global__ void __launch_bounds__(XC_THREADS, 1) xs_cluster_proto_kernel(const __grid_constant__ xc_args a) {
  constexpr int FRAC = 8 * DIG - 2;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_pmax[2][XC_R];   /* [warp parity][row]: the CTA's partial row maxima */
  __shared__ float s_rmax[XC_R];      /* rows' maxima over the cluster */
  cg::cluster_group cl = cg::this_cluster();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ub = (int)cl.block_rank(), rb = blockIdx.y;
  const uint32_t rs = (uint32_t)__cvta_generic_to_shared(smem);
  int8_t *chunk = (int8_t *)(smem + XC_U * XC_K);
  int32_t *scratch = (int32_t *)(smem + XC_U * XC_K + chunk_bytes<DIG>());   /* [DIG][8 rows][64 units] */

  xs_proto_load_r<XC_H, XC_U, XC_THREADS>(rs, a.RT, ub);
  const int j = tid & 63, ra = tid >> 6;   /* cells: unit j, rows ra + 4 q */
  float dh[8];
#pragma unroll
  for (int q = 0; q < 8; q++) dh[q] = a.dh0[(rb * XC_R + ra + 4 * q) * XC_H + ub * XC_U + j];
  __syncthreads();

  const float cgt[3] = {0.5f, -0.25f, 0.375f};
  const int dw = warp & 3, ng = warp >> 2, g4 = lane >> 2, tq = lane & 3, r8 = lane & 7, mi = lane >> 3;
  for (int step = 0; step < a.T; step++) {
    /* 1-2: the stand-in cell and the CTA's row maxima */
    float v[8][3];
#pragma unroll
    for (int q = 0; q < 8; q++) {
#pragma unroll
      for (int g = 0; g < 3; g++) v[q][g] = (dh[q] * cgt[g]) * 0x1p-11f;
      float m = fmaxf(fabsf(v[q][0]), fmaxf(fabsf(v[q][1]), fabsf(v[q][2])));
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) s_pmax[warp & 1][ra + 4 * q] = m;
    }
    cl.sync();   /* partial maxima visible to the cluster; every peer done reading this CTA's chunk */
    {   /* row tid / 8 over 2 peers a thread, then the 8 lanes of the row */
      const int r = tid >> 3, p0 = (tid & 7) * 2;
      float m = 0.f;
#pragma unroll
      for (int p = p0; p < p0 + 2; p++) {
        const float *pm = cl.map_shared_rank(&s_pmax[0][0], p);
        m = fmaxf(m, fmaxf(pm[r], pm[XC_R + r]));
      }
      for (int o = 4; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if ((tid & 7) == 0) s_rmax[r] = m;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < 8 && a.mode < 4; q++) {
      const int r = ra + 4 * q;
      const int sh = row_shift(s_rmax[r], FRAC);
      const float p2 = __int_as_float((127 + sh) << 23);   /* 2^sh: within [-126, 127] for these values */
#pragma unroll
      for (int g = 0; g < 3; g++) {
        int8_t dig[DIG];
        xs_proto_digits<DIG>(__float2int_rn(v[q][g] * p2), dig);
#pragma unroll
        for (int d = 0; d < DIG; d++) chunk[frag_offset(d, r, g * XC_U + j)] = dig[d];
      }
    }
    cl.sync();   /* the cluster's chunks written */

    /* 3: the products, warp w: digit dw (< DIG) of rows 0..31, units 32 ng .. 32 ng + 31 */
    int32_t acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0;
    if (dw < DIG && a.mode < 4) {
      int4 af[2][2][XC_KS];   /* [buffer][m tile][k step] */
      auto fetch = [&](int buf, int c) {
        const int8_t *src = a.mode >= 2 ? chunk : cl.map_shared_rank(chunk, c);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
          for (int ks = 0; ks < XC_KS; ks++)
            af[buf][mt][ks] = *(const int4 *)(src + ((dw * 2 + mt) * XC_KS + ks) * 512 + lane * 16);
      };
      auto product = [&](int buf, int c) {
#pragma unroll
        for (int ks = 0; ks < XC_KS; ks++) {
          uint32_t bf[4][2];
          const int kc = (c * XC_KC + ks * 32) / 16 + (mi & 1);
#pragma unroll
          for (int np = 0; np < 2; np++) {
            const int u = ng * 32 + np * 16 + (mi >> 1) * 8 + r8;
            ldsm_x4(bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1], xs_proto_r_addr<XC_K>(rs, u, kc));
          }
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            const int4 f = af[buf][mt][ks];
            const uint32_t A[4] = {(uint32_t)f.x, (uint32_t)f.y, (uint32_t)f.z, (uint32_t)f.w};
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
              if (a.mode == 1 || a.mode == 3) acc[mt][nt][0] ^= (int32_t)(A[nt] ^ bf[nt][0] ^ bf[nt][1]);
              else mma_s8(acc[mt][nt], A, bf[nt]);
            }
          }
        }
      };
      /* chunks in pairs: buffer 0 holds the even ones, 1 the odd ones; each chunk's loads are
       * issued before the previous chunk's products */
      fetch(0, ub);
#pragma unroll 1
      for (int ci = 0; ci < XC_UB; ci += 2) {
        fetch(1, (ub + ci + 1) & (XC_UB - 1));
        product(0, (ub + ci) & (XC_UB - 1));
        if (ci + 2 < XC_UB) fetch(0, (ub + ci + 2) & (XC_UB - 1));
        product(1, (ub + ci + 1) & (XC_UB - 1));
      }
    }
    /* 4: the combine in four passes of 8 rows (pass p: m tile p / 2, fragment rows (e / 2) = p % 2) */
#pragma unroll
    for (int p = 0; p < 4 && a.mode < 4; p++) {
      if (dw < DIG) {
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
          for (int e2 = 0; e2 < 2; e2++)
            scratch[(dw * 8 + g4) * XC_U + ng * 32 + nt * 8 + 2 * tq + e2] = acc[p >> 1][nt][(p & 1) * 2 + e2];
      }
      __syncthreads();
#pragma unroll
      for (int qq = 0; qq < 2; qq++) {   /* this thread's rows in the pass: ra + 4 q, q = 2 p + qq */
        const int q = 2 * p + qq, r = ra + 4 * q, rl = r - 8 * p;
        long long S = 0;
#pragma unroll
        for (int d = 0; d < DIG; d++) S += (long long)scratch[(d * 8 + rl) * XC_U + j] << (8 * d);
        const int sh = row_shift(s_rmax[r], FRAC);
        dh[q] = (float)((double)S * __longlong_as_double((long long)(1023 - sh) << 52));
      }
      __syncthreads();
    }
  }
  cl.sync();   /* no CTA leaves while a peer may still read its chunk */
#pragma unroll
  for (int q = 0; q < 8; q++) a.out[(rb * XC_R + ra + 4 * q) * XC_H + ub * XC_U + j] = dh[q];
}

template <int DIG>
static void run(const char *name, int mode, const std::vector<int8_t> &RT, const std::vector<float> &dh0) {
  int8_t *dR;
  float *ddh, *dout;
  CK(cudaMalloc(&dR, RT.size())); CK(cudaMemcpy(dR, RT.data(), RT.size(), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&ddh, dh0.size() * 4)); CK(cudaMemcpy(ddh, dh0.data(), dh0.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&dout, dh0.size() * 4));
  auto k = xs_cluster_proto_kernel<DIG>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<DIG>()));
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  xc_args a = {dR, ddh, dout, 1, mode};
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = XC_UB; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(XC_UB, XC_RB); cfg.blockDim = dim3(XC_THREADS); cfg.dynamicSmemBytes = smem_bytes<DIG>();
  cfg.stream = 0; cfg.attrs = at; cfg.numAttrs = 1;
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, (const void *)k, &cfg));
  const int rb_timed = clusters >= 1 && clusters < XC_RB ? clusters : XC_RB;
  auto launch = [&](int T) {
    a.T = T;
    cfg.gridDim = dim3(XC_UB, T == 1 ? XC_RB : rb_timed);
    CK(cudaLaunchKernelEx(&cfg, k, a));
  };
  double err = -1;
  if (mode == 0) {   /* one step against fp64: dq = (dh c_g) 2^-11 as the kernel forms it */
    err = xs_proto_check_step(launch, dout, RT, dh0, XC_N, XC_H, 0x1p-11f);
  }
  const float ms = time_ms([&] { launch(100); }, 0);
  printf("%-10s mode %d: %8.3f ms / 100 steps = %6.2f us a step (%d of the %d row blocks' clusters resident at once and timed)", name,
         mode, ms, ms * 10.0f, rb_timed, XC_RB);
  if (err >= 0) printf("; one step vs fp64: largest |error| / largest |value| %.2e", err);
  printf("\n");
  CK(cudaFree(dR)); CK(cudaFree(ddh)); CK(cudaFree(dout));
}

int main() {
  std::vector<int8_t> RT;
  std::vector<float> dh0;
  xs_proto_inputs(XC_N, XC_H, RT, dh0);
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  printf("xs_cluster_proto on %s: N %d H %d, %d row blocks of one %d-CTA cluster, %d threads a CTA, %d bytes of shared memory "
         "(4 digits)\n", pr.name, XC_N, XC_H, XC_RB, XC_UB, XC_THREADS, smem_bytes<4>());
  for (int mode = 0; mode < 5; mode++) run<4>("4 digits", mode, RT, dh0);
  run<3>("3 digits", 0, RT, dh0);
  return 0;
}
