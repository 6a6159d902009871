/*
 * int_gru_bwd_step.cuh: the integer GRU STE backward's per-step kernels (the fallback path of
 * int_gru_backward.cu's header): bwd_step_kernel and bwd_step1_kernel (the cell of every (row,
 * unit) of one step, with the block's bias sums), bwd_step1_xs_kernel (the strict mode's step
 * fused with its exact int8 split, in thread-block clusters), the adds of the previous step's
 * product slices, bias_steps_kernel (the step sums in a fixed order after the loop), and the
 * per-step GEMM's slice count.
 * Included once by kernels/int_gru_backward.cu, after int_gru_bwd_after.cuh.
 */

/* ---- the per-step path ----------------------------------------------------------------------------
 * bwd_step_kernel: step s for every (row, unit): blocks of BS_X units x BS_Y row lanes, each thread
 * `rpt` rows (n = chunk BS_Y rpt + lane + BS_Y k). dL/dh_{s+1} of (n, i) is dd[e] (the direct part
 * the previous step wrote) plus, in order, the nparts split-K partial products P[k][e] of the
 * previous step's GEMM (dq_{s+1} R~ over K slices; nparts = 0 when cuBLAS added its product into
 * dd itself, and at the first step). It writes dp, dq and dn (the direct part of dL/dh_s),
 * Hf[s] = deq(h code) (the dR GEMM's operand, for padded steps too), and instead of the [T N, 3H]
 * bias contributions the block's sums over its rows of the four distinct bias gradients (dzpre,
 * drpre, dgpre, drhb: dbx = (z, r, g), dbr = (z, r, Rh_g + br_g)), in double: each lane its rows in
 * order, then the lanes in order, into sp[s][chunk][4][H] (every entry written every step, 0 for
 * padded rows). bias_steps_kernel adds those in a fixed order.
 * ONE: rpt = 1 as a constant (40 registers against 80 for the loop at sm_90: 6 blocks per
 * multiprocessor instead of 3); MB: the blocks per multiprocessor asked of ptxas (8: 32
 * registers, a 16-byte stack, so that a step of large, 1024 blocks, is one wave on 132
 * multiprocessors instead of 1.29). WORDS: the saved records read as 32-bit words (load_step / prepare_step, as the persistent
 * kernels; the host checks the base's alignment) instead of qg_cell_unpack's byte copies; every
 * load of a row is issued before its stores. */
enum { BS_X = 32, BS_Y = 8 };

/* The step kernels' bias sums: the block's four sums (a0..a3 of each thread) over its BS_Y row
 * lanes, in order, in double, into sp[((s chunks + chunk) 4 + k) H + i] (thread row k < 4). I: the
 * kernel's index type (int64_t, or int where the step's indices fit 32 bits). */
template <typename I, int BX = BS_X>
__device__ __forceinline__ void block_bias_sums(double (&sh)[4][BS_Y][BX], double a0, double a1, double a2, double a3, I s,
                                                I H, I i, double *__restrict__ sp, I chunk, I chunks) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  sh[0][ty][tx] = a0; sh[1][ty][tx] = a1; sh[2][ty][tx] = a2; sh[3][ty][tx] = a3;
  __syncthreads();
  if (ty < 4 && i < H) {
    double v = 0;
    for (int y = 0; y < BS_Y; y++) v += sh[ty][y][tx];
    sp[((s * chunks + chunk) * 4 + ty) * H + i] = v;
  }
}

