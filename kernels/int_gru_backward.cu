/*
 * int_gru_backward.cu: the straight-through backward of the integer GRU layer on CUDA
 * (qg_int_gru_backward of core/qgru.h, QUANT_SPEC.md section 4). The per-unit work is the shared
 * STE cell qg_cell_backward of core/int_gru_cell.h, the function the CPU backend
 * (core/int_gru_cpu.c) calls; this file arranges the recurrence and the GEMMs around it. It is a
 * file of its own (the forward and the weight quantization are kernels/int_gru.cu) because its
 * recurrence has two paths of its own. Built with --fmad=false (CMakeLists.txt) like int_gru.cu:
 * the cell's float math must round as the CPU's (built with -ffp-contract=off).
 *
 * The recurrence, steps s = T-1 down to 0, one of two paths (ctx->kernel_path; AUTO takes the
 * persistent one where it fits and its estimate beats the fallback's, a forced PERSISTENT on a
 * shape it cannot hold is QG_ERR_UNSUPPORTED naming the limit, a forced FALLBACK runs the
 * per-step launches):
 *   - persistent (kernels/int_gru_bwd_persist.cu: bwd_persist_kernel, R~ in shared memory, and
 *     its register variants bwd_reg_kernel, bwd_ws_kernel, bwd_ws3_kernel for small H): one
 *     launch for all T steps, thread-block clusters holding R~ on chip; that file says how.
 *   - fallback: per step a cell kernel (bwd_step1_kernel where the step's indices fit 32 bits and
 *     the saved records are 4-byte aligned, else bwd_step_kernel; the same per-unit code) and the cuBLAS
 *     GEMM dq_s R~ in the context's math mode (in strict mode below QGRU_OWN_STEP_FLOPS a step, our
 *     step_product_kernel instead, into the same K-slice partials): where the output's tiles do not fill the device
 *     (large: N 256, H 1024), one strided-batched GEMM over S slices of K = 3H into S partial
 *     products that the next step kernel adds in order (step_gemm_slices), else one GEMM adding
 *     into the direct part. The step kernel also writes Hf (the dR GEMM's
 *     dequantized h) and, instead of the bias contributions bcx, bcr, each block's double sums of
 *     the four distinct bias gradients over its rows (bias_steps_kernel adds those after the
 *     loop in a fixed order): a third fewer bytes per step and no [T N, 3H] re-read. The loop is
 *     captured into a CUDA graph on the second identical call and replayed after (the context's
 *     cache of captured loops in kernels/gru.cu, keyed by every pointer, size, kernel argument and
 *     the math mode; a changed pointer or shape is a new key).
 * Padded steps (s >= lengths[n]) pass dh through and write zero dq, bcx, bcr (dp of padded time
 * rows is cleared before the loop); time t = reverse ? lengths[n] - 1 - s : s.
 * The TF32 mode's bf16 split (per-step path with bwd_step1_kernel; pieces = 2): every float GEMM
 * of this backward multiplies a float gradient (dq or dp) by a fake-quantized tensor (R~, W~, x~,
 * h~). Where those are at most 8-bit grids, (q - z) 2^-e with |q - z| <= 256, they are exact in
 * bf16, and the step kernel writes each gradient as two bf16 pieces, hi = bf16(v) and
 * lo = bf16(v - hi) ([T N][2][3H]: 16 significant bits, TF32 keeps 11). Then every product of a
 * bf16 GEMM is exact and only fp32 accumulation rounds: more accurate than TF32 (bench/
 * bf16_split_gemm.cu: 12-70x smaller errors at the large shape) and faster (half the bytes of the
 * weight operand, bf16 tensor cores at twice TF32's rate). The pieces are extra rows of the
 * product (the per-step GEMM's 2N columns, dW's and dR's 6H rows, dx's 2 T N rows), added after
 * it in a fixed order (hi first): by the step kernel, add_parts_kernel and masked_add2_kernel.
 * The strict mode's exact int8 split (exact_split.cuh; qg_ctx_set_exact_split, auto where the
 * SGEMMs it replaces are large): the same observation, with exact integer sums instead of bf16
 * pieces. Per step (bwd_step1_kernel<4>, the per-step path): the step kernel writes dq in fp32,
 * xs_rows_kernel turns dq_s into digit planes (R's per-row exponents folded in), one int8 GEMM
 * (two K slices where the output leaves the device idle) by R's codes, and the next step kernel
 * adds the digit products (xs_element: int64, one rounding). Where a thread-block cluster holds a
 * row's units (H <= 1024), bwd_step1_xs_kernel is the step kernel and the split in one launch
 * (the same bits) and also gathers the after-loop split's column maxima of dq and dp; its product
 * is then igemm's (igemm.cuh: wgmma, a programmatic dependent of the step kernel, R's codes loaded
 * before its wait; cuBLAS where the device is not sm_90). Beside the loop (per-step path, both
 * splits), a side stream at the device's least priority prepares what the after-loop products
 * need and computes dx chunk by chunk (step_loop; bench/cuda_int_gru.md, session 21: large strict
 * backward 4.92 -> 4.74 ms; the last chunk's dx after the loop, beside the after-loop work, and
 * joined at the end: QGRU_SIDE_DEFER_LAST). After the loop (either path): the
 * codes of h and x as K = T N contiguous rows, dq's and dp's columns as digit planes (a shift per
 * column from its largest value), dp's rows for dx; dR, dW, dx as int8 GEMMs and combines that
 * add the masked results. More accurate than SGEMM (bench/xs_gemm.cu) and 1.9x faster for the
 * large strict train step (bench/gpu.md, run 16).
 * After the loop: dx, dW, dR by GEMMs (qg_cuda_f32_compute: strict fp32 or TF32; dW on the
 * context's aux stream beside the other two, forked and joined with its events) and the bias sums
 * in a fixed order in double (persistent: chunks of (step, row) pairs, then the chunks in order;
 * per-step: the step kernel's row sums, then those in order), dh0 = dh M(h0).
 * Files (one translation unit: this file includes them once, in this order):
 *   - int_gru_bwd_after.cuh: the after-loop kernels and GEMM wrappers;
 *   - int_gru_bwd_step.cuh: the per-step path's kernels (the cell steps, the fused split step);
 *   - int_gru_bwd_product.cuh: the strict mode's own fp32 per-step product;
 *   - int_gru_bwd_loop.cuh: the splits' choices, the side stream, the per-step loop;
 *   - this file: qg_cuda_int_gru_backward, which picks the path and runs the phases.
 *   The split moved code only: built without -lineinfo, the sm_90 cubin is byte for byte the single
 *   file's (session 50).
 */
