/*
 * int_gru_bwd_loop.cuh: the integer GRU STE backward's per-step loop (the fallback path of
 * int_gru_backward.cu's header): which split runs (the TF32 mode's bf16 pieces, the strict mode's
 * exact int8 digits; their operand checks), the loop's settings (row groups, the side stream's
 * chunks, the step product), the side stream's work beside the recurrence (the after-loop
 * operands, dx chunk by chunk), and step_loop_body, the loop itself, which the backward runs
 * through the context's graph cache. The timing-only builds' traces (QG_KTRACE, XS_TIMELINE)
 * are here too.
 * Included once by kernels/int_gru_backward.cu, after int_gru_bwd_product.cuh.
 */

/* The TF32 mode's bf16 split (int_gru_backward.cu's header) needs every value of the fake-quantized operands
 * exact in bf16: (q - z) 2^-e with |q - z| <= 256 (bf16 carries 8 significant bits; |e| <= 31
 * always, QUANT_SPEC.md section 1) for every code q of the grid. */
static int grid_bf16_exact(int64_t qmin, int64_t qmax, int64_t z) { return qmin - z >= -256 && qmax - z <= 256; }

/* The same for every row (channel) of weight w: its zero points from the host copy (current:
 * device-derived quantizers are symmetric, their host zero points 0). */
static int weight_bf16_exact(const qg_int_gru *g, int w) {
  const int b = g->w_bits[w];
  if (!g->w_set[w] || b < 1 || b > 8) return 0;
  const int64_t qmin = g->w_unsigned[w] ? 0 : -(1LL << (b - 1)), qmax = g->w_unsigned[w] ? (1LL << b) - 1 : (1LL << (b - 1)) - 1;
  for (int64_t j = 0; j < 3 * g->H; j++)
    if (!grid_bf16_exact(qmin, qmax, g->w_zp_host[w][j])) return 0;
  return 1;
}

/* The exact int8 split's codes of a grid [qmin, qmax] (at most 256 codes): c = q - off within
 * [-128, 127] with off = 0 where the grid is int8's, else qmin + 128 (exact_split.cuh). */
static int xs_offset(int64_t qmin, int64_t qmax) { return qmin >= -128 && qmax <= 127 ? 0 : (int)(qmin + 128); }

/* Whether weight w's codes can be the exact split's integer operand: at most 8 bits, and every
 * row's |off - z| <= 2^15 (so that the corrections' int64 sums cannot overflow); off in *off. */
static int weight_xs(const qg_int_gru *g, int w, int *off) {
  const int b = g->w_bits[w];
  if (!g->w_set[w] || b < 1 || b > 8 || !g->codes[w]) return 0;
  const int64_t qmin = g->w_unsigned[w] ? 0 : -(1LL << (b - 1)), qmax = g->w_unsigned[w] ? (1LL << b) - 1 : (1LL << (b - 1)) - 1;
  const int o = xs_offset(qmin, qmax);
  for (int64_t j = 0; j < 3 * g->H; j++)
    if (llabs((long long)o - g->w_zp_host[w][j]) > (1LL << 15)) return 0;
  *off = o;
  return 1;
}

/* The same for a per-tensor activation quantizer (input.x, output.h). */
static int act_xs(qg_qp q, int *off) {
  if (q.qmax - q.qmin > 255) return 0;
  const int o = xs_offset(q.qmin, q.qmax);
  if (llabs((long long)o - q.z) > (1LL << 15)) return 0;
  *off = o;
  return 1;
}

/* dx rows [r0, r0 + rows) (time rows (t, n), dx [T N, C] += masked dp W~) on stream st with handle
 * hb, by the strict split: dp's rows as digit planes Dp [4][rows][Kp] (W's exponents wke and zero
 * points wkz folded in, shifts rsh and corrections rco per row), the int8 GEMM by W~'s codes WT
 * [C][Kp] into PX [4][rows][C], the combine adding the masked results. Per-row values and integer
 * sums: the same bits for any split of the rows (the loop's side chunks, or all rows after it). */
static qg_status xs_dx_rows(qg_ctx *ctx, const char *fn, cudaStream_t st, cublasHandle_t hb, float *dx, const float *dp,
                            const uint8_t *xmask, int8_t *Dp, int *rsh, long long *rco, int32_t *PX, const int8_t *WT,
                            const int32_t *wke, const int32_t *wkz, int offW, int64_t H3, int64_t Kp, int64_t C, int64_t r0,
                            int64_t rows) {
  int8_t *D = Dp + XS_DIGITS * r0 * Kp;
  int32_t *P = PX + XS_DIGITS * r0 * C;
  xs_rows_kernel<<<(unsigned)rows, XS_THREADS, 0, st>>>(D, rsh + r0, rco + r0, dp + r0 * H3, H3, rows, H3, Kp, wke, wkz, offW);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  QG_CHECK(xs_gemm_on(ctx, hb, fn, P, D, WT, XS_DIGITS * rows, C, Kp, 1));
  xs_combine_kernel<<<qg_cuda_blocks(rows * C, 256), 256, 0, st>>>(dx + r0 * C, P, 1, rsh + r0, rco + r0, xmask + r0 * C, rows, C, 0, 1);
  return qg_cuda_launched(ctx, fn);
}