template <bool WORDS, bool ONE, int MB>
__global__ void __launch_bounds__(BS_X * BS_Y, MB) bwd_step_kernel(const __grid_constant__ bwd_params p, int64_t s, int rpt,
                                                                const float *__restrict__ dd, const float *__restrict__ P,
                                                                int nparts, float *__restrict__ dn, float *__restrict__ Hf,
                                                                double *__restrict__ sp) {
  __shared__ double sh[4][BS_Y][BS_X];
  const int64_t H = p.H, N = p.N, NH = N * H, H3 = 3 * H, i = blockIdx.x * (int64_t)BS_X + threadIdx.x;
  const qg_qp QH = p.cell.a[QG_Q_OUTPUT_H];
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  if (i < H)
    for (int k = 0; k < (ONE ? 1 : rpt); k++) {
      const int64_t n = blockIdx.y * (int64_t)(BS_Y * rpt) + threadIdx.y + (int64_t)k * BS_Y;
      if (n >= N) break;
      const int64_t e = n * H + i, Ln = length_at(p.L, n, p.T);
      float dh = dd[e];
      for (int j = 0; j < nparts; j++) dh += P[j * NH + e];
      float *dqr = p.dq + (s * N + n) * H3;
      if (s >= Ln) {   /* padded step: the gradient passes through, nothing else */
        const int32_t hp = p.hq[s * NH + e];
        dqr[i] = dqr[H + i] = dqr[2 * H + i] = 0.0f;
        dn[e] = dh;
        Hf[s * NH + e] = (float)qg_deq(hp, QH);
        continue;
      }
      const int64_t t = p.reverse ? Ln - 1 - s : s;
      qg_cell_grad gr;
      int32_t hp;
      if (WORDS) {
        step_in in;
        load_step(p, s, n, i, Ln, in);
        hp = in.hp;
        step_vals v;
        prepare_step(p, s, Ln, in, v);
        qg_cell_backward_values(v.v.mask, v.v.z, v.v.rr, v.v.g, v.v.dsz, v.v.dsr, v.v.dtg, v.v.hp, v.v.rhb, dh + v.dy, &gr);
      } else {
        hp = p.hq[s * NH + e];
        const float dH = dh + (p.dy ? p.dy[(t * N + n) * p.Hy + p.y_offset + i] : 0.0f);
        qg_cell_out su;
        qg_cell_unpack(p.cellp + ((s * N + n) * H + i) * p.cb, &p.cell, &su);
        qg_cell_backward(&p.cell, &p.tb, &su, hp, dH, &gr);
      }
      float *dpr = p.dp + (t * N + n) * H3;
      dpr[i] = gr.dp[0]; dpr[H + i] = gr.dp[1]; dpr[2 * H + i] = gr.dp[2];
      dqr[i] = gr.dq[0]; dqr[H + i] = gr.dq[1]; dqr[2 * H + i] = gr.dq[2];
      a0 += (double)gr.dbx[0]; a1 += (double)gr.dbx[1]; a2 += (double)gr.dbx[2]; a3 += (double)gr.dbr[2];
      dn[e] = gr.dhprev;
      Hf[s * NH + e] = (float)qg_deq(hp, QH);
    }
  block_bias_sums<int64_t>(sh, a0, a1, a2, a3, s, H, i, sp, (int64_t)blockIdx.y, (int64_t)gridDim.y);
}

/* v = hi + lo + r as bf16 pieces, hi = bf16(v), lo = bf16(v - hi) (v - hi is exact in fp32): 16
 * significant bits of v (TF32 keeps 11), r at most 2^-17 |v| */
__device__ __forceinline__ void split_bf16(float v, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  *hi = h;
  *lo = __float2bfloat16_rn(__fsub_rn(v, __bfloat162float(h)));
}

/* 2^-e as a double without ldexp's general path (exact: e in [-1022, 1022] builds the bits). */
__device__ __forceinline__ double pow2_neg(int e) {
  return e >= -1022 && e <= 1022 ? __longlong_as_double((long long)(1023 - e) << 52) : ldexp(1.0, -e);
}

/* bwd_step1_kernel: bwd_step_kernel's step for one row per thread where every index of the step
 * fits 32 bits (step_fits32; every shape of the benchmarks) and the saved records are read as
 * words: 32-bit index math; every load of the thread (dd, the nparts partial products, unrolled
 * up to STEP_MAX_SLICES so that they are in flight together, the saved record, the h code, dy)
 * issued before any use; with the cell's tables (tb.val[0] set) the unpack
 * and qg_cell_backward_prepare inline: table index = the stored offset from qmin, the
 * dequantizations (double, as qg_cell_backward_prepare and qg_deq) with 2^-e built from its bits;
 * hp of the cell and Hf are the same value (qg_deq of the h code), computed once. Without tables,
 * prepare_step. Same values and sums in the same order as bwd_step_kernel: bit-identical results.
 * (Tried in round 3, bench/cuda_int_gru.md: launching it with programmatic dependent launch after
 * the step's GEMM, the dh-independent part before griddepcontrol.wait: no gain at large, and the
 * wait's serialization of the partial products' loads cost 0.09 ms at medium.)
 * 8 blocks per multiprocessor asked of ptxas: 32 registers (16 bytes of stack), one wave at large;
 * the 40-register build (6 blocks, no stack) ran the same (bench/cuda_int_gru.md, round 3).
 * A launch runs the rows [n0, n0 + nr) (n0 a multiple of BS_Y; the two row groups of
 * step_loop_body), its blocks' bias sums are chunks n0 / BS_Y + blockIdx.y of `chunks`, and P
 * holds the products of those rows only: planes of nr rows. */
enum { STEP_MAX_SLICES = 8 };   /* step_gemm_slices' cap */