#include "int_gru_bwd.cuh"   /* bwd_params, the per-(row, unit) step, the persistent path */
#include "gru_persist.cuh"   /* cluster_barrier, sum_partials, ptx.cuh */
#include "exact_split.cuh"   /* the strict mode's exact int8 split products */
#include "igemm.cuh"         /* the split loop's per-step product as a programmatic dependent (sm_90a) */
#include "ktrace.cuh"        /* QG_KTRACE builds only: the split loop's kernel trace */

#include <cuda_bf16.h>
#include <stdio.h>
#include <string.h>

/* The per-step fallback's cost per step (us): two launches (about 4 us each at small shapes, the
 * QAT step timings of bench/gpu.md) plus the GEMM's arithmetic. */
static double fallback_step_us(const qg_ctx *ctx, int64_t N, int64_t H) {
  const double flops = 2.0 * (double)N * 3.0 * (double)H * (double)H;
  return 8.0 + flops / (ctx->math == QG_MATH_TF32 ? 100e6 : 25e6);
}

/* after the loop: bias sums, conversions, masked adds, GEMM wrappers */
#include "int_gru_bwd_after.cuh"

/* the per-step path's kernels */
#include "int_gru_bwd_step.cuh"

/* the strict mode's own fp32 per-step product (small shapes) */
#include "int_gru_bwd_product.cuh"

/* the splits' choices, the side stream and the per-step loop (step_loop_body) */
#include "int_gru_bwd_loop.cuh"