/* The same rows by the bf16 split: tX [rows][2][C] = dp's rows (bf16 pieces [T N][2][3H], as
 * [2 rows, 3H]) W~ (bf16 Wb [3H, C]), the two pieces added into dx (hi first), masked. */
static qg_status bf16_dx_rows(qg_ctx *ctx, const char *fn, cudaStream_t st, cublasHandle_t hb, float *dx, const __nv_bfloat16 *dp,
                              const uint8_t *xmask, const __nv_bfloat16 *Wb, float *tX, int64_t H3, int64_t C, int64_t r0, int64_t rows) {
  QG_CHECK(gemm_bf16_rm_on(ctx, hb, fn, 0, 0, 2 * rows, C, H3, dp + r0 * 2 * H3, H3, Wb, C, tX + r0 * 2 * C));
  masked_add2_kernel<<<qg_cuda_blocks(rows * C, 256), 256, 0, st>>>(dx + r0 * C, tX + r0 * 2 * C, xmask + r0 * C, rows * C, C, 2 * C, C);
  return qg_cuda_launched(ctx, fn);
}

/* K slices of the exact split's per-step product [4N, H] (K = 3H): up to XS_STEP_SLICES while the
 * output's 256 x 128 tiles leave multiprocessors idle and every slice keeps at least 256 bytes of
 * K (in XS_KPAD units). A function of the shape and the device, like step_gemm_slices; the
 * slices' integer sums are exact in any order anyway, so the results do not depend on it. */
#ifndef QGRU_XS_STEP_SLICES
#define QGRU_XS_STEP_SLICES 2
#endif
static_assert(QGRU_XS_STEP_SLICES >= 1 && QGRU_XS_STEP_SLICES <= XS_MAX_SLICES, "xs_element adds at most XS_MAX_SLICES slices");
static int xs_step_slices(const qg_ctx *ctx, int64_t N, int64_t H) {   /* N: the rows of one product */
  const int64_t tiles = ((4 * N + 255) / 256) * ((H + 127) / 128), units = xs_kpad(3 * H) / XS_KPAD;
  int S = 1;
  while (S < QGRU_XS_STEP_SLICES && tiles * 2 * S <= ctx->sm_count && units % (2 * S) == 0 && units / (2 * S) >= 16) S *= 2;
  return S;
}

/* 1: the strict split's per-step chain fuses dq_s's split into the step kernel (bwd_step1_xs_kernel)
 * where H allows; 0: xs_rows_kernel after bwd_step1_kernel everywhere (the same bits). */
#ifndef QGRU_XS_FUSED_STEP
#define QGRU_XS_FUSED_STEP 1
#endif

/* bwd_step1_xs_kernel's launch: clusters of ceil(H / XF_X) blocks of XF_X x BS_Y threads along
 * the units, ceil(nr / BS_Y) of them along the rows; at: the attributes' storage (2). pdl: as a
 * programmatic dependent launch, so that the kernel is launched while the stream's previous kernel
 * (the step's GEMM) drains and waits for it in griddep_wait (H200, large strict backward 4.24-4.26
 * -> 4.12-4.14 ms; bench/cuda_int_gru.md, session 30). */
static cudaLaunchConfig_t xs_fused_config(int64_t H, int64_t nr, cudaStream_t st, int pdl, cudaLaunchAttribute *at) {
  const unsigned K = (unsigned)((H + XF_X - 1) / XF_X);
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(K, (unsigned)((nr + BS_Y - 1) / BS_Y));
  lc.blockDim = dim3(XF_X, BS_Y);
  lc.stream = st;
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = K; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
  lc.attrs = at;
  lc.numAttrs = 1;
  if (pdl) {
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    lc.numAttrs = 2;
  }
  return lc;
}

/* bwd_step1_xs_kernel's variant for the loop's K slices of P (1: the single-slice form). */
typedef void (*xs_step_kernel_t)(bwd_params, int, const float *, const int32_t *, int, float *, void *, double *, int *, long long *, int,
                                 int, int, int8_t *, int, const int32_t *, const int32_t *, int, int, unsigned *);
static xs_step_kernel_t xs_step_kernel_for(int slices) {
  return slices <= 1 ? bwd_step1_xs_kernel<1> : bwd_step1_xs_kernel<XS_MAX_SLICES>;
}

/* Whether the device runs bwd_step1_xs_kernel's clusters for H units (ceil(H / XF_X) blocks of
 * XF_X x BS_Y threads: at least one such cluster resident at once; not on every partition of a
 * GPU), in the variant for `slices`. Memoized per device ordinal, cluster size and variant (an
 * occupancy query). */