/* Where bwd_step1_xs_kernel stores a thread's dq, dp and dL/dh_{s-1} (after its cluster barrier, so
 * that the barrier's release does not wait on them): step1_unit leaves them to the caller when
 * given one of these. dp_row < 0: a padded step (no dp written). */
struct step1_defer { int q_row, p_row; float dn; };

/* The work of bwd_step1_kernel's thread (n, i) (i < H, n in [n0, n0 + nr)): its four bias terms
 * into a (0 for a padded step) and its three dq and dp values into dq3 and dp3 (as written to
 * p.dq and p.dp; a padded step writes no dp and leaves dp3 as it was; PC = 2 leaves both unset). */
template <int PC, int MS = XS_MAX_SLICES>
__device__ __forceinline__ void step1_unit(const bwd_params &p, int s, const float *__restrict__ dd, const float *__restrict__ P,
                                           int nparts, float *__restrict__ dn, void *__restrict__ Hf, const int *__restrict__ xsh,
                                           const long long *__restrict__ xcorr, int n0, int nr, int i, int n, double (&a)[4],
                                           float (&dq3)[3], float (&dp3)[3], step1_defer *df = nullptr) {
  const int H = (int)p.H, N = (int)p.N, NH = N * H, H3 = 3 * H;
  const int e = n * H + i, se = s * NH + e;
  const int Ln = (int)length_at(p.L, n, p.T);
  const qg_qp QH = p.cell.a[QG_Q_OUTPUT_H];
  const int32_t hq = p.hq[se];
  float dh = dd[e];
  if (PC == 4) {   /* the exact int8 split's product (strict mode): [nparts K slices][4 digits][nr][H] int32 */
    if (MS == 1) {   /* at most one slice: 32-bit offsets (P is read from the second step on, T >= 2, so 4 nr H < 3 T N H < 2^31: step_fits32) */
      if (nparts) dh += xs_element1((const int32_t *)P, (unsigned)(nr * H), (unsigned)((n - n0) * H + i), xcorr[n], xsh[n]);
    } else if (nparts) {
      dh += xs_element<MS>((const int32_t *)P, nparts, (int64_t)nr * H, (n - n0) * H + i, xcorr[n], xsh[n]);
    }
  } else {
    /* the partial products: slice j, piece c of (n, i) at P[j PC nr H + ((n - n0) PC + c) H + i]
     * (PC = 1: P[j nr H + (n - n0) H + i]); added slice by slice, pieces in order */
    const int pr = nr * H, nl = n - n0;
    float pv[STEP_MAX_SLICES];
#pragma unroll
    for (int j = 0; j < STEP_MAX_SLICES; j++)   /* all in flight at once */
      pv[j] = j < nparts * PC ? P[(j / PC) * PC * pr + (nl * PC + j % PC) * H + i] : 0.0f;
#pragma unroll
    for (int j = 0; j < STEP_MAX_SLICES; j++)
      if (j < nparts * PC) dh += pv[j];
  }
  constexpr int PW = PC == 2 ? 2 : 1;             /* dq and dp rows as written: PC = 2 as bf16 pieces hi, lo */
  const int qrow = (s * N + n) * PW * H3 + i;   /* the row of dq */
  if (s >= Ln) {   /* padded step: the gradient passes through, nothing else */
    const float hf = (float)((double)(hq - QH.z) * pow2_neg(QH.e));
    if (PC != 2) {
      if (!df) {
        float *dqr = p.dq + qrow;
        dqr[0] = dqr[H] = dqr[2 * H] = 0.0f;
      }
      dq3[0] = dq3[1] = dq3[2] = 0.0f;
      if (PC != 4 || Hf) ((float *)Hf)[se] = hf;
    } else {
      __nv_bfloat16 *dqr = (__nv_bfloat16 *)p.dq + qrow;
      const __nv_bfloat16 z = __float2bfloat16_rn(0.0f);
      dqr[0] = dqr[H] = dqr[2 * H] = dqr[H3] = dqr[H3 + H] = dqr[H3 + 2 * H] = z;
      ((__nv_bfloat16 *)Hf)[se] = __float2bfloat16_rn(hf);   /* exact: the host's split condition */
    }
    if (df) *df = step1_defer{qrow, -1, dh};
    else dn[e] = dh;
  } else {
    const int t = p.reverse ? Ln - 1 - s : s;
    const uint32_t *src = (const uint32_t *)(p.cellp + (unsigned)se * (unsigned)p.cb);
    step_in in;
    const int nw = p.cb / 4;
#pragma unroll
    for (int k = 0; k < BP_MAX_WORDS; k++)
      if (k < nw) in.w[k] = src[k];
    in.hp = hq;
    in.dy = p.dy ? p.dy[(t * N + n) * (int)p.Hy + p.y_offset + i] : 0.0f;
    step_vals v;
    if (p.tb.val[0]) {
      const qg_cell_q &q = p.cell;
      const qg_qp QRH = q.a[QG_Q_MATMUL_RH];
      int iz, ir, ig, rhb;
      if (q.narrow) {
        iz = (int)(in.w[0] & 0xffffu); ir = (int)(in.w[0] >> 16); ig = (int)(in.w[1] & 0xffffu);
        rhb = (int)(in.w[1] >> 16) + (int)QRH.qmin;
        v.v.mask = in.w[2];
      } else {
        iz = (int)((int32_t)in.w[0] - q.a[QG_Q_Z_PRE].qmin); ir = (int)((int32_t)in.w[1] - q.a[QG_Q_R_PRE].qmin);
        ig = (int)((int32_t)in.w[2] - q.a[QG_Q_G_PRE].qmin);
        rhb = (int32_t)in.w[3];
        v.v.mask = in.w[4];
      }
      v.v.z = p.tb.val[0][iz]; v.v.rr = p.tb.val[1][ir]; v.v.g = p.tb.val[2][ig];
      v.v.dsz = p.tb.der[0][iz]; v.v.dsr = p.tb.der[1][ir]; v.v.dtg = p.tb.der[2][ig];
      v.v.hp = (float)((double)((int64_t)hq - QH.z) * pow2_neg(QH.e));
      v.v.rhb = (float)((double)((int64_t)rhb - QRH.z) * pow2_neg(QRH.e));
      v.dy = in.dy;
    } else {
      prepare_step(p, s, Ln, in, v);
    }
    qg_cell_grad gr;
    qg_cell_backward_values(v.v.mask, v.v.z, v.v.rr, v.v.g, v.v.dsz, v.v.dsr, v.v.dtg, v.v.hp, v.v.rhb, dh + v.dy, &gr);
    const int prow = (t * N + n) * PW * H3 + i;
    if (PC != 2) {
      if (PC != 4 || Hf) ((float *)Hf)[se] = v.v.hp;   /* PC = 4: NULL where the after-loop GEMMs split too */
      if (!df) {
        float *dpr = p.dp + prow, *dqr = p.dq + qrow;
        dpr[0] = gr.dp[0]; dpr[H] = gr.dp[1]; dpr[2 * H] = gr.dp[2];
        dqr[0] = gr.dq[0]; dqr[H] = gr.dq[1]; dqr[2 * H] = gr.dq[2];
      }
      dq3[0] = gr.dq[0]; dq3[1] = gr.dq[1]; dq3[2] = gr.dq[2];
      dp3[0] = gr.dp[0]; dp3[1] = gr.dp[1]; dp3[2] = gr.dp[2];
    } else {
      ((__nv_bfloat16 *)Hf)[se] = __float2bfloat16_rn(v.v.hp);
      __nv_bfloat16 *dpr = (__nv_bfloat16 *)p.dp + prow, *dqr = (__nv_bfloat16 *)p.dq + qrow;
#pragma unroll
      for (int k = 0; k < 3; k++) {
        split_bf16(gr.dp[k], dpr + k * H, dpr + H3 + k * H);
        split_bf16(gr.dq[k], dqr + k * H, dqr + H3 + k * H);
      }
    }
    a[0] = (double)gr.dbx[0]; a[1] = (double)gr.dbx[1]; a[2] = (double)gr.dbx[2]; a[3] = (double)gr.dbr[2];
    if (df) *df = step1_defer{qrow, prow, gr.dhprev};
    else dn[e] = gr.dhprev;
  }
}

