/*
 * int_gru.cu: the CUDA backend of the integer GRU layer (qg_int_gru of core/qgru.h): weight
 * quantization, the integer forward of QUANT_SPEC.md section 3 (bit-exact with the CPU) and the
 * straight-through backward of section 4. The per-unit work is the shared cell of
 * core/int_gru_cell.h (the CPU backend, core/int_gru_cpu.c, calls the same functions); this file
 * only arranges the integer products around it. Built with --fmad=false (CMakeLists.txt).
 *
 * Forward, one layer and direction:
 *   1. x -> input.x codes and masks (saved for the backward), observed at valid steps.
 *   2. W x over all steps as one exact integer GEMM, requantized to matmul.Wx in its epilogue:
 *      - int8 tensor cores (mma.sync m16n8k32 s8, int32 accumulation) for operands of <= 16 bits
 *        and K < 2^17: a code q of b bits becomes r = q - base in the signed b-bit range (base =
 *        2^(b-1) on unsigned grids), fed as one s8 plane (b <= 8) or two (r = 256 hi + lo + 128,
 *        9..16 bits: four plane products). With c = q - z = sum_p scale_p plane_p + off,
 *          sum_k cA cB = sum_ab sA sB (PA_a . PB_b) + offB SA[j] + offA[j] SB[n] + K offA[j] offB,
 *        where SA, SB are row sums of (r - c0): the static zero-point terms form an int64 bias
 *        per output row; offA[j] SB[n] only exists for asymmetric weights. Every plane product
 *        is below 2^14 K < 2^31 (exact in int32), the combination is int64: exact. In the
 *        persistent kernel's 32-bit mode (below) the epilogue writes the int32 accumulators
 *        themselves (exact: below 2^29) and the recurrence requantizes them.
 *      - otherwise (and when the fallback path is forced) an fp64 cuBLAS GEMM of centered codes,
 *        exact for <= 16-bit operands (sums < 2^53); wider operands are simulated in double, as
 *        on the CPU (identical only while the double sums are exact).
 *   3. h0 -> output.h codes (observed when given), in the same launch as step 1.
 *   4. the recurrence, one of three paths (ctx->kernel_path; AUTO picks the persistent one where
 *      the shape fits, a forced PERSISTENT on a shape it cannot hold is QG_ERR_UNSUPPORTED; a
 *      forced FALLBACK always takes the per-step one):
 *      - persistent: one launch for all T steps. A thread-block cluster of CS CTAs owns NB batch
 *        rows; CTA `rank` holds the int8 planes of R's rows for units [rank U, rank U + U) (all
 *        three gates) in shared memory and computes R h for them with mma.sync (work items of
 *        16 rows x 8 batch rows x a part of K over the warps, partial sums in shared memory);
 *        each thread then runs the cell of one (unit, row), the CTA's new output.h planes are pushed
 *        into every peer's next h buffer through distributed shared memory, 4 bytes a store
 *        (st.async), with the per-row sums of (r - c0) the zero-point term needs (warp
 *        reductions); each CTA's mbarrier per h buffer counts the bytes of a step's pushes, so a
 *        step waits for its h only, not for a cluster barrier (whose release waited for the y
 *        stores as well; a block barrier when CS = 1). Where no row of R has a
 *        zero-point term (symmetric signed <= 8-bit R: roff = 0) the row sums are skipped and
 *        each thread pushes its own bytes straight after its cell (4 lanes gather a word for
 *        the peers), without the slice and its barrier. Operands of <= 16 bits; the
 *        configuration (CS, NB) comes from a model of the per-step time and the occupancy API
 *        (or qg_ctx_set_persist_shape), with one CTA per multiprocessor when the grid fits the
 *        GPU. Activation tables go to shared memory.
 *        32-bit mode (no observer, every operator of <= 16 bits, and the host's bound
 *        max|centered W| max|centered x| C and the same for R h, H at most 2^29; also taken by the tensor-core step below): W x arrives as
 *        int32 accumulators, every R h sum is taken mod 2^32 (exact, the true sums being below
 *        2^29), and the cell is int_gru_cell.h's qg_cell32_forward, which requantizes the
 *        accumulators itself. Its per-unit rows (qg_cell32_unit: the quantizers, exponents and
 *        the device's bias codes) are built once per launch in shared memory and held in each
 *        thread's registers for all steps (CTAs of at most 256 threads), or read there by the
 *        cells in CTAs of 257-512 threads (at most 128 registers a thread). A unit whose bias
 *        terms leave the 32-bit bounds makes its CTA run the general loop (qg_cell_forward on
 *        the same accumulators; the same barriers, so CTAs of a cluster may differ) and sets a
 *        flag in the layer's memory, which qg_int_gru_cell_path reads on demand.
 *      - small H (kernels/int_gru_small.cu, taken first where it holds the layer): the 32-bit mode
 *        with single-plane R and h when all of R fits the registers of one CTA (H <= 128): no
 *        cluster, one CTA per 1..8 batch rows, R h on __dp4a, one block barrier per step.
 *      - GPU-wide persistent (tc_grid_kernel, kernels/int_gru_grid.cuh): where the cluster
 *        kernel cannot hold R, in the 32-bit mode with one int8 plane of R and of h, no forced
 *        cluster shape, and every block of the tensor-core step's grid resident at once: one
 *        cooperative launch for all steps, the step kernel's tiles with R's rows held in shared
 *        memory, each block's two batch halves in a ping-pong between its product and cell
 *        warps, an arrival counter per (batch group, half) between steps (also what a forced
 *        PERSISTENT path takes there).
 *      - fallback: one kernel per step (tc_step_kernel), for shapes whose R does not fit a
 *        cluster (large H). R's int8 planes stay in L2 between steps; the h planes of the step
 *        are double-buffered in global memory. A block takes 32 units (their 96 rows of R, all
 *        three gates) x 64 batch rows: R h on mma.sync m16n8k32 (a 4-stage cp.async pipeline
 *        of K tiles, two K groups of 8 warps), the per-row sums of the h planes for the zero-point
 *        term from the same B fragments (__dp4a); the sums of a unit's three gates meet in
 *        shared memory, then each thread runs the cells of one unit for 4 batch rows and writes
 *        the next step's h codes and planes. Operands of <= 16 bits and H < 2^17 (exact as W x
 *        above). In the 32-bit mode (the persistent kernel's conditions, under auto where the
 *        persistent kernel cannot hold the shape) the cells are qg_cell32_forward on the int32
 *        W x accumulators and the R h sums taken mod 2^32; their per-unit rows are built once
 *        per forward (cell32_units_kernel, [QG_C32_ROWS + 1, H] in the workspace) and each block
 *        stages its 32 units' rows in shared memory; a unit outside the bounds runs the general
 *        cell and sets the same flag. Otherwise (operands above 16 bits) the per-step kernel of one thread per
 *        (unit, row) sums R h in double with the transposed centered R, as the CPU's simulated
 *        GEMM.
 *      Both write y (0 at padded steps), the saved state and hn; the per-step kernels read the
 *      W x codes through cell_wx.
 *   Statistics (calibration) go through the device observer of stats.cuh: min/max and integer
 *   counts do not depend on order, so the rows equal the CPU's, except that the real values
 *   observed for gate.z_out / r_out / g_out come from the device's exp and tanh, which may differ
 *   from glibc's in the last bit. For the same reason pre-activations above 16 bits (no table,
 *   f evaluated per unit; documented as not integer-deployable) are not guaranteed bit-identical.
 * Files (one translation unit: this file includes the others once, in this order, after the
 *   helpers they share):
 *   - int_gru_wx_lt.cuh: W x on cuBLASLt for the GPU-wide recurrence (plans, the captured graph);
 *   - int_gru_prep.cuh: the weights' quantization and steps 1-3 (operands as planes, x and h0);
 *   - int_gru_step.cuh: the per-step recurrence on the tensor cores (tc_step_kernel);
 *   - int_gru_grid.cuh: the GPU-wide persistent recurrence (tc_grid_kernel);
 *   - int_gru_fallback.cuh: the per-step recurrence for operands above 16 bits;
 *   - int_gru_cluster.cuh: the persistent recurrence in clusters (persistent_kernel, pk_choose);
 *   - int_gru_small.cu (its own translation unit): the small-H recurrence;
 *   - this file: rec_common, the kernel choices and qg_cuda_int_gru_forward, which runs the steps.
 *   The split moved code only: built without -lineinfo, the sm_90 cubin is byte for byte the single
 *   file's (session 50).
 * Backward: kernels/int_gru_backward.cu.
 * Variable lengths as on the CPU: step s is valid for row n iff s < lengths[n], at time t =
 *   reverse ? lengths[n] - 1 - s : s. Device lengths are not read by the host; values outside
 *   1..T are clamped into 0..T (the CPU front door rejects them on the host).
 */