static int xs_fused_fits(int64_t H, int slices) {
  enum { DEVS = 64 };
  static signed char memo[DEVS][XF_MAX_CLUSTER + 1][2];   /* 0 unknown, 1 no, 2 yes */
  const int K = (int)((H + XF_X - 1) / XF_X), v = slices <= 1 ? 0 : 1;
  int dev = 0;
  if (K < 1 || K > XF_MAX_CLUSTER || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DEVS) { (void)cudaGetLastError(); return 0; }
  if (!memo[dev][K][v]) {
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t lc = xs_fused_config(H, BS_Y, 0, 0, at);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, xs_step_kernel_for(slices), &lc) != cudaSuccess) { n = 0; (void)cudaGetLastError(); }
    memo[dev][K][v] = n > 0 ? 2 : 1;
  }
  return memo[dev][K][v] == 2;
}

/* The strict split's per-step chain (the step kernel, xs_rows_kernel, the int8 GEMM) runs as two
 * independent chains of half the batch rows each, on the main and the aux stream, from this many
 * rows (N) on: each chain's latency-bound kernels then overlap the other's GEMM (H200, large:
 * backward 5.20-5.24 -> 4.97-5.03 ms; bench/cuda_int_gru.md, session 19). Every row's values and
 * sums are those of one chain: the same bits. step_loop_body runs the TF32 split's chain the same
 * way, but there (no split kernel between the step kernel and its GEMM) two groups were slower
 * (2.64 -> 2.86 ms), so it keeps one. */
#ifndef QGRU_ROW_GROUP_ROWS
#define QGRU_ROW_GROUP_ROWS 128
#endif
/* How many row groups from QGRU_ROW_GROUP_ROWS rows on: at most XG_MAX, one stream each (the main
 * and aux streams, then ext[0], ...; the context's last ext stream is the side stream). Four groups
 * (with QG_EXT_STREAMS = 3) were slower than two: large strict backward 5.02-5.05 ms against
 * 4.85-4.90 (H200, session 21). */
#ifndef QGRU_ROW_GROUPS
#define QGRU_ROW_GROUPS 2
#endif
enum { XG_MAX = 2 };
static_assert(QGRU_ROW_GROUPS >= 2 && QGRU_ROW_GROUPS <= XG_MAX && XG_MAX <= 2 + QG_EXT_STREAMS - 1,
              "row groups on the main, aux and ext streams, the last ext stream left for the side stream");
static_assert(QGRU_ROW_GROUP_ROWS >= 2 * XG_MAX * BS_Y, "every row group keeps at least one block row of the step kernel");

/* The fused split loop's per-step product P = Dq RT^T by igemm (kernels/igemm.cuh: wgmma and TMA,
 * a programmatic dependent of the step kernel, R's codes loaded before its wait) where the device
 * runs it (1), or by cuBLAS (0: the same integers). H200, large strict backward: 4.08-4.10 ms with
 * cuBLAS, 3.94-3.99 with igemm (bench/cuda_int_gru.md, session 36). QGRU_XS_OWN_BN: igemm's block
 * tile columns (64; 128 was slower there: 4.03-4.04). */
#ifndef QGRU_XS_OWN_PRODUCT
#define QGRU_XS_OWN_PRODUCT 1
#endif
#ifndef QGRU_XS_OWN_BN
#define QGRU_XS_OWN_BN 64
#endif

/* The splits' work beside the per-step loop (step_loop: column maxima, dx) in chunks of about this
 * many (t, n) rows, on the context's last ext stream, where the loop has at least two chunks; 0:
 * all of it after the loop. */
#ifndef QGRU_SIDE_CHUNK_ROWS
#define QGRU_SIDE_CHUNK_ROWS 2048
#endif
/* 1: the side stream's dx for the loop's last chunk of steps (queued only once the loop's last step
 * is) runs after the loop, beside the after-loop work, instead of at the loop's end, and the main
 * stream joins the side stream at the end of the backward (nothing after the loop reads dx). The
 * side stream runs behind the loop: at the large shape its work ended 0.07-0.12 ms after the main
 * stream's last step. H200, large strict backward: 3.661-3.671 ms against 3.670-3.724
 * (bench/cuda_int_gru.md, session 40; the same bits). */
#ifndef QGRU_SIDE_DEFER_LAST
#define QGRU_SIDE_DEFER_LAST 1
#endif

/* Where QG_SPLIT_AUTO takes the exact split: the float GEMMs it replaces at least this many flops
 * (2^32 after the loop: ~0.1 ms against its ~15 launches). Per step, xs_step_auto: since its
 * product runs on igemm (session 36) the split's step beats the fp32 step product from about
 * 6e7 flops a step, and at every N from H 640 (H200, strict backward, forced on against the old
 * threshold of 2^28: N 8 H 1024 2.12 -> 1.25 ms, N 64 H 512 1.30 -> 1.21, N 128 H 512 2.25 -> 1.48;
 * N 32 H 512, 5e7 flops: 1.106 against 1.128; bench/cuda_int_gru.md, session 50). Above H 1024
 * (the step kernel without the fused split) the old threshold stays: not measured there. */
