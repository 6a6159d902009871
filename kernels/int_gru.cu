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

/* ================================ W x on cuBLASLt ================================ */

/* The 32-bit mode's W x with single planes and no observer, where the GPU-wide recurrence
 * (tc_grid_kernel, inference and training variants) consumes it: cuBLASLt's
 * int8 x int8 -> int32 GEMM (sm90: wgmma / TMA; bench/wx_gemm_bench.cu: 0.127 ms at the large
 * shape against 0.27 for wx_gemm_kernel) writes the plane product D[tn][j] = sum_k PX[tn][k]
 * PW[j][k] (K = the padded Kp: the padding is zeros) into rows of lt_ldc(3H) int32, and
 * tc_grid_kernel adds the zero-point terms bconst[j] + offW[j] SX[tn] where its cells use them (mod 2^32,
 * exactly what wx_gemm_kernel's acc_out epilogue writes). The handle is the context's cuBLAS
 * handle (a cublasHandle_t is a valid cublasLtHandle_t), the workspace its cuBLAS workspace (the
 * same stream: the calls are ordered), the descriptors are initialized in place (no allocation)
 * and, with the algorithm of the heuristic, cached by size in the context (ctx->lt_plans, one
 * host allocation at the first use, released with the context): nothing is created per call, and
 * the call can be captured in a CUDA graph. A size cuBLASLt has no algorithm for keeps
 * wx_gemm_kernel. A context is used by one thread at a time (as every qg_ctx), so the cache takes
 * no lock. */
enum { LT_CACHE = 16 };
static const size_t LT_WORKSPACE = (size_t)4 << 20;   /* within the context's cuBLAS workspace (32 MiB, device.cu) */

struct lt_plan {
  int used, ok;
  int64_t M, N, K, ldc;
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};
struct lt_cache {
  lt_plan plans[LT_CACHE];
  int next;   /* the slot the next new size replaces (round robin) */
};

extern "C" void qg_cuda_int_gru_release(qg_ctx *ctx) {
  free(ctx->lt_plans);
  ctx->lt_plans = NULL;
}

/* row stride of the cuBLASLt output (32-byte rows) */
static inline int64_t lt_ldc(int64_t H3) { return round_up(H3, 8); }

/* The context's cached plan of D [N][ldc] = X [N][K] W [M][K]^T (*out->ok = 0 where cuBLASLt has
 * no algorithm for it). */
static qg_status lt_plan_of(qg_ctx *ctx, const char *fn, int64_t M, int64_t N, int64_t K, int64_t ldc, lt_plan **out) {
  if (!ctx->lt_plans && !(ctx->lt_plans = calloc(1, sizeof(lt_cache))))
    return qg_fail(ctx, QG_ERR_MEMORY, fn, "cannot allocate the cuBLASLt plan cache (%zu bytes)", sizeof(lt_cache));
  lt_cache *c = (lt_cache *)ctx->lt_plans;
  for (int i = 0; i < LT_CACHE; i++) {
    lt_plan *p = &c->plans[i];
    if (p->used && p->M == M && p->N == N && p->K == K && p->ldc == ldc) { *out = p; return QG_OK; }
  }
  lt_plan *p = &c->plans[c->next];
  c->next = (c->next + 1) % LT_CACHE;
  memset(p, 0, sizeof *p);
  p->used = 1; p->M = M; p->N = N; p->K = K; p->ldc = ldc;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulPreferenceOpaque_t pref;
  size_t wsz = ctx->blas_ws[0] ? LT_WORKSPACE : 0;
  cublasLtMatmulHeuristicResult_t res;
  int n = 0;
  const cublasLtHandle_t h = (cublasLtHandle_t)qg_cuda_blas(ctx);
  p->ok = cublasLtMatmulDescInit(&p->op, CUBLAS_COMPUTE_32I, CUDA_R_32I) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
          /* W [M][K] row-major = K x M column-major, op T; X [N][K] = K x N; D [N][ldc] = M x N, ld ldc */
          cublasLtMatrixLayoutInit(&p->la, CUDA_R_8I, (uint64_t)K, (uint64_t)M, K) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatrixLayoutInit(&p->lb, CUDA_R_8I, (uint64_t)K, (uint64_t)N, K) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatrixLayoutInit(&p->lc, CUDA_R_32I, (uint64_t)M, (uint64_t)N, ldc) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceInit(&pref) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoGetHeuristic(h, &p->op, &p->la, &p->lb, &p->lc, &p->lc, &pref, 1, &res, &n) == CUBLAS_STATUS_SUCCESS &&
          n >= 1 && res.state == CUBLAS_STATUS_SUCCESS && res.workspaceSize <= wsz;
  if (p->ok) p->algo = res.algo;
  *out = p;
  return QG_OK;
}

/* Whether cuBLASLt has an algorithm for this W x (M = 3H, N = T N, K = Kp). */
static qg_status lt_wx_usable(qg_ctx *ctx, const char *fn, int64_t M, int64_t N, int64_t K, int *ok) {
  lt_plan *p;
  QG_CHECK(lt_plan_of(ctx, fn, M, N, K, lt_ldc(M), &p));
  *ok = p->ok;
  return QG_OK;
}

/* One W x product for lt_wx_run: also the key of its captured graph (everything the enqueued work
 * depends on: the plan's algorithm and sizes, every pointer). */
struct lt_wx_call {
  char tag[8];
  cublasLtMatmulAlgo_t algo;
  int64_t M, N, K, ldc;
  const int8_t *W, *X;
  int32_t *D;
  void *ws;
  size_t wsz;
  lt_plan *p;      /* (not compared: the algorithm and sizes above are) */
  qg_ctx *ctx;
  const char *fn;
};

static qg_status lt_wx_body(void *arg) {
  const lt_wx_call *c = (const lt_wx_call *)arg;
  const int32_t one = 1, zero = 0;
  const cublasStatus_t s = cublasLtMatmul((cublasLtHandle_t)qg_cuda_blas(c->ctx), &c->p->op, &one, c->W, &c->p->la, c->X, &c->p->lb, &zero,
                                          c->D, &c->p->lc, c->D, &c->p->lc, &c->algo, c->ws, c->wsz, qg_cuda_stream(c->ctx));
  return qg_cublas_status(c->ctx, c->fn, s);
}

/* Enqueues D = X W^T on the context's stream (a size lt_wx_usable accepted). From the second call
 * with the same pointers on, as a captured graph (qg_cuda_graphed): cublasLtMatmul's own host work
 * is 55-70 us a call on the device machines' hosts (bench/cuda_int_gru.md, session 49), longer
 * than the kernels queued before it, so the GPU waited for it; a graph launch is a few us. */
static qg_status lt_wx_run(qg_ctx *ctx, const char *fn, int64_t M, int64_t N, int64_t K, const int8_t *W, const int8_t *X, int32_t *D) {
  lt_plan *p;
  QG_CHECK(lt_plan_of(ctx, fn, M, N, K, lt_ldc(M), &p));
  if (!p->ok) return qg_fail(ctx, QG_ERR_DEVICE, fn, "cuBLASLt: no int8 algorithm for %lld x %lld x %lld", (long long)M, (long long)N, (long long)K);
  lt_wx_call c;
  memset(&c, 0, sizeof c);   /* the key is compared byte for byte: no stray padding */
  memcpy(c.tag, "qgLtWx", 7);
  c.algo = p->algo;
  c.M = M; c.N = N; c.K = K; c.ldc = p->ldc;
  c.W = W; c.X = X; c.D = D;
  c.ws = ctx->blas_ws[0]; c.wsz = ctx->blas_ws[0] ? LT_WORKSPACE : 0;
  c.p = p; c.ctx = ctx; c.fn = fn;
  return qg_cuda_graphed(ctx, qg_cuda_stream(ctx), &c, offsetof(lt_wx_call, p), lt_wx_body, &c);
}

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

/* ================================ weight quantization ================================ */

/* The four weights' codes, fake-quantized values and masks (QUANT_SPEC.md section 1, per output
 * channel j: qg_quant_f32 and qg_deq_f32, which give qg_quant_real's and qg_deq's values in float
 * arithmetic). A warp per row of W and of R (rows 3H each: the row's quantizer made once; rows
 * strided over the first row_blocks blocks' warps), each lane WQ_VEC 16-byte loads in flight at
 * once where the row allows (v4: cols % 4 == 0, the arrays aligned), then blocks of WQ_THREADS
 * bias elements (one channel each). The first version (a grid-stride loop over all elements that
 * found each element's weight and channel by a search and a 64-bit division, with ldexp's general
 * path twice per element) took 31 us at T100 N256 C512 H1024 (H200, ncu); a warp per row with
 * double arithmetic, 21 us. */
enum { WQ_THREADS = 256, WQ_VEC = 4 };

struct wq_params {
  const float *src[QG_W_NUM];
  int32_t *codes[QG_W_NUM];
  float *fq[QG_W_NUM];
  uint8_t *mask[QG_W_NUM];
  const int32_t *exps[QG_W_NUM], *zps[QG_W_NUM];
  int bits[QG_W_NUM], uns[QG_W_NUM];
  int v4[2];                /* W, R: rows as 16-byte vectors */
  int64_t cols[QG_W_NUM];   /* W: C, R: H, the biases 1 (qg_int_gru_weight_cols) */
  int64_t H3, row_blocks;
};

/* One weight value: its code, fake-quantized value (*fq) and mask (*m); qf = qg_qf32_make(q) (its
 * float clamp where it applies: the same codes). */
__device__ __forceinline__ int32_t wq_value(float x, const qg_qp &q, const qg_qf32 &qf, float *fq, uint32_t *m) {
  int mm;
  const int64_t code = qf.ok ? qg_quant_qf32(x, &qf, &mm) : qg_quant_f32(x, q, &mm);
  *fq = qg_deq_f32(code, q);
  *m = (uint32_t)mm;
  return (int32_t)code;
}