template <int PC>
__global__ void __launch_bounds__(BS_X * BS_Y, 8) bwd_step1_kernel(const __grid_constant__ bwd_params p, int s,
                                                                 const float *__restrict__ dd, const float *__restrict__ P,
                                                                 int nparts, float *__restrict__ dn, void *__restrict__ Hf,
                                                                 double *__restrict__ sp, const int *__restrict__ xsh,
                                                                 const long long *__restrict__ xcorr, int n0, int nr, int chunks) {
  __shared__ double sh[4][BS_Y][BS_X];
  const int H = (int)p.H;
  const int i = blockIdx.x * BS_X + threadIdx.x, n = n0 + blockIdx.y * BS_Y + threadIdx.y;
  double a[4] = {0, 0, 0, 0};
  float dq3[3], dp3[3];
  if (i < H && n < n0 + nr) step1_unit<PC>(p, s, dd, P, nparts, dn, Hf, xsh, xcorr, n0, nr, i, n, a, dq3, dp3);
  block_bias_sums<int>(sh, a[0], a[1], a[2], a[3], s, H, i, sp, (int)(n0 / BS_Y + blockIdx.y), chunks);
}

/* bwd_step1_xs_kernel: bwd_step1_kernel<4> (the strict mode's exact split) with xs_rows_kernel's
 * work on dq_s fused in, so that the per-step chain is this kernel and the int8 GEMM (the split
 * was a kernel of its own, 5 us a step at large, and a launch more in the chain). A block is
 * XF_X units x BS_Y rows; a thread-block cluster of ceil(H / XF_X) blocks holds every unit of its
 * BS_Y rows, so each row's largest |dq 2^-ke| (the split's shift) is a cluster reduction: each
 * block pushes its row maxima into every peer's shared memory (distributed shared memory), one
 * cluster barrier, each block reduces its copies. Then each thread writes its three dq values as
 * digits into the planes D [4][nr][Kp] (the threads of units i < Kp - 3H also zero the row's
 * padding), and block 0 of the cluster writes the row's shift xsh[n] and correction xcorr[n]
 * (sum of Xi (zoff - kz): with zero-point terms (zc_any) the blocks' int64 sums pushed to block 0
 * and added in rank order after a second barrier; else 0). The same integers, shifts and
 * corrections as xs_rows_kernel (the same xs_fixed of the same floats, exact integer sums): the
 * same bits. The bias sums are bwd_step1_kernel's (each unit's BS_Y rows in order). R's exponents
 * (and zero points) of the block's columns arrive by cp.async during the cell. With kmx (the
 * after-loop split's column maxima of dq and dp, [2][3H] float bits, zeroed before the loop) each
 * block adds its rows' |dq| and |dp| by integer atomicMax, as xs_colmax_kernel would from the
 * stored rows (the same maxima: max is order-free), so neither the side stream nor the after-loop
 * work reads them again. Clusters of up to XF_MAX_CLUSTER blocks: H <= XF_X XF_MAX_CLUSTER.
 * Launched as a programmatic dependent of the GEMM before it (xs_fused_config): it reads nothing
 * the previous kernels wrote before griddep_wait. MS = 1 (one K slice, the two row groups' form)
 * reads P with 32-bit offsets and no predicated slices (session 30: the general form's slice
 * addressing was ~100 of ~820 instructions a warp; large strict backward 4.36-4.41 -> 4.24-4.26 ms).
 * (Measured and not kept, session 30: two units a thread at 64 registers, within noise; the same at
 * 40 registers and 3 blocks a multiprocessor, 0.15 ms slower.) */