#include "cuda_common.cuh"
#include "int_gru_common.cuh"
#include "int_gru_small.cuh"
#include "mbarrier.cuh"   /* tc_grid_kernel's roles, the cluster kernel's h exchange */
#include "ptx.cuh"        /* mma.sync, ldmatrix, cp.async, arrival counters, st.async */
#include "stats.cuh"
#include "wx_gemm.cuh"
#include "../core/int_gru.h"

#include <cooperative_groups.h>
#include <cublasLt.h>
#include <type_traits>   /* std::integral_constant: tc_grid_kernel's cell variants */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <mutex>

namespace cg = cooperative_groups;

/* the W x product on cuBLASLt (lt_wx_usable, lt_wx_run) */
#include "int_gru_wx_lt.cuh"

/* ================================ shared device helpers ================================ */

__device__ __forceinline__ void observe(double *range, int64_t *counts, int op, double v) {
  qg_stats_observe_dev(range + 4 * op, counts + (int64_t)QG_STATS_BINS * op, v);
}

/* r = q - base split into s8 planes: one (np = 1) or r = 256 p0 + p1 + 128 (np = 2). */
__device__ __forceinline__ void split_planes(int64_t q, int64_t base, int np, int8_t *p0, int8_t *p1) {
  const int32_t r = (int32_t)(q - base);
  if (np == 1) { *p0 = (int8_t)r; *p1 = 0; return; }
  const int32_t lo = (r & 255) - 128;
  *p0 = (int8_t)(r >> 8);
  *p1 = (int8_t)lo;
}

__host__ __device__ __forceinline__ int64_t plane_scale(int np, int p) { return (np == 2 && p == 0) ? 256 : 1; }

/* Sum of an int64 over the block (any order gives the same integer). red: 32 int64 of shared memory. */
__device__ __forceinline__ int64_t block_sum_i64(int64_t v, int64_t *red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[w] = v;
  __syncthreads();
  int64_t s = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < nw; i++) s += red[i];
  return s;   /* valid in thread 0 */
}

__device__ __forceinline__ uint32_t lds32(const int8_t *p) { return *(const uint32_t *)p; }

/* One k32 slice of a warp's R h tile, as tc_step_kernel and tc_grid_kernel run it: the warp's 3
 * m16 tiles of A (R's rows ra0 .. ra0 + 47 of As, row pitch ld) against NT n8 tiles of B (h's
 * batch rows rb0 .. rb0 + 8 NT - 1 of Bs) at byte columns k0 .. k0 + 31 on mma.sync m16n8k32; with
 * sums, the per-row sums of the B fragments' codes (the zero-point term) into rs (lane: rows
 * rb0 + g + 8 nt). Fragments by ldmatrix: one instruction per m16 tile of A and per two n8 tiles
 * of B (32-bit loads took four and two: bench/cuda_int_gru.md, "ldmatrix"); ld, k0 and the
 * buffers 16-byte aligned, ld an odd multiple of 16 modulo 128 so that the 8 rows of a matrix hit
 * distinct banks; NT even. */
template <int NT>
__device__ __forceinline__ void rh_k32(int32_t (&acc)[3][NT][4], int32_t (&rs)[NT], const int8_t *As, const int8_t *Bs, int ra0,
                                       int rb0, int ld, int k0, bool sums) {
  const int lane = threadIdx.x & 31, r8 = lane & 7, mi = lane >> 3;
  uint32_t af[3][4], bf[NT][2];
  /* A: matrices (rows 0-7, bytes 0-15), (rows 8-15, 0-15), (0-7, 16-31), (8-15, 16-31) = a0..a3 */
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(As) + (ra0 + r8 + (mi & 1) * 8) * ld + k0 + (mi >> 1) * 16;
#pragma unroll
  for (int mt = 0; mt < 3; mt++) ldsm_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3], a + mt * 16 * ld);
  /* B, two n8 tiles at a time: matrices (tile 2p, bytes 0-15), (2p, 16-31), (2p + 1, 0-15), (2p + 1, 16-31) */
  const uint32_t b = (uint32_t)__cvta_generic_to_shared(Bs) + (rb0 + (mi >> 1) * 8 + r8) * ld + k0 + (mi & 1) * 16;
#pragma unroll
  for (int np = 0; np < NT / 2; np++) ldsm_x4(bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1], b + np * 16 * ld);
#pragma unroll
  for (int mt = 0; mt < 3; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mma_s8(acc[mt][nt], af[mt], bf[nt]);
  if (sums) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) rs[nt] = __dp4a((int)bf[nt][1], 0x01010101, __dp4a((int)bf[nt][0], 0x01010101, rs[nt]));
  }
}

/* weight quantization and the forward's operand preparation */
#include "int_gru_prep.cuh"

/* ---- W x on the int8 tensor cores, requantized in the epilogue: wx_gemm_kernel of
 * kernels/wx_gemm.cuh (included above) ---- */

/* ================================ forward: the recurrence ================================ */

/* What every recurrent kernel reads and writes besides R h. */
struct rec_common {
  qg_cell_q cell;
  int64_t T, N, H;
  const int32_t *qwx;          /* [T N, 3H] matmul.Wx codes (time order) */
  const uint8_t *mwx;
  const int32_t *bxc, *brc, *bxz, *brz, *bxe, *bre;   /* bias codes, zero points, exponents [3H] */
  const int32_t *eR;           /* weight.R exponents [3H] */
  const int64_t *L;
  int reverse;
  float *y;
  int64_t Hy;
  int y_offset;
  float *hn;                   /* [N, H] or NULL: written at the last step */
  uint8_t *cell_out;           /* saved cell state [T, N, H, cb] or NULL */
  int cb;
  int32_t *hq;                 /* saved output.h codes [T+1, N, H], or NULL */
  int32_t *hping;              /* without saved state: two [N, H] buffers (step s at s & 1) */
  double *range;
  int64_t *counts;
};