__device__ __forceinline__ void wq_element(const wq_params &p, int w, const qg_qp &q, const qg_qf32 &qf, int64_t i) {
  float f;
  uint32_t m;
  p.codes[w][i] = wq_value(p.src[w][i], q, qf, &f, &m);
  p.fq[w][i] = f;
  p.mask[w][i] = (uint8_t)m;
}

__global__ void __launch_bounds__(WQ_THREADS) quantize_weights_kernel(const __grid_constant__ wq_params p) {
  const int64_t H3 = p.H3;
  if ((int64_t)blockIdx.x < p.row_blocks) {   /* row r: W's row r (r < 3H) or R's row r - 3H */
    const int lane = threadIdx.x & 31;
    const int64_t warps = p.row_blocks * (WQ_THREADS / 32);
    for (int64_t r = blockIdx.x * (int64_t)(WQ_THREADS / 32) + (threadIdx.x >> 5); r < 2 * H3; r += warps) {
      const int w = r < H3 ? 0 : 1;
      const int64_t j = r - w * H3, cols = p.cols[w], i0 = j * cols;
      const qg_qp q = qg_qp_make(p.bits[w], p.uns[w], p.exps[w][j], p.zps[w][j]);
      const qg_qf32 qf = qg_qf32_make(q);
      if (!p.v4[w]) {
        for (int64_t c = lane; c < cols; c += 32) wq_element(p, w, q, qf, i0 + c);
        continue;
      }
      for (int64_t c0 = 4 * (int64_t)lane; c0 < cols; c0 += 4 * 32 * WQ_VEC) {
        float4 v[WQ_VEC];
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {   /* every load of the lane first */
          const int64_t c = c0 + u * 4 * 32;
          v[u] = c < cols ? *(const float4 *)(p.src[w] + i0 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {
          const int64_t c = c0 + u * 4 * 32;
          if (c >= cols) break;
          const float x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
          int32_t k[4];
          float f[4];
          uint32_t mw = 0;
#pragma unroll
          for (int e = 0; e < 4; e++) {
            uint32_t m;
            k[e] = wq_value(x[e], q, qf, &f[e], &m);
            mw |= m << (8 * e);
          }
          *(int4 *)(p.codes[w] + i0 + c) = make_int4(k[0], k[1], k[2], k[3]);
          *(float4 *)(p.fq[w] + i0 + c) = make_float4(f[0], f[1], f[2], f[3]);
          *(uint32_t *)(p.mask[w] + i0 + c) = mw;
        }
      }
    }
    return;
  }
  const int64_t e = ((int64_t)blockIdx.x - p.row_blocks) * WQ_THREADS + threadIdx.x;   /* bias element e of bx, then br */
  if (e >= 2 * H3) return;
  const int w = e < H3 ? QG_W_BX : QG_W_BR;
  const int64_t j = e < H3 ? e : e - H3;
  const qg_qp q = qg_qp_make(p.bits[w], p.uns[w], p.exps[w][j], p.zps[w][j]);
  wq_element(p, w, q, qg_qf32_make(q), j);
}

static int aligned16(const void *a) { return ((uintptr_t)a & 15) == 0; }

extern "C" qg_status qg_cuda_int_gru_quantize_weights(qg_ctx *ctx, qg_int_gru *g, const qg_tensor *W, const qg_tensor *R,
                                                      const qg_tensor *bx, const qg_tensor *br) {
  const qg_tensor *src[QG_W_NUM] = {W, R, bx, br};
  static_assert(QG_W_W == 0 && QG_W_R == 1 && QG_W_BX == 2 && QG_W_BR == 3 && QG_W_NUM == 4, "the kernel's row order");
  wq_params p;
  for (int w = 0; w < QG_W_NUM; w++) {
    p.src[w] = (const float *)src[w]->data;
    p.codes[w] = g->codes[w]; p.fq[w] = g->fq[w]; p.mask[w] = g->mask[w];
    p.exps[w] = g->w_exp[w]; p.zps[w] = g->w_zp[w];
    p.bits[w] = g->w_bits[w]; p.uns[w] = g->w_unsigned[w];
    p.cols[w] = qg_int_gru_weight_cols(g, w);
    if (w < 2)
      p.v4[w] = p.cols[w] % 4 == 0 && aligned16(p.src[w]) && aligned16(p.codes[w]) && aligned16(p.fq[w]) && ((uintptr_t)p.mask[w] & 3) == 0;
  }
  p.H3 = 3 * g->H;
  if (p.H3 == 0) return QG_OK;
  const int64_t need = (2 * p.H3 + WQ_THREADS / 32 - 1) / (WQ_THREADS / 32), cap = 8 * (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1);
  p.row_blocks = need < cap ? need : cap;
  const int64_t blocks = p.row_blocks + qg_cuda_blocks(2 * p.H3, WQ_THREADS);
  quantize_weights_kernel<<<(unsigned)blocks, WQ_THREADS, 0, qg_cuda_stream(ctx)>>>(p);
  return qg_cuda_launched(ctx, "qg_int_gru_quantize_weights");
}

/* ================================ forward: operand preparation ================================ */

/* Planes of a weight's codes [rows, K] for the int8 GEMMs, one block per padded row j < Mp:
 * planes [np][Mp][Kp] (zeros beyond rows and K); off[j] = c0 + base - z[j];
 * bconst[j] = offB S[j] + K off[j] offB with S[j] = sum_k (r - c0). */
struct planes_job {
  const int32_t *codes, *zp;
  int64_t rows, K, Mp, Kp;
  int np;
  int64_t base, c0, offB;
  int8_t *planes;
  int64_t *off, *bconst;
};

/* A warp per row (rows strided over the grid's warps): rows [0, na) of job a (W), then rows
 * [0, nb) of job b (R). Where K and Kp are multiples of 4 and the codes 16-byte aligned (every
 * shape of the benchmarks), each lane takes 4 consecutive columns per vector, WQ_VEC vectors in
 * flight at once (16-byte loads, 4-byte plane stores; a block per row, one column per thread and
 * trip, took 17 us at the large shape, H200): the same planes and sums. */
__device__ __forceinline__ uint32_t planes_quad(const int4 &q4, const planes_job &p, uint32_t *hi, int64_t *sum) {
  const int32_t q[4] = {q4.x, q4.y, q4.z, q4.w};
  uint32_t w0 = 0, w1 = 0;
  int32_t s = 0;   /* |q - base - c0| < 2^17 (codes of at most 16 bits in planes) */
#pragma unroll
  for (int e = 0; e < 4; e++) {
    int8_t p0, p1;
    split_planes(q[e], p.base, p.np, &p0, &p1);
    w0 |= (uint32_t)(uint8_t)p0 << (8 * e);
    w1 |= (uint32_t)(uint8_t)p1 << (8 * e);
    s += q[e] - (int32_t)(p.base + p.c0);
  }
  *sum += s;
  *hi = w1;
  return w0;
}

__global__ void __launch_bounds__(WQ_THREADS) weight_planes_kernel(const __grid_constant__ planes_job a, const __grid_constant__ planes_job b,
                                                                   int64_t na, int64_t nb) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (WQ_THREADS / 32);
  for (int64_t rr = blockIdx.x * (int64_t)(WQ_THREADS / 32) + (threadIdx.x >> 5); rr < na + nb; rr += warps) {
    const bool first = rr < na;
    const planes_job &p = first ? a : b;
    const int64_t j = first ? rr : rr - na;
    int64_t sum = 0;
    const bool v4 = p.K % 4 == 0 && p.Kp % 4 == 0 && ((uintptr_t)p.codes & 15) == 0 && ((uintptr_t)p.planes & 3) == 0;
    if (v4) {
      const bool row = j < p.rows;
      const int32_t *cr = p.codes + j * p.K;
      uint32_t *d0 = (uint32_t *)(p.planes + j * p.Kp), *d1 = (uint32_t *)(p.planes + (p.Mp + j) * p.Kp);
      for (int64_t k0 = 4 * (int64_t)lane; k0 < p.Kp; k0 += 4 * 32 * WQ_VEC) {
        int4 c[WQ_VEC];
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {   /* every load of the lane first */
          const int64_t k = k0 + u * 4 * 32;
          c[u] = row && k < p.K ? *(const int4 *)(cr + k) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {
          const int64_t k = k0 + u * 4 * 32;
          if (k >= p.Kp) break;
          uint32_t w0 = 0, w1 = 0;
          if (row && k < p.K) w0 = planes_quad(c[u], p, &w1, &sum);
          d0[k / 4] = w0;
          if (p.np == 2) d1[k / 4] = w1;
        }
      }
    } else {
      for (int64_t k = lane; k < p.Kp; k += 32) {
        int8_t p0 = 0, p1 = 0;
        if (j < p.rows && k < p.K) {
          const int64_t q = p.codes[j * p.K + k];
          split_planes(q, p.base, p.np, &p0, &p1);
          sum += q - p.base - p.c0;
        }
        p.planes[j * p.Kp + k] = p0;
        if (p.np == 2) p.planes[(p.Mp + j) * p.Kp + k] = p1;
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const int64_t o = j < p.rows ? p.c0 + p.base - p.zp[j] : 0;
      p.off[j] = o;
      p.bconst[j] = j < p.rows ? p.offB * sum + p.K * o * p.offB : 0;
    }
  }
}

/* Centered codes of a weight [rows, K] as doubles (the fp64 GEMM), or transposed [K, rows] (the
 * double recurrence's R). */
__global__ void weight_centered_kernel(const int32_t *codes, const int32_t *zp, int64_t rows, int64_t K, int transpose,
                                       double *out) {
  const int64_t n = rows * K;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = e / K, k = e % K;
    const int64_t c = (int64_t)codes[e] - zp[j];
    const int64_t o = transpose ? k * rows + j : e;
    out[o] = (double)c;
  }
}

/* input.x: one block per row r < nrows (rows >= TN only get zero planes): codes and masks (xq /
 * xm NULL: not written), int8
 * planes [np][Np][Kp] and S[r] = sum_k (r - c0) (when planes), centered doubles (when xd),
 * statistics at valid steps. The blocks after nrows quantize h0 (h0_part). */
struct h0_job {
  const float *h0;   /* NULL: zeros */
  int64_t NH;
  qg_qp QH;
  int32_t *hq0;
};

template <int OBS>
__device__ __forceinline__ void h0_part(const h0_job &h, int64_t blk, double *range, int64_t *counts) {
  const int64_t i = blk * blockDim.x + threadIdx.x;
  if (i >= h.NH) return;
  const double v = h.h0 ? (double)h.h0[i] : 0.0;
  int m;
  h.hq0[i] = (int32_t)qg_quant_real(v, h.QH, &m);
  if (OBS && h.h0) observe(range, counts, QG_Q_OUTPUT_H, v);
}

template <int OBS>
__global__ void x_quant_kernel(const float *x, int64_t T, int64_t N, int64_t C, qg_qp QX, const int64_t *L, int32_t *xq,
                               uint8_t *xm, int np, int64_t base, int64_t c0, int64_t Np, int64_t Kp, int8_t *planes,
                               int64_t *S, double *xd, double *range, int64_t *counts, int64_t nrows, const __grid_constant__ h0_job hj) {
  __shared__ int64_t red[32];
  if ((int64_t)blockIdx.x >= nrows) { h0_part<OBS>(hj, blockIdx.x - nrows, range, counts); return; }
  const int64_t r = blockIdx.x, TN = T * N;
  const bool row = r < TN;
  bool valid = false;
  if (OBS && row) valid = r / N < length_at(L, r % N, T);
  int64_t sum = 0;
  const int64_t kend = planes ? Kp : C;
  for (int64_t k = threadIdx.x; k < kend; k += blockDim.x) {
    int8_t p0 = 0, p1 = 0;
    if (row && k < C) {
      const int64_t i = r * C + k;
      const float v = x[i];
      int m;
      const int64_t q = qg_quant_real((double)v, QX, &m);
      if (xq) xq[i] = (int32_t)q;
      if (xm) xm[i] = (uint8_t)m;
      if (OBS && valid) observe(range, counts, QG_Q_INPUT_X, (double)v);
      if (planes) { split_planes(q, base, np, &p0, &p1); sum += q - base - c0; }
      if (xd) xd[i] = (double)(q - QX.z);
    }
    if (planes) {
      planes[r * Kp + k] = p0;
      if (np == 2) planes[(Np + r) * Kp + k] = p1;
    }
  }
  if (planes) {
    sum = block_sum_i64(sum, red);
    if (threadIdx.x == 0) S[r] = sum;
  }
}

/* x_quant_kernel without an observer for one int8 plane, C % 4 == 0 and x 16-byte aligned: a
 * warp per row (rows strided over the grid's warps), each lane XQ4_VEC 16-byte loads of x in
 * flight at once, then 4-byte stores of the plane and the masks and 16-byte stores of the codes;
 * xq / xm NULL (inference: nothing reads them) skip those stores. The same codes, planes and sums
 * as x_quant_kernel (qg_quant_f32 per element: qg_quant_real's codes in float arithmetic;
 * FAST = 1: qg_quant_qf32, its float clamp, where qg_qf32_make says it applies). (A block of 64
 * threads per row, two loads each, took 31 us at T100 N256 C512 on an H200: six waves of one
 * round trip each; a warp per row with double arithmetic, 28 us; with qg_quant_f32's 64-bit
 * integer clamps, 31 us at 62% of the issue slots; with the float clamp, 22 us.) The blocks from
 * row_blocks on quantize h0. */
enum { XQ4_THREADS = 256, XQ4_VEC = 4 };

template <int FAST>
__device__ __forceinline__ uint32_t xq4_quad(float4 v4, bool in, const qg_qp &QX, const qg_qf32 &QF, int64_t base, int64_t c0, int32_t *xq,
                                             uint8_t *xm, int32_t *sum) {
  if (!in) return 0;
  const float v[4] = {v4.x, v4.y, v4.z, v4.w};
  int32_t q[4];
  uint32_t mw = 0, pw = 0;
#pragma unroll
  for (int e = 0; e < 4; e++) {
    int m;
    q[e] = FAST ? qg_quant_qf32(v[e], &QF, &m) : (int32_t)qg_quant_f32(v[e], QX, &m);
    mw |= (uint32_t)m << (8 * e);
    const int32_t rr = q[e] - (int32_t)base;
    pw |= ((uint32_t)rr & 255u) << (8 * e);
    *sum += rr - (int32_t)c0;
  }
  if (xq) *(int4 *)xq = make_int4(q[0], q[1], q[2], q[3]);
  if (xm) *(uint32_t *)xm = mw;
  return pw;
}

template <int FAST>
__global__ void __launch_bounds__(XQ4_THREADS) x_quant4_kernel(const float *__restrict__ x, int64_t TN, int64_t C, qg_qp QX,
                                                               int32_t *xq, uint8_t *xm, int64_t base, int64_t c0, int64_t Kp,
                                                               int8_t *planes, int64_t *S, int64_t nrows, int64_t row_blocks,
                                                               const __grid_constant__ h0_job hj) {
  if ((int64_t)blockIdx.x >= row_blocks) { h0_part<0>(hj, blockIdx.x - row_blocks, NULL, NULL); return; }
  const int lane = threadIdx.x & 31;
  const int64_t warps = row_blocks * (XQ4_THREADS / 32);
  const qg_qf32 QF = qg_qf32_make(QX);
  for (int64_t r = blockIdx.x * (int64_t)(XQ4_THREADS / 32) + (threadIdx.x >> 5); r < nrows; r += warps) {
    const bool row = r < TN;
    int32_t sum = 0;   /* |sum| <= 255 C < 2^31 (C < 2^17) */
    for (int64_t k0 = 4 * (int64_t)lane; k0 < Kp; k0 += 4 * 32 * XQ4_VEC) {
      float4 v[XQ4_VEC];
#pragma unroll
      for (int u = 0; u < XQ4_VEC; u++) {   /* every load of the lane first */
        const int64_t k = k0 + u * 4 * 32;
        v[u] = row && k < C ? *(const float4 *)(x + r * C + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < XQ4_VEC; u++) {
        const int64_t k = k0 + u * 4 * 32;
        if (k >= Kp) break;
        const bool in = row && k < C;
        *(uint32_t *)(planes + r * Kp + k) =
            xq4_quad<FAST>(v[u], in, QX, QF, base, c0, in && xq ? xq + r * C + k : NULL, in && xm ? xm + r * C + k : NULL, &sum);
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) S[r] = sum;
  }
}

/* matmul.Wx codes and masks from an fp64 accumulator [TN, 3H] (exact integers, or simulated). */
template <int OBS>
__global__ void wx_requant_kernel(const double *acc, int64_t T, int64_t N, int64_t H3, const int32_t *eW, int eX, qg_qp Q,
                                  int exact, const int64_t *L, int32_t *qwx, uint8_t *mwx, double *range, int64_t *counts) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= T * N * H3) return;
  const int64_t r = e / H3, j = e % H3;
  const int s = eW[j] + eX;
  const double a = acc[e];
  int m;
  const int64_t code = exact ? qg_requant64((int64_t)a, s, Q, &m) : qg_requant_real(a, s, Q, &m);
  qwx[e] = (int32_t)code;
  mwx[e] = (uint8_t)m;
  if (OBS && r / N < length_at(L, r % N, T)) observe(range, counts, QG_Q_MATMUL_WX, ldexp(a, -s));
}

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

/* ---- tensor-core step: one kernel per step where the persistent kernel cannot hold R ----
 * Block (TS_THREADS threads): TS_U units (all three gates: the TS_M rows k H + u0 + u of R, gate
 * major) x TS_N batch rows. R h from the int8 planes of R ([PR][3H][Kp], read from L2 every step)
 * and of the step's h ([PH][Np][Kp], double-buffered: step s reads buffer s & 1 and writes the
 * other) on mma.sync m16n8k32, the tiles of each TS_BK columns staged by cp.async through
 * TS_STAGES buffers (three tiles in flight: with one, the loop waits on L2 latency every tile).
 * Warps: two K groups (the two 32-column halves of each staged tile) of 8 warps, each 48 rows x
 * 16 batch rows. The per-row sums of the h planes (the zero-point term offR[j] SH[n]) come from
 * the same B fragments (__dp4a, warps of the first 48 rows). The two K groups' sums meet in
 * shared memory (int32 for one plane pair, else int64 with the plane scales), where each thread
 * then takes the three gates of its unit for TS_N / 16 batch rows: the exact sum
 *   R h = sum_ab sA sB (PR_a . PH_b) + rconst[j] + offR[j] SH[n]     (see the header)
 * requantized to matmul.Rh, the shared cell, y, the saved state, hn, and the next step's h codes
 * and planes. Every plane product is below 2^14 Kp < 2^31 (H < 2^17): exact. */
enum { TS_U = 32, TS_M = 3 * TS_U, TS_N = 64, TS_BK = 64, TS_LD = TS_BK + 16, TS_THREADS = 512, TS_ALD = TS_M + 4,
       TS_STAGE = (TS_M + TS_N) * TS_LD, TS_STAGES = 4 };

struct ts_params {
  rec_common c;
  const int8_t *Rp;                /* [PR][3H][Kp] */
  const int64_t *rconst, *roff;    /* [3H] */
  int8_t *Hp;                      /* [2][PH][Np][Kp]; rows >= N and columns >= H stay 0 */
  int64_t Np, Kp;
  int PR, PH;
  int64_t baseH;                   /* output.h planes: r = q - baseH */
  /* the 32-bit mode (A32): the per-tensor part of the 32-bit cell, the per-unit rows
   * [QG_C32_ROWS + 1][H] (cell32_units_kernel; the last row: 1 where the unit is within the
   * bounds), W's exponents and input.x's (the general cell's requantization of W x) */
  qg_cell32 c32;
  const int32_t *P32;
  const int32_t *eW;
  int eX;
};

/* Shared memory of the tensor-core step: the staging buffers, later the summed tile. */
static size_t ts_smem(int single) {
  const size_t stage = (size_t)TS_STAGES * TS_STAGE, tile = (size_t)TS_N * TS_ALD * (single ? 4 : 8);
  return stage > tile ? stage : tile;
}


/* The rows of the 32-bit cell of every unit, once per forward for the tensor-core step's 32-bit
 * mode: P [QG_C32_ROWS + 1][H], the last row 1 where qg_cell32_unit accepts the unit, 2 where
 * besides every requantization of the unit and of the layer (tensor_fast: qg_cell32's fast) has
 * k >= 0 (the cell may run with `fast` set, qg_rs32); a unit outside the bounds sets *flag (the
 * general cell runs for it, qg_int_gru_cell_path says 64). */
__global__ void cell32_units_kernel(const __grid_constant__ rec_common c, const int32_t *eW, int32_t *P, int32_t *flag, int tensor_fast) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, H = c.H;
  if (i >= H) return;
  int ok = cell32_unit_rows(P, H, i, &c.cell, H, i, eW, c.eR, c.bxc, c.bxz, c.bxe, c.brc, c.brz, c.bre);
  if (ok && tensor_fast && qg_cell32_unit_fast(P, H, i)) ok = 2;
  /* a unit outside the bounds: qg_cell32_unit returned before writing all its rows; tc_step_kernel
   * still stages every row of its block's units (and runs the general cell for this one), so the
   * rest is defined here (compute-sanitizer initcheck: uninitialized workspace reads otherwise) */
  if (!ok)
    for (int r = 0; r < QG_C32_ROWS; r++) P[r * H + i] = 0;
  P[QG_C32_ROWS * H + i] = ok;
  if (!ok) *flag = 1;
}

/* Whether every unit of a block (units u0 .. u0 + TS_U - 1 of H, their flag row of P staged in
 * Ps [QG_C32_ROWS + 1][TS_U]) takes the cell without clamps (cell32_units_kernel's 2). */
__device__ __forceinline__ bool c32_block_fast(const int32_t *Ps, int64_t u0, int64_t H) {
  bool fast = true;
  for (int uu = 0; uu < TS_U; uu++) fast = fast && (u0 + uu >= H || Ps[QG_C32_ROWS * TS_U + uu] == 2);
  return fast;
}

/* SINGLE: one plane of R and of h (operands of <= 8 bits): int32 sums, no plane loops.
 * A32: W x arrives as int32 accumulators (wx_gemm_kernel with acc_out) and R h is taken mod 2^32
 * (exact: the host bounds every accumulator below 2^29, as in the persistent kernel's 32-bit
 * mode); the block's units' rows of the 32-bit cell (p.P32) are staged in shared memory, and
 * each unit within the bounds runs qg_cell32_forward, the others the general cell. */
template <int WIDE, int OBS, int SINGLE, int A32>
__global__ void __launch_bounds__(TS_THREADS) tc_step_kernel(const __grid_constant__ ts_params p, int64_t s) {
  typedef typename std::conditional<SINGLE, int32_t, int64_t>::type tile_t;
  typedef typename std::conditional<A32, uint32_t, int64_t>::type sum_t;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t rsum[2][2][TS_N];   /* [K group][h plane][batch row]: sums of the h planes */
  __shared__ int32_t Ps[A32 ? (QG_C32_ROWS + 1) * TS_U : 1];   /* A32: [QG_C32_ROWS + 1][TS_U] */
  const rec_common &c = p.c;
  const int64_t H = c.H, H3 = 3 * H, N = c.N, Kp = p.Kp, Np = p.Np;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int kg = warp >> 3, wm = warp & 1, wn = (warp >> 1) & 3;   /* K group; warp tile rows wm 48, cols wn 16 */
  const int64_t u0 = (int64_t)blockIdx.x * TS_U, n0 = (int64_t)blockIdx.y * TS_N;
  const int cur = (int)(s & 1), nxt = cur ^ 1;
  const int PR = SINGLE ? 1 : p.PR, PH = SINGLE ? 1 : p.PH;
  int8_t *stage = (int8_t *)smem;
  tile_t *tile = (tile_t *)smem;   /* after the K loops: [TS_N][TS_ALD] */
  if (A32)   /* read after the K loop's barriers */
    for (int e = tid; e < (QG_C32_ROWS + 1) * TS_U; e += TS_THREADS) {
      const int r = e / TS_U, uu = e % TS_U;
      Ps[e] = u0 + uu < H ? p.P32[r * H + u0 + uu] : 0;
    }
  /* A32: this thread's cells' inputs that do not depend on R h (unit tid % TS_U, batch rows
   * tid / TS_U + 16 q: the W x accumulators, from DRAM at large shapes, and the previous codes),
   * loaded before the products so that their latency hides behind them */
  constexpr int TS_RPT = TS_N / (TS_THREADS / TS_U), TS_PRE = A32 ? TS_RPT : 1;
  int32_t pwx[TS_PRE][3], php[TS_PRE];
  if (A32) {
    const int64_t i = u0 + tid % TS_U;
#pragma unroll
    for (int q = 0; q < TS_PRE; q++) {
      const int64_t n = n0 + tid / TS_U + q * (TS_THREADS / TS_U);
      pwx[q][0] = pwx[q][1] = pwx[q][2] = php[q] = 0;
      if (i < H && n < N) {
        const int64_t Ln = length_at(c.L, n, c.T);
        php[q] = h_at(c, s)[n * H + i];
        if (s < Ln) {
          const int32_t *wx = c.qwx + ((c.reverse ? Ln - 1 - s : s) * N + n) * 3 * H + i;
          pwx[q][0] = wx[0]; pwx[q][1] = wx[H]; pwx[q][2] = wx[2 * H];
        }
      }
    }
  }

  /* this thread's 16-byte chunks of each staged tile: chunk tid, and tid + TS_THREADS where it
   * exists (rows 0..TS_M-1 of R, then TS_N rows of h) */
  const int nchunks = (TS_M + TS_N) * (TS_BK / 16);
  int64_t src_row[2];   /* byte offset of the chunk's row, plane 0, column 0 (R rows: -1 = zero fill) */
  int dst[2];
  bool isA[2], has[2];
  for (int q = 0; q < 2; q++) {
    const int ch = tid + q * TS_THREADS, row = ch / (TS_BK / 16), cv = ch % (TS_BK / 16);
    has[q] = ch < nchunks;
    isA[q] = row < TS_M;
    dst[q] = row * TS_LD + cv * 16;
    if (isA[q]) {
      const int gt = row / TS_U, u = row % TS_U;
      src_row[q] = u0 + u < H ? (gt * H + u0 + u) * Kp + cv * 16 : -1;
    } else {
      src_row[q] = (n0 + row - TS_M) * Kp + cv * 16;
    }
  }

  int32_t acc[3][2][4];
  int64_t wacc[3][2][4];
  if (!SINGLE) {
#pragma unroll
    for (int a = 0; a < 3; a++)
#pragma unroll
      for (int b = 0; b < 2; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) wacc[a][b][e] = 0;
  }
  const int nk = (int)(Kp / TS_BK);
  for (int pa = 0; pa < PR; pa++)
    for (int pb = 0; pb < PH; pb++) {
#pragma unroll
      for (int a = 0; a < 3; a++)
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[a][b][e] = 0;
      int32_t rs[2] = {0, 0};
      const int8_t *Ab = p.Rp + (int64_t)pa * H3 * Kp, *Bb = p.Hp + ((int64_t)cur * PH + pb) * Np * Kp;
      auto load = [&](int kt, int buf) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
          if (!has[q]) continue;
          const int8_t *src = isA[q] ? (src_row[q] >= 0 ? Ab + src_row[q] : Ab) : Bb + src_row[q];
          const int bytes = isA[q] && src_row[q] < 0 ? 0 : 16;
          cp_async16_zfill(stage + buf * TS_STAGE + dst[q], src + (bytes ? (int64_t)kt * TS_BK : 0), bytes);
        }
      };
      /* TS_STAGES buffers: tiles kt + 1 .. kt + TS_STAGES - 1 in flight while tile kt is used */
#pragma unroll
      for (int q = 0; q < TS_STAGES - 1; q++) {
        if (q < nk) load(q, q);
        cp_async_commit();
      }
      for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<TS_STAGES - 2>();
        __syncthreads();   /* tile kt landed for every thread; tile kt - 1's buffer is free */
        if (kt + TS_STAGES - 1 < nk) load(kt + TS_STAGES - 1, (kt + TS_STAGES - 1) % TS_STAGES);
        cp_async_commit();
        const int8_t *As = stage + (kt % TS_STAGES) * TS_STAGE, *Bs = As + TS_M * TS_LD;
        rh_k32<2>(acc, rs, As, Bs, wm * 48, wn * 16, TS_LD, kg * 32, pa == 0 && wm == 0);
      }
      cp_async_wait<0>();
      __syncthreads();   /* every buffer free for the next plane pair or the tile */
      if (pa == 0 && wm == 0) {   /* the row sums of this h plane: lanes tq of a row, then one store */
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          int32_t v = rs[nt];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (tq == 0) rsum[kg][pb][wn * 16 + nt * 8 + g] = v;
        }
      }
      if (!SINGLE) {
        const int64_t sc = plane_scale(PR, pa) * plane_scale(PH, pb);
#pragma unroll
        for (int a = 0; a < 3; a++)
#pragma unroll
          for (int b = 0; b < 2; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) wacc[a][b][e] += sc * acc[a][b][e];
      }
    }
  /* the K groups' sums into the tile [batch row][gate row] (the staging buffers are free: the
   * last K step ended with a barrier) */
  for (int pass = 1; pass >= 0; pass--) {
    if (kg == pass) {
#pragma unroll
      for (int mt = 0; mt < 3; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int row = wm * 48 + mt * 16 + g + 8 * (e >> 1), col = wn * 16 + nt * 8 + 2 * tq + (e & 1);
            const tile_t v = SINGLE ? (tile_t)acc[mt][nt][e] : (tile_t)wacc[mt][nt][e];
            if (pass) tile[col * TS_ALD + row] = v;
            else tile[col * TS_ALD + row] += v;
          }
    }
    __syncthreads();
  }

  /* the cells: unit u of the tile, batch rows rb, rb + 16, ... */
  const int u = tid % TS_U, rb = tid / TS_U;
  const int64_t i = u0 + u;
  if (i >= H) return;
  const qg_qp QH = c.cell.a[QG_Q_OUTPUT_H], QRH = c.cell.a[QG_Q_MATMUL_RH];
  qg_cell_in base_in;
  fill_bias(c, i, &base_in);
  sum_t rconst[3], roff[3];
  int srh[3];
