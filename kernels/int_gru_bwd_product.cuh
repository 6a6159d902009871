/*
 * int_gru_bwd_product.cuh: the integer GRU STE backward's own fp32 per-step product
 * (step_product_kernel: dq_s R~ in K slices, a fixed FMA order) for the strict mode's small
 * shapes, where the exact split does not run, and its tile shape (step_product_shape).
 * Included once by kernels/int_gru_backward.cu, after int_gru_bwd_step.cuh.
 */

/* step_product_kernel: the strict mode's per-step product where the exact split does not run
 * (shapes below QGRU_OWN_STEP_FLOPS): P[k][n][i] = sum over j of slice k (j = k Kc ..
 * min(3H, k Kc + Kc) - 1, ascending) of dq_s[n][j] R~[j][i], one fp32 FMA chain per output, the S
 * slices added in order by the next step kernel. The order depends only on the shape
 * (deterministic), and the accuracy is SGEMM's (a chain of at most Kc FMAs, then S adds).
 * Why not cuBLAS: at medium (N 64, H 512) cublasGemmStridedBatchedEx runs its 8 slices of
 * 64 x 512 x 192 as 32 x 32 SIMT tiles of 64 threads, 7.9 us a step under ncu (caches kept) against
 * 7.0 here, and the strict backward went 1.39-1.42 -> 1.31-1.32 ms (bench/cuda_int_gru.md,
 * session 25; the step is bound by latency at 4 warps a multiprocessor, not by its FMAs).
 * A CTA of 8 TR / RT threads computes a tile of TR rows x SP_TU units (thread t: units
 * 4 (t % 8) .. + 3 of rows t / 8 + (TR / RT) q, q < RT) over its slice in chunks of SP_KB columns,
 * streamed into a ring of SP_STAGES shared-memory stages by cp.async, SP_STAGES - 1 chunks ahead of
 * the FMAs: dq's rows as [row][k] (rows SP_QP words apart, so the four rows a warp reads at once
 * are on distinct banks), R~'s rows as [k][unit]. RT = 4 (16 outputs a thread); 2 (256 threads) and
 * 8 (64) ran slower. VEC (H % 4 == 0): 16-byte copies, each wholly inside or outside the operands
 * (zero-filled outside); else 4-byte copies and zeros stored outside. */
enum { SP_KB = 32, SP_TU = 32, SP_STAGES = 3, SP_QP = SP_KB + 4, SP_RT = 4 };