/* output.h codes of step s (before the step runs: the state after s steps). */
__device__ __forceinline__ int32_t *h_at(const rec_common &c, int64_t s) {
  return c.hq ? c.hq + s * c.N * c.H : c.hping + (s & 1) * c.N * c.H;
}

/* The bias terms of unit i into a cell input (as the CPU's bias_terms). */
__device__ __forceinline__ void fill_bias(const rec_common &c, int64_t i, qg_cell_in *in) {
  for (int k = 0; k < 3; k++) {
    const int64_t j = k * c.H + i;
    in->bx[k] = (int64_t)c.bxc[j] - c.bxz[j];
    in->br[k] = (int64_t)c.brc[j] - c.brz[j];
    in->ebx[k] = c.bxe[j];
    in->ebr[k] = c.bre[j];
  }
}

/* The cell of unit i, row n at step s (time t), given a complete input; writes y and the saved
 * state, observes; returns the new output.h code. */
template <int WIDE, int OBS>
__device__ __forceinline__ int64_t run_cell(const qg_cell_q *q, const rec_common &c, int64_t s, int64_t t, int64_t n,
                                            int64_t i, const qg_cell_in *in) {
  qg_cell_out out;
  qg_cell_reals re = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  qg_cell_forward(q, in, &out, WIDE, OBS, &re);
  if (OBS) {
    observe(c.range, c.counts, QG_Q_Z_PRE, re.zpre); observe(c.range, c.counts, QG_Q_R_PRE, re.rpre);
    observe(c.range, c.counts, QG_Q_Z_OUT, re.zout); observe(c.range, c.counts, QG_Q_R_OUT, re.rout);
    observe(c.range, c.counts, QG_Q_MATMUL_RH, re.rhb); observe(c.range, c.counts, QG_Q_RRH, re.rrh);
    observe(c.range, c.counts, QG_Q_G_PRE, re.gpre); observe(c.range, c.counts, QG_Q_G_OUT, re.gout);
    observe(c.range, c.counts, QG_Q_OLD, re.old); observe(c.range, c.counts, QG_Q_NEW, re.nw);
    observe(c.range, c.counts, QG_Q_OUTPUT_H, re.h);
  }
  const qg_qp QH = q->a[QG_Q_OUTPUT_H];
  c.y[(t * c.N + n) * c.Hy + c.y_offset + i] = (float)((double)(out.h - QH.z) * ldexp(1.0, -QH.e));
  if (c.cell_out) qg_cell_pack(c.cell_out + ((s * c.N + n) * c.H + i) * c.cb, q, &out);
  return out.h;
}

/* Zero saved state of a padded step. */
__device__ __forceinline__ void zero_cell(const rec_common &c, int64_t s, int64_t n, int64_t i) {
  if (!c.cell_out) return;
  uint8_t *d = c.cell_out + ((s * c.N + n) * c.H + i) * c.cb;
  for (int b = 0; b < c.cb; b++) d[b] = 0;
}

/* A padded step (s >= the row's length) of unit i, row n (N = c.N, as the caller holds it): no
 * saved state, y at time s is 0 (the state stays: the caller keeps h). */
__device__ __forceinline__ void pad_cell(const rec_common &c, int64_t s, int64_t n, int64_t i, int64_t N) {
  zero_cell(c, s, n, i);
  c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
}

/* R h's sums a[k] of a cell's three gates requantized to matmul.Rh (exponents srh[k]) into in.rh,
 * their in-range bits or-ed into in.mask at QG_MB_RH_*, observed when OBS. A32: the sums are
 * taken mod 2^32 (the 32-bit mode). */
template <int A32, int OBS, typename S>
__device__ __forceinline__ void cell_rh(const rec_common &c, const S (&a)[3], const int (&srh)[3], qg_qp QRH, qg_cell_in &in) {
#pragma unroll
  for (int k = 0; k < 3; k++) {
    const int64_t av = A32 ? (int64_t)(int32_t)a[k] : (int64_t)a[k];
    int m;
    in.rh[k] = qg_requant64(av, srh[k], QRH, &m);
    if (OBS) observe(c.range, c.counts, QG_Q_MATMUL_RH, ldexp((double)av, -srh[k]));
    in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
  }
}

/* The W x input of the cell of unit i at time row `row` (= t N + n): the matmul.Wx codes of its
 * three gates, their in-range bits placed at QG_MB_WX_* (or-ed into in->mask). The one place the
 * per-step kernels read what the W x GEMM produced. */
__device__ __forceinline__ void cell_wx(const rec_common &c, int64_t row, int64_t i, qg_cell_in *in) {
  const int64_t o = row * 3 * c.H + i;
#pragma unroll
  for (int k = 0; k < 3; k++) {
    in->wx[k] = c.qwx[o + k * c.H];
    in->mask |= (uint32_t)c.mwx[o + k * c.H] << (QG_MB_WX_Z + k);
  }
}

/* the per-step recurrence on the tensor cores (tc_step_kernel) */
#include "int_gru_step.cuh"

/* The h planes of step 0 (buffer 0) from the output.h codes of h0. */
__global__ void h0_planes_kernel(const int32_t *hq, int64_t N, int64_t H, int64_t base, int np, int64_t Np, int64_t Kp, int8_t *Hp) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= N * H) return;
  const int64_t n = e / H, i = e % H;
  int8_t p0, p1;
  split_planes(hq[e], base, np, &p0, &p1);
  Hp[n * Kp + i] = p0;
  if (np == 2) Hp[(Np + n) * Kp + i] = p1;
}

/* the GPU-wide persistent recurrence (tc_grid_kernel): kernels/int_gru_grid.cuh */
#include "int_gru_grid.cuh"

/* the per-step recurrence for operands above 16 bits (fallback_step_kernel) */
#include "int_gru_fallback.cuh"

/* hn = deq(output.h codes after T steps). */
__global__ void hn_kernel(const int32_t *h, int64_t NH, qg_qp QH, float *hn) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < NH) hn[i] = (float)qg_deq(h[i], QH);
}

/* the persistent recurrence in clusters (persistent_kernel) and its configuration (pk_choose) */
#include "int_gru_cluster.cuh"

/* ================================ forward: host side ================================ */

/* How a GEMM operand of codes is fed to the int8 tensor cores (see the header). */
struct op_planes {
  int n;          /* 1 (<= 8 bits) or 2 (9..16 bits) */
  int64_t base;   /* r = q - base in the signed b-bit range */
  int64_t c0;     /* r = sum_p scale_p plane_p + c0 */
};

static op_planes planes_of(int bits, int uns) {
  op_planes p;
  p.n = bits <= 8 ? 1 : 2;
  p.base = uns ? ((int64_t)1 << (bits - 1)) : 0;
  p.c0 = p.n == 2 ? 128 : 0;
  return p;
}