#define XS_MIN_STEP_FLOPS 6.0e7
#define XS_MIN_STEP_FLOPS_WIDE 268435456.0
#define XS_MIN_AFTER_FLOPS 4294967296.0
static int xs_step_auto(double step_flops, int64_t H) {
  if (H > 1024) return step_flops >= XS_MIN_STEP_FLOPS_WIDE;
  return H >= 640 || step_flops >= XS_MIN_STEP_FLOPS;
}
/* the strict step product below this many flops a step, where the split does not run: our
 * step_product_kernel, else cuBLAS (session 25) */
#ifndef QGRU_OWN_STEP_FLOPS
#define QGRU_OWN_STEP_FLOPS 268435456.0
#endif

/* Whether every index of a step of bwd_step1_kernel fits 32 bits: the dp / dq rows [T N, 3H], the
 * saved records [T N H] of cb bytes, dy [T N, Hy] (and so the h codes, Hf and the step sums). */
static int step_fits32(int64_t T, int64_t N, int64_t H, int cb, int64_t Hy) {
  const int64_t TN = T * N, lim = (int64_t)1 << 31;
  return TN < lim && TN * 3 * H < lim && TN * H * cb < lim && TN * (Hy + 1) < lim;
}

/* QG_KTRACE builds (ktrace.cuh): the split loop's records, reset before each call's loop and
 * summarized on stderr after the call (the call then waits for its work). */
#if QG_KTRACE
static kt_rec *kt_dev;   /* [KT_MAX_T][2][2] */
__global__ void kt_reset_kernel(kt_rec *r, int n) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) r[k] = kt_rec{~0ull, ~0ull, 0ull, 0ull};
}
static void kt_prepare(int64_t T, cudaStream_t st) {
  if (!kt_dev) {
    cudaMalloc(&kt_dev, sizeof(kt_rec) * KT_MAX_T * 4);
    cudaMemcpyToSymbol(kt_loop, &kt_dev, sizeof kt_dev);
  }
  if (T <= KT_MAX_T) kt_reset_kernel<<<(unsigned)((T * 4 + 255) / 256), 256, 0, st>>>(kt_dev, (int)(T * 4));
}
static kt_rec *kt_product_rec(int64_t s, int gi) { return kt_dev && s < KT_MAX_T ? kt_dev + 2 * (2 * s + (gi > 0)) + 1 : NULL; }
static double kt_median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { const double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
  return n ? v[n / 2] : 0.0;
}
/* per group, medians over the middle steps (us): the step kernel's first-block wait to last end
 * (run), the product's (run), the edges (step end -> product's first wait; product end -> the next
 * step kernel's first wait), the period (one step kernel's first wait to the next's); then the
 * raw records of three middle steps, us from the first one's t0 */
static void kt_print(int64_t T, int groups) {
  if (!kt_dev || T > KT_MAX_T || T < 8) return;
  cudaDeviceSynchronize();
  static kt_rec h[KT_MAX_T * 4];
  cudaMemcpy(h, kt_dev, sizeof(kt_rec) * T * 4, cudaMemcpyDeviceToHost);
  static double v[6][KT_MAX_T];
  for (int g = 0; g < groups && g < 2; g++) {
    int n = 0;
    for (int64_t s = T - 3; s >= 2; s--, n++) {   /* processing order: s descending */
      const kt_rec S = h[2 * (2 * s + g)], P = h[2 * (2 * s + g) + 1], S2 = h[2 * (2 * (s - 1) + g)];
      v[0][n] = (S.t1 - S.w0) * 1e-3; v[1][n] = (P.t1 - P.w0) * 1e-3; v[2][n] = ((double)P.w0 - (double)S.t1) * 1e-3;
      v[3][n] = ((double)S2.w0 - (double)P.t1) * 1e-3; v[4][n] = ((double)S2.w0 - (double)S.w0) * 1e-3;
      v[5][n] = ((double)S.w1 - (double)S.w0) * 1e-3;
    }
    fprintf(stderr, "kt group %d (median of %d steps, us): step run %.2f (wait spread %.2f), product run %.2f, edge step->product %.2f, "
                    "edge product->step %.2f, period %.2f\n", g, n, kt_median(v[0], n), kt_median(v[5], n), kt_median(v[1], n),
            kt_median(v[2], n), kt_median(v[3], n), kt_median(v[4], n));
  }
  const int64_t sm = T / 2;
  const double base = (double)h[2 * (2 * sm)].t0;
  for (int64_t s = sm; s > sm - 3; s--)
    for (int g = 0; g < groups && g < 2; g++)
      for (int k = 0; k < 2; k++) {
        const kt_rec r = h[2 * (2 * s + g) + k];
        fprintf(stderr, "kt s %lld g %d %s t0 %8.2f w0 %8.2f w1 %8.2f t1 %8.2f\n", (long long)s, g, k ? "prod" : "step",
                ((double)r.t0 - base) * 1e-3, ((double)r.w0 - base) * 1e-3, ((double)r.w1 - base) * 1e-3, ((double)r.t1 - base) * 1e-3);
      }
}
#define KT_PREPARE(T, st) kt_prepare(T, st)
#define KT_PRINT(T, groups) kt_print(T, groups)
#define KT_PRODUCT(s, gi) ig_kt_set(kt_product_rec(s, gi))
#else
#define KT_PREPARE(T, st) ((void)0)
#define KT_PRINT(T, groups) ((void)0)
#define KT_PRODUCT(s, gi) ((void)0)
#endif