template <int TR, int RT, bool VEC>
__global__ void __launch_bounds__(8 * TR / RT) step_product_kernel(float *__restrict__ P, const float *__restrict__ dq,
                                                                   const float *__restrict__ R, int N, int H, int Kc) {
  constexpr int NT = 8 * TR / RT, RS = TR / RT;   /* threads; the rows of a thread are RS apart */
  __shared__ __align__(16) float qs[SP_STAGES][TR][SP_QP];
  __shared__ __align__(16) float rs[SP_STAGES][SP_KB][SP_TU];
  const int tid = threadIdx.x, tu = tid & 7, tr = tid >> 3;
  const int i0 = blockIdx.x * SP_TU, n0 = blockIdx.y * TR, H3 = 3 * H;
  const int j0 = blockIdx.z * Kc, j1 = min(H3, j0 + Kc), nch = (j1 - j0 + SP_KB - 1) / SP_KB;
  /* chunk c into stage b: the thread's share of the TR x SP_KB dq values and SP_KB x SP_TU R~ values */
  auto issue = [&](int c, int b) {
    if (c < nch) {
      const int j = j0 + c * SP_KB;
      if (VEC) {
#pragma unroll
        for (int m = 0; m < TR * SP_KB / 4 / NT; m++) {   /* 16-byte pieces: row pr, columns pc .. pc + 3 */
          const int q = tid + m * NT, pr = q >> 3, pc = 4 * (q & 7), n = n0 + pr;
          const bool ok = n < N && j + pc < j1;
          cp_async16_zfill(&qs[b][pr][pc], ok ? dq + (int64_t)n * H3 + j + pc : dq, ok ? 16 : 0);
        }
#pragma unroll
        for (int m = 0; m < SP_KB * SP_TU / 4 / NT; m++) {   /* R~: row kr, units uc .. uc + 3 */
          const int q = tid + m * NT, kr = q >> 3, uc = 4 * (q & 7);
          const bool ok = j + kr < j1 && i0 + uc < H;
          cp_async16_zfill(&rs[b][kr][uc], ok ? R + (int64_t)(j + kr) * H + i0 + uc : R, ok ? 16 : 0);
        }
      } else {
#pragma unroll 4
        for (int m = 0; m < TR * SP_KB / NT; m++) {   /* one value: row pr, column pc */
          const int q = tid + m * NT, pr = q / SP_KB, pc = q % SP_KB, n = n0 + pr;
          if (n < N && j + pc < j1) cp_async4(&qs[b][pr][pc], dq + (int64_t)n * H3 + j + pc);
          else qs[b][pr][pc] = 0.0f;
        }
#pragma unroll 4
        for (int m = 0; m < SP_KB * SP_TU / NT; m++) {
          const int q = tid + m * NT, kr = q / SP_TU, uc = q % SP_TU;
          if (j + kr < j1 && i0 + uc < H) cp_async4(&rs[b][kr][uc], R + (int64_t)(j + kr) * H + i0 + uc);
          else rs[b][kr][uc] = 0.0f;
        }
      }
    }
    cp_async_commit();   /* a group every call, empty past the slice: the waits count SP_STAGES - 2 */
  };
  float acc[RT][4];
#pragma unroll
  for (int q = 0; q < RT; q++)
#pragma unroll
    for (int u = 0; u < 4; u++) acc[q][u] = 0.0f;
#pragma unroll
  for (int c = 0; c < SP_STAGES - 1; c++) issue(c, c);
  for (int c = 0; c < nch; c++) {
    const int b = c % SP_STAGES;
    cp_async_wait<SP_STAGES - 2>();   /* this thread's copies of chunk c have landed */
    __syncthreads();                  /* everyone's; and every read of chunk c - 1's stage is done */
    issue(c + SP_STAGES - 1, (c + SP_STAGES - 1) % SP_STAGES);
#pragma unroll 2
    for (int k4 = 0; k4 < SP_KB; k4 += 4) {
      float4 a[RT];
#pragma unroll
      for (int q = 0; q < RT; q++) a[q] = *reinterpret_cast<const float4 *>(&qs[b][tr + RS * q][k4]);
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        const float4 r4 = *reinterpret_cast<const float4 *>(&rs[b][k4 + kk][4 * tu]);
#pragma unroll
        for (int q = 0; q < RT; q++) {
          const float av = kk == 0 ? a[q].x : kk == 1 ? a[q].y : kk == 2 ? a[q].z : a[q].w;
          acc[q][0] = fmaf(av, r4.x, acc[q][0]);
          acc[q][1] = fmaf(av, r4.y, acc[q][1]);
          acc[q][2] = fmaf(av, r4.z, acc[q][2]);
          acc[q][3] = fmaf(av, r4.w, acc[q][3]);
        }
      }
    }
  }
  cp_async_wait_all();
  float *Pk = P + (int64_t)blockIdx.z * N * H;
#pragma unroll
  for (int q = 0; q < RT; q++) {
    const int n = n0 + tr + RS * q;
    if (n >= N) continue;
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (i0 + 4 * tu + u < H) Pk[(int64_t)n * H + i0 + 4 * tu + u] = acc[q][u];
  }
}

/* step_product_kernel's launch shape for dq_s [N, 3H] R~ [3H, H]: the tile's rows (64 from 33
 * rows on, else 32), and K slices of Kc columns (a multiple of SP_KB), as many as bring the CTAs to about
 * one per multiprocessor, at most STEP_MAX_SLICES (the step kernel's loads). A function of the
 * shape and the device's multiprocessor count, so the summation order is fixed. */
struct sp_shape {
  int rows, slices, Kc;
};
static sp_shape step_product_shape(const qg_ctx *ctx, int64_t N, int64_t H) {
  sp_shape o;
  o.rows = N > 32 ? 64 : 32;
  const int64_t H3 = 3 * H, tiles = ((H + SP_TU - 1) / SP_TU) * ((N + o.rows - 1) / o.rows);
  int64_t S = (ctx->sm_count + tiles - 1) / tiles;
  if (S > STEP_MAX_SLICES) S = STEP_MAX_SLICES;
  if (S < 1) S = 1;
  const int64_t Kc = round_up((H3 + S - 1) / S, SP_KB);
  o.Kc = (int)Kc;
  o.slices = H3 > 0 ? (int)((H3 + Kc - 1) / Kc) : 0;
  return o;
}