/* off = c0 + base - z: the centered code minus its planes' value. */
static int64_t planes_off(op_planes p, int32_t z) { return p.c0 + p.base - z; }

/* qg_int_gru_cell_path after a forward in the 32-bit mode: the 32-bit cell, unless a unit outside
 * its bounds raised the device flag (then the general cell of g->cell_path ran for it). Waits
 * for the device (tests and diagnostics only). */
static int cell_path_read(const qg_int_gru *g) {
  int32_t flag = 0;
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(&flag, g->c32_flag, sizeof flag, cudaMemcpyDeviceToHost) != cudaSuccess) {
    (void)cudaGetLastError();
    return QG_CELL_NONE;
  }
  return flag ? g->cell_path : QG_CELL_32;
}

typedef void (*ts_kernel)(ts_params, int64_t);

static ts_kernel ts_kernel_of(int wide, int obs, int single, int a32) {
  if (a32) {   /* no observer */
    if (wide) return single ? tc_step_kernel<1, 0, 1, 1> : tc_step_kernel<1, 0, 0, 1>;
    return single ? tc_step_kernel<0, 0, 1, 1> : tc_step_kernel<0, 0, 0, 1>;
  }
  if (wide) {
    if (obs) return single ? tc_step_kernel<1, 1, 1, 0> : tc_step_kernel<1, 1, 0, 0>;
    return single ? tc_step_kernel<1, 0, 1, 0> : tc_step_kernel<1, 0, 0, 0>;
  }
  if (obs) return single ? tc_step_kernel<0, 1, 1, 0> : tc_step_kernel<0, 1, 0, 0>;
  return single ? tc_step_kernel<0, 0, 1, 0> : tc_step_kernel<0, 0, 0, 0>;
}

typedef void (*tg_kernel)(tg_params);

/* save: the training forward (saved codes and cell state written), else inference */
static tg_kernel tg_kernel_of(int wide, int save) {
  if (save) return wide ? tc_grid_kernel<1, 1> : tc_grid_kernel<0, 1>;
  return wide ? tc_grid_kernel<1, 0> : tc_grid_kernel<0, 0>;
}

/* Bytes of the activation tables the grid kernel copies into shared memory (0: they stay in
 * global memory): the three tables when they exist, total at most 64 KiB, and fit beside the
 * rest of the kernel's shared memory (smem_left bytes). */
static int64_t tg_lut_bytes(int64_t lut_bytes, int64_t smem_left) {
  return lut_bytes > 0 && lut_bytes <= 65536 && lut_bytes <= smem_left ? lut_bytes : 0;
}

/* Whether the GPU-wide persistent recurrence (int_gru_grid.cuh) runs this forward: the 32-bit
 * mode, one int8 plane of R and of h, no forced persistent shape, the block's shared memory
 * within the device's limit, every block of the grid resident at once, cooperative launch. */
static qg_status tg_choose(qg_ctx *ctx, const char *fn, int wide, int save, int a32, int PR, int PH, int64_t N, int64_t H,
                           int64_t lut_bytes, int *ok) {
  *ok = 0;
  if (!a32 || PR != 1 || PH != 1 || ctx->persist_cluster > 0 || N <= 0 || H <= 0 || H >= (1 << 17)) return QG_OK;
  int dev, sms, smem_max, coop, nb = 0;
  QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (!coop) return QG_OK;
  const tg_kernel k = tg_kernel_of(wide, save);
  cudaFuncAttributes fa;
  QG_CUDA_CHECK(ctx, fn, cudaFuncGetAttributes(&fa, (const void *)k));
  const size_t smem0 = tg_smem(round_up(H, TS_BK), 0);
  if (smem0 + fa.sharedSizeBytes > (size_t)smem_max) return QG_OK;
  const size_t smem = tg_smem(round_up(H, TS_BK), tg_lut_bytes(lut_bytes, (int64_t)smem_max - (int64_t)(smem0 + fa.sharedSizeBytes)));
  QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  QG_CUDA_CHECK(ctx, fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, (const void *)k, TS_THREADS, smem));
  const int64_t blocks = ((H + TS_U - 1) / TS_U) * ((N + TS_N - 1) / TS_N);
  *ok = nb >= 1 && blocks <= (int64_t)nb * sms;
  return QG_OK;
}