/* The per-step recurrence: arguments of the loop (also the graph cache's key, with a tag). */
struct step_loop {
  char tag[8];                 /* "qgIGRUb" */
  bwd_params bp;
  const void *R;               /* R~ [3H, H]: float, or bf16 when pieces = 2 */
  float *dh, *dh_next, *P;
  void *Hf;                    /* [T N, H]: float, or bf16 when pieces = 2 */
  double *sp;
  int64_t chunks;
  int rpt, math, slices, words;
  int fits32;                  /* bwd_step1_kernel (step_fits32) */
  int pieces;                  /* 2: the TF32 mode's bf16 split (dq, dp, Hf, R~ in bf16) */
  int own, own_rows, own_kc;   /* the strict product by step_product_kernel (its tile's rows, the slice width) instead of cuBLAS */
  /* the strict mode's exact int8 split of the step's product (xs = 1; exact_split.cuh): dq_s's
   * digit planes Dq [4][N][Kp], its shifts and corrections xsh, xcorr [N], R~'s codes RT [H][Kp],
   * R's per-row exponents ke and zero points kz, the codes' offset zoff; the products in P as
   * int32 [slices][4][N][H] */
  int xs, zoff;
  int fused, zc_any;           /* xs: bwd_step1_xs_kernel (the split fused into the step kernel; zc_any: R has zero-point terms) */
  int own_xs;                  /* fused: the product by igemm (a programmatic dependent) instead of cuBLAS */
  ig_plan xp[XG_MAX];          /* own_xs: each row group's product */
  unsigned *kmx;               /* fused: the after-loop split's column maxima of dq, dp [2][3H], by the step kernel (else NULL) */
  int64_t Kp;
  int8_t *Dq;
  const int8_t *RT;
  int *xsh;
  long long *xcorr;
  const int32_t *ke, *kz;
  /* the row groups (QGRU_ROW_GROUP_ROWS, QGRU_ROW_GROUPS; groups = 1: all rows): group g rows
   * [gstart[g], gstart[g + 1]) on stream gstream[g] (the main stream, the aux stream; their marks
   * gev[g]), each with its own products P + S pc
   * n0 H [S][pc][nr][H] (pc = 4 digits or 2 pieces) and (xs) digit planes Dq + 4 n0 Kp [4][nr][Kp] */
  int groups;
  int64_t gstart[XG_MAX + 1];
  void *gstream[XG_MAX], *gblas[XG_MAX], *gev[XG_MAX];
  /* work beside the recurrence, on side_stream (the context's last ext stream, at the device's
   * least priority, its own cuBLAS handle; mark side_ev), in chunks of sc steps (sc = 0: none;
   * QGRU_SIDE_CHUNK_ROWS): at the start the after-loop products' codes (split: h^T, x^T, W~^T;
   * bf16 split: x~, W~ in bf16), then for each chunk [s, s + sc), once the row groups' step kernels
   * of its step s (the loop's last of the chunk) are done, (split) the column maxima of its dq and
   * dp rows and (side_dx) dx of its time rows (defer_last: not the last chunk's dx, which the
   * caller queues after the loop). Each value is what the after-loop work computes from all rows
   * (per-row splits, integer sums, maxima by integer atomicMax): the same bits */
  int sc, side_dx, offW, offH, offX, reverse;
  int64_t C, TNp;
  qg_qp QX;
  void *side_stream, *side_blas, *side_ev;
  int8_t *Dp, *WT, *hT, *xT;   /* split: dp's row digits [4][T N][Kp], W~^T [C][Kp], h^T [H][TNp], x^T [C][TNp] */
  unsigned *mx;                /* split: column maxima of dq, dp [2][3H] */
  int *rsh;
  long long *rco;
  int32_t *PX;                 /* split: dx's products [4][T N][C] */
  const int32_t *Wcodes, *wke, *wkz, *xcodes;
  const float *Wq;             /* bf16 split: W~ (float) */
  void *Xb, *Wb;               /* bf16 split: x~ [T N, C], W~ [3H, C] in bf16 */
  float *tX;                   /* bf16 split: dx's two pieces [T N][2][C] */
  float *dx;
  const uint8_t *xmask;
  int defer_last;              /* the last chunk's dx is left to the caller (after the loop; QGRU_SIDE_DEFER_LAST) */
  qg_ctx *ctx;
};

typedef void (*step_kernel)(bwd_params, int64_t, int, const float *, const float *, int, float *, float *, double *);