#if QG_KTRACE   /* the split loop's trace (ktrace.cuh): records [KT_MAX_T steps][2 row groups][step kernel, product]; with
                   more than the default two row groups, the groups after the first share the second's records */
enum { KT_MAX_T = 4096 };
__device__ kt_rec *kt_loop;
#define KT_STEP_REC(s, n0) (kt_loop && (s) < KT_MAX_T ? kt_loop + 2 * (2 * (s) + ((n0) > 0)) : (kt_rec *)0)
#else
#define KT_STEP_REC(s, n0) ((kt_rec *)0)
#endif
/* 1: bwd_step1_xs_kernel lets its programmatic dependent (the step's igemm product) launch once
 * every block is past its cluster barriers, so that the product's launch and R's first loads
 * overlap the step kernel's tail (the digits and the stores). H200, large strict backward: 3.87-3.88
 * ms against 3.94-4.00 (bench/cuda_int_gru.md, session 37). Session 36's trigger right after the
 * wait was slower: the product's blocks then held multiprocessors for the whole step kernel. */
#ifndef QGRU_XS_STEP_TRIGGER
#define QGRU_XS_STEP_TRIGGER 1
#endif
enum { XF_X = 128, XF_MAX_CLUSTER = 8 };
template <int MS>   /* the most K slices of P: 1 (the two row groups' products) or XS_MAX_SLICES */
__global__ void __launch_bounds__(XF_X * BS_Y, 2) bwd_step1_xs_kernel(const __grid_constant__ bwd_params p, int s,
                                                                    const float *__restrict__ dd, const int32_t *__restrict__ P,
                                                                    int nparts, float *__restrict__ dn, void *__restrict__ Hf,
                                                                    double *__restrict__ sp, int *__restrict__ xsh,
                                                                    long long *__restrict__ xcorr, int n0, int nr, int chunks,
                                                                    int8_t *__restrict__ D, int Kp, const int32_t *__restrict__ ke,
                                                                    const int32_t *__restrict__ kz, int zoff, int zc_any,
                                                                    unsigned *__restrict__ kmx) {
  __shared__ double sh[4][BS_Y][XF_X];
  __shared__ float wmax[BS_Y][XF_X / 32];
  __shared__ float rmax[XF_MAX_CLUSTER][BS_Y];       /* the cluster's blocks' row maxima, pushed by each */
  __shared__ long long wsum[BS_Y][XF_X / 32];
  __shared__ long long csum[XF_MAX_CLUSTER][BS_Y];   /* block 0's: the blocks' correction sums */
  __shared__ int32_t kes[3][XF_X], kzs[3][XF_X];     /* R's exponents and zero points of the block's columns */
  cg::cluster_group cl = cg::this_cluster();
  const int K = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int H = (int)p.H, H3 = 3 * H, tx = threadIdx.x, ty = threadIdx.y, lane = tx & 31, w = tx >> 5;
  const int i = blockIdx.x * XF_X + tx, n = n0 + blockIdx.y * BS_Y + ty;
  const bool valid = i < H && n < n0 + nr;
  kt_rec *const kr = KT_STEP_REC(s, n0);
  (void)kr;
  KT_START(kr, ty * XF_X + tx);
  cluster_arrive_relaxed();   /* this block has started: peers may write its shared memory after their wait */
  if (ty < 3 && i < H) {
    if (ke) cp_async4(&kes[ty][tx], ke + ty * H + i);
    if (zc_any && kz) cp_async4(&kzs[ty][tx], kz + ty * H + i);
  }
  cp_async_commit();
  /* launched as a programmatic dependent of the step's GEMM (xs_fused_config): what it wrote (P)
   * and the previous step kernel's dd, xsh, xcorr are visible from here on; R's exponents and zero
   * points above are the weights' (unchanged in the backward) */
  griddep_wait();
  KT_WAITED(kr, ty * XF_X + tx);
  double a[4] = {0, 0, 0, 0};
  float dq3[3] = {0.0f, 0.0f, 0.0f}, dp3[3] = {0.0f, 0.0f, 0.0f};
  step1_defer df{0, -1, 0.0f};
  if (valid) step1_unit<4, MS>(p, s, dd, (const float *)P, nparts, dn, Hf, xsh, xcorr, n0, nr, i, n, a, dq3, dp3, &df);
  cp_async_wait_all();
  block_bias_sums<int, XF_X>(sh, a[0], a[1], a[2], a[3], s, H, i, sp, (int)(n0 / BS_Y + blockIdx.y), chunks);   /* a block barrier */
  /* the row maxima of |dq 2^-ke| (xs_rows_kernel's m): the warp (one row), the block, the cluster */
  float m = 0.0f;
  if (valid)
#pragma unroll
    for (int k = 0; k < 3; k++) m = fmaxf(m, xs_mag(dq3[k]) * xs_pow2_neg(ke ? kes[k][tx] : 0));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) wmax[ty][w] = m;
  __syncthreads();   /* (and the bias sums are done with sh) */
  float *cm = (float *)&sh[0][0][0];   /* kmx: [6][BS_Y][XF_X], |dq| then |dp| of each (row, column) */
  if (kmx)