#if TG_TIMELINE
/* experiment builds only: medians over blocks and steps 10..T-10 of tc_grid_kernel's stamps */
static int tl_cmp(const void *a, const void *b) { const double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double tl_med(double *v, int n) { qsort(v, n, sizeof *v, tl_cmp); return n ? v[n / 2] : 0; }
static void tg_timeline_print(cudaStream_t st, int gx, int gy, int64_t T) {
  static unsigned long long h[TG_TL_B * TG_TL_S * 2 * TG_TL_E];
  cudaStreamSynchronize(st);
  cudaMemcpyFromSymbol(h, tg_tl, sizeof h);
  const int nb = gx * gy < (int)TG_TL_B ? gx * gy : (int)TG_TL_B, s0 = 10, s1 = (int)(T < (int64_t)TG_TL_S ? T : (int64_t)TG_TL_S) - 10;
  if (s1 <= s0) return;
  auto at = [&](int b, int s, int x, int e) -> double { return (double)h[((b * TG_TL_S + s) * 2 + x) * TG_TL_E + e]; };
  static const char *names[] = {"wake (poll seen -> buffer free)", "h copy", "R h (mma)", "tile sums", "tiles -> cells", "cells",
                                "h stores + barrier + release", "straggle (last release - median release of the group)",
                                "propagation (last release of the group -> poll seen)", "step period (cells start, half 0)",
                                "cells idle (end of a half's cells -> next half's start)", "W x words (release -> words done)"};
  const int nd = 12;
  double *v = (double *)malloc(sizeof(double) * (size_t)nb * (size_t)(s1 - s0) * 2);
  for (int d = 0; d < nd; d++) {
    int n = 0;
    for (int b = 0; b < nb; b++)
      for (int s = s0; s < s1; s++)
        for (int x = 0; x < 2; x++) {
          double val;
          const int g0 = (b / gx) * gx;
          double mx = 0, rel[64];
          int nr = 0;
          if (d == 7 || d == 8) {
            for (int c = g0; c < g0 + gx && c < nb; c++) { const double t = at(c, s - 1, x, 7); if (t > mx) mx = t; if (nr < 64) rel[nr++] = t; }
          }
          switch (d) {
            case 0: val = at(b, s, x, 1) - at(b, s, x, 0); break;
            case 1: val = at(b, s, x, 2) - at(b, s, x, 1); break;
            case 2: val = at(b, s, x, 3) - at(b, s, x, 2); break;
            case 3: val = at(b, s, x, 4) - at(b, s, x, 3); break;
            case 4: val = at(b, s, x, 5) - at(b, s, x, 4); break;
            case 5: val = at(b, s, x, 6) - at(b, s, x, 5); break;
            case 6: val = at(b, s, x, 7) - at(b, s, x, 6); break;
            case 7: val = mx - tl_med(rel, nr); break;
            case 8: val = at(b, s, x, 0) - mx; break;
            case 9: if (x) continue; val = at(b, s, 0, 5) - at(b, s - 1, 0, 5); break;
            case 11: val = at(b, s, x, 8) - at(b, s, x, 7); break;
            default: val = x ? at(b, s, 1, 5) - at(b, s, 0, 6) : at(b, s, 0, 5) - at(b, s - 1, 1, 6); break;
          }
          v[n++] = val;
        }
    const double med = tl_med(v, n), p90 = v[(int)(n * 0.9)];
    fprintf(stderr, "tg_timeline %-58s median %8.0f ns  p90 %8.0f ns\n", names[d], med, p90);
  }
  /* the stragglers: per block, the median over steps of its release after its group's median */
  {
    double late[TG_TL_B];
    for (int b = 0; b < nb; b++) {
      const int g0 = (b / gx) * gx;
      int n = 0;
      for (int s = s0; s < s1; s++)
        for (int x = 0; x < 2; x++) {
          double rel[64];
          int nr = 0;
          for (int c = g0; c < g0 + gx && c < nb && nr < 64; c++) rel[nr++] = at(c, s, x, 7);
          v[n++] = at(b, s, x, 7) - tl_med(rel, nr);
        }
      late[b] = tl_med(v, n);
    }
    for (int k = 0; k < 6; k++) {
      int w = 0;
      for (int b = 1; b < nb; b++) if (late[b] > late[w]) w = b;
      fprintf(stderr, "tg_timeline late block %3d (x %2d, y %d): median %6.0f ns after its group's median release\n", w, w % gx, w / gx, late[w]);
      late[w] = -1e30;
    }
  }
  free(v);
}
#endif

extern "C" qg_status qg_cuda_int_gru_forward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn,
                                             const qg_int_gru_saved *saved, const qg_stats *stats, const qg_tensor *x,
                                             const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_int_gru_forward";
  cudaStream_t st = qg_cuda_stream(ctx);
  const int64_t T = x->dims[0], N = x->dims[1], C = g->C, H = g->H, H3 = 3 * H, TN = T * N, NH = N * H;
  const qg_cell_q *cq = &g->cell;
  const qg_qspec *A = g->act;
  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H], QWX = cq->a[QG_Q_MATMUL_WX];
  const int xb = A[QG_Q_INPUT_X].bitwidth, hb = A[QG_Q_OUTPUT_H].bitwidth, wb = g->w_bits[QG_W_W], rb = g->w_bits[QG_W_R];
  const op_planes xpl = planes_of(xb, A[QG_Q_INPUT_X].is_unsigned), hpl = planes_of(hb, A[QG_Q_OUTPUT_H].is_unsigned);
  const op_planes wpl = planes_of(wb, g->w_unsigned[QG_W_W]), rpl = planes_of(rb, g->w_unsigned[QG_W_R]);
  const int path = ctx->kernel_path, obs = stats != NULL;
  double *range = obs ? (double *)stats->range->data : NULL;
  int64_t *counts = obs ? (int64_t *)stats->counts->data : NULL;
  const int64_t *L = lengths ? (const int64_t *)lengths->data : NULL;

  /* W x: int8 tensor cores, or the fp64 GEMM (forced fallback path, operands above 16 bits, huge C) */
  const int wx_exact = xb <= 16 && wb <= 16;
  const int wx_mma = wx_exact && C < (1 << 17) && path != QG_PATH_FALLBACK;
  /* the recurrence */
  const int rec_exact = hb <= 16 && rb <= 16;
  int64_t lut_bytes = 0;
  for (int k = 0; k < 3; k++) lut_bytes += cq->lut[k] ? 2 * cq->lut_n[k] * 4 : 0;
  if (!(cq->lut[0] && cq->lut[1] && cq->lut[2])) lut_bytes = 0;
  /* the 32-bit mode of the persistent kernel and of the tensor-core step (int_gru_cell.h
   * qg_cell32_*): no observer, W x on the tensor cores (so not on a forced fallback), every
   * operator of at most 16 bits, the W x and R h accumulators at most 2^29 in magnitude (exact
   * in int32); the per-unit bounds (bias terms) are checked on the device */
  qg_cell32 c32;
  memset(&c32, 0, sizeof c32);
  int a32 = 0;
  if (!obs && wx_mma && rec_exact && cq->narrow && path != QG_PATH_FALLBACK) {
    const qg_qp gw = qg_qp_make(wb, g->w_unsigned[QG_W_W], 0, 0), gr = qg_qp_make(rb, g->w_unsigned[QG_W_R], 0, 0);
    int64_t wmax = 0, rmax = 0;
    for (int64_t j = 0; j < H3; j++) {
      const int64_t zw = g->w_zp_host[QG_W_W][j], zr = g->w_zp_host[QG_W_R][j];
      const int64_t aw = gw.qmax - zw > zw - gw.qmin ? gw.qmax - zw : zw - gw.qmin;
      const int64_t ar = gr.qmax - zr > zr - gr.qmin ? gr.qmax - zr : zr - gr.qmin;
      if (aw > wmax) wmax = aw;
      if (ar > rmax) rmax = ar;
    }
    const double bound = (double)QG_C32_BOUND;
    a32 = (double)wmax * (double)qg_cell32_cmax(QX) * (double)C <= bound &&
          (double)rmax * (double)qg_cell32_cmax(QH) * (double)H <= bound && qg_cell32_setup(&c32, cq, 1);
  }
  /* the 64-bit cell where its bounds hold (as the CPU decides, from the bias exponents). Where
   * those were derived on the device since the host last read them (tracked weights,
   * qg_int_gru_calibrate_weight), the 32-bit mode runs units outside its bounds on the 128-bit
   * cell (exact for any exponents) and nothing waits; other modes read them back first. */
  int wide = 1;
  if (!a32 || !(g->w_exp_stale[QG_W_BX] || g->w_exp_stale[QG_W_BR])) {
    QG_CHECK(qg_int_gru_host_exps(ctx, g, QG_W_BX));
    QG_CHECK(qg_int_gru_host_exps(ctx, g, QG_W_BR));
    wide = qg_int_gru_needs_wide(g);
  }
  pk_plan pc;
  memset(&pc, 0, sizeof pc);
  int persistent = 0, grid_rec = 0;   /* grid_rec: the GPU-wide persistent recurrence (tc_grid_kernel) */
  /* the small-H kernel (int_gru_small.cu: all of R in one CTA, no cluster): the 32-bit mode with
   * single-plane R and h; under auto wherever it holds the layer, forced by a persist shape of
   * storage 2 or 5 (the cell over two roles of warps; qgru.h), which then runs nothing else */
  isk_plan sp;
  memset(&sp, 0, sizeof sp);
  int small = 0;
  const int force_small = ctx->persist_cluster > 0 && (ctx->persist_storage == 2 || ctx->persist_storage == 5);
  const int two_roles = force_small ? (ctx->persist_storage == 5 ? 1 : 0) : 2;   /* storage 5: the two-role variant */
  if (path != QG_PATH_FALLBACK && TN > 0 && a32 && rpl.n == 1 && hpl.n == 1 && (ctx->persist_cluster == 0 || (force_small && ctx->persist_cluster == 1)))
    QG_CHECK(isk_choose(ctx, fn, T, N, H, y->dims[2], force_small ? ctx->persist_rows : 0, force_small ? ctx->persist_splits : 0, two_roles, lut_bytes, &sp,
                        &small));
  if (path != QG_PATH_FALLBACK && TN > 0) {
    char why[160];
    why[0] = 0;
    if (small) {
    } else if (force_small) {
      snprintf(why, sizeof why, "a forced small-H shape (cluster %d, %d rows, %d splits) that holds the layer (H = %lld, the 32-bit mode, "
               "R and h of at most 8 bits)", ctx->persist_cluster, ctx->persist_rows, ctx->persist_splits, (long long)H);
    } else if (!rec_exact) snprintf(why, sizeof why, "output.h and weight.R of at most 16 bits (got %d and %d)", hb, rb);
    else if (H >= (1 << 17)) snprintf(why, sizeof why, "H < 131072 (got %lld)", (long long)H);
    else {
      int found;
      QG_CHECK(pk_choose(ctx, fn, wide, obs, a32, N, H, rpl.n, hpl.n, lut_bytes, &pc, &found));
      if (!found) QG_CHECK(tg_choose(ctx, fn, wide, saved != NULL, a32, rpl.n, hpl.n, N, H, lut_bytes, &grid_rec));   /* R over the whole GPU */
      if (!found && !grid_rec)
        snprintf(why, sizeof why, "the int8 planes of R (H = %lld, %d and %d bits) in the shared memory of a 16-CTA cluster",
                 (long long)H, rb, hb);
    }
    if (why[0]) {
      if (path == QG_PATH_PERSISTENT)
        return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "the persistent integer GRU kernel needs %s; use kernel path 'auto' or 'fallback'", why);
    } else if (!grid_rec) {
      persistent = 1;
    }
  }
  /* where the persistent kernel does not run: the tensor-core step kernel (<= 16-bit operands;
   * the 32-bit mode as well), else R h in double */
  const int rec_mma = !persistent && rec_exact && H < (1 << 17) && TN > 0;
  if (!persistent && !rec_mma) a32 = 0;
  g->cell_path = wide || !rec_exact ? QG_CELL_128 : QG_CELL_64;
  g->cell_path_read = a32 ? cell_path_read : NULL;
  const int64_t KpR = small ? sp.Kp : persistent ? pc.Kp : round_up(H, TS_BK), NpH = round_up(N, TS_N);
  /* W x on cuBLASLt (above: the plane product; tc_grid_kernel adds the zero-point terms) where
   * the GPU-wide recurrence (inference and training variants) consumes the 32-bit mode's
   * accumulators with single planes and no observer (wx_gemm_kernel's epilogue gathers its
   * statistics), else wx_gemm_kernel; qwx rows of ldq int32 */
  int lt_wx = 0;
  if (grid_rec && !obs && wx_mma && a32 && wpl.n == 1 && xpl.n == 1 && TN > 0 && TN < (1LL << 31))
    QG_CHECK(lt_wx_usable(ctx, fn, H3, TN, round_up(C, WX_BK), &lt_wx));
  const int64_t ldq = lt_wx ? lt_ldc(H3) : H3;

  /* device workspace */
  int64_t total = 0;
  const int64_t o_hp = saved ? 0 : take(&total, 2 * NH * 4);
  const int64_t o_qwx = take(&total, TN * ldq * 4), o_mwx = take(&total, TN * H3);
  const int64_t Np = round_up(TN > 0 ? TN : 1, WX_BT), KpX = round_up(C, WX_BK), MpW = round_up(H3, WX_BJ);
  int64_t o_Xp = 0, o_SX = 0, o_Wp = 0, o_offW = 0, o_bcW = 0, o_Xd = 0, o_Wd = 0, o_acc = 0;
  if (wx_mma) {
    o_Xp = take(&total, xpl.n * Np * KpX); o_SX = take(&total, Np * 8);
    o_Wp = take(&total, wpl.n * MpW * KpX); o_offW = take(&total, MpW * 8); o_bcW = take(&total, MpW * 8);
  } else {
    o_Xd = take(&total, TN * C * 8); o_Wd = take(&total, H3 * C * 8); o_acc = take(&total, TN * H3 * 8);
  }
  int64_t o_Rp = 0, o_offR = 0, o_bcR = 0, o_Rt = 0, o_Hp = 0, o_P32 = 0, o_bar = 0;
  if (persistent || rec_mma) {
    o_Rp = take(&total, (int64_t)rpl.n * H3 * KpR); o_offR = take(&total, H3 * 8); o_bcR = take(&total, H3 * 8);
    if (rec_mma) o_Hp = take(&total, 2LL * hpl.n * NpH * KpR);
    if (rec_mma && a32) o_P32 = take(&total, (int64_t)(QG_C32_ROWS + 1) * H * 4);
    if (grid_rec) o_bar = take(&total, (NpH / TS_N) * 2 * 4);   /* [batch group][half] */
  } else {
    o_Rt = take(&total, H3 * H * 8);
  }
  char *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, total, (void **)&ws));
  /* input.x codes and masks: only the backward reads them (inference writes none) */
  int32_t *xq = saved ? (int32_t *)saved->xq->data : NULL;
  uint8_t *xm = saved ? (uint8_t *)saved->xmask->data : NULL;
  int32_t *qwx = (int32_t *)(ws + o_qwx);
  uint8_t *mwx = (uint8_t *)(ws + o_mwx);

  int32_t *hq0 = saved ? (int32_t *)saved->hq->data : (int32_t *)(ws + o_hp);

  /* 1. weights as GEMM operands: int8 planes (W for the tensor-core W x, R for the persistent
   * kernel and the tensor-core step; one launch) or centered codes */
  {
    planes_job jobs[2];
    int nj = 0;
    int64_t blocks[2] = {0, 0};
    if (wx_mma) {
      planes_job w = {g->codes[QG_W_W], g->w_zp[QG_W_W], H3, C, MpW, KpX, wpl.n, wpl.base, wpl.c0, planes_off(xpl, QX.z),
                      (int8_t *)(ws + o_Wp), (int64_t *)(ws + o_offW), (int64_t *)(ws + o_bcW)};
      blocks[nj] = MpW;
      jobs[nj++] = w;
    }
    if (persistent || rec_mma) {
      planes_job r = {g->codes[QG_W_R], g->w_zp[QG_W_R], H3, H, H3, KpR, rpl.n, rpl.base, rpl.c0, planes_off(hpl, QH.z),
                      (int8_t *)(ws + o_Rp), (int64_t *)(ws + o_offR), (int64_t *)(ws + o_bcR)};
      blocks[nj] = H3;
      jobs[nj++] = r;
    }
    if (nj > 0) {   /* a warp per row, at most 8 blocks of 8 warps per multiprocessor */
      const int64_t need = (blocks[0] + blocks[1] + WQ_THREADS / 32 - 1) / (WQ_THREADS / 32),
                    cap = 8 * (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1);
      weight_planes_kernel<<<(unsigned)(need < cap ? need : cap), WQ_THREADS, 0, st>>>(jobs[0], jobs[nj - 1], blocks[0], blocks[1]);
    }
  }
  if (!wx_mma)
    weight_centered_kernel<<<qg_cuda_blocks(H3 * C, 256) < 4096 ? qg_cuda_blocks(H3 * C, 256) : 4096, 256, 0, st>>>(
        g->codes[QG_W_W], g->w_zp[QG_W_W], H3, C, 0, (double *)(ws + o_Wd));
  if (!persistent && !rec_mma)
    weight_centered_kernel<<<qg_cuda_blocks(H3 * H, 256) < 4096 ? qg_cuda_blocks(H3 * H, 256) : 4096, 256, 0, st>>>(
        g->codes[QG_W_R], g->w_zp[QG_W_R], H3, H, 1, (double *)(ws + o_Rt));
  QG_CHECK(qg_cuda_launched(ctx, fn));

  /* 2. input.x codes and h0 -> output.h codes (one launch), 3. W x requantized to matmul.Wx */
  const int64_t rows = TN > 0 ? (wx_mma ? Np : TN) : 0, h0_blocks = (NH + 127) / 128;
  int8_t *Xp = wx_mma ? (int8_t *)(ws + o_Xp) : NULL;
  int64_t *SX = wx_mma ? (int64_t *)(ws + o_SX) : NULL;
  double *Xd = wx_mma ? NULL : (double *)(ws + o_Xd);
  if (rows + h0_blocks > 0) {
    h0_job hj = {h0 ? (const float *)h0->data : NULL, NH, QH, hq0};
    const int vec4 = !obs && wx_mma && xpl.n == 1 && C % 4 == 0 && ((uintptr_t)x->data & 15) == 0 && (!xq || ((uintptr_t)xq & 15) == 0) &&
                     (!xm || ((uintptr_t)xm & 3) == 0);
    if (vec4) {   /* rows strided over at most 8 blocks of 8 warps per multiprocessor */
      const int64_t need = (rows + XQ4_THREADS / 32 - 1) / (XQ4_THREADS / 32), cap = 8 * (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1);
      const int64_t rb = need < cap ? need : cap;
      auto xq4 = qg_qf32_make(QX).ok ? x_quant4_kernel<1> : x_quant4_kernel<0>;   /* the float clamp where it applies */
      xq4<<<(unsigned)(rb + (NH + XQ4_THREADS - 1) / XQ4_THREADS), XQ4_THREADS, 0, st>>>((const float *)x->data, TN, C, QX, xq, xm, xpl.base,
                                                                                      xpl.c0, KpX, Xp, SX, rows, rb, hj);
    } else if (obs) {
      x_quant_kernel<1><<<(unsigned)(rows + h0_blocks), 128, 0, st>>>((const float *)x->data, T, N, C, QX, L, xq, xm, xpl.n, xpl.base,
                                                                       xpl.c0, Np, KpX, Xp, SX, Xd, range, counts, rows, hj);
    } else {
      x_quant_kernel<0><<<(unsigned)(rows + h0_blocks), 128, 0, st>>>((const float *)x->data, T, N, C, QX, L, xq, xm, xpl.n, xpl.base,
                                                                       xpl.c0, Np, KpX, Xp, SX, Xd, range, counts, rows, hj);
    }
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (TN > 0) {
    if (lt_wx) {
      QG_CHECK(lt_wx_run(ctx, fn, H3, TN, KpX, (const int8_t *)(ws + o_Wp), Xp, qwx));
    } else if (wx_mma) {
      wx_params wp;
      wp.Wp = (const int8_t *)(ws + o_Wp); wp.Xp = Xp;
      wp.Mp = MpW; wp.Np = Np; wp.Kp = KpX; wp.PA = wpl.n; wp.PB = xpl.n;
      wp.H3 = H3; wp.T = T; wp.N = N;
      wp.bconst = (const int64_t *)(ws + o_bcW); wp.offW = (const int64_t *)(ws + o_offW); wp.SX = SX;
      wp.eW = g->w_exp[QG_W_W]; wp.eX = QX.e; wp.Q = QWX; wp.L = L;
      wp.qwx = qwx; wp.mwx = mwx; wp.acc_out = a32; wp.range = range; wp.counts = counts;
      QG_CUDA_CHECK(ctx, fn, wx_gemm_launch(wp, obs, wpl.n == 1 && xpl.n == 1, st, ctx->sm_count));
    } else {
      const double one = 1.0, zero = 0.0;
      double *acc = (double *)(ws + o_acc);
      QG_CUBLAS_CHECK(ctx, fn, cublasDgemm(qg_cuda_blas(ctx), CUBLAS_OP_T, CUBLAS_OP_N, (int)H3, (int)TN, (int)C, &one,
                                           (const double *)(ws + o_Wd), (int)C, Xd, (int)C, &zero, acc, (int)H3));
      const unsigned blocks = qg_cuda_blocks(TN * H3, 256);
      if (obs) wx_requant_kernel<1><<<blocks, 256, 0, st>>>(acc, T, N, H3, g->w_exp[QG_W_W], QX.e, QWX, wx_exact, L, qwx, mwx, range, counts);
      else wx_requant_kernel<0><<<blocks, 256, 0, st>>>(acc, T, N, H3, g->w_exp[QG_W_W], QX.e, QWX, wx_exact, L, qwx, mwx, range, counts);
    }
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }

  /* the recurrence's common arguments (padded steps get y = 0 in the recurrent kernels, which
   * also write hn) */
  rec_common rc;
  memset(&rc, 0, sizeof rc);
  rc.cell = *cq;
  rc.T = T; rc.N = N; rc.H = H;
  rc.qwx = qwx; rc.mwx = mwx;
  rc.bxc = g->codes[QG_W_BX]; rc.brc = g->codes[QG_W_BR];
  rc.bxz = g->w_zp[QG_W_BX]; rc.brz = g->w_zp[QG_W_BR];
  rc.bxe = g->w_exp[QG_W_BX]; rc.bre = g->w_exp[QG_W_BR];
  rc.eR = g->w_exp[QG_W_R];
  rc.L = L; rc.reverse = reverse ? 1 : 0;
  rc.y = (float *)y->data; rc.Hy = y->dims[2]; rc.y_offset = y_offset;
  rc.hn = hn ? (float *)hn->data : NULL;
  rc.cell_out = saved ? (uint8_t *)saved->cell->data : NULL;
  rc.cb = qg_cell_bytes(cq->narrow);
  rc.hq = saved ? (int32_t *)saved->hq->data : NULL;
  rc.hping = saved ? NULL : (int32_t *)(ws + o_hp);
  rc.range = range; rc.counts = counts;

  /* 5. the steps */
  if (TN > 0 && small) {
    isk_params ip;
    memset(&ip, 0, sizeof ip);
    ip.cell = *cq; ip.c32 = c32;
    ip.T = T; ip.N = N; ip.H = H;
    ip.qwx = qwx; ip.Rp = (const int8_t *)(ws + o_Rp); ip.rconst = (const int64_t *)(ws + o_bcR); ip.roff = (const int64_t *)(ws + o_offR);
    for (int64_t j = 0; j < H3; j++) ip.need_sh |= planes_off(rpl, g->w_zp_host[QG_W_R][j]) != 0;
    ip.baseH = hpl.base;
    ip.bxc = rc.bxc; ip.brc = rc.brc; ip.bxz = rc.bxz; ip.brz = rc.brz; ip.bxe = rc.bxe; ip.bre = rc.bre;
    ip.eR = rc.eR; ip.eW = g->w_exp[QG_W_W]; ip.eX = QX.e; ip.wide = wide;
    ip.L = L; ip.reverse = rc.reverse;
    ip.y = rc.y; ip.Hy = rc.Hy; ip.y_offset = y_offset; ip.hn = rc.hn;
    ip.cell_out = rc.cell_out; ip.hq = rc.hq; ip.hping = rc.hping; ip.c32_flag = g->c32_flag;
    QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(g->c32_flag, 0, sizeof(int32_t), st));
    QG_CHECK(isk_launch(ctx, fn, &sp, &ip));
  } else if (TN > 0 && persistent) {
    pk_params pp;
    memset(&pp, 0, sizeof pp);
    pp.c = rc;
    pp.CS = pc.CS; pp.U = pc.U; pp.NB = pc.NB; pp.Kp = pc.Kp; pp.Mp = pc.Mp; pp.PR = rpl.n; pp.PH = hpl.n; pp.ksplit = pc.ksplit;
    pp.baseH = hpl.base; pp.c0H = hpl.c0;
    for (int64_t j = 0; j < H3; j++) pp.need_sh |= planes_off(rpl, g->w_zp_host[QG_W_R][j]) != 0;
    pp.c32 = c32; pp.eW = g->w_exp[QG_W_W]; pp.eX = QX.e; pp.c32_flag = g->c32_flag;
    if (a32) QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(g->c32_flag, 0, sizeof(int32_t), st));
    pp.Rp = (const int8_t *)(ws + o_Rp); pp.rconst = (const int64_t *)(ws + o_bcR); pp.roff = (const int64_t *)(ws + o_offR);
    pp.off_H = pc.off_H; pp.off_acc = pc.off_acc; pp.off_part = pc.off_part; pp.off_slice = pc.off_slice; pp.off_contrib = pc.off_contrib; pp.off_items = pc.off_items; pp.off_P = pc.off_P; pp.off_mb = pc.off_mb; pp.off_lut = pc.off_lut;
    pp.smem = pc.smem; pp.lut_smem = pc.lut_smem;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = pk_config(pc, pc.smem, &attr);
    cfg.stream = st;
    const pk_kernel pkern = pk_kernel_of(wide, obs, a32, pc.psm);
    QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(pkern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pc.smem));
    if (pc.CS > 8) QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(pkern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    QG_CUDA_CHECK(ctx, fn, cudaLaunchKernelEx(&cfg, pkern, pp));
  } else if (rec_mma) {
    ts_params tp;
    memset(&tp, 0, sizeof tp);
    tp.c = rc;
    tp.Rp = (const int8_t *)(ws + o_Rp); tp.rconst = (const int64_t *)(ws + o_bcR); tp.roff = (const int64_t *)(ws + o_offR);
    tp.Hp = (int8_t *)(ws + o_Hp); tp.Np = NpH; tp.Kp = KpR; tp.PR = rpl.n; tp.PH = hpl.n; tp.baseH = hpl.base;
    tp.c32 = c32; tp.P32 = (const int32_t *)(ws + o_P32); tp.eW = g->w_exp[QG_W_W]; tp.eX = QX.e;
    if (a32) {   /* the rows of the 32-bit cell, once for all steps */
      QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(g->c32_flag, 0, sizeof(int32_t), st));
      cell32_units_kernel<<<qg_cuda_blocks(H, 128), 128, 0, st>>>(rc, g->w_exp[QG_W_W], (int32_t *)(ws + o_P32), g->c32_flag, c32.fast);
    }
    const int single = rpl.n == 1 && hpl.n == 1;
    const ts_kernel tk = ts_kernel_of(wide, obs, single, a32);
    const size_t smem = ts_smem(single);
    QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute((const void *)tk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* both h plane buffers zero (padding rows and columns), then h0's planes into buffer 0 */
    QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(tp.Hp, 0, (size_t)(2 * hpl.n * NpH * KpR), st));
    if (NH > 0) h0_planes_kernel<<<qg_cuda_blocks(NH, 256), 256, 0, st>>>(hq0, N, H, hpl.base, hpl.n, NpH, KpR, tp.Hp);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    const dim3 grid(qg_cuda_blocks(H, TS_U), (unsigned)(NpH / TS_N));
    if (grid_rec) {   /* all steps in one cooperative launch; the batch groups' arrival counters start at 0 */
      tg_params gp;
      gp.t = tp;
      gp.bar = (int32_t *)(ws + o_bar);
      gp.rld = (int)(KpR + 16);
      gp.wx_ld = ldq;
      gp.wx_bc = lt_wx ? (const int64_t *)(ws + o_bcW) : NULL;
      gp.wx_ow = lt_wx ? (const int64_t *)(ws + o_offW) : NULL;
      gp.wx_sx = lt_wx ? SX : NULL;
      const tg_kernel gk = tg_kernel_of(wide, saved != NULL);
      int dev, smem_max;
      cudaFuncAttributes fa;
      QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
      QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
      QG_CUDA_CHECK(ctx, fn, cudaFuncGetAttributes(&fa, (const void *)gk));
      const int64_t glut = tg_lut_bytes(lut_bytes, (int64_t)smem_max - (int64_t)(tg_smem(KpR, 0) + fa.sharedSizeBytes));   /* as tg_choose */
      gp.lut_smem = glut > 0;
      const size_t gsmem = tg_smem(KpR, glut);
      QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(gp.bar, 0, (size_t)(NpH / TS_N) * 2 * 4, st));
      QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute((const void *)gk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gsmem));
      void *args[1] = {&gp};
      QG_CUDA_CHECK(ctx, fn, cudaLaunchCooperativeKernel((const void *)gk, grid, dim3(TS_THREADS), args, gsmem, st));