/* The side stream's work before the loop (step_loop, "work beside the recurrence"). */
static qg_status side_start(qg_ctx *ctx, const char *fn, const step_loop &L) {
  const cudaStream_t ss = (cudaStream_t)L.side_stream;
  const int64_t T = L.bp.T, N = L.bp.N, H = L.bp.H, H3 = 3 * H, TN = T * N, C = L.C;
  const dim3 tb(XS_THREADS);
  if (L.xs) {   /* the after-loop products' operands */
    if (!L.kmx) QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(L.mx, 0, (size_t)2 * H3 * 4, ss));   /* (else zeroed before the loop) */
    xs_codes_t_kernel<<<dim3(qg_cuda_blocks(L.TNp, XS_TILE), qg_cuda_blocks(H, XS_TILE)), tb, 0, ss>>>(L.hT, L.bp.hq, TN, H, L.TNp, L.offH);
    xs_codes_t_kernel<<<dim3(qg_cuda_blocks(L.TNp, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, ss>>>(L.xT, L.xcodes, TN, C, L.TNp, L.offX);
    if (L.side_dx)
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(L.Kp, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, ss>>>(L.WT, L.Wcodes, H3, C, L.Kp, L.offW);
  } else {
    deq_bf16_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, ss>>>(L.xcodes, TN * C, L.QX, (__nv_bfloat16 *)L.Xb);
    if (L.side_dx) to_bf16_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ss>>>(L.Wq, H3 * C, (__nv_bfloat16 *)L.Wb);
  }
  return qg_cuda_launched(ctx, fn);
}

/* The side stream's work for the chunk of steps [s, se), whose dq rows (step-indexed) are
 * [s N, se N) and dp rows (time-indexed) [t0 N, t0 N + rows): the parts named by `parts`. */
enum { SIDE_COLMAX = 1,   /* the column maxima of its dq and dp rows (split, where the step kernels do not) */
       SIDE_DX = 2 };     /* dx of its rows (side_dx) */
static qg_status side_chunk(qg_ctx *ctx, const char *fn, const step_loop &L, int64_t s, int64_t se, int parts) {
  const cudaStream_t ss = (cudaStream_t)L.side_stream;
  const cublasHandle_t sb = (cublasHandle_t)L.side_blas;
  const int64_t T = L.bp.T, N = L.bp.N, H = L.bp.H, H3 = 3 * H, C = L.C;
  const int64_t t0 = L.reverse ? T - se : s, rows = (se - s) * N, r0 = t0 * N;
  if ((parts & SIDE_COLMAX) && L.xs && !L.kmx) {   /* (kmx: the step kernels' work) */
    const int64_t rpb = XS_COLMAX_ROWS;   /* rows per block of the column maxima, as after the loop */
    const dim3 mg(qg_cuda_blocks(H3, XS_THREADS), qg_cuda_blocks(rows, (int)rpb));
    xs_colmax_kernel<<<mg, XS_THREADS, 0, ss>>>(L.mx, L.bp.dq + s * N * H3, rows, H3, rpb);
    xs_colmax_kernel<<<mg, XS_THREADS, 0, ss>>>(L.mx + H3, L.bp.dp + r0 * H3, rows, H3, rpb);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (!L.side_dx || !(parts & SIDE_DX)) return QG_OK;
  if (L.xs) return xs_dx_rows(ctx, fn, ss, sb, L.dx, L.bp.dp, L.xmask, L.Dp, L.rsh, L.rco, L.PX, L.WT, L.wke, L.wkz, L.offW, H3, L.Kp, C, r0, rows);
  return bf16_dx_rows(ctx, fn, ss, sb, L.dx, (const __nv_bfloat16 *)L.bp.dp, L.xmask, (const __nv_bfloat16 *)L.Wb, L.tX, H3, C, r0, rows);
}

#if XS_TIMELINE
static void xs_tl(const char *name, cudaStream_t s);   /* the timing-only build's marks (below) */
#endif

static qg_status step_loop_body(void *arg) {
  const step_loop &L = *(const step_loop *)arg;
  qg_ctx *ctx = L.ctx;
  const char *fn = "qg_int_gru_backward";
  const int64_t N = L.bp.N, H = L.bp.H, H3 = 3 * H, S = L.slices, Kc = S ? H3 / S : 0;
  const dim3 grid((unsigned)((H + BS_X - 1) / BS_X), (unsigned)L.chunks), block(BS_X, BS_Y);
  float *dh = L.dh, *dn = L.dh_next;
  const int chunks = (int)L.chunks;
  if (L.xs || L.pieces == 2) {   /* the splits: their row groups, each a chain of its own (a stream and cuBLAS handle each) */
    const cudaStream_t st = (cudaStream_t)L.gstream[0], ss = (cudaStream_t)L.side_stream;
    const int64_t T = L.bp.T;
    if (L.groups > 1 || L.sc) {   /* fork: the other streams start after what the main one holds */
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[0], st));
      for (int gi = 1; gi < L.groups; gi++) QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent((cudaStream_t)L.gstream[gi], (cudaEvent_t)L.gev[0], 0));
      if (L.sc) QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(ss, (cudaEvent_t)L.gev[0], 0));
    }
    if (L.sc) QG_CHECK(side_start(ctx, fn, L));
    for (int64_t s = T - 1; s >= 0; s--) {
      const int np = s == T - 1 ? 0 : (int)S;
      const int mark = L.sc && s % L.sc == 0;   /* a side chunk's lowest step: its dq and dp rows are final after the step kernels */
      for (int gi = 0; gi < L.groups; gi++) {
        const int64_t n0 = L.gstart[gi], nr = L.gstart[gi + 1] - n0;
        const cudaStream_t gs = (cudaStream_t)L.gstream[gi];
        const cublasHandle_t gb = (cublasHandle_t)L.gblas[gi];
        const dim3 gg((unsigned)((H + BS_X - 1) / BS_X), (unsigned)((nr + BS_Y - 1) / BS_Y));
        if (L.xs) {
          int32_t *Pg = (int32_t *)L.P + S * XS_DIGITS * n0 * H;
          int8_t *Dg = L.Dq + XS_DIGITS * n0 * L.Kp;
          if (L.fused) {   /* the step and dq_s's digit planes (R's exponents folded in) in one kernel */
            cudaLaunchAttribute at[2];
            const cudaLaunchConfig_t lc = xs_fused_config(H, nr, gs, 1, at);
            QG_CUDA_CHECK(ctx, fn, cudaLaunchKernelEx(&lc, xs_step_kernel_for((int)S), L.bp, (int)s, (const float *)dh, (const int32_t *)Pg, np, dn,
                                                      L.Hf, L.sp, L.xsh, L.xcorr, (int)n0, (int)nr, chunks, Dg, (int)L.Kp, L.ke, L.kz,
                                                      L.zoff, L.zc_any, L.kmx));
            QG_CHECK(qg_cuda_launched(ctx, fn));
            if (mark) QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], gs));
          } else {
            bwd_step1_kernel<4><<<gg, block, 0, gs>>>(L.bp, (int)s, dh, (const float *)Pg, np, dn, L.Hf, L.sp, L.xsh, L.xcorr, (int)n0,
                                                       (int)nr, chunks);
            QG_CHECK(qg_cuda_launched(ctx, fn));
            if (mark) QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], gs));
            /* dq_s as digit planes (R's exponents folded in) */
            xs_rows_kernel<<<(unsigned)nr, XS_THREADS, 0, gs>>>(Dg, L.xsh + n0, L.xcorr + n0, L.bp.dq + (s * N + n0) * H3, H3, nr, H3, L.Kp,
                                                               L.ke, L.kz, L.zoff);
            QG_CHECK(qg_cuda_launched(ctx, fn));
          }
          /* P [S][4 nr, H] = Dq [4 nr, Kp] RT [H, Kp]^T */
          KT_PRODUCT(s, gi);
          if (L.own_xs) QG_CUDA_CHECK(ctx, fn, ig_launch(&L.xp[gi], Pg, gs, 1, 1));
          else QG_CHECK(xs_gemm_on(ctx, gb, fn, Pg, Dg, L.RT, XS_DIGITS * nr, H, L.Kp, (int)S));
        } else {
          float *Pg = L.P + S * 2 * n0 * H;
          bwd_step1_kernel<2><<<gg, block, 0, gs>>>(L.bp, (int)s, dh, Pg, np, dn, L.Hf, L.sp, NULL, NULL, (int)n0, (int)nr, chunks);
          QG_CHECK(qg_cuda_launched(ctx, fn));
          if (mark) QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], gs));
          /* P[k] [2 nr, H]: row l 2 + c = piece c of dq_s's row n0 + l (bf16 [N][2][3H]: column-major
           * [3H, 2 nr] with ld 3H) times R~'s slice k (bf16); every product exact, fp32 accumulation */
          const __nv_bfloat16 *dqs = (const __nv_bfloat16 *)L.bp.dq + (s * N + n0) * 2 * H3;
          const float one = 1.0f, zero = 0.0f;
          QG_CHECK(qg_cublas_status(ctx, fn, cublasGemmStridedBatchedEx(gb, CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)(2 * nr), (int)Kc, &one, L.R,
                                                                        CUDA_R_16BF, (int)H, Kc * H, dqs, CUDA_R_16BF, (int)H3, Kc, &zero,
                                                                        Pg, CUDA_R_32F, (int)H, 2 * nr * H, (int)S, CUBLAS_COMPUTE_32F,
                                                                        CUBLAS_GEMM_DEFAULT)));
        }
      }
      if (mark) {   /* the chunk of steps [s, s + sc) */
        for (int gi = 0; gi < L.groups; gi++) QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(ss, (cudaEvent_t)L.gev[gi], 0));
        QG_CHECK(side_chunk(ctx, fn, L, s, s + L.sc < T ? s + L.sc : T, L.defer_last && s == 0 ? SIDE_COLMAX : SIDE_COLMAX | SIDE_DX));
      }
      float *tmp = dh; dh = dn; dn = tmp;
    }