extern "C" qg_status qg_cuda_int_gru_backward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                                              qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                                              const qg_tensor *dhn, const qg_int_gru_saved *saved, const qg_tensor *h0,
                                              const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_int_gru_backward";
  cudaStream_t st = qg_cuda_stream(ctx);
  const qg_tensor *xq = saved->xq;
  const int64_t T = xq->dims[0], N = xq->dims[1], C = g->C, H = g->H, H3 = 3 * H, TN = T * N, NH = N * H;
  const qg_cell_q *cq = &g->cell;
  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H];
  const int64_t chunks = (TN + BIAS_CHUNK - 1) / BIAS_CHUNK;
  const int path = ctx->kernel_path;
  XS_TL("start", st);

  /* the recurrence's path (before any work is queued) */
  bp_plan pc;
  memset(&pc, 0, sizeof pc);
  int persistent = 0;
  if (path != QG_PATH_FALLBACK && TN > 0 && NH > 0) {
    char why[256];
    why[0] = 0;
    double step_us = 0;
    int found = 0;
    if (T >= (1LL << 31) || H > (1LL << 20) || N >= (1LL << 31))
      snprintf(why, sizeof why, "T, N below 2^31 and H at most 2^20 (got T = %lld, N = %lld, H = %lld)", (long long)T, (long long)N,
               (long long)H);
    else if (((uintptr_t)saved->cell->data & 3) != 0)
      snprintf(why, sizeof why, "the saved cell state 4-byte aligned (got address %p)", saved->cell->data);
    else {
      QG_CHECK(int_bwd_persist_choose(ctx, fn, N, H, &pc, &step_us, &found));
      if (!found && ctx->persist_cluster > 0)
        snprintf(why, sizeof why,
                 "a forced shape that holds H = %lld: %d CTAs per cluster, %d rows (qg_ctx_set_persist_shape; shared memory "
                 "per CTA: at most %d bytes)",
                 (long long)H, ctx->persist_cluster, ctx->persist_rows, ctx->smem_optin);
      else if (!found)
        snprintf(why, sizeof why,
                 "R~ (float [3H, H], H = %lld) split over the shared memory of a cluster of up to 16 CTAs: %lld bytes per CTA "
                 "with 16 plus the exchanged dq, at most %d",
                 (long long)H, (long long)(12 * H * ((H + 15) / 16)), ctx->smem_optin);
    }
    if (why[0]) {
      if (path == QG_PATH_PERSISTENT)
        return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "the persistent integer GRU backward needs %s; use kernel path 'auto' or 'fallback'", why);
    } else {
      persistent = path == QG_PATH_PERSISTENT || ctx->persist_cluster > 0 || step_us <= fallback_step_us(ctx, N, H);
    }
  }

  /* the per-step path's row chunks (bwd_step_kernel) */
  const int rpt = persistent ? 1 : step_rows_per_thread(N);
  const int64_t schunks = (N + (int64_t)BS_Y * rpt - 1) / ((int64_t)BS_Y * rpt);
  const int words = ((uintptr_t)saved->cell->data & 3) == 0, cb = qg_cell_bytes(cq->narrow);
  const int64_t Hy = dy ? dy->dims[2] : 0;
  const int fits32 = words && rpt == 1 && step_fits32(T, N, H, cb, Hy);
  /* the TF32 mode's bf16 split (top of the file): the per-step path with bwd_step1_kernel, every
   * fake-quantized operand exact in bf16 (R~, W~ where dx is asked, x, h) */
  const qg_qp QXg = cq->a[QG_Q_INPUT_X], QHg = cq->a[QG_Q_OUTPUT_H];
  const int pieces = !persistent && TN > 0 && NH > 0 && ctx->math == QG_MATH_TF32 && fits32 && TN * 6 * H < (1LL << 31) &&
                             weight_bf16_exact(g, QG_W_R) && (!dx || weight_bf16_exact(g, QG_W_W)) &&
                             grid_bf16_exact(QXg.qmin, QXg.qmax, QXg.z) && grid_bf16_exact(QHg.qmin, QHg.qmax, QHg.z)
                         ? 2
                         : 1;
  /* the strict mode's exact int8 split (exact_split.cuh): of the per-step product (xs_step: the
   * per-step path with bwd_step1_kernel, R's codes within int8 after an offset) and of the
   * after-loop GEMMs (xs_after: R, W where dx is asked, input.x and output.h grids of at most 256
   * codes, K = T N and 3H within the int32 accumulation's bound); under QG_SPLIT_AUTO only where
   * the float GEMMs are large enough for it to gain (below, the split's extra launches cost more
   * than the SGEMMs: H200, bench/gpu.md run 16, long-kws 1.37 ms against 1.22) */
  int offR = 0, offW = 0, offX = 0, offH = 0;
  const int strict = ctx->math == QG_MATH_STRICT && ctx->exact_split != QG_SPLIT_OFF, force = ctx->exact_split == QG_SPLIT_ON;
  const double step_flops = 2.0 * (double)N * (double)H3 * (double)H,
               after_flops = 2.0 * (double)TN * (double)H3 * (double)(H + C + (dx ? C : 0));
  const int xs_R = strict && weight_xs(g, QG_W_R, &offR);
  const int xs_step = xs_R && !persistent && TN > 0 && NH > 0 && fits32 && xs_kpad(H3) <= XS_MAX_K &&
                      (force || xs_step_auto(step_flops, H));
  const int xs_after = xs_R && TN > 0 && H > 0 && (!dx || weight_xs(g, QG_W_W, &offW)) && act_xs(QXg, &offX) && act_xs(QHg, &offH) &&
                       xs_kpad(TN) <= XS_MAX_K && xs_kpad(H3) <= XS_MAX_K && (force || after_flops >= XS_MIN_AFTER_FLOPS);
  /* the strict split's per-step chain in two row groups where the batch is large enough (QGRU_ROW_GROUP_ROWS) */
  const int groups = xs_step && N >= QGRU_ROW_GROUP_ROWS ? QGRU_ROW_GROUPS : 1;
  int64_t gstart[XG_MAX + 1];   /* group g: rows [gstart[g], gstart[g + 1]), block-row aligned */
  for (int gi = 0; gi <= groups; gi++) {
    const int64_t b = gi == groups ? N : round_up((gi * N + groups - 1) / groups, BS_Y);
    gstart[gi] = b < N ? b : N;
  }
  /* work beside the per-step loop in chunks of sc steps (QGRU_SIDE_CHUNK_ROWS; step_loop): the
   * split's loop with the split after it, or the bf16 split's loop where dx is asked; at least two
   * chunks; a chunk's time rows are a range (not with both reverse and lengths: there a step's
   * time rows differ per row) */
  const int64_t sc_want = QGRU_SIDE_CHUNK_ROWS > 0 && N > 0 ? (QGRU_SIDE_CHUNK_ROWS + N - 1) / N : 0;
  const int side_ok = (xs_step && xs_after) || (pieces == 2 && dx);
  const int sc = side_ok && C > 0 && sc_want > 0 && sc_want < T && !(reverse && lengths) ? (int)sc_want : 0;
  const int side_dx = sc && dx;
  /* K slices of the step's product: with two groups their two GEMMs fill the device together, and one slice each ran faster (H200,
   * large: backward 4.92-4.94 ms against 5.00-5.04 with two) */
  int slices = persistent || TN == 0 || NH == 0 ? 0 : (xs_step ? (groups == 2 ? 1 : xs_step_slices(ctx, N, H)) : step_gemm_slices(ctx, N, H, pieces));
  /* the strict product without the split: step_product_kernel where its shape is small (below
   * QGRU_OWN_STEP_FLOPS a step: cuBLAS's SGEMM runs small tiles there; bench/cuda_int_gru.md,
   * session 25), else cuBLAS */
  const int own = !persistent && TN > 0 && NH > 0 && !xs_step && pieces == 1 && ctx->math == QG_MATH_STRICT && fits32 &&
                  H3 * H < (1LL << 31) && step_flops < QGRU_OWN_STEP_FLOPS;
  const sp_shape osh = own ? step_product_shape(ctx, N, H) : sp_shape{0, 0, 0};
  if (own) slices = osh.slices;
  if (pieces == 2 && slices == 0) slices = 1;   /* the split's products always go to P (the step kernel adds the pieces) */
  /* the split of dq_s in the step kernel (bwd_step1_xs_kernel) where a cluster holds a row's units
   * and its digit planes' offsets fit 32 bits, else xs_rows_kernel after it */
  const int xs_fused = QGRU_XS_FUSED_STEP && xs_step && H <= (int64_t)XF_X * XF_MAX_CLUSTER &&
                       XS_DIGITS * N * xs_kpad(H3) < (1LL << 31) && xs_fused_fits(H, slices);
  /* workspace floats: dp, dq [TN, 3H], the persistent path's bcx, bcr [TN, 3H] (not bwd_ws_kernel's), dh, dh_next [N, H],
   * Xf [TN, C], Hf [TN, H], tmpX [TN, C], tmpW [3H, C], tmpR [3H, H]; doubles: the persistent path's
   * bias partial sums [chunks, 2, 3H] (bwd_ws_kernel: [N, 4, H]) or the per-step path's step sums [T, schunks, 4, H] */
  const int64_t nbc = persistent && !pc.WS ? TN * H3 * 4 : 0;
  const int64_t npart = persistent ? (pc.WS ? N * 4 * H : chunks * 2 * H3) : T * schunks * 4 * H;
  int64_t total = 0;
  /* the exact split's buffers (exact_split.cuh): per step dq_s's digits [4][N][3Hp], shifts and
   * corrections [N], R~'s codes [H][3Hp]; after the loop the digits of dq^T, dp^T [4][3H][TNp] and
   * of dp [4][TN][3Hp], their shifts and corrections, the codes h^T [H][TNp], x^T [C][TNp], W^T
   * [C][3Hp], the column maxima of dq and dp, and the int32 products [4][3H][H], [4][3H][C],
   * [4][TN][C] (the float SGEMM path's Xf, tX, tW, tR are not needed then) */
  const int64_t H3p = xs_kpad(H3), TNp = xs_kpad(TN), xa = xs_after ? 1 : 0, xd = xs_after && dx ? 1 : 0, xst = xs_step ? 1 : 0;
  const int64_t fpo = xs_after ? 0 : 1;   /* the float after-loop buffers */
  const int64_t o_dp = take(&total, TN * H3 * 4), o_dq = take(&total, TN * H3 * 4), o_bcx = take(&total, nbc),
                o_bcr = take(&total, nbc), o_dh = take(&total, NH * 4), o_dhn = take(&total, NH * 4),
                o_Xf = take(&total, fpo * TN * C * 4), o_Hf = take(&total, TN * H * 4), o_tX = take(&total, fpo * pieces * TN * C * 4),
                o_tW = take(&total, fpo * pieces * H3 * C * 4), o_tR = take(&total, fpo * pieces * H3 * H * 4),
                o_P = take(&total, slices * (xs_step ? XS_DIGITS : pieces) * NH * 4), o_part = take(&total, npart * 8),
                o_Rb = take(&total, pieces == 2 ? H3 * H * 2 : 0), o_Wb = take(&total, pieces == 2 && dx ? H3 * C * 2 : 0),
                o_sDq = take(&total, xst * XS_DIGITS * N * H3p), o_sSh = take(&total, xst * N * 4), o_sCo = take(&total, xst * N * 8),
                o_RT = take(&total, xst * H * H3p), o_DqT = take(&total, xa * XS_DIGITS * H3 * TNp),
                o_DpT = take(&total, xa * XS_DIGITS * H3 * TNp), o_Dp = take(&total, xd * XS_DIGITS * TN * H3p),
                o_hT = take(&total, xa * H * TNp), o_xT = take(&total, xa * C * TNp), o_WT = take(&total, xd * C * H3p),
                o_mx = take(&total, xa * 2 * H3 * 4), o_csh = take(&total, xa * 2 * H3 * 4), o_cco = take(&total, xa * 2 * H3 * 8),
                o_rsh = take(&total, xd * TN * 4), o_rco = take(&total, xd * TN * 8), o_PR = take(&total, xa * XS_DIGITS * H3 * H * 4),
                o_PW = take(&total, xa * XS_DIGITS * H3 * C * 4), o_PX = take(&total, xd * XS_DIGITS * TN * C * 4);
  char *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, total, (void **)&ws));
  float *dp = (float *)(ws + o_dp), *dq = (float *)(ws + o_dq), *bcx = (float *)(ws + o_bcx), *bcr = (float *)(ws + o_bcr);
  float *dh = (float *)(ws + o_dh), *dh_next = (float *)(ws + o_dhn);
  float *Xf = (float *)(ws + o_Xf), *Hf = (float *)(ws + o_Hf), *tX = (float *)(ws + o_tX), *tW = (float *)(ws + o_tW),
        *tR = (float *)(ws + o_tR), *P = (float *)(ws + o_P);
  double *part = (double *)(ws + o_part);
  __nv_bfloat16 *Rb = (__nv_bfloat16 *)(ws + o_Rb), *Wb = (__nv_bfloat16 *)(ws + o_Wb);
  int8_t *sDq = (int8_t *)(ws + o_sDq), *RT = (int8_t *)(ws + o_RT);

  if (lengths && TN > 0) QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(dp, 0, (size_t)(TN * H3) * 4, st));   /* padded (t, n) rows */
  if (NH > 0) {
    if (dhn) QG_CUDA_CHECK(ctx, fn, cudaMemcpyAsync(dh, dhn->data, (size_t)NH * 4, cudaMemcpyDeviceToDevice, st));
    else QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(dh, 0, (size_t)NH * 4, st));
  }
  bwd_params bp;
  memset(&bp, 0, sizeof bp);
  bp.cell = *cq; bp.tb = g->bwd;
  bp.T = T; bp.N = N; bp.H = H;
  bp.L = lengths ? (const int64_t *)lengths->data : NULL;
  bp.reverse = reverse ? 1 : 0;
  bp.hq = (const int32_t *)saved->hq->data;
  bp.cellp = (const uint8_t *)saved->cell->data;
  bp.cb = cb;
  bp.dy = dy ? (const float *)dy->data : NULL;
  bp.Hy = Hy;
  bp.y_offset = y_offset;
  bp.dp = dp; bp.dq = dq; bp.bcx = persistent ? bcx : NULL; bp.bcr = persistent ? bcr : NULL;
  bp.Rf = g->fq[QG_W_R];
  bp.bsum = persistent && pc.WS ? part : NULL;
  if (persistent) {
    QG_CHECK(int_bwd_persist_launch(ctx, fn, bp, pc, dh));
  }
  unsigned *kmx = NULL;   /* the after-loop split's column maxima when the step kernels compute them (bwd_step1_xs_kernel) */
  cudaEvent_t side_join = NULL;        /* work left on the side stream after the loop (QGRU_SIDE_DEFER_LAST): joined at the end */
  cudaStream_t side_stream = NULL;
  if (!persistent && TN > 0 && NH > 0) {
    /* the per-step loop, as one CUDA graph from the second identical call on (the context's cache of
     * captured loops, kernels/gru.cu): the key is every argument of the loop */
    step_loop L;
    memset(&L, 0, sizeof L);
    memcpy(L.tag, "qgIGRUb", 8);
    memcpy(&L.bp, &bp, sizeof bp);
    if (pieces == 2) {   /* R~ in bf16 (exact), outside the captured loop: R~ changes with the weights */
      to_bf16_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>(g->fq[QG_W_R], H3 * H, Rb);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    if (xs_step) {   /* R's codes as RT [H][3Hp] (K = 3H contiguous), outside the captured loop likewise */
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(H3p, XS_TILE), qg_cuda_blocks(H, XS_TILE)), XS_THREADS, 0, st>>>(RT, g->codes[QG_W_R], H3, H,
                                                                                                            H3p, offR);
      QG_CHECK(qg_cuda_launched(ctx, fn));
      L.xs = 1; L.zoff = offR; L.Kp = H3p; L.Dq = sDq; L.RT = RT;
      L.fused = xs_fused;
      L.own_xs = QGRU_XS_OWN_PRODUCT && xs_fused && slices >= 1 && ig_available();
      L.zc_any = 0;
      for (int64_t j = 0; j < H3 && !L.zc_any; j++) L.zc_any = g->w_zp_host[QG_W_R][j] != offR;
      if (xs_fused && xs_after) {   /* the after-loop split's column maxima by the step kernels: zeroed here, before the loop */
        L.kmx = kmx = (unsigned *)(ws + o_mx);
        QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(kmx, 0, (size_t)2 * H3 * 4, st));
      }
      L.xsh = (int *)(ws + o_sSh); L.xcorr = (long long *)(ws + o_sCo);
      L.ke = g->w_exp[QG_W_R]; L.kz = g->w_zp[QG_W_R];
    }
    L.R = pieces == 2 ? (const void *)Rb : (const void *)g->fq[QG_W_R];
    L.dh = dh; L.dh_next = dh_next; L.P = P; L.sp = part;
    L.Hf = xs_step && xs_after ? NULL : Hf;   /* the split's dR takes h's codes: no dequantized h to write */
    L.chunks = schunks; L.rpt = rpt; L.math = (int)ctx->math; L.slices = slices;
    L.words = words;
    L.fits32 = fits32;
    L.pieces = pieces;
    L.own = own; L.own_rows = osh.rows; L.own_kc = osh.Kc;
    L.ctx = ctx;
    L.groups = groups;
    for (int gi = 0; gi <= groups; gi++) L.gstart[gi] = gstart[gi];
    for (int gi = 0; gi < groups && L.own_xs; gi++) {   /* each row group's product: its digit rows by RT; cuBLAS where a plan fails */
      const int64_t n0 = gstart[gi], nr = gstart[gi + 1] - n0;
      if (ig_plan_init(&L.xp[gi], L.Dq + XS_DIGITS * n0 * L.Kp, L.Kp, RT, L.Kp, XS_DIGITS * nr, H, L.Kp, H, slices, XS_DIGITS * nr * H,
                       QGRU_XS_OWN_BN) ||
          L.xp[gi].slices != slices) {
        L.own_xs = 0;
        memset(L.xp, 0, sizeof L.xp);
      }
    }
    for (int gi = 0; gi < groups; gi++) {   /* streams: main, aux (then ext[0], ... where XG_MAX allows) */
      L.gstream[gi] = gi == 0 ? (void *)st : gi == 1 ? ctx->aux_stream : ctx->ext_stream[gi - 2];
      L.gblas[gi] = gi == 0 ? (void *)qg_cuda_blas(ctx) : gi == 1 ? ctx->aux_cublas : ctx->ext_cublas[gi - 2];
      L.gev[gi] = ctx->ev_mark[gi];
    }
    if (sc) {   /* the side stream's work (step_loop) */
      L.sc = sc; L.side_dx = side_dx; L.reverse = reverse ? 1 : 0; L.C = C; L.TNp = TNp; L.QX = QX;
      L.offW = offW; L.offH = offH; L.offX = offX;
      L.side_stream = ctx->ext_stream[QG_EXT_STREAMS - 1]; L.side_blas = ctx->ext_cublas[QG_EXT_STREAMS - 1];
      L.side_ev = ctx->ev_mark[1 + QG_EXT_STREAMS];
      L.xcodes = (const int32_t *)xq->data;
      if (xs_step) {
        L.Dp = (int8_t *)(ws + o_Dp); L.WT = (int8_t *)(ws + o_WT); L.hT = (int8_t *)(ws + o_hT); L.xT = (int8_t *)(ws + o_xT);
        L.mx = (unsigned *)(ws + o_mx); L.rsh = (int *)(ws + o_rsh); L.rco = (long long *)(ws + o_rco); L.PX = (int32_t *)(ws + o_PX);
        L.Wcodes = g->codes[QG_W_W]; L.wke = g->w_exp[QG_W_W]; L.wkz = g->w_zp[QG_W_W];
      } else {
        L.Xb = Xf; L.Wb = Wb; L.Wq = g->fq[QG_W_W]; L.tX = tX;
      }
      if (side_dx) { L.dx = (float *)dx->data; L.xmask = (const uint8_t *)saved->xmask->data; }
      L.defer_last = QGRU_SIDE_DEFER_LAST && side_dx;
    }
    static_assert(sizeof(step_loop) <= QG_CUDA_GRAPH_KEY, "the per-step loop's key fits the graph cache");
    XS_TL("loop0", st);
    KT_PREPARE(T, st);