#if TG_TIMELINE
      if (!saved && getenv("QGRU_TG_TIMELINE")) tg_timeline_print(st, grid.x, grid.y, T);
#endif
    } else {
      for (int64_t s = 0; s < T && NH > 0; s++) {
        void *args[2] = {&tp, &s};
        QG_CUDA_CHECK(ctx, fn, cudaLaunchKernel((const void *)tk, grid, dim3(TS_THREADS), args, smem, st));
      }
    }
  } else if (TN > 0) {
    const dim3 grid(qg_cuda_blocks(H, FB_UNITS), qg_cuda_blocks(N, FB_NB));
    const double *Rt = (const double *)(ws + o_Rt);
    for (int64_t s = 0; s < T; s++) {
      if (obs) fallback_step_kernel<1><<<grid, FB_THREADS, 0, st>>>(rc, Rt, s);
      else fallback_step_kernel<0><<<grid, FB_THREADS, 0, st>>>(rc, Rt, s);
    }
  }
  QG_CHECK(qg_cuda_launched(ctx, fn));
  if (hn && NH > 0 && TN == 0) {   /* no step: hn = h0 */
    const int32_t *last = hq0;
    hn_kernel<<<qg_cuda_blocks(NH, 256), 256, 0, st>>>(last, NH, QH, (float *)hn->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  return QG_OK;
}