#if XS_TIMELINE   /* (the loop runs uncaptured in this build) the main stream's and the side stream's last work */
    xs_tl("loopmain", st);
    if (L.sc) xs_tl("loopside", ss);
#endif
    /* join: the main stream waits for the others */
    for (int gi = 1; gi < L.groups; gi++) {
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], (cudaStream_t)L.gstream[gi]));
      QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(st, (cudaEvent_t)L.gev[gi], 0));
    }
    if (L.sc) {
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.side_ev, ss));
      QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(st, (cudaEvent_t)L.side_ev, 0));
    }
    return QG_OK;
  }
  for (int64_t s = L.bp.T - 1; s >= 0; s--) {
    const int np = s == L.bp.T - 1 ? 0 : (int)S;
    if (L.fits32) {
      bwd_step1_kernel<1><<<grid, block, 0, (cudaStream_t)L.gstream[0]>>>(L.bp, (int)s, dh, L.P, np, dn, L.Hf, L.sp, NULL, NULL, 0, (int)N, chunks);
    } else {
    const step_kernel f = L.words ? (L.rpt == 1 ? bwd_step_kernel<true, true, 8> : bwd_step_kernel<true, false, 1>)
                                  : (L.rpt == 1 ? bwd_step_kernel<false, true, 8> : bwd_step_kernel<false, false, 1>);
    f<<<grid, block, 0, (cudaStream_t)L.gstream[0]>>>(L.bp, s, L.rpt, dh, L.P, np, dn, (float *)L.Hf, L.sp);
    }
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (L.own) {   /* P[k] = dq_s[:, slice k] R~[slice k, :] (step_product_kernel, strict fp32) */
      const dim3 pg((unsigned)((H + SP_TU - 1) / SP_TU), (unsigned)((N + L.own_rows - 1) / L.own_rows), (unsigned)S);
      const float *dqs = L.bp.dq + s * N * H3;
      const auto f = L.own_rows == 64 ? (H % 4 ? step_product_kernel<64, SP_RT, false> : step_product_kernel<64, SP_RT, true>)
                                      : (H % 4 ? step_product_kernel<32, SP_RT, false> : step_product_kernel<32, SP_RT, true>);
      f<<<pg, 8 * L.own_rows / SP_RT, 0, (cudaStream_t)L.gstream[0]>>>(L.P, dqs, (const float *)L.R, (int)N, (int)H, L.own_kc);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    } else if (!S) {
      const float *dqs = L.bp.dq + s * N * H3;
      QG_CHECK(sgemm_rm(ctx, fn, 0, 0, N, H, H3, dqs, (const float *)L.R, 1.0f, dn));   /* dn += dq_s R~ */
    } else {   /* P[k] = dq_s[:, k Kc : (k + 1) Kc] R~[k Kc : (k + 1) Kc, :] (column-major: P^T = R~^T dq^T) */
      const float *dqs = L.bp.dq + s * N * H3;
      const float one = 1.0f, zero = 0.0f;
      QG_CHECK(qg_cublas_status(ctx, fn, cublasGemmStridedBatchedEx(
                                             qg_cuda_blas(ctx), CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)N, (int)Kc, &one, L.R,
                                             CUDA_R_32F, (int)H, Kc * H, dqs, CUDA_R_32F, (int)H3, Kc, &zero, L.P, CUDA_R_32F,
                                             (int)H, N * H, (int)S, qg_cuda_f32_compute(ctx), CUBLAS_GEMM_DEFAULT)));
    }
    float *tmp = dh; dh = dn; dn = tmp;
  }
  return QG_OK;
}