#pragma unroll
    for (int k = 0; k < 3; k++) {
      cm[(k * BS_Y + ty) * XF_X + tx] = xs_mag(dq3[k]);
      cm[((3 + k) * BS_Y + ty) * XF_X + tx] = xs_mag(dp3[k]);
    }
  cluster_wait();   /* every block of the cluster has started */
  if (ty == 0 && tx < BS_Y * K) {   /* thread (row r, peer q): the block's maximum of row r into q's rmax[rank][r] */
    const int r = tx % BS_Y, q = tx / BS_Y;
    float b = wmax[r][0];
#pragma unroll
    for (int k = 1; k < XF_X / 32; k++) b = fmaxf(b, wmax[r][k]);
    st_cluster_f32(mapa_shared(smem_addr(&rmax[rank][r]), (uint32_t)q), b);
  }
  cluster_arrive();
  cluster_wait();   /* every block's maxima are here (and cm is complete) */
#if QGRU_XS_STEP_TRIGGER
  griddep_launch();   /* the product may launch: what is left is the digits' and stores' tail */
#endif
  if (valid) {   /* dq, dp and dL/dh_{s-1}, stored after the barrier (step1_defer) */
    float *dqr = p.dq + (unsigned)df.q_row;
    dqr[0] = dq3[0]; dqr[H] = dq3[1]; dqr[2 * H] = dq3[2];
    if (df.p_row >= 0) {
      float *dpr = p.dp + (unsigned)df.p_row;
      dpr[0] = dp3[0]; dpr[H] = dp3[1]; dpr[2 * H] = dp3[2];
    }
    dn[(unsigned)(n * H + i)] = df.dn;
  }
  if (kmx && ty < 6 && i < H) {   /* the block's column maxima over its rows, by integer atomicMax (order-free) */
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < BS_Y; r++) v = fmaxf(v, cm[(ty * BS_Y + r) * XF_X + tx]);
    if (v > 0.0f) atomicMax(kmx + (ty / 3) * H3 + (ty % 3) * H + i, __float_as_uint(v));
  }
  float rm = 0.0f;
  for (int q = 0; q < K; q++) rm = fmaxf(rm, rmax[q][ty]);
  const int sft = xs_shift((double)rm);
  /* the digits of the thread's three values, and their correction terms */
  long long c = 0;
  const unsigned plane = (unsigned)(nr * Kp);
  int8_t *drow = D + (unsigned)((n - n0) * Kp);   /* (32-bit offsets from one pointer: 4 nr Kp < 2^31, the host's check) */
  if (valid) {
#pragma unroll
    for (int k = 0; k < 3; k++) {
      const int xi = xs_fixed(dq3[k], sft - (ke ? kes[k][tx] : 0));
      int8_t dg[XS_DIGITS];
      xs_digits(xi, dg);
      if (zc_any) c += xi * (long long)(zoff - (kz ? kzs[k][tx] : 0));
      int8_t *q = drow + (unsigned)(k * H + i);
#pragma unroll
      for (int d = 0; d < XS_DIGITS; d++, q += plane) *q = dg[d];
    }
  }
  if (n < n0 + nr && i < Kp - H3) {   /* the row's padding columns [3H, Kp) */
    int8_t *q = drow + (unsigned)(H3 + i);
#pragma unroll
    for (int d = 0; d < XS_DIGITS; d++, q += plane) *q = 0;
  }
  if (zc_any) {   /* the row's correction: warps, blocks (pushed to block 0), in rank order */
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if (lane == 0) wsum[ty][w] = c;
    __syncthreads();
    if (ty == 0 && tx < BS_Y) {
      long long b = 0;
#pragma unroll
      for (int k = 0; k < XF_X / 32; k++) b += wsum[tx][k];
      st_cluster_s64(mapa_shared(smem_addr(&csum[rank][tx]), 0), b);
    }
    cluster_arrive();
    cluster_wait();
  }
  if (rank == 0 && tx == 0 && n < n0 + nr) {
    long long b = 0;
    if (zc_any)
      for (int q = 0; q < K; q++) b += csum[q][ty];
    xsh[n] = sft;
    xcorr[n] = b;
  }
  KT_END(kr, ty * XF_X + tx);
}