#if XS_TIMELINE   /* uncaptured, so that the loop's own marks are events on the streams */
    QG_CHECK(step_loop_body(&L));
#else
    QG_CHECK(qg_cuda_graphed(ctx, st, &L, sizeof L, step_loop_body, &L));
#endif
    if (L.defer_last) {   /* the last chunk's dx on the side stream, beside the after-loop work; joined at the end */
      const cudaStream_t ss = (cudaStream_t)L.side_stream;
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)ctx->ev_mark[0], st));
      QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(ss, (cudaEvent_t)ctx->ev_mark[0], 0));
      QG_CHECK(side_chunk(ctx, fn, L, 0, L.sc < T ? L.sc : T, SIDE_DX));
      side_join = (cudaEvent_t)L.side_ev;
      side_stream = ss;
    }
    XS_TL("loop", st);
    if (T % 2) { float *tmp = dh; dh = dh_next; dh_next = tmp; }   /* where dL/dh_0's direct part ended */
    if (slices && xs_step) {   /* plus the last step's product */
      for (int gi = 0; gi < groups; gi++) {   /* the row groups' products: planes of nr rows each */
        const int64_t n0 = gstart[gi], nr = gstart[gi + 1] - n0;
        add_xs_kernel<<<qg_cuda_blocks(nr * H, 256), 256, 0, st>>>(dh + n0 * H, (const int32_t *)P + slices * XS_DIGITS * n0 * H, slices,
                                                                   L.xsh + n0, L.xcorr + n0, nr * H, H, dh_next + n0 * H);
      }
      QG_CHECK(qg_cuda_launched(ctx, fn));
      float *tmp = dh; dh = dh_next; dh_next = tmp;
    } else if (slices) {   /* plus the last GEMM's partial products */
      for (int gi = 0; gi < groups; gi++) {   /* per row group as for the split above (one group: all rows) */
        const int64_t n0 = gstart[gi], nr = gstart[gi + 1] - n0;
        add_parts_kernel<<<qg_cuda_blocks(nr * H, 256), 256, 0, st>>>(dh + n0 * H, P + slices * pieces * n0 * H, slices, pieces, nr * H, H,
                                                                      dh_next + n0 * H);
      }
      QG_CHECK(qg_cuda_launched(ctx, fn));
      float *tmp = dh; dh = dh_next; dh_next = tmp;
    }
    QG_CHECK(bias_steps(ctx, fn, st, part, T, schunks, H, g, dbx, dbr));
    XS_TL("bias", st);
  } else if (pc.WS) {
    bias_rows_kernel<<<qg_cuda_blocks(H3, 128), 128, 0, st>>>(part, N, H, g->mask[QG_W_BX], g->mask[QG_W_BR], (float *)dbx->data,
                                                              (float *)dbr->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  } else {
    if (TN > 0 && H3 > 0) {
      bias_partial_kernel<<<dim3(qg_cuda_blocks(H3, 128), (unsigned)chunks), 128, 0, st>>>(bcx, bcr, T, N, H3, part);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    bias_final_kernel<<<qg_cuda_blocks(H3, 128), 128, 0, st>>>(part, TN > 0 ? chunks : 0, H3, g->mask[QG_W_BX], g->mask[QG_W_BR],
                                                               (float *)dbx->data, (float *)dbr->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (dh0 && NH > 0) {
    dh0_kernel<<<qg_cuda_blocks(NH, 256), 256, 0, st>>>(dh, h0 ? (const float *)h0->data : NULL, QH, NH, (float *)dh0->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (xs_after) {
    /* the exact int8 split (exact_split.cuh): codes of h (step-indexed like dq) and x (time-indexed
     * like dp) as K = T N contiguous rows; dq and dp as digit planes of their columns (one shift per
     * column from its largest |value|) and, for dx, dp's rows (W's exponents folded in); each
     * product an int8 GEMM and a combine that adds the masked results. On the aux stream dp's
     * column split and dW = dp^T x~, beside the main stream's dq split, dR = dq^T h~, dp's row
     * split and dx = dp W~ (the splits are memory-bound, the GEMMs compute-bound: they overlap) */
    int8_t *DqT = (int8_t *)(ws + o_DqT), *DpT = (int8_t *)(ws + o_DpT), *Dp = (int8_t *)(ws + o_Dp), *hT = (int8_t *)(ws + o_hT),
           *xT = (int8_t *)(ws + o_xT), *WT = (int8_t *)(ws + o_WT);
    unsigned *mx = (unsigned *)(ws + o_mx);
    int *csh = (int *)(ws + o_csh), *rsh = (int *)(ws + o_rsh);
    long long *cco = (long long *)(ws + o_cco), *rco = (long long *)(ws + o_rco);
    int32_t *PR = (int32_t *)(ws + o_PR), *PW = (int32_t *)(ws + o_PW), *PX = (int32_t *)(ws + o_PX);
    const dim3 tb(XS_THREADS);
    const int64_t rpb = XS_COLMAX_ROWS;   /* rows per block of the column maxima */
    const dim3 mg(qg_cuda_blocks(H3, XS_THREADS), qg_cuda_blocks(TN, (int)rpb));
    /* the aux stream from here: its memory-bound splits run beside the main stream's GEMMs */
    cudaStream_t ax = (cudaStream_t)ctx->aux_stream;
    QG_CHECK(qg_cuda_fork_aux(ctx, fn));
    /* aux: dW = dp^T x~ (x's codes and the column maxima: the loop's side stream, where sc) */
    if (!sc) {
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(TNp, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, ax>>>(xT, (const int32_t *)xq->data, TN, C,
                                                                                                    TNp, offX);
      if (!kmx) {
        QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(mx + H3, 0, (size_t)H3 * 4, ax));
        xs_colmax_kernel<<<mg, tb, 0, ax>>>(mx + H3, dp, TN, H3, rpb);
      }
    }
    QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(cco + H3, 0, (size_t)H3 * 8, ax));
    QG_CUDA_CHECK(ctx, fn, xs_cols(DpT, csh + H3, cco + H3, dp, mx + H3, TN, H3, TNp, offX - (int)QX.z, ax));
    XS_TL("ax_dpsplit", ax);
    QG_CHECK(xs_gemm_on(ctx, (cublasHandle_t)ctx->aux_cublas, fn, PW, DpT, xT, XS_DIGITS * H3, C, TNp, 1));
    XS_TL("ax_dW", ax);
    xs_combine_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ax>>>((float *)dW->data, PW, 1, csh + H3, cco + H3, g->mask[QG_W_W], H3, C,
                                                                   (int)QX.e, 1);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    XS_TL("ax_dWcomb", ax);
    /* main: dR = dq^T h~, then dx = dp W~ (h's codes, the column maxima and dx: the loop's side stream, where sc) */
    if (!sc) {
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(TNp, XS_TILE), qg_cuda_blocks(H, XS_TILE)), tb, 0, st>>>(hT, bp.hq, TN, H, TNp, offH);
      if (!kmx) {
        QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(mx, 0, (size_t)H3 * 4, st));
        xs_colmax_kernel<<<mg, tb, 0, st>>>(mx, dq, TN, H3, rpb);
      }
    }
    QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(cco, 0, (size_t)H3 * 8, st));
    QG_CUDA_CHECK(ctx, fn, xs_cols(DqT, csh, cco, dq, mx, TN, H3, TNp, offH - (int)QH.z, st));
    XS_TL("dqsplit", st);
    QG_CHECK(xs_gemm_on(ctx, qg_cuda_blas(ctx), fn, PR, DqT, hT, XS_DIGITS * H3, H, TNp, 1));
    XS_TL("dR", st);
    xs_combine_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>((float *)dR->data, PR, 1, csh, cco, g->mask[QG_W_R], H3, H, (int)QH.e, 1);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    XS_TL("dRcomb", st);
    if (dx && !side_dx) {
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(H3p, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, st>>>(WT, g->codes[QG_W_W], H3, C, H3p, offW);
      QG_CHECK(xs_dx_rows(ctx, fn, st, qg_cuda_blas(ctx), (float *)dx->data, dp, (const uint8_t *)saved->xmask->data, Dp, rsh, rco, PX, WT,
                          g->w_exp[QG_W_W], g->w_zp[QG_W_W], offW, H3, H3p, C, 0, TN));
    }
    QG_CHECK(qg_cuda_join_aux(ctx, fn));
    XS_TL("end", st);
    KT_PRINT(T, groups);
  } else if (TN > 0 && H > 0 && pieces == 2) {
    /* the split: bf16 operands (x~, h~ from the step kernel, W~ exact; dp, dq as [T N][2][3H] pieces),
     * each GEMM's two piece results added by masked_add2_kernel (hi's first) */
    if (!sc) {   /* (else the loop's side stream did) */
      deq_bf16_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, st>>>((const int32_t *)xq->data, TN * C, QX, (__nv_bfloat16 *)Xf);
      if (dx) to_bf16_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, st>>>(g->fq[QG_W_W], H3 * C, Wb);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    cudaStream_t ax = (cudaStream_t)ctx->aux_stream;
    QG_CHECK(qg_cuda_fork_aux(ctx, fn));
    /* tW [2][3H, C] = dp^T Xf (rows c 3H + j: piece c of dp's column j) */
    QG_CHECK(gemm_bf16_rm_on(ctx, (cublasHandle_t)ctx->aux_cublas, fn, 1, 0, 2 * H3, C, TN, dp, 2 * H3, Xf, C, tW));
    masked_add2_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ax>>>((float *)dW->data, tW, g->mask[QG_W_W], H3 * C, H3 * C, 0, H3 * C);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    /* tR [2][3H, H] = dq^T Hf */
    QG_CHECK(gemm_bf16_rm_on(ctx, qg_cuda_blas(ctx), fn, 1, 0, 2 * H3, H, TN, dq, 2 * H3, Hf, H, tR));
    masked_add2_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>((float *)dR->data, tR, g->mask[QG_W_R], H3 * H, H3 * H, 0, H3 * H);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (dx && !side_dx)
      QG_CHECK(bf16_dx_rows(ctx, fn, st, qg_cuda_blas(ctx), (float *)dx->data, (const __nv_bfloat16 *)dp, (const uint8_t *)saved->xmask->data,
                            Wb, tX, H3, C, 0, TN));
    QG_CHECK(qg_cuda_join_aux(ctx, fn));
  } else if (TN > 0 && H > 0) {
    deq_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, st>>>((const int32_t *)xq->data, TN * C, QX, Xf);
    if (persistent) deq_kernel<<<qg_cuda_blocks(TN * H, 256), 256, 0, st>>>(bp.hq, TN * H, QH, Hf);   /* else the step kernel's */
    QG_CHECK(qg_cuda_launched(ctx, fn));
    /* dW on the aux stream (forked from and joined back to the main one, as the float GRU's two
     * directions, kernels/gru.cu) beside dR and dx on the main one: neither GEMM fills the device
     * alone (tf32 at large: dW 0.61 ms on 96 of 132 multiprocessors) */
    cudaStream_t ax = (cudaStream_t)ctx->aux_stream;
    QG_CHECK(qg_cuda_fork_aux(ctx, fn));
    QG_CHECK(sgemm_rm_on(ctx, (cublasHandle_t)ctx->aux_cublas, fn, 1, 0, H3, C, TN, dp, Xf, 0.0f, tW));   /* dp^T [3H, TN] Xf [TN, C] */
    masked_add_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ax>>>((float *)dW->data, tW, g->mask[QG_W_W], H3 * C);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    QG_CHECK(sgemm_rm(ctx, fn, 1, 0, H3, H, TN, dq, Hf, 0.0f, tR));   /* dq^T [3H, TN] Hf [TN, H] */
    masked_add_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>((float *)dR->data, tR, g->mask[QG_W_R], H3 * H);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (dx) {
      QG_CHECK(sgemm_rm(ctx, fn, 0, 0, TN, C, H3, dp, g->fq[QG_W_W], 0.0f, tX));   /* dp [TN, 3H] W~ [3H, C] */
      masked_add_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, st>>>((float *)dx->data, tX, (const uint8_t *)saved->xmask->data, TN * C);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    QG_CHECK(qg_cuda_join_aux(ctx, fn));
  }
  if (side_join) {   /* the side stream's work after the loop */
    QG_CUDA_CHECK(ctx, fn, cudaEventRecord(side_join, side_stream));
    QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(st, side_join, 0));
  }
  XS_TL("join", st);
  XS_TL_PRINT();
  return QG_OK;
}