/* A timing-only experiment build (-DXS_TIMELINE=1; never in normal builds): CUDA events at the
 * strict backward's phases on their streams, printed to stderr after each call as ms from the
 * call's start (the call then waits for its work). */
#if XS_TIMELINE
static cudaEvent_t xs_tl_ev[24];
static const char *xs_tl_name[24];
static int xs_tl_n;
static void xs_tl(const char *name, cudaStream_t s) {
  if (xs_tl_n >= 24) return;
  if (!xs_tl_ev[xs_tl_n]) cudaEventCreate(&xs_tl_ev[xs_tl_n]);
  xs_tl_name[xs_tl_n] = name;
  cudaEventRecord(xs_tl_ev[xs_tl_n++], s);
}
static void xs_tl_print(void) {
  if (xs_tl_n == 0) return;
  cudaEventSynchronize(xs_tl_ev[xs_tl_n - 1]);
  cudaDeviceSynchronize();
  fprintf(stderr, "xs_timeline");
  for (int k = 1; k < xs_tl_n; k++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, xs_tl_ev[0], xs_tl_ev[k]);
    fprintf(stderr, " %s %.3f", xs_tl_name[k], ms);
  }
  fprintf(stderr, "\n");
  xs_tl_n = 0;
}
#define XS_TL(name, s) xs_tl(name, s)
#define XS_TL_PRINT() xs_tl_print()
#else
#define XS_TL(name, s) ((void)0)
#define XS_TL_PRINT() ((void)0)
#endif