#pragma unroll
  for (int k = 0; k < 3; k++) {
    const int64_t j = k * H + i;
    rconst[k] = (sum_t)p.rconst[j];
    roff[k] = (sum_t)p.roff[j];
    srh[k] = c.eR[j] + QH.e;
  }
  qg_cell32 c32 = p.c32;   /* A32: this block's rows in shared memory, unit u */
  c32.P = Ps;
  c32.H = TS_U;
  const bool use32 = A32 ? Ps[QG_C32_ROWS * TS_U + u] != 0 : false;
  const bool fast = A32 && c32_block_fast(Ps, u0, H);
  const int32_t *hprev_codes = h_at(c, s);
  int32_t *hnext = h_at(c, s + 1);
  /* rows rb, rb + 16, ...; A32: a constant trip count, unrolled (the prefetched inputs stay in registers) */
#pragma unroll TS_PRE
  for (int rq = 0, r = rb; A32 ? rq < TS_PRE : r < TS_N; rq++, r += TS_THREADS / TS_U) {
    const int64_t n = n0 + r;
    if (n >= N) break;
    const int64_t Ln = length_at(c.L, n, c.T), hp = A32 ? php[rq] : hprev_codes[n * H + i];
    int64_t hnew = hp;
    if (s >= Ln) {   /* padded step (t = s): the state stays, y = 0 */
      zero_cell(c, s, n, i);
      c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
    } else {
      const int64_t t = c.reverse ? Ln - 1 - s : s;
      sum_t sh = 0;
      for (int q = 0; q < 2; q++)
        for (int pb = 0; pb < PH; pb++) sh += (sum_t)plane_scale(PH, pb) * (sum_t)rsum[q][pb][r];
      sum_t a[3];
#pragma unroll
      for (int k = 0; k < 3; k++) a[k] = (sum_t)tile[r * TS_ALD + k * TS_U + u] + rconst[k] + roff[k] * sh;
      if (use32) {
        qg_cell32_out o;
        if (fast)
          qg_cell32_forward(&c32, u, pwx[rq][0], pwx[rq][1], pwx[rq][2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hp, &o, 1);
        else
          qg_cell32_forward(&c32, u, pwx[rq][0], pwx[rq][1], pwx[rq][2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hp, &o, 0);
        hnew = o.h;
        c.y[(t * N + n) * c.Hy + c.y_offset + i] = (float)((double)(o.h - QH.z) * ldexp(1.0, -QH.e));
        if (c.cell_out) {   /* narrow (A32 implies it): three aligned words */
          uint32_t w[3];
          qg_cell_narrow_words(&c.cell, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, w);
          uint32_t *d = (uint32_t *)(c.cell_out + ((s * N + n) * H + i) * 12);
          d[0] = w[0]; d[1] = w[1]; d[2] = w[2];
        }
      } else {
        qg_cell_in in = base_in;
        in.mask = 0;
#pragma unroll
        for (int k = 0; k < 3; k++) {
          const int64_t av = A32 ? (int64_t)(int32_t)a[k] : (int64_t)a[k];
          int m;
          in.rh[k] = qg_requant64(av, srh[k], QRH, &m);
          if (OBS) observe(c.range, c.counts, QG_Q_MATMUL_RH, ldexp((double)av, -srh[k]));
          in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
        }
        if (A32) {   /* a unit outside the 32-bit bounds: W x requantized here, as wx_gemm_kernel does */
#pragma unroll
          for (int k = 0; k < 3; k++) {
            int m;
            in.wx[k] = qg_requant64(pwx[rq][k], p.eW[k * H + i] + p.eX, c.cell.a[QG_Q_MATMUL_WX], &m);
            in.mask |= (uint32_t)m << (QG_MB_WX_Z + k);
          }
        } else {
          cell_wx(c, t * N + n, i, &in);
        }
        in.hprev = hp;
        hnew = run_cell<WIDE, OBS>(&c.cell, c, s, t, n, i, &in);
      }
    }
    hnext[n * H + i] = (int32_t)hnew;
    if (s == c.T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(hnew, QH);
    int8_t p0, p1;
    split_planes(hnew, p.baseH, PH, &p0, &p1);
    int8_t *hp_next = p.Hp + (int64_t)nxt * PH * Np * Kp + n * Kp + i;
    hp_next[0] = p0;
    if (PH == 2) hp_next[Np * Kp] = p1;
  }
}

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

/* ---- operands above 16 bits: one kernel per step in double ----
 * Block: FB_UNITS units x FB_NB rows, one thread per (unit, row): R h with the transposed centered
 * R in double (as the CPU's simulated GEMM: identical while the double sums are exact; the rows of
 * a unit read the same R entries, from L1) and the rows' centered h codes staged in shared memory
 * FB_KT at a time; then the (128-bit) cell. */
enum { FB_UNITS = 64, FB_NB = 4, FB_THREADS = FB_UNITS * FB_NB, FB_KT = 256 };

template <int OBS>
__global__ void __launch_bounds__(FB_THREADS) fallback_step_kernel(const __grid_constant__ rec_common c, const double *Rt, int64_t s) {
  __shared__ double hs[FB_NB][FB_KT];
  const int64_t H = c.H, H3 = 3 * H, N = c.N;
  const int r = threadIdx.x / FB_UNITS;
  const int64_t i = (int64_t)blockIdx.x * FB_UNITS + threadIdx.x % FB_UNITS, n = (int64_t)blockIdx.y * FB_NB + r;
  const qg_qp QH = c.cell.a[QG_Q_OUTPUT_H], QRH = c.cell.a[QG_Q_MATMUL_RH];
  const int32_t *hprev = h_at(c, s);
  int32_t *hnext = h_at(c, s + 1);
  const bool mine = i < H && n < N;
  double acc[3] = {0, 0, 0};
  for (int64_t k0 = 0; k0 < H; k0 += FB_KT) {
    for (int e = threadIdx.x; e < FB_NB * FB_KT; e += FB_THREADS) {
      const int rr = e / FB_KT, kk = e % FB_KT;
      const int64_t nn = (int64_t)blockIdx.y * FB_NB + rr, k = k0 + kk;
      hs[rr][kk] = (nn < N && k < H) ? (double)((int64_t)hprev[nn * H + k] - QH.z) : 0.0;
    }
    __syncthreads();
    if (mine) {
      const int kn = (int)(H - k0 < FB_KT ? H - k0 : FB_KT);
#pragma unroll 4
      for (int kk = 0; kk < kn; kk++) {
        const int64_t o = (k0 + kk) * H3 + i;
        const double hv = hs[r][kk];
        acc[0] += Rt[o] * hv;
        acc[1] += Rt[o + H] * hv;
        acc[2] += Rt[o + 2 * H] * hv;
      }
    }
    __syncthreads();
  }
  if (!mine) return;
  const int64_t Ln = length_at(c.L, n, c.T);
  const int64_t hp = hprev[n * H + i];
  int64_t hnew = hp;
  if (s >= Ln) {   /* padded step (t = s): the state stays, y = 0 */
    zero_cell(c, s, n, i);
    c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
  } else {
    const int64_t t = c.reverse ? Ln - 1 - s : s;
    qg_cell_in in;
    in.mask = 0;
    for (int k = 0; k < 3; k++) {
      const int sc = c.eR[k * H + i] + QH.e;
      int m;
      in.rh[k] = qg_requant_real(acc[k], sc, QRH, &m);
      if (OBS) observe(c.range, c.counts, QG_Q_MATMUL_RH, ldexp(acc[k], -sc));
      in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
    }
    cell_wx(c, t * N + n, i, &in);
    fill_bias(c, i, &in);
    in.hprev = hp;
    hnew = run_cell<1, OBS>(&c.cell, c, s, t, n, i, &in);
  }
  hnext[n * H + i] = (int32_t)hnew;
  if (s == c.T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(hnew, QH);
}

/* ---- persistent: one launch for all steps (see the header) ---- */
struct pk_params {
  rec_common c;
  int CS, U, NB, Kp, Mp, PR, PH, ksplit;
  int need_sh;                    /* some row of R has a zero-point term roff != 0: per-step row sums of h */
  int64_t baseH, c0H;             /* output.h planes */
  const int8_t *Rp;               /* [PR][3H][Kp] */
  const int64_t *rconst, *roff;   /* [3H] */
  /* the 32-bit mode (A32): the per-tensor part of the 32-bit cell (P, H and the tables set per
   * thread), W's exponents and input.x's (the general cell's requantization of W x), and the
   * flag a unit outside the 32-bit bounds sets (zeroed before the launch) */
  qg_cell32 c32;
  const int32_t *eW;
  int eX;
  int32_t *c32_flag;
  /* shared memory layout (bytes) */
  int64_t off_H, off_acc, off_part, off_slice, off_contrib, off_items, off_P, off_mb, off_lut, smem;
  int lut_smem;
};


/* Sum over the warp (every lane gets it). */
template <typename S>
__device__ __forceinline__ S warp_sum(S v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* A32: W x arrives as int32 accumulators (wx_gemm_kernel with acc_out) and every R h sum is
 * taken in uint32 arithmetic: the host checked that every accumulator is below 2^29 in
 * magnitude, so its value mod 2^32 (what wrap-around sums of the plane products, the zero-point
 * constants and the row sums give) is exact. Each thread computes its unit's rows of the 32-bit
 * cell (qg_cell32_unit, into registers) once, and runs qg_cell32_forward at every step; a unit
 * outside the 32-bit bounds (its bias terms) runs the general cell on the same accumulators and
 * raises c32_flag. Both give the same codes, so the choice is per unit. */
template <int WIDE, int OBS, int A32, int PSM>
__global__ void __launch_bounds__(A32 && !PSM ? 256 : 512, 1) persistent_kernel(const __grid_constant__ pk_params p) {
  typedef typename std::conditional<A32, uint32_t, int64_t>::type sum_t;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  const rec_common &c = p.c;
  const int rank = (int)cluster.block_rank();
  const int CS = p.CS, U = p.U, NB = p.NB, Kp = p.Kp, Mp = p.Mp, PR = p.PR, PH = p.PH;
  const int RS = Kp + 16, HS = Kp + 16;
  const int64_t H = c.H, H3 = 3 * H, N = c.N, T = c.T;
  const int64_t n0 = (int64_t)(blockIdx.x / CS) * NB, i0 = (int64_t)rank * U;
  const int Ureal = (int)(H - i0 < 0 ? 0 : (H - i0 < U ? H - i0 : U));
  int8_t *Rs = (int8_t *)smem;
  int8_t *Hs = (int8_t *)(smem + p.off_H);             /* [2][PH][NB][HS] */
  sum_t *accp = (sum_t *)(smem + p.off_acc);           /* [ksplit][NB][Mp + 4]: R h partial sums */
  sum_t *part = (sum_t *)(smem + p.off_part);          /* [2][CS][NB] row sums of h by source rank */
  int8_t *slice = (int8_t *)(smem + p.off_slice);      /* [PH][NB][U] this CTA's new h planes (need_sh) */
  int32_t *contrib = (int32_t *)(smem + p.off_contrib);   /* [NB][U] r - c0 of the new h (need_sh) */
  int4 *items = (int4 *)(smem + p.off_items);          /* the R h work items: m row, n row, k steps, k part */
  const int tid = threadIdx.x, nthr = blockDim.x;
  const int warp = tid >> 5, nwarps = nthr >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int64_t hbuf = (int64_t)PH * NB * HS;

  /* R's rows of this CTA's units (local row g U + u), zero rows and columns beyond */
  const int kv = Kp / 16;
  for (int e = tid; e < PR * Mp * kv; e += nthr) {
    const int pl = e / (Mp * kv), rem = e % (Mp * kv), lr = rem / kv, cv = rem % kv;
    int4 v = make_int4(0, 0, 0, 0);
    if (lr < 3 * U) {
      const int gt = lr / U, u = lr % U;
      if (u < Ureal) v = ((const int4 *)(p.Rp + ((int64_t)pl * H3 + gt * H + i0 + u) * Kp))[cv];
    }
    *(int4 *)(Rs + ((int64_t)pl * Mp + lr) * RS + cv * 16) = v;
  }
  /* activation tables */
  qg_cell_q q = c.cell;
  if (p.lut_smem) cell_luts_to_smem(&q, (int32_t *)(smem + p.off_lut), tid, nthr);
  for (int64_t e = tid; e < 2 * hbuf / 16; e += nthr) ((int4 *)Hs)[e] = make_int4(0, 0, 0, 0);
  for (int e = tid; e < 2 * CS * NB; e += nthr) part[e] = 0;
  /* CS > 1: hb[b] counts the bytes the cluster stores into h buffer b (and its row sums): each
   * phase is one step's exchange, armed by thread 0 with the bytes of all CS CTAs (below, before
   * the cluster barrier that precedes every push); hb[1] first takes h_1, hb[0] h_2 (h_0 is
   * written locally) */
  uint64_t *hb = (uint64_t *)(smem + p.off_mb);
  const uint32_t tx_bytes = (uint32_t)(CS * PH * NB * U + (p.need_sh ? CS * NB * (int)sizeof(sum_t) : 0));
  if (CS > 1 && tid == 0) {
    mb_init(&hb[0], 1);
    mb_init(&hb[1], 1);
    mb_init_fence_cluster();
  }
  const int Mt = Mp / 16, Nt = NB / 8, Ks = Kp / 32, nitems = Mt * Nt * p.ksplit, Mps = Mp + 4;
  for (int it = tid; it < nitems; it += nthr) {
    const int mt = it % Mt, rest = it / Mt, nt = rest % Nt, ks = rest / Nt;
    items[it] = make_int4(mt * 16, nt * 8, (ks * Ks / p.ksplit) | (((ks + 1) * Ks / p.ksplit) << 16), ks);
  }
  __syncthreads();
  /* h0 planes of every unit (buffer 0) and their row sums (as if all came from rank 0), a warp per row */
  const int32_t *hq0 = h_at(c, 0);
  for (int nl = warp; nl < NB; nl += nwarps) {
    const int64_t n = n0 + nl;
    if (n >= N) continue;
    sum_t sum = 0;
    for (int64_t k = lane; k < H; k += 32) {
      const int64_t code = hq0[n * H + k];
      int8_t p0, p1;
      split_planes(code, p.baseH, PH, &p0, &p1);
      Hs[(int64_t)nl * HS + k] = p0;
      if (PH == 2) Hs[(int64_t)(NB + nl) * HS + k] = p1;
      sum += (sum_t)(code - p.baseH - p.c0H);
    }
    sum = warp_sum(sum);
    if (lane == 0) part[nl] = sum;
  }
  /* this thread's cell: unit u of the slice, row nl of the tile */
  const int u = tid % U, nl = tid / U;
  const int64_t i = i0 + u, n = n0 + nl;
  const bool mine = tid < U * NB;   /* owns a slot of the slice (maybe a padding one) */
  const bool active = mine && u < Ureal && n < N;
  const qg_qp QH = q.a[QG_Q_OUTPUT_H], QRH = q.a[QG_Q_MATMUL_RH];
  qg_cell_in base_in;
  sum_t rconst[3] = {0, 0, 0}, roff[3] = {0, 0, 0};
  int srh[3] = {0, 0, 0};
  int64_t hprev = 0, Ln = 0;
  base_in.mask = 0;
  base_in.hprev = 0;
  for (int k = 0; k < 3; k++) base_in.wx[k] = base_in.rh[k] = base_in.bx[k] = base_in.br[k] = base_in.ebx[k] = base_in.ebr[k] = 0;
  if (active) {
    if (!A32) fill_bias(c, i, &base_in);
    for (int k = 0; k < 3; k++) {
      const int64_t j = k * H + i;
      rconst[k] = (sum_t)p.rconst[j];
      roff[k] = (sum_t)p.roff[j];
      srh[k] = c.eR[j] + QH.e;
    }
    hprev = hq0[n * H + i];
    Ln = length_at(c.L, n, T);
  }
  /* A32: the rows of the 32-bit cell of this CTA's units, computed by the threads of row 0 into
   * shared memory; then each thread's unit's rows in its registers for all steps (51 of them:
   * CTAs of at most 256 threads), or, with PSM, read from shared memory by the cells (CTAs of
   * up to 512 threads, at most 128 registers each) */
  int32_t *Ps = (int32_t *)(smem + p.off_P);   /* [QG_C32_ROWS][U] */
  int use32 = 1, fast_unit = 1;
  if (A32 && active && nl == 0) {
    use32 = cell32_unit_rows(Ps, U, u, &q, H, i, p.eW, c.eR, c.bxc, c.bxz, c.bxe, c.brc, c.brz, c.bre);
    if (!use32) *p.c32_flag = 1;
    fast_unit = use32 && qg_cell32_unit_fast(Ps, U, u);
  }
  /* one loop per CTA: the 32-bit one where every unit of the CTA is within the bounds */
  use32 = __syncthreads_and(use32);
  /* the cell without the requantizations' clamps where every unit allows it (qg_rs32) */
  const bool fast = A32 && __syncthreads_and(p.c32.fast && fast_unit);
  constexpr int NP = PSM ? 1 : QG_C32_ROWS;   /* the rows' copy in registers (none with PSM) */
  int32_t P[NP];
#pragma unroll
  for (int r = 0; r < NP; r++) P[r] = !PSM && A32 && use32 && active ? Ps[r * U + u] : 0;
  qg_cell32 c32 = p.c32;
  c32.P = PSM ? Ps : P;
  c32.H = PSM ? U : 1;
  const int64_t iP = PSM ? u : 0;   /* the unit's column of c32.P */
#pragma unroll
  for (int k = 0; k < 3; k++) c32.lut[k] = q.lut[k];
  const double yscale = ldexp(1.0, -QH.e);
  if (mine && p.need_sh) {   /* padding slots push zeros */
    for (int pl = 0; pl < PH; pl++) slice[((int64_t)pl * NB + nl) * U + u] = 0;
    contrib[tid] = 0;
  }
  /* need_sh: this thread's 4-byte word of the new slice (plane, row, word), pushed to every CTA */
  const int words = U / 4, has_word = tid < PH * NB * words;
  const int64_t word_src = has_word ? (int64_t)(tid / words) * U + 4 * (tid % words) : 0;
  const int64_t word_dst = has_word ? (int64_t)(tid / words) * HS + i0 + 4 * (tid % words) : 0;
  /* only the phases some step waits for (synccheck reports an armed phase left unwaited) */
  if (CS > 1 && tid == 0) {
    if (T > 1) mb_arrive_expect_tx(&hb[1], tx_bytes);
    if (T > 2) mb_arrive_expect_tx(&hb[0], tx_bytes);
  }
  cluster.sync();

  /* the steps; C32 (a compile-time bool): the 32-bit cell. The same exchange in either loop, so
   * CTAs of a cluster may run different ones. */
  auto steps = [&](auto c32_tag) {
  constexpr bool C32 = decltype(c32_tag)::value;
  for (int64_t s = 0; s < T; s++) {
    const int cur = (int)(s & 1), nxt = cur ^ 1;
    /* CS > 1: h_s (s >= 1) has arrived when hb[cur] completes the phase of that step: phase
     * (s - 1) / 2 of the barrier (h_1, h_3, ... on hb[1]; h_2, h_4, ... on hb[0]). Every thread
     * of the CTA has pushed h_s, so has read accp, part[nxt] and buffer nxt of step s - 1: the
     * wait orders this step's writes after those reads, as the block barrier it replaces did.
     * Then thread 0 arms the barrier's next phase (h_{s+2}, where a step waits for it) before
     * its own push of h_{s+1}, which every peer needs before it can push h_{s+2}. The block
     * barrier after it orders nothing more, but racecheck does not follow the order through the
     * pushes and reports the accp reads and writes of consecutive steps without it (two buffers
     * of accp by step parity instead were slower: medium 0.516-0.522 ms against 0.501-0.509) */
    if (CS > 1 && s > 0) {
      mb_wait(&hb[cur], (int)(((s - 1) >> 1) & 1));
      if (tid == 0 && s + 2 < T) mb_arrive_expect_tx(&hb[cur], tx_bytes);
      __syncthreads();
    }
    /* this step's W x codes (A32: accumulators), fetched before the products to hide their latency */
    const bool valid = active && s < Ln;
    const int64_t t = valid ? (c.reverse ? Ln - 1 - s : s) : 0;
    int32_t wxc[3] = {0, 0, 0};
    uint32_t wxm = 0;
    if (valid) {
      const int64_t row = (t * N + n) * H3;
      for (int k = 0; k < 3; k++) {
        wxc[k] = c.qwx[row + k * H + i];
        if (!A32) wxm |= (uint32_t)c.mwx[row + k * H + i] << (QG_MB_WX_Z + k);
      }
    }
    /* R h: items (m tile, n tile, k part) over the warps */
    const int8_t *Hc = Hs + cur * hbuf;
    for (int it = warp; it < nitems; it += nwarps) {
      const int4 d4 = items[it];
      const int m16 = d4.x, n8 = d4.y, kb = d4.z & 0xffff, ke = d4.z >> 16, ks = d4.w;
      sum_t a64[4] = {0, 0, 0, 0};
      for (int pa = 0; pa < PR; pa++)
        for (int pb = 0; pb < PH; pb++) {
          /* fragments by ldmatrix (the mma layouts, rh_k32's matrices), two k32 steps a round on two
           * accumulators (independent mma chains): A (rows 0-7 | 8-15) x (bytes 0-15 | 16-31) per
           * step, B rows 0-7 x bytes 0-15, 16-31, 32-47, 48-63 for both steps (the last round of an
           * odd count only its first two) */
          int32_t d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
          const uint32_t A = smem_addr(Rs) + (uint32_t)(((pa * Mp + m16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS) + (lane >> 4) * 16);
          const uint32_t B = smem_addr(Hc) + (uint32_t)((pb * NB + n8 + (lane & 7)) * HS + (lane >> 3) * 16);
          for (int kst = kb; kst < ke; kst += 2) {
            const uint32_t kk = (uint32_t)kst * 32;
            uint32_t a0[4], a1[4], bb[4];
            if (kst + 1 < ke) ldsm_x4(bb[0], bb[1], bb[2], bb[3], B + kk);
            else ldsm_x2(bb[0], bb[1], B + kk);
            ldsm_x4(a0[0], a0[1], a0[2], a0[3], A + kk);
            mma_s8(d[0], a0, bb);
            if (kst + 1 < ke) {
              ldsm_x4(a1[0], a1[1], a1[2], a1[3], A + kk + 32);
              mma_s8(d[1], a1, bb + 2);
            }
          }
          const sum_t sc = (sum_t)(plane_scale(PR, pa) * plane_scale(PH, pb));
          for (int e = 0; e < 4; e++) a64[e] += sc * (sum_t)(int32_t)((uint32_t)d[0][e] + (uint32_t)d[1][e]);   /* below 2^31: exact */
        }
      for (int e = 0; e < 4; e++) {
        const int row = m16 + g + (e >= 2 ? 8 : 0), col = n8 + 2 * tq + (e & 1);
        accp[((int64_t)ks * NB + col) * Mps + row] = a64[e];
      }
    }
    __syncthreads();
    /* the cells */
    int64_t hnew = hprev;
    if (active) {
      if (!valid) {   /* padded step (t = s): the state stays, y = 0 */
        zero_cell(c, s, n, i);
        c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
      } else {
        sum_t sh = 0;
        if (p.need_sh)
          for (int r = 0; r < CS; r++) sh += part[(cur * CS + r) * NB + nl];
        sum_t a[3];
        for (int k = 0; k < 3; k++) {
          const int lr = k * U + u;
          a[k] = rconst[k] + roff[k] * sh;
          for (int ks = 0; ks < p.ksplit; ks++) a[k] += accp[((int64_t)ks * NB + nl) * Mps + lr];
        }
        if (C32) {
          qg_cell32_out o;
          if (fast)
            qg_cell32_forward(&c32, iP, wxc[0], wxc[1], wxc[2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hprev, &o, 1);
          else
            qg_cell32_forward(&c32, iP, wxc[0], wxc[1], wxc[2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hprev, &o, 0);
          hnew = o.h;
          c.y[(t * N + n) * c.Hy + c.y_offset + i] = (float)((double)(o.h - QH.z) * yscale);
          if (c.cell_out) {   /* narrow (A32 implies it): three aligned words */
            uint32_t w[3];
            qg_cell_narrow_words(&q, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, w);
            uint32_t *d = (uint32_t *)(c.cell_out + ((s * N + n) * H + i) * 12);
            d[0] = w[0]; d[1] = w[1]; d[2] = w[2];
          }
        } else {
          qg_cell_in in;
          if (A32) {   /* a unit outside the 32-bit bounds: W x requantized here, as wx_gemm_kernel does */
            fill_bias(c, i, &in);
            in.mask = 0;
            for (int k = 0; k < 3; k++) {
              int m;
              in.wx[k] = qg_requant64(wxc[k], p.eW[k * H + i] + p.eX, q.a[QG_Q_MATMUL_WX], &m);
              in.mask |= (uint32_t)m << (QG_MB_WX_Z + k);
            }
          } else {
            in = base_in;
            in.mask = wxm;
            for (int k = 0; k < 3; k++) in.wx[k] = wxc[k];
          }
          for (int k = 0; k < 3; k++) {
            const int64_t av = A32 ? (int64_t)(int32_t)a[k] : (int64_t)a[k];
            int m;
            in.rh[k] = qg_requant64(av, srh[k], QRH, &m);
            if (OBS) observe(c.range, c.counts, QG_Q_MATMUL_RH, ldexp((double)av, -srh[k]));
            in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
          }
          in.hprev = hprev;
          hnew = run_cell<WIDE, OBS>(&q, c, s, t, n, i, &in);
        }
      }
      if (c.hq) c.hq[((s + 1) * N + n) * H + i] = (int32_t)hnew;
      else if (s == T - 1) h_at(c, T)[n * H + i] = (int32_t)hnew;
      if (s == T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(hnew, QH);
      hprev = hnew;
    }
    /* the new output.h planes to every CTA of the cluster (none after the last step): plain
     * shared stores when CS = 1 (the block barrier below orders them), else st.async into each
     * peer's buffer nxt, counted on its hb[nxt] */
    if (s + 1 < T) {
    const uint32_t mb_nxt = smem_addr(&hb[nxt]);
    if (p.need_sh) {   /* through the slice, with the row sums of r - c0 (warp reductions) */
      if (active) {
        int8_t p0, p1;
        split_planes(hnew, p.baseH, PH, &p0, &p1);
        slice[(int64_t)nl * U + u] = p0;
        if (PH == 2) slice[(int64_t)(NB + nl) * U + u] = p1;
        contrib[tid] = (int32_t)(hnew - p.baseH - p.c0H);
      }
      __syncthreads();
      if (has_word) {
        const uint32_t v = *(const uint32_t *)(slice + word_src);
        if (CS == 1) *(uint32_t *)(Hs + nxt * hbuf + word_dst) = v;
        else {
          const uint32_t d = smem_addr(Hs + nxt * hbuf + word_dst);
          for (int r = 0; r < CS; r++) st_async_b32(mapa_shared(d, r), v, mapa_shared(mb_nxt, r));
        }
      }
      for (int rl = warp; rl < NB; rl += nwarps) {
        sum_t sum = 0;
        for (int uu = lane; uu < U; uu += 32) sum += (sum_t)contrib[rl * U + uu];
        sum = warp_sum(sum);
        if (CS == 1) { if (lane == 0) part[nxt * NB + rl] = sum; }
        else {
          const uint32_t d = smem_addr(&part[(nxt * CS + rank) * NB + rl]);
          for (int r = lane; r < CS; r += 32) {
            if (sizeof(sum_t) == 4) st_async_b32(mapa_shared(d, r), (uint32_t)sum, mapa_shared(mb_nxt, r));
            else st_async_b64(mapa_shared(d, r), (uint64_t)sum, mapa_shared(mb_nxt, r));
          }
        }
      }
    } else {   /* straight from the cells: no row sums, no slice, no barrier before the push */
      int8_t p0 = 0, p1 = 0;
      if (active) split_planes(hnew, p.baseH, PH, &p0, &p1);
      int8_t *dst = Hs + nxt * hbuf + (int64_t)nl * HS + i0 + u;
      if (CS == 1) {
        if (mine) {
          dst[0] = p0;
          if (PH == 2) dst[(int64_t)NB * HS] = p1;
        }
      } else {   /* lanes 4a..4a+3 hold units 4a..4a+3 of one row (U % 4 == 0): one word, stores spread over them */
        const int sh8 = 8 * (tid & 3);
        uint32_t w0 = (uint32_t)(uint8_t)p0 << sh8, w1 = (uint32_t)(uint8_t)p1 << sh8;
        w0 |= __shfl_xor_sync(0xffffffffu, w0, 1);
        w0 |= __shfl_xor_sync(0xffffffffu, w0, 2);
        if (PH == 2) {
          w1 |= __shfl_xor_sync(0xffffffffu, w1, 1);
          w1 |= __shfl_xor_sync(0xffffffffu, w1, 2);
        }
        if (mine) {
          const uint32_t d0 = smem_addr(dst - (tid & 3));
          for (int r = tid & 3; r < CS; r += 4) {
            const uint32_t mb = mapa_shared(mb_nxt, r);
            st_async_b32(mapa_shared(d0, r), w0, mb);
            if (PH == 2) st_async_b32(mapa_shared(d0 + (uint32_t)(NB * HS), r), w1, mb);
          }
        }
      }
    }
    }
    if (CS == 1) __syncthreads();
  }
  /* no CTA leaves while a peer may still store into it */
  if (CS > 1) cluster.sync();
  };
  if (A32 && use32) steps(std::true_type());
  else steps(std::false_type());
}

/* hn = deq(output.h codes after T steps). */
__global__ void hn_kernel(const int32_t *h, int64_t NH, qg_qp QH, float *hn) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < NH) hn[i] = (float)qg_deq(h[i], QH);
}

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

/* One configuration of the persistent kernel. */
struct pk_plan {
  int CS, U, NB, Kp, Mp, ksplit, threads, lut_smem, psm;
  int64_t off_H, off_acc, off_part, off_slice, off_contrib, off_items, off_P, off_mb, off_lut, smem, clusters;
  double cost;
};

/* Sizes of configuration (CS, NB) for H units; 0 when it does not fit a block of max_threads. */
static int pk_layout(int CS, int NB, int64_t H, int PR, int PH, int64_t lut_bytes, int64_t smem_max, int max_threads, pk_plan *c) {
  const int64_t U = round_up((H + CS - 1) / CS, 4);
  if (U * NB > max_threads) return 0;
  c->CS = CS; c->NB = NB; c->U = (int)U; c->psm = 0;
  c->Kp = (int)round_up(CS * U, 32);
  c->Mp = (int)round_up(3 * U, 16);
  c->threads = (int)round_up(U * NB, 32);
  if (c->threads < 64) c->threads = 64;
  const int nwarps = c->threads / 32, Mt = c->Mp / 16, Nt = NB / 8, Ks = c->Kp / 32;
  int64_t best = -1;
  for (int ks = 1; ks <= Ks; ks++) {
    const int64_t rounds = ((int64_t)Mt * Nt * ks + nwarps - 1) / nwarps, per = (Ks + ks - 1) / ks, cost = rounds * per;
    if (best < 0 || cost < best) { best = cost; c->ksplit = ks; }
  }
  int64_t o = (int64_t)PR * c->Mp * (c->Kp + 16);
  c->off_H = round_up(o, 16); o = c->off_H + 2LL * PH * NB * (c->Kp + 16);
  c->off_acc = round_up(o, 16); o = c->off_acc + (int64_t)c->ksplit * (c->Mp + 4) * NB * 8;
  c->off_part = round_up(o, 16); o = c->off_part + 2LL * CS * NB * 8;
  c->off_slice = round_up(o, 16); o = c->off_slice + (int64_t)PH * NB * U;
  c->off_contrib = round_up(o, 16); o = c->off_contrib + (int64_t)NB * U * 4;
  c->off_items = round_up(o, 16); o = c->off_items + (int64_t)(c->Mp / 16) * (NB / 8) * c->ksplit * 16;
  c->off_P = round_up(o, 16); o = c->off_P + (int64_t)QG_C32_ROWS * U * 4;
  c->off_mb = round_up(o, 16); o = c->off_mb + 16;
  c->off_lut = round_up(o, 16);
  c->lut_smem = lut_bytes > 0 && lut_bytes <= 65536 && c->off_lut + lut_bytes <= smem_max;
  c->smem = c->lut_smem ? c->off_lut + lut_bytes : c->off_lut;
  return c->smem <= smem_max;
}

typedef void (*pk_kernel)(pk_params);

/* The kernel of a variant: 64- or 128-bit sums, observer, the 32-bit mode (whose per-unit rows
 * live in registers, CTAs of up to 256 threads, or with psm in shared memory, up to 512). */
static pk_kernel pk_kernel_of(int wide, int obs, int a32, int psm) {
  if (a32) {
    if (psm) return wide ? persistent_kernel<1, 0, 1, 1> : persistent_kernel<0, 0, 1, 1>;
    return wide ? persistent_kernel<1, 0, 1, 0> : persistent_kernel<0, 0, 1, 0>;
  }
  if (wide) return obs ? persistent_kernel<1, 1, 0, 0> : persistent_kernel<1, 0, 0, 0>;
  return obs ? persistent_kernel<0, 1, 0, 0> : persistent_kernel<0, 0, 0, 0>;
}

/* The launch configuration of plan c with `smem` bytes of dynamic shared memory (attr: storage for
 * its cluster dimension); the caller sets the stream. */
static cudaLaunchConfig_t pk_config(const pk_plan &c, int64_t smem, cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t cfg = {};
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = (unsigned)c.CS; attr->val.clusterDim.y = 1; attr->val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)(c.clusters * c.CS));
  cfg.blockDim = dim3((unsigned)c.threads);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/* The fastest configuration that launches, by a model of the per-step time (waves of clusters x
 * cells per CTA, then the smaller cluster); *found = 0 when none fits. The waves count the
 * clusters the device holds at once (cudaOccupancyMaxActiveClusters), not SMs / CS: an H200 holds
 * only 7 clusters of 16 CTAs, so 8 of them ran in two waves (medium, bench/cuda_int_gru.md session
 * 24). In the 32-bit mode a CTA of more than 256 cells reads its units' rows from shared memory
 * (psm), which lets it run 512 threads. */
static qg_status pk_choose_uncached(qg_ctx *ctx, const char *fn, int wide, int obs, int a32, int64_t N, int64_t H, int PR, int PH,
                                    int64_t lut_bytes, pk_plan *out, int *found) {
  *found = 0;
  int dev, sms, smem_max, smem_sm;
  QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  pk_plan cand[20];
  int nc = 0;
  const int nbs[4] = {8, 16, 32, 64}, css[5] = {1, 2, 4, 8, 16};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 5; b++) {
      pk_plan c;
      if (ctx->persist_cluster > 0 && (css[b] != ctx->persist_cluster || nbs[a] != 8 * ctx->persist_rows)) continue;   /* forced */
      if (!pk_layout(css[b], nbs[a], H, PR, PH, lut_bytes, smem_max, 512, &c)) continue;
      c.psm = a32 && c.U * c.NB > 256;
      c.clusters = (N + c.NB - 1) / c.NB;
      /* clusters resident at once, at the shared memory the launch asks for */
      const pk_kernel kern = pk_kernel_of(wide, obs, a32, c.psm);
      QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
      if (c.CS > 8) QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t cfg = pk_config(c, c.smem, &attr);
      int resident = 0;
      if (cudaOccupancyMaxActiveClusters(&resident, kern, &cfg) != cudaSuccess) { (void)cudaGetLastError(); resident = 0; }
      if (resident <= 0) continue;
      const int64_t waves = (c.clusters + resident - 1) / resident;
      /* 32-bit mode: the step time grows with the cells of a CTA and with the cluster (fitted on an
       * H100 over forced shapes: long-kws best at CS 4-8 x NB 8, seed-qat at CS 16 x NB 8) */
      if (a32) c.cost = (double)waves * (2.0 + (double)(c.U * c.NB) / 128.0) + 0.06 * c.CS + 0.001 * c.NB;
      else c.cost = (double)waves * (2.0 + (double)((c.U * c.NB + 255) / 256)) + 0.01 * c.CS + 0.001 * c.NB;
      cand[nc++] = c;
    }
  int bi = -1;
  for (int k = 0; k < nc; k++)
    if (bi < 0 || cand[k].cost < cand[bi].cost) bi = k;
  if (bi < 0) return QG_OK;
  pk_plan c = cand[bi];
  /* one CTA per multiprocessor where all of them fit at once: ask for more than half of a
   * multiprocessor's shared memory (two CTAs on one multiprocessor would slow their clusters) */
  const int64_t half = smem_sm / 2;
  if (c.clusters * c.CS <= sms && c.smem < half && half <= smem_max) {
    const pk_kernel kern = pk_kernel_of(wide, obs, a32, c.psm);
    int wide_active = 0;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = pk_config(c, half, &attr);
    QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)half));
    if (cudaOccupancyMaxActiveClusters(&wide_active, kern, &cfg) != cudaSuccess) { (void)cudaGetLastError(); wide_active = 0; }
    if (wide_active >= c.clusters) c.smem = half;
  }
  *out = c;
  *found = 1;
  return QG_OK;
}

/* pk_choose_uncached memoized per device, variant, shape and forced settings (its occupancy
 * queries would otherwise cost every forward tens of microseconds of host time). The caller sets
 * the kernel's shared-memory attribute to the plan's before each launch. */
static qg_status pk_choose(qg_ctx *ctx, const char *fn, int wide, int obs, int a32, int64_t N, int64_t H, int PR, int PH,
                           int64_t lut_bytes, pk_plan *out, int *found) {
  enum { MEMO = 32 };
  struct memo_entry { int64_t key[12]; int found; pk_plan plan; };
  static memo_entry memo[MEMO];
  static int nmemo = 0, next = 0;
  static std::mutex lock;
  int dev;
  QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
  const int64_t key[12] = {dev, wide, obs, a32, N, H, PR, PH, lut_bytes, ctx->persist_cluster, ctx->persist_rows, ctx->persist_splits};
  {
    std::lock_guard<std::mutex> g(lock);
    for (int k = 0; k < nmemo; k++)
      if (memcmp(memo[k].key, key, sizeof key) == 0) {
        *found = memo[k].found;
        if (*found) *out = memo[k].plan;
        return QG_OK;
      }
  }
  QG_CHECK(pk_choose_uncached(ctx, fn, wide, obs, a32, N, H, PR, PH, lut_bytes, out, found));
  std::lock_guard<std::mutex> g(lock);
  const int slot = nmemo < MEMO ? nmemo++ : (next++ % MEMO);
  memcpy(memo[slot].key, key, sizeof key);
  memo[slot].found = *found;
  if (*found) memo[slot].plan = *out;
  return QG_OK;
}

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