/* out[e] = dd[e] + the nparts slices' partial products of e = (n, i), pieces in order within a
 * slice, as bwd_step1_kernel adds them (dL/dh_0 after the split-K loop); pc pieces, NH = N H. */
__global__ void add_parts_kernel(const float *dd, const float *P, int nparts, int pc, int64_t NH, int64_t H, float *out) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= NH) return;
  const int64_t n = e / H, i = e - n * H;
  float v = dd[e];
  for (int j = 0; j < nparts; j++)
    for (int c = 0; c < pc; c++) v += P[j * pc * NH + (n * pc + c) * H + i];
  out[e] = v;
}

/* out[e] = dd[e] + the exact split's product of e = (n, i) (dL/dh_0 after the loop): P
 * [slices][4][N][H], the shifts and corrections of row n. */
__global__ void add_xs_kernel(const float *dd, const int32_t *P, int slices, const int *sh, const long long *corr, int64_t NH, int64_t H,
                              float *out) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= NH) return;
  const int64_t n = e / H;
  out[e] = dd[e] + xs_element<XS_MAX_SLICES>(P, slices, NH, e, corr[n], sh[n]);
}

/* The bias gradients from the step sums sp [T][chunks][4][H]: column c of 4H sums its T chunks
 * entries, numbered q = 0, 1, ... (s = T - 1 - q / chunks, chunk q % chunks: the CPU's
 * steps-descending order), over BF_Y lanes (lane l: q = l, l + BF_Y, ..., in order), then the
 * lanes in order, in double; dbx += M_bx (z, r, g sums), dbr += M_br (z, r, Rh_g + br_g sums).
 * Each lane issues BF_U loads before adding them (in order); the index arithmetic in U: unsigned
 * where T chunks 4 H < 2^32 (the host's choice), else 64-bit. (One 64-bit division a load and one
 * load in flight a lane made it latency-bound: 64 us for the 105 MB of the large shape's sums,
 * H200, ncu, session 27.) */
enum { BF_X = 32, BF_Y = 32, BF_U = 8 };

template <typename U>
__global__ void __launch_bounds__(BF_X * BF_Y) bias_steps_kernel(const double *__restrict__ sp, int64_t T, int64_t chunks, int64_t H,
                                                                  const uint8_t *mbx, const uint8_t *mbr, float *dbx, float *dbr) {
  __shared__ double sh[BF_Y][BF_X + 1];
  const int64_t c = blockIdx.x * (int64_t)BF_X + threadIdx.x, H4 = 4 * H;
  const U Q = (U)(T * chunks), uc = (U)chunks, uT = (U)T, uH = (U)H;
  double v = 0;
  if (c < H4) {
    const U k = (U)(c / H), i = (U)c - k * uH;
    for (U q0 = threadIdx.y; q0 < Q; q0 += BF_Y * BF_U) {
      double w[BF_U];
#pragma unroll
      for (int u = 0; u < BF_U; u++) {
        const U q = q0 + (U)(u * BF_Y), s = uT - 1 - q / uc, ch = q % uc;
        w[u] = q < Q ? sp[((s * uc + ch) * 4 + k) * uH + i] : 0.0;
      }
#pragma unroll
      for (int u = 0; u < BF_U; u++)
        if (q0 + (U)(u * BF_Y) < Q) v += w[u];
    }
  }
  sh[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y != 0 || c >= H4) return;
  double t = 0;
  for (int y = 0; y < BF_Y; y++) t += sh[y][threadIdx.x];
  const int64_t k = c / H, i = c - k * H;
  const float f = (float)t;
  if (k < 3) dbx[k * H + i] += mbx[k * H + i] ? f : 0.0f;
  if (k < 2) dbr[k * H + i] += mbr[k * H + i] ? f : 0.0f;
  if (k == 3) dbr[2 * H + i] += mbr[2 * H + i] ? f : 0.0f;
}

/* dbx, dbr += the bias gradients from the step sums sp [T][chunks][4][H] (bias_steps_kernel), on st. */
static qg_status bias_steps(qg_ctx *ctx, const char *fn, cudaStream_t st, const double *sp, int64_t T, int64_t chunks, int64_t H,
                            const qg_int_gru *g, qg_tensor *dbx, qg_tensor *dbr) {
  const auto f = T * chunks * 4 * H < ((int64_t)1 << 32) ? bias_steps_kernel<unsigned> : bias_steps_kernel<uint64_t>;
  f<<<qg_cuda_blocks(4 * H, BF_X), dim3(BF_X, BF_Y), 0, st>>>(sp, T, chunks, H, g->mask[QG_W_BX], g->mask[QG_W_BR], (float *)dbx->data,
                                                             (float *)dbr->data);
  return qg_cuda_launched(ctx, fn);
}

/* Rows per thread of bwd_step_kernel: one (two rows per thread, 512 blocks at large, ran 12.2 us
 * a step against 8.4 for one, bench/gpu_runs/large_bwd_ncu_tf32.log: a thread's second row waited
 * for its first's stores), more only where the row chunks would pass the grid's y limit. A
 * function of the shape only, so the summation order is fixed. */
static int step_rows_per_thread(int64_t N) {
  const int64_t r = (N + (int64_t)BS_Y * 65535 - 1) / ((int64_t)BS_Y * 65535);
  return r < 1 ? 1 : (int)r;
}

/* K slices of the per-step GEMM dq_s [N, 3H] R~ [3H, H]: 0 (one cublasGemmEx adding into the
 * direct part, beta 1: cuBLAS's own choice, at large a split-K 8 kernel plus its reduction
 * kernel, bench/cuda_int_gru.md) when the output's 128 x 128 tiles fill the device, else S: one
 * strided-batched GEMM of S slices of 3H / S (S divides 3H) into S partial products that the next
 * step kernel adds in order (no reduction kernel, no atomics). pieces = 2 (the bf16 split): the
 * output has 2N rows, and a slice costs the step kernel two loads (at most STEP_MAX_SLICES in all).
 * A function of the shape, the math mode and the device's multiprocessor count, so the summation
 * order is fixed. */
static int step_gemm_slices(const qg_ctx *ctx, int64_t N, int64_t H, int pieces) {
  const int64_t tiles = ((N * pieces + 127) / 128) * ((H + 127) / 128), H3 = 3 * H;
  int64_t S = (ctx->sm_count + tiles - 1) / tiles;
  if (S > STEP_MAX_SLICES / pieces) S = STEP_MAX_SLICES / pieces;   /* the step kernel's loads */
  while (S > 1 && (H3 % S != 0 || H3 / S < 128)) S--;
  return S > 1 ? (int)S : 0;
}
