/*
 * int_gru_cpu.c: the CPU backend of the integer GRU layer (int_gru.c validated the arguments).
 *
 * Two forwards, picked once per call, bit-exact with each other and with tests/lua/qref.lua:
 *   the 32-bit forward (no observer; every operator of at most 16 bits and the bounds of
 *     int_gru_cell.h's qg_cell32_setup / qg_cell32_unit, e.g. every 8-bit config): per thread
 *     (a block of batch rows for the whole recurrence, no synchronisation per step) x is
 *     quantized and W x multiplied for all steps, then per step R h and one pass of the 32-bit
 *     cell over each row's units, vectorized (16 units per AVX-512 vector), which also
 *     requantizes the W x and R h accumulators. The GEMMs of codes are exact: on bytes with
 *     AVX-512 VNNI where the CPU has it and x, h have at most 8 bits and the centered weight codes
 *     fit a signed byte (gemm_u8s8), else float32 (exact below 2^24). Training packs the saved
 *     state as 32-bit words (qg_cell_narrow_words, the layout of qg_cell_pack).
 *   the general forward (the statistics observer, wider operators): one GEMM of centered codes for
 *     W x over all steps (fp32 or fp64, exact; simulated in fp64 above 16 bits), requantized to
 *     matmul.Wx; per step R h requantized to matmul.Rh, then qg_cell_forward on 64 or 128 bits.
 * Backward (STE, float32): where the saved state is narrow and the tables exist, one parallel
 *   region: per thread its rows' recurrence (the STE cell vectorized over units, then dh += dq R~
 *   with R~ packed once, cpu_gemm.h), bias sums per row in double; after a barrier the weight
 *   gradients as QG_BWD_TASKS tasks of a fixed split (dx, dW, dR with x~ and h~ packed straight
 *   from the saved codes; the bias columns summed over rows in row order). Elsewhere the general
 *   backward (scalar cell, bias sums over (step, row) in a fixed order).
 * Variable lengths: step s is valid for row n iff s < lengths[n], at time t = reverse ?
 *   lengths[n] - 1 - s : s; invalid steps keep the state, write y = 0 and pass dh through.
 * Threads: rows are split over the threads (OpenMP, as many as OpenBLAS is set to use), each
 *   calling single-threaded BLAS. A row's results do not depend on the split and every sum
 *   across rows runs in one fixed order, so results are identical for any thread count
 *   (int_gru_paths_spec). The statistics observer runs on one thread.
 * Floating-point contraction is off for this file (CMakeLists.txt), so the STE math rounds the
 *   same in every target clone and as in the CUDA kernels.
 */
#include "backend.h"
#include "cpu_gemm.h"
#include "cpu_threads.h"
#include "int_gru.h"
#include "stats.h"

#include <cblas.h>
#include <string.h>


/* Loops compiled for x86-64-v3 and v4 too, picked at load time (GCC on x86-64 Linux). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define QG_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define QG_CLONES
#endif
#if defined(__GNUC__)
#define QG_INLINE static inline __attribute__((always_inline))
#define QG_FLATTEN __attribute__((flatten))
#else
#define QG_INLINE static inline
#define QG_FLATTEN
#endif

/* One channel of a weight: codes, fake-quantized values and masks of n values, element for
 * element qg_quant_real and qg_deq (x 2^e and (q - z) 2^-e are exact in double). */
QG_CLONES static void quantize_channel(const float *restrict x, int64_t n, qg_qp q, int32_t *restrict codes, float *restrict fq,
                                       uint8_t *restrict mask) {
  const double sc = ldexp(1.0, q.e), isc = ldexp(1.0, -q.e), lo = (double)q.qmin, hi = (double)q.qmax, z = (double)q.z;
  for (int64_t i = 0; i < n; i++) {
    const double r = nearbyint((double)x[i] * sc) + z;
    const int m = (r >= lo) & (r <= hi);
    double c = r < lo ? lo : (r > hi ? hi : r);
    c = c == c ? c : z;   /* NaN: the code of zero */
    codes[i] = (int32_t)(int64_t)c;
    fq[i] = (float)((c - z) * isc);
    mask[i] = (uint8_t)m;
  }
}

/* (float)deq of n codes: (float)((double)(c - z) 2^-e), as qg_deq. */
QG_CLONES static void deq_codes(const int32_t *restrict c, int64_t n, qg_qp q, float *restrict out) {
  const double sc = ldexp(1.0, -q.e);
  const int32_t z = q.z;
  for (int64_t i = 0; i < n; i++) out[i] = (float)((double)((int64_t)c[i] - z) * sc);
}

qg_status qg_cpu_int_gru_quantize_weights(qg_ctx *ctx, qg_int_gru *g, const qg_tensor *W, const qg_tensor *R,
                                          const qg_tensor *bx, const qg_tensor *br) {
  (void)ctx;
  const qg_tensor *src[QG_W_NUM] = {W, R, bx, br};
  const int64_t H3 = 3 * g->H;
  for (int w = 0; w < QG_W_NUM; w++) {
    const int64_t cols = qg_int_gru_weight_cols(g, w);
    const float *xp = (const float *)src[w]->data;
    for (int64_t j = 0; j < H3; j++) {
      const qg_qp q = qg_qp_make(g->w_bits[w], g->w_unsigned[w], g->w_exp[w][j], g->w_zp[w][j]);
      quantize_channel(xp + j * cols, cols, q, g->codes[w] + j * cols, g->fq[w] + j * cols, g->mask[w] + j * cols);
    }
  }
  return QG_OK;
}

/* Largest |q - z| of a grid over every zero point in zps (n of them; one z1 when zps is NULL). */
static int64_t max_centered(int bits, int uns, const int32_t *zps, int64_t n, int32_t z1) {
  const qg_qp g = qg_qp_make(bits, uns, 0, 0);
  int64_t m = 0;
  for (int64_t i = 0; i < (zps ? n : 1); i++) {
    const int64_t z = zps ? zps[i] : z1;
    const int64_t a = g.qmax - z > z - g.qmin ? g.qmax - z : z - g.qmin;
    if (a > m) m = a;
  }
  return m;
}

/* Whether a GEMM of centered codes is exact in float32: every partial sum is an integer below
 * 2^24 when max|a| max|b| K < 2^24, whatever the summation order. */
static int exact_in_f32(int64_t amax, int64_t bmax, int64_t K) {
  return amax > 0 && bmax > 0 && (double)amax * (double)bmax * (double)K < 16777216.0;
}

/* How one GEMM of centered codes runs: exact integers (in f32 or f64) or simulated in f64. */
typedef struct {
  int exact, use_f32;
} gemm_mode;

static gemm_mode gemm_mode_of(int in_bits, int in_unsigned, int32_t in_z, int w_bits, int w_unsigned, const int32_t *w_zp,
                              int64_t rows, int64_t K) {
  gemm_mode m;
  m.exact = in_bits <= 16 && w_bits <= 16;
  m.use_f32 = m.exact && exact_in_f32(max_centered(in_bits, in_unsigned, NULL, 1, in_z), max_centered(w_bits, w_unsigned, w_zp, rows, 0), K);
  return m;
}

/* acc [M, 3H] = A [M, K] B [3H, K]^T over centered codes, in fp32 (Af, Bf) or fp64 (Ad, Bd). */
static void gemm_codes(int64_t M, int64_t H3, int64_t K, gemm_mode gm, const float *Af, const float *Bf, float *accf,
                       const double *Ad, const double *Bd, double *acc) {
  if (M > 0 && H3 > 0 && K > 0 && gm.use_f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)H3, (int)K, 1.0f, Af, (int)K, Bf, (int)K, 0.0f, accf, (int)H3);
    for (int64_t i = 0; i < M * H3; i++) acc[i] = (double)accf[i];
  } else if (M > 0 && H3 > 0 && K > 0) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)H3, (int)K, 1.0, Ad, (int)K, Bd, (int)K, 0.0, acc, (int)H3);
  } else {
    memset(acc, 0, (size_t)(M * H3) * sizeof(double));
  }
}

/* Row i of acc [., 3H] requantized to q from the scale 2^-(wexp[j] + e_in) of column j: codes and
 * masks; the real values go to the statistics row (range, counts) when observing. */
static inline void requant_row(int64_t H3, const double *acc, gemm_mode gm, const int32_t *wexp, int e_in, qg_qp q,
                               int64_t *codes, uint8_t *masks, const int observe, double *range, int64_t *counts) {
  for (int64_t j = 0; j < H3; j++) {
    const int s = wexp[j] + e_in;
    const double a = acc[j];
    int m;
    codes[j] = gm.exact ? qg_requant64((int64_t)a, s, q, &m) : qg_requant_real(a, s, q, &m);   /* |a| < 2^53 */
    masks[j] = (uint8_t)m;
    if (observe) qg_stats_observe(range, counts, ldexp(a, -s));
  }
}

/* The statistics rows of operator op (NULL pointers when not observing). */
typedef struct {
  double *range;
  int64_t *counts;
} stat_rows;

static inline void observe_op(stat_rows st, int op, double v) {
  qg_stats_observe(st.range + 4 * op, st.counts + (int64_t)QG_STATS_BINS * op, v);
}

static inline int64_t length_of(const int64_t *L, int64_t n, int64_t T) { return L ? L[n] : T; }

/* The vectorized paths run their recurrences in chunks of QG_ROW_CHUNK batch rows, handed to the
 * threads dynamically: a thread the system delays (a shared machine) holds the others up by one
 * chunk at most. The chunks do not depend on the thread count. */
enum { QG_ROW_CHUNK = 16 };
static inline int64_t row_chunks(int64_t N) { return (N + QG_ROW_CHUNK - 1) / QG_ROW_CHUNK; }
static inline int64_t chunk_end(int64_t N, int64_t ch) { return (ch + 1) * QG_ROW_CHUNK < N ? (ch + 1) * QG_ROW_CHUNK : N; }

/* Per-channel bias terms of unit i (centered codes and exponents), gate rows z, r, g. */
static inline void bias_terms(const qg_int_gru *g, const int32_t *bxc, const int32_t *brc, int64_t i, qg_cell_in *in) {
  const int64_t H = g->H;
  for (int k = 0; k < 3; k++) {
    const int64_t j = k * H + i;
    in->bx[k] = (int64_t)bxc[j] - g->w_zp[QG_W_BX][j];
    in->br[k] = (int64_t)brc[j] - g->w_zp[QG_W_BR][j];
    in->ebx[k] = g->w_exp[QG_W_BX][j];
    in->ebr[k] = g->w_exp[QG_W_BR][j];
  }
}

/* The time loop of the forward; observe is a literal at each call so the compiler specializes it. */
static inline void forward_steps(const qg_int_gru *g, int64_t T, int64_t N, int64_t n0, int64_t n1, const int64_t *L,
                                 int reverse, gemm_mode grh,
                                 const int64_t *qWx, const uint8_t *mWx, int32_t *hqp, float *yp, int64_t Hy, int y_offset,
                                 uint8_t *cellp, int cell_bytes, float *Hf, const float *Rf, float *accRhf, double *Hc,
                                 const double *Rc, double *accRh, int64_t *qRh, uint8_t *mRh, const int wide, const int observe,
                                 stat_rows st) {
  const int64_t H = g->H, H3 = 3 * H;
  const qg_cell_q *cq = &g->cell;
  const qg_qp QH = cq->a[QG_Q_OUTPUT_H], QRH = cq->a[QG_Q_MATMUL_RH];
  const double scale_h = ldexp(1.0, -QH.e);
  const int32_t *bxc = g->codes[QG_W_BX], *brc = g->codes[QG_W_BR];
  for (int64_t s = 0; s < T; s++) {
    const int32_t *hprev = hqp + s * N * H;
    int32_t *hnext = hqp + (s + 1) * N * H;
    if (grh.use_f32) for (int64_t i = n0 * H; i < n1 * H; i++) Hf[i] = (float)((int64_t)hprev[i] - QH.z);
    else for (int64_t i = n0 * H; i < n1 * H; i++) Hc[i] = (double)((int64_t)hprev[i] - QH.z);
    gemm_codes(n1 - n0, H3, H, grh, Hf + n0 * H, Rf, accRhf + n0 * H3, Hc + n0 * H, Rc, accRh + n0 * H3);
    for (int64_t n = n0; n < n1; n++) {
      const int64_t Ln = length_of(L, n, T);
      if (s >= Ln) {   /* padded step: the state stays */
        memcpy(hnext + n * H, hprev + n * H, (size_t)H * sizeof(int32_t));
        if (cellp) memset(cellp + (s * N + n) * H * cell_bytes, 0, (size_t)(H * cell_bytes));
        continue;
      }
      const int64_t t = reverse ? Ln - 1 - s : s;
      requant_row(H3, accRh + n * H3, grh, g->w_exp[QG_W_R], QH.e, QRH, qRh + n * H3, mRh + n * H3, observe,
                  observe ? st.range + 4 * QG_Q_MATMUL_RH : NULL, observe ? st.counts + (int64_t)QG_STATS_BINS * QG_Q_MATMUL_RH : NULL);
      const int64_t *wx = qWx + (t * N + n) * H3, *rh = qRh + n * H3;
      const uint8_t *mwx = mWx + (t * N + n) * H3, *mrh = mRh + n * H3;
      float *yrow = yp + (t * N + n) * Hy + y_offset;
      for (int64_t i = 0; i < H; i++) {
        qg_cell_in in;
        qg_cell_out out;
        qg_cell_reals re = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        in.mask = 0;
        for (int k = 0; k < 3; k++) {
          in.wx[k] = wx[k * H + i];
          in.rh[k] = rh[k * H + i];
          in.mask |= (uint32_t)mwx[k * H + i] << (QG_MB_WX_Z + k) | (uint32_t)mrh[k * H + i] << (QG_MB_RH_Z + k);
        }
        bias_terms(g, bxc, brc, i, &in);
        in.hprev = hprev[n * H + i];
        qg_cell_forward(cq, &in, &out, wide, observe, &re);
        if (observe) {
          observe_op(st, QG_Q_Z_PRE, re.zpre); observe_op(st, QG_Q_R_PRE, re.rpre);
          observe_op(st, QG_Q_Z_OUT, re.zout); observe_op(st, QG_Q_R_OUT, re.rout);
          observe_op(st, QG_Q_MATMUL_RH, re.rhb); observe_op(st, QG_Q_RRH, re.rrh);
          observe_op(st, QG_Q_G_PRE, re.gpre); observe_op(st, QG_Q_G_OUT, re.gout);
          observe_op(st, QG_Q_OLD, re.old); observe_op(st, QG_Q_NEW, re.nw); observe_op(st, QG_Q_OUTPUT_H, re.h);
        }
        hnext[n * H + i] = (int32_t)out.h;
        yrow[i] = (float)((double)(out.h - QH.z) * scale_h);
        if (cellp) qg_cell_pack(cellp + ((s * N + n) * H + i) * cell_bytes, cq, &out);
      }
    }
  }
}

/* ---- the 32-bit forward ---------------------------------------------------------------------
 * For layers within the 32-bit cell's bounds (qg_cell32_setup, qg_cell32_unit) and no observer:
 * the W x accumulators stay float32 (exact integers) and are requantized inside the cell, per
 * step the R h GEMM of a thread's rows and one vectorized pass over each row's units. */


/* quant of n values of x to q: codes, masks and the centered codes as floats (GEMM operand).
 * x 2^e is exact in double, so this is qg_quant_real element for element. */
QG_CLONES static void quantize_codes(const float *x, int64_t n, qg_qp q, int32_t *restrict codes, uint8_t *restrict mask,
                                     float *restrict xc) {
  const double sc = ldexp(1.0, q.e), lo = (double)q.qmin, hi = (double)q.qmax, z = (double)q.z;
  for (int64_t i = 0; i < n; i++) {
    const double r = nearbyint((double)x[i] * sc) + z;
    const int m = (r >= lo) & (r <= hi);
    double c = r < lo ? lo : (r > hi ? hi : r);
    c = c == c ? c : z;   /* NaN: the code of zero */
    codes[i] = (int32_t)c;
    mask[i] = (uint8_t)m;
    if (xc) xc[i] = (float)(c - z);
  }
}

/* ---- int8 GEMMs (AVX-512 VNNI) ---------------------------------------------------------------
 * Where the CPU has AVX-512 VNNI and the operands fit bytes (input.x and output.h of at most 8
 * bits, the centered weight codes in [-128, 127]), the W x and R h products of the 32-bit forward
 * run on bytes: A holds codes minus the grid's qmin (unsigned bytes), B the centered weight codes
 * (signed bytes), vpdpbusd sums 4 products per 32-bit lane, and corr[j] = (z - qmin) sum_k B[j, k]
 * recenters A: acc = sum_k (a + qmin - z) B = vnni - corr. Exact integers, as the float32 GEMM they
 * replace (same values, 4 times the multiply-adds per instruction). B is packed once per forward
 * into panels of 16 columns x 4 k: Bp[((p Kq + q) 16 + c) 4 + b] = B[16 p + c][4 q + b]. */
typedef struct {
  int8_t *packed;    /* [P, Kq, 16, 4] */
  int32_t *corr;     /* [P * 16] */
  int64_t Nc, Kq;    /* columns (3H), k quads */
} s8mat;

static int64_t s8_bytes(int64_t Nc, int64_t K) { return (Nc + 15) / 16 * 16 * ((K + 3) / 4) * 4; }

/* Packs B = codes [Nc, K] minus their per-row zero points zp; corr as above for an A offset of
 * zoff = z - qmin. */
static void pack_s8(s8mat *b, const int32_t *codes, const int32_t *zp, int64_t Nc, int64_t K, int32_t zoff) {
  const int64_t Kq = (K + 3) / 4, P = (Nc + 15) / 16;
  b->Nc = Nc; b->Kq = Kq;
  for (int64_t p = 0; p < P; p++)
    for (int64_t c = 0; c < 16; c++) {
      const int64_t j = p * 16 + c;
      int32_t sum = 0;
      for (int64_t k = 0; k < Kq * 4; k++) {
        const int32_t v = j < Nc && k < K ? codes[j * K + k] - zp[j] : 0;
        b->packed[((p * Kq + k / 4) * 16 + c) * 4 + k % 4] = (int8_t)v;
        sum += v;
      }
      b->corr[j] = zoff * sum;
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define QG_HAVE_VNNI_KERNEL 1

/* C [M, Nc] (ldc) = A [M, 4 Kq] (lda bytes, unsigned) B^T - corr, B packed. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void gemm_u8s8(int64_t M, const uint8_t *A, int64_t lda,
                                                                               const s8mat *b, int32_t *Cm, int64_t ldc) {
  const int64_t Nc = b->Nc, Kq = b->Kq, P = (Nc + 15) / 16;
  for (int64_t p0 = 0; p0 < P; p0 += 4) {
    const int64_t np = P - p0 < 4 ? P - p0 : 4;
    __mmask16 mk[4];
    __m512i corr[4];
    for (int64_t q = 0; q < 4; q++) {
      const int64_t rem = Nc - (p0 + q) * 16;
      mk[q] = q >= np ? 0 : (rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1));
      corr[q] = q < np ? _mm512_loadu_si512((const void *)(b->corr + (p0 + q) * 16)) : _mm512_setzero_si512();
    }
    const int8_t *B0 = b->packed + p0 * Kq * 64;
    int64_t m = 0;
    if (np == 4) {
      for (; m + 4 <= M; m += 4) {
        __m512i c[4][4];
        for (int r = 0; r < 4; r++)
          for (int q = 0; q < 4; q++) c[r][q] = _mm512_setzero_si512();
        for (int64_t k = 0; k < Kq; k++) {
          const __m512i b0 = _mm512_loadu_si512((const void *)(B0 + k * 64)), b1 = _mm512_loadu_si512((const void *)(B0 + (Kq + k) * 64)),
                        b2 = _mm512_loadu_si512((const void *)(B0 + (2 * Kq + k) * 64)),
                        b3 = _mm512_loadu_si512((const void *)(B0 + (3 * Kq + k) * 64));
          for (int r = 0; r < 4; r++) {
            int32_t a4;
            memcpy(&a4, A + (m + r) * lda + 4 * k, 4);
            const __m512i av = _mm512_set1_epi32(a4);
            c[r][0] = _mm512_dpbusd_epi32(c[r][0], av, b0);
            c[r][1] = _mm512_dpbusd_epi32(c[r][1], av, b1);
            c[r][2] = _mm512_dpbusd_epi32(c[r][2], av, b2);
            c[r][3] = _mm512_dpbusd_epi32(c[r][3], av, b3);
          }
        }
        for (int r = 0; r < 4; r++)
          for (int q = 0; q < 4; q++)
            _mm512_mask_storeu_epi32(Cm + (m + r) * ldc + (p0 + q) * 16, mk[q], _mm512_sub_epi32(c[r][q], corr[q]));
      }
    }
    for (; m < M; m++) {   /* remaining rows, or fewer than 64 remaining columns */
      __m512i c[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int64_t k = 0; k < Kq; k++) {
        int32_t a4;
        memcpy(&a4, A + m * lda + 4 * k, 4);
        const __m512i av = _mm512_set1_epi32(a4);
        for (int64_t q = 0; q < np; q++) c[q] = _mm512_dpbusd_epi32(c[q], av, _mm512_loadu_si512((const void *)(B0 + (q * Kq + k) * 64)));
      }
      for (int64_t q = 0; q < np; q++) _mm512_mask_storeu_epi32(Cm + m * ldc + (p0 + q) * 16, mk[q], _mm512_sub_epi32(c[q], corr[q]));
    }
  }
}

static int cpu_has_vnni(void) {
  static int cached = -1;
  if (cached < 0) {
    __builtin_cpu_init();
    cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  }
  return cached;
}
#else
static int cpu_has_vnni(void) { return 0; }
#endif

/* Whether a grid's codes minus qmin fit an unsigned byte, and a weight's centered codes (every
 * channel) a signed one. */
static int grid_u8(qg_qp q) { return q.qmax - q.qmin <= 255; }
static int weight_s8(const qg_int_gru *g, int w) {
  const qg_qp grid = qg_qp_make(g->w_bits[w], g->w_unsigned[w], 0, 0);
  for (int64_t j = 0; j < 3 * g->H; j++) {
    const int64_t z = g->w_zp_host[w][j];
    if (grid.qmin - z < -128 || grid.qmax - z > 127) return 0;
  }
  return 1;
}

/* Everything the 32-bit forward's threads share. */
typedef struct {
  const qg_int_gru *g;
  const qg_cell32 *c;
  int64_t T, N, C, H, Hy, ring;
  int y_offset, reverse, nt, vnni, cb;
  const int64_t *L;
  const float *x;
  int32_t *xq, *hq;            /* hq(s) = hq + (s % ring) N H */
  uint8_t *xmask, *cells;
  float *y;
  /* float32 GEMMs: centered codes Xf [TN, C], Wf [3H, C], Rf [3H, H], Hf [N, H]; accumulators */
  float *Xf, *Wf, *Rf, *Hf, *accWxf, *accRhf;
  /* byte GEMMs: A operands xu [TN, 4 Kq(C)], hu [N, 4 Kq(H)]; packed W, R; accumulators */
  uint8_t *xu, *hu;
  s8mat Wb, Rb;
  int32_t *accWxi, *accRhi;
} fwd32_args;

/* quant of n values of x to q, as quantize_codes, with the codes minus qmin as bytes. */
QG_CLONES static void quantize_codes_u8(const float *x, int64_t n, qg_qp q, int32_t *restrict codes, uint8_t *restrict mask,
                                        uint8_t *restrict xu) {
  const double sc = ldexp(1.0, q.e), lo = (double)q.qmin, hi = (double)q.qmax, z = (double)q.z;
  for (int64_t i = 0; i < n; i++) {
    const double r = nearbyint((double)x[i] * sc) + z;
    const int m = (r >= lo) & (r <= hi);
    double c = r < lo ? lo : (r > hi ? hi : r);
    c = c == c ? c : z;
    codes[i] = (int32_t)c;
    mask[i] = (uint8_t)m;
    xu[i] = (uint8_t)(c - lo);
  }
}

/* One row of the 32-bit cell over accumulators given as float32 or int32 (isint); fast: the
 * layer's every requantization has k >= 0 (cell32_prepare), so the cell's rounding shifts skip
 * their clamps (qg_rs32). */
QG_INLINE void cell32_row_any(const qg_cell32 *c, const qg_cell_q *q, const void *aw, const void *ar, const int32_t *restrict hprev,
                              int32_t *restrict hnext, float *restrict y, float yscale, uint32_t *restrict rec, const int train,
                              const int isint, const int fast) {
  const int64_t H = c->H;
  const float *restrict awf = (const float *)aw, *restrict arf = (const float *)ar;
  const int32_t *restrict awi = (const int32_t *)aw, *restrict ari = (const int32_t *)ar;
  QG_PRAGMA(omp simd)
  for (int64_t i = 0; i < H; i++) {
#define QG_ACC(fp, ip, j) (isint ? (ip)[j] : (int32_t)(fp)[j])
    qg_cell32_out o;
    qg_cell32_forward(c, i, QG_ACC(awf, awi, i), QG_ACC(awf, awi, H + i), QG_ACC(awf, awi, 2 * H + i), QG_ACC(arf, ari, i),
                      QG_ACC(arf, ari, H + i), QG_ACC(arf, ari, 2 * H + i), hprev[i], &o, fast);
#undef QG_ACC
    hnext[i] = o.h;
    y[i] = (float)(o.h - c->h.z) * yscale;
    if (train) qg_cell_narrow_words(q, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, rec + 3 * i);
  }
}

/* The variants as separate loops (each argument after yscale a literal). */
QG_INLINE void cell32_row_variant(const qg_cell32 *c, const qg_cell_q *q, const void *aw, const void *ar, const int32_t *hprev,
                                  int32_t *hnext, float *y, float yscale, uint32_t *rec, int isint, const int fast) {
  if (isint) {
    if (rec) cell32_row_any(c, q, aw, ar, hprev, hnext, y, yscale, rec, 1, 1, fast);
    else cell32_row_any(c, q, aw, ar, hprev, hnext, y, yscale, NULL, 0, 1, fast);
  } else {
    if (rec) cell32_row_any(c, q, aw, ar, hprev, hnext, y, yscale, rec, 1, 0, fast);
    else cell32_row_any(c, q, aw, ar, hprev, hnext, y, yscale, NULL, 0, 0, fast);
  }
}

QG_CLONES QG_FLATTEN static void cell32_row(const qg_cell32 *c, const qg_cell_q *q, const void *aw, const void *ar, const int32_t *hprev,
                                 int32_t *hnext, float *y, float yscale, uint32_t *rec, int isint) {
  if (c->fast) cell32_row_variant(c, q, aw, ar, hprev, hnext, y, yscale, rec, isint, 1);
  else cell32_row_variant(c, q, aw, ar, hprev, hnext, y, yscale, rec, isint, 0);
}

/* The time loop of the 32-bit forward for rows [n0, n1): first x's codes and the W x
 * accumulators of these rows at every time step, then per step the R h GEMM and the cells. */
static void forward32_rows(const fwd32_args *a, int64_t n0, int64_t n1) {
  const qg_int_gru *g = a->g;
  const qg_cell32 *c = a->c;
  const int64_t T = a->T, N = a->N, C = a->C, H = a->H, H3 = 3 * H, nb = n1 - n0, ring = a->ring;
  const qg_cell_q *cq = &g->cell;
  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H];
  const float yscale = (float)ldexp(1.0, -QH.e);
  if (nb <= 0) return;
  const int64_t Cp = a->Wb.Kq * 4, Hp = a->Rb.Kq * 4;
  for (int64_t t = 0; t < T; t++) {
    const int64_t r0 = t * N + n0;
    if (a->vnni) {
      if (Cp == C) {
        quantize_codes_u8(a->x + r0 * C, nb * C, QX, a->xq + r0 * C, a->xmask + r0 * C, a->xu + r0 * Cp);
      } else {
        for (int64_t r = r0; r < r0 + nb; r++) {
          quantize_codes_u8(a->x + r * C, C, QX, a->xq + r * C, a->xmask + r * C, a->xu + r * Cp);
          memset(a->xu + r * Cp + C, 0, (size_t)(Cp - C));
        }
      }
#ifdef QG_HAVE_VNNI_KERNEL
      gemm_u8s8(nb, a->xu + r0 * Cp, Cp, &a->Wb, a->accWxi + r0 * H3, H3);
#endif
    } else {
      quantize_codes(a->x + r0 * C, nb * C, QX, a->xq + r0 * C, a->xmask + r0 * C, a->Xf + r0 * C);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)H3, (int)C, 1.0f, a->Xf + r0 * C, (int)C, a->Wf, (int)C, 0.0f,
                  a->accWxf + r0 * H3, (int)H3);
    }
  }
  for (int64_t s = 0; s < T; s++) {
    const int32_t *hprev = a->hq + (s % ring) * N * H;
    int32_t *hnext = a->hq + ((s + 1) % ring) * N * H;
    if (a->vnni) {
      const int32_t lo = (int32_t)QH.qmin;
      for (int64_t n = n0; n < n1; n++)
        for (int64_t i = 0; i < H; i++) a->hu[n * Hp + i] = (uint8_t)(hprev[n * H + i] - lo);
#ifdef QG_HAVE_VNNI_KERNEL
      gemm_u8s8(nb, a->hu + n0 * Hp, Hp, &a->Rb, a->accRhi + n0 * H3, H3);
#endif
    } else {
      for (int64_t i = n0 * H; i < n1 * H; i++) a->Hf[i] = (float)(hprev[i] - c->h.z);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)H3, (int)H, 1.0f, a->Hf + n0 * H, (int)H, a->Rf, (int)H, 0.0f,
                  a->accRhf + n0 * H3, (int)H3);
    }
    for (int64_t n = n0; n < n1; n++) {
      const int64_t Ln = length_of(a->L, n, T);
      if (s >= Ln) {   /* padded step: the state stays */
        memcpy(hnext + n * H, hprev + n * H, (size_t)H * sizeof(int32_t));
        if (a->cells) memset(a->cells + (s * N + n) * H * a->cb, 0, (size_t)(H * a->cb));
        continue;
      }
      const int64_t t = a->reverse ? Ln - 1 - s : s;
      const void *aw = a->vnni ? (const void *)(a->accWxi + (t * N + n) * H3) : (const void *)(a->accWxf + (t * N + n) * H3);
      const void *ar = a->vnni ? (const void *)(a->accRhi + n * H3) : (const void *)(a->accRhf + n * H3);
      uint32_t *rec = a->cells ? (uint32_t *)(a->cells + (s * N + n) * H * a->cb) : NULL;   /* narrow: 12 bytes a unit */
      cell32_row(c, cq, aw, ar, hprev + n * H, hnext + n * H, a->y + (t * N + n) * a->Hy + a->y_offset, yscale, rec, a->vnni);
    }
  }
}

/* The per-unit rows of the 32-bit cell for this layer's quantizers and bias codes; 0 when a
 * bound fails (then the general cell runs). c->fast ends up set when every requantization of the
 * layer has k >= 0. */
static int cell32_prepare(const qg_int_gru *g, qg_cell32 *c, int32_t *P, int gemm_exact) {
  const int64_t H = g->H;
  if (!qg_cell32_setup(c, &g->cell, gemm_exact)) return 0;
  c->P = P;
  c->H = H;
  for (int64_t i = 0; i < H; i++) {
    int ew[3], er[3], ebx[3], ebr[3];
    int64_t bx[3], br[3];
    for (int k = 0; k < 3; k++) {
      const int64_t j = k * H + i;
      ew[k] = g->w_exp[QG_W_W][j]; er[k] = g->w_exp[QG_W_R][j];
      ebx[k] = g->w_exp[QG_W_BX][j]; ebr[k] = g->w_exp[QG_W_BR][j];
      bx[k] = (int64_t)g->codes[QG_W_BX][j] - g->w_zp[QG_W_BX][j];
      br[k] = (int64_t)g->codes[QG_W_BR][j] - g->w_zp[QG_W_BR][j];
    }
    if (!qg_cell32_unit(P, H, i, &g->cell, ew, er, bx, ebx, br, ebr)) return 0;
    if (!qg_cell32_unit_fast(P, H, i)) c->fast = 0;   /* the cheaper rounding only where every unit allows it */
  }
  return 1;
}

/* The 32-bit forward; returns 0 (having written nothing) when the layer is outside its bounds. */
static int forward32(qg_ctx *ctx, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn, const qg_int_gru_saved *saved,
                     const qg_tensor *x, const qg_tensor *h0, const qg_tensor *lengths, int reverse, qg_status *st) {
  const char *fn = "qg_int_gru_forward";
  const int64_t T = x->dims[0], N = x->dims[1], C = g->C, H = g->H, H3 = 3 * H, TN = T * N;
  const qg_cell_q *cq = &g->cell;
  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H];
  *st = QG_OK;
  const gemm_mode gwx = gemm_mode_of(g->act[QG_Q_INPUT_X].bitwidth, g->act[QG_Q_INPUT_X].is_unsigned, QX.z, g->w_bits[QG_W_W],
                                     g->w_unsigned[QG_W_W], g->w_zp_host[QG_W_W], H3, C);
  const gemm_mode grh = gemm_mode_of(g->act[QG_Q_OUTPUT_H].bitwidth, g->act[QG_Q_OUTPUT_H].is_unsigned, QH.z, g->w_bits[QG_W_R],
                                     g->w_unsigned[QG_W_R], g->w_zp_host[QG_W_R], H3, H);
  if (!gwx.use_f32 || !grh.use_f32 || C < 1 || H < 1) return 0;
  fwd32_args a;
  memset(&a, 0, sizeof a);
  a.g = g;
  a.T = T; a.N = N; a.C = C; a.H = H; a.Hy = y->dims[2];
  a.y_offset = y_offset; a.reverse = reverse;
  a.nt = qg_cpu_row_threads(N);
  a.vnni = cpu_has_vnni() && grid_u8(QX) && grid_u8(QH) && weight_s8(g, QG_W_W) && weight_s8(g, QG_W_R);
  a.L = lengths ? (const int64_t *)lengths->data : NULL;
  a.x = (const float *)x->data;
  a.y = (float *)y->data;
  a.ring = saved ? T + 1 : 2;
  a.cb = qg_cell_bytes(cq->narrow);
  /* workspace (64-byte aligned blocks): int32 P [51, H]; hq [2, N, H], xq [TN, C] and bytes
   * xmask [TN, C] at inference; then float32 operands and accumulators, or byte operands, packed
   * weights and int32 accumulators */
  const int64_t Cp = (C + 3) / 4 * 4, Hp = (H + 3) / 4 * 4, P16 = (H3 + 15) / 16 * 16;
  int64_t sz[12], nblk = 0;
  sz[nblk++] = QG_C32_ROWS * H * 4;
  sz[nblk++] = saved ? 0 : 2 * N * H * 4;
  sz[nblk++] = saved ? 0 : TN * C * 4;
  sz[nblk++] = saved ? 0 : TN * C;
  if (a.vnni) {
    sz[nblk++] = TN * Cp; sz[nblk++] = N * Hp;
    sz[nblk++] = s8_bytes(H3, C); sz[nblk++] = s8_bytes(H3, H); sz[nblk++] = 2 * P16 * 4;
    sz[nblk++] = TN * H3 * 4; sz[nblk++] = N * H3 * 4;
  } else {
    sz[nblk++] = (TN * C + H3 * C + H3 * H + N * H + TN * H3 + N * H3) * 4;
  }
  int64_t total = 64;
  for (int64_t i = 0; i < nblk; i++) total += (sz[i] + 63) / 64 * 64;
  char *ws;
  *st = qg_workspace(ctx, fn, total, (void **)&ws);
  if (*st != QG_OK) return 1;
  char *blk[12];
  {
    char *p = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    for (int64_t i = 0; i < nblk; i++) { blk[i] = p; p += (sz[i] + 63) / 64 * 64; }
  }
  int32_t *P = (int32_t *)blk[0];
  a.hq = saved ? (int32_t *)saved->hq->data : (int32_t *)blk[1];
  a.xq = saved ? (int32_t *)saved->xq->data : (int32_t *)blk[2];
  a.xmask = saved ? (uint8_t *)saved->xmask->data : (uint8_t *)blk[3];
  a.cells = saved ? (uint8_t *)saved->cell->data : NULL;
  qg_cell32 c;
  if (!cell32_prepare(g, &c, P, 1)) return 0;
  a.c = &c;
  /* 1. the weights as GEMM operands */
  if (a.vnni) {
    a.xu = (uint8_t *)blk[4]; a.hu = (uint8_t *)blk[5];
    a.Wb.packed = (int8_t *)blk[6]; a.Rb.packed = (int8_t *)blk[7];
    a.Wb.corr = (int32_t *)blk[8]; a.Rb.corr = a.Wb.corr + P16;
    a.accWxi = (int32_t *)blk[9]; a.accRhi = (int32_t *)blk[10];
    pack_s8(&a.Wb, g->codes[QG_W_W], g->w_zp[QG_W_W], H3, C, (int32_t)(QX.z - QX.qmin));
    pack_s8(&a.Rb, g->codes[QG_W_R], g->w_zp[QG_W_R], H3, H, (int32_t)(QH.z - QH.qmin));
    if (Hp > H) memset(a.hu, 0, (size_t)(N * Hp));
  } else {
    a.Xf = (float *)blk[4]; a.Wf = a.Xf + TN * C; a.Rf = a.Wf + H3 * C; a.Hf = a.Rf + H3 * H; a.accWxf = a.Hf + N * H;
    a.accRhf = a.accWxf + TN * H3;
    a.Wb.Kq = C / 4; a.Rb.Kq = H / 4;   /* unused */
    const int32_t *Wq = g->codes[QG_W_W], *Rq = g->codes[QG_W_R];
    for (int64_t j = 0; j < H3; j++) {
      const int32_t zw = g->w_zp[QG_W_W][j], zr = g->w_zp[QG_W_R][j];
      for (int64_t k = 0; k < C; k++) a.Wf[j * C + k] = (float)(Wq[j * C + k] - zw);
      for (int64_t k = 0; k < H; k++) a.Rf[j * H + k] = (float)(Rq[j * H + k] - zr);
    }
  }
  /* 2. h0 */
  {
    int32_t *h = a.hq;
    if (h0) {
      for (int64_t i = 0; i < N * H; i++) {
        int m;
        h[i] = (int32_t)qg_quant_real((double)((const float *)h0->data)[i], QH, &m);
      }
    } else {
      int m;
      const int32_t z0 = (int32_t)qg_quant_real(0.0, QH, &m);
      for (int64_t i = 0; i < N * H; i++) h[i] = z0;
    }
  }
  /* 3. padded time steps give zero output */
  if (a.L)
    for (int64_t n = 0; n < N; n++)
      for (int64_t t = a.L[n]; t < T; t++) memset(a.y + (t * N + n) * a.Hy + y_offset, 0, (size_t)H * sizeof(float));
  /* 4. the steps, rows split over the threads */
  g->cell_path = a.vnni ? QG_CELL_32_BYTES : QG_CELL_32;
  if (a.nt > 1) {
    const int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    QG_PRAGMA(omp parallel for num_threads(a.nt) schedule(dynamic, 1))
    for (int64_t ch = 0; ch < row_chunks(N); ch++) forward32_rows(&a, ch * QG_ROW_CHUNK, chunk_end(N, ch));
    openblas_set_num_threads(blas);
  } else {
    for (int64_t ch = 0; ch < row_chunks(N); ch++) forward32_rows(&a, ch * QG_ROW_CHUNK, chunk_end(N, ch));
  }
  if (hn) deq_codes(a.hq + (T % a.ring) * N * H, N * H, QH, (float *)hn->data);
  return 1;
}

qg_status qg_cpu_int_gru_forward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn,
                                 const qg_int_gru_saved *saved, const qg_stats *stats, const qg_tensor *x,
                                 const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_int_gru_forward";
  const int64_t T = x->dims[0], N = x->dims[1], C = g->C, H = g->H, H3 = 3 * H, TN = T * N;
  const int64_t *L = lengths ? (const int64_t *)lengths->data : NULL;
  const qg_cell_q *cq = &g->cell;
  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H], QWX = cq->a[QG_Q_MATMUL_WX];
  const int observing = stats != NULL;
  if (!observing) {
    qg_status fst;
    if (forward32(ctx, g, y, y_offset, hn, saved, x, h0, lengths, reverse, &fst)) return fst;
  }
  stat_rows st = {observing ? (double *)stats->range->data : NULL, observing ? (int64_t *)stats->counts->data : NULL};

  /* workspace: doubles Xc [TN, C], Wc [3H, C], Rc [3H, H], accWx [TN, 3H], Hc [N, H], accRh [N, 3H];
   * int64 qWx [TN, 3H], qRh [N, 3H]; int32 hq [T+1, N, H] and xq [TN, C] at inference; bytes mWx [TN, 3H],
   * mRh [N, 3H], xmask [TN, C] at inference; then float copies of the GEMM operands. */
  const int64_t nd = TN * C + H3 * C + H3 * H + TN * H3 + N * H + N * H3, ni = TN * H3 + N * H3;
  const int64_t nhq = saved ? 0 : (T + 1) * N * H, nxq = saved ? 0 : TN * C;
  const int64_t nb = TN * H3 + N * H3 + nxq;
  const int64_t bytes = nd * 8 + ni * 8 + (nhq + nxq) * 4 + nb + nd * 4 + 256;
  char *ws;
  QG_CHECK(qg_workspace(ctx, fn, bytes, (void **)&ws));
  double *Xc = (double *)ws, *Wc = Xc + TN * C, *Rc = Wc + H3 * C, *accWx = Rc + H3 * H, *Hc = accWx + TN * H3, *accRh = Hc + N * H;
  int64_t *qWx = (int64_t *)(accRh + N * H3), *qRh = qWx + TN * H3;
  int32_t *hqp = saved ? (int32_t *)saved->hq->data : (int32_t *)(qRh + N * H3);
  int32_t *xcodes = saved ? (int32_t *)saved->xq->data : hqp + nhq;
  uint8_t *mWx = (uint8_t *)((int32_t *)(qRh + N * H3) + nhq + nxq), *mRh = mWx + TN * H3;
  uint8_t *xmask = saved ? (uint8_t *)saved->xmask->data : mRh + N * H3;
  float *Xf = (float *)(((uintptr_t)(mRh + N * H3 + nxq) + 63) & ~(uintptr_t)63), *Wf = Xf + TN * C, *Rf = Wf + H3 * C;
  float *accWxf = Rf + H3 * H, *Hf = accWxf + TN * H3, *accRhf = Hf + N * H;

  const gemm_mode gwx = gemm_mode_of(g->act[QG_Q_INPUT_X].bitwidth, g->act[QG_Q_INPUT_X].is_unsigned, QX.z, g->w_bits[QG_W_W],
                                     g->w_unsigned[QG_W_W], g->w_zp_host[QG_W_W], H3, C);
  const gemm_mode grh = gemm_mode_of(g->act[QG_Q_OUTPUT_H].bitwidth, g->act[QG_Q_OUTPUT_H].is_unsigned, QH.z, g->w_bits[QG_W_R],
                                     g->w_unsigned[QG_W_R], g->w_zp_host[QG_W_R], H3, H);

  /* 1. input.x codes (observed at valid steps only) */
  const float *xp = (const float *)x->data;
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++) {
      const int valid = t < length_of(L, n, T);
      for (int64_t k = 0; k < C; k++) {
        const int64_t i = (t * N + n) * C + k;
        int m;
        const int64_t q = qg_quant_real((double)xp[i], QX, &m);
        if (observing && valid) observe_op(st, QG_Q_INPUT_X, (double)xp[i]);
        xcodes[i] = (int32_t)q;
        Xc[i] = (double)(q - QX.z);
        Xf[i] = (float)(q - QX.z);
        xmask[i] = (uint8_t)m;
      }
    }
  /* 2. centered weight codes and the W x GEMM over all steps */
  const int32_t *Wq = g->codes[QG_W_W], *Rq = g->codes[QG_W_R];
  for (int64_t j = 0; j < H3; j++) {
    for (int64_t k = 0; k < C; k++) Wf[j * C + k] = (float)(Wc[j * C + k] = (double)((int64_t)Wq[j * C + k] - g->w_zp[QG_W_W][j]));
    for (int64_t k = 0; k < H; k++) Rf[j * H + k] = (float)(Rc[j * H + k] = (double)((int64_t)Rq[j * H + k] - g->w_zp[QG_W_R][j]));
  }
  gemm_codes(TN, H3, C, gwx, Xf, Wf, accWxf, Xc, Wc, accWx);
  if (observing) {
    for (int64_t t = 0; t < T; t++)
      for (int64_t n = 0; n < N; n++) {
        const int64_t r = t * N + n;
        if (t < length_of(L, n, T))
          requant_row(H3, accWx + r * H3, gwx, g->w_exp[QG_W_W], QX.e, QWX, qWx + r * H3, mWx + r * H3, 1,
                      st.range + 4 * QG_Q_MATMUL_WX, st.counts + (int64_t)QG_STATS_BINS * QG_Q_MATMUL_WX);
        else
          requant_row(H3, accWx + r * H3, gwx, g->w_exp[QG_W_W], QX.e, QWX, qWx + r * H3, mWx + r * H3, 0, NULL, NULL);
      }
  } else {
    const int nt = qg_cpu_row_threads(TN);
    QG_PRAGMA(omp parallel for num_threads(nt) schedule(static))
    for (int64_t r = 0; r < TN; r++)
      requant_row(H3, accWx + r * H3, gwx, g->w_exp[QG_W_W], QX.e, QWX, qWx + r * H3, mWx + r * H3, 0, NULL, NULL);
  }
  /* 3. h0 */
  for (int64_t i = 0; i < N * H; i++) {
    int m;
    const double v = h0 ? (double)((const float *)h0->data)[i] : 0.0;
    hqp[i] = (int32_t)qg_quant_real(v, QH, &m);
    if (observing && h0) observe_op(st, QG_Q_OUTPUT_H, v);
  }
  /* 4. padded time steps give zero output */
  float *yp = (float *)y->data;
  const int64_t Hy = y->dims[2];
  if (L)
    for (int64_t n = 0; n < N; n++)
      for (int64_t t = L[n]; t < T; t++) memset(yp + (t * N + n) * Hy + y_offset, 0, (size_t)H * sizeof(float));
  /* 5. the steps */
  uint8_t *cellp = saved ? (uint8_t *)saved->cell->data : NULL;
  const int cb = qg_cell_bytes(cq->narrow);
  /* the 64-bit cell where its bounds hold (identical results, cheaper), else the 128-bit one */
  const int wide = qg_int_gru_needs_wide(g);
  g->cell_path = wide ? QG_CELL_128 : QG_CELL_64;
#define QG_FORWARD_STEPS(n0, n1, WIDE, OBS)                                                                                   \
  forward_steps(g, T, N, n0, n1, L, reverse, grh, qWx, mWx, hqp, yp, Hy, y_offset, cellp, cb, Hf, Rf, accRhf, Hc, Rc, accRh, qRh, \
                mRh, WIDE, OBS, st)
  const int nt = observing ? 1 : qg_cpu_row_threads(N);
  if (observing) {
    if (wide) QG_FORWARD_STEPS(0, N, 1, 1);
    else QG_FORWARD_STEPS(0, N, 0, 1);
  } else if (nt > 1) {
    const int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    QG_PRAGMA(omp parallel num_threads(nt)) {
      const int k = QG_THREAD_NUM();
      if (wide) QG_FORWARD_STEPS(qg_cpu_part(N, k, nt), qg_cpu_part(N, k + 1, nt), 1, 0);
      else QG_FORWARD_STEPS(qg_cpu_part(N, k, nt), qg_cpu_part(N, k + 1, nt), 0, 0);
    }
    openblas_set_num_threads(blas);
  } else {
    if (wide) QG_FORWARD_STEPS(0, N, 1, 0);
    else QG_FORWARD_STEPS(0, N, 0, 0);
  }
#undef QG_FORWARD_STEPS
  if (hn) {
    float *o = (float *)hn->data;
    const int32_t *last = hqp + T * N * H;
    for (int64_t i = 0; i < N * H; i++) o[i] = (float)qg_deq(last[i], QH);
  }
  return QG_OK;
}

/* The backward's time loop for rows [n0, n1); returns the buffer holding dL/dh_0 (dh or dh_next:
 * the same for every row block, as each runs T steps). bcx, bcr [T, N, 3H] get the unmasked bias
 * contributions of each (step, row), summed after the loop in a fixed order. */
static float *backward_rows(const qg_int_gru *g, int64_t T, int64_t N, int64_t n0, int64_t n1, const int64_t *L, int reverse,
                            const int32_t *hqp, const uint8_t *sp, const float *dyp, int64_t Hy, int y_offset, float *dp,
                            float *dq, float *dh, float *dh_next, float *bcx, float *bcr) {
  const int64_t H = g->H, H3 = 3 * H;
  const qg_cell_q *cq = &g->cell;
  const int cb = qg_cell_bytes(cq->narrow);
  for (int64_t s = T - 1; s >= 0; s--) {
    const int32_t *hprev = hqp + s * N * H;
    for (int64_t n = n0; n < n1; n++) {
      const int64_t Ln = length_of(L, n, T);
      float *dqr = dq + (s * N + n) * H3, *bxr = bcx + (s * N + n) * H3, *brr = bcr + (s * N + n) * H3;
      if (s >= Ln) {   /* padded step: the gradient passes through, nothing else */
        memset(dqr, 0, (size_t)H3 * sizeof(float));
        memset(bxr, 0, (size_t)H3 * sizeof(float));
        memset(brr, 0, (size_t)H3 * sizeof(float));
        memcpy(dh_next + n * H, dh + n * H, (size_t)H * sizeof(float));
        continue;
      }
      const int64_t t = reverse ? Ln - 1 - s : s;
      float *dpr = dp + (t * N + n) * H3;
      for (int64_t i = 0; i < H; i++) {
        qg_cell_out su;
        qg_cell_grad gr;
        qg_cell_unpack(sp + ((s * N + n) * H + i) * cb, cq, &su);
        const float dH = dh[n * H + i] + (dyp ? dyp[(t * N + n) * Hy + y_offset + i] : 0.0f);
        qg_cell_backward(cq, &g->bwd, &su, hprev[n * H + i], dH, &gr);
        for (int k = 0; k < 3; k++) {
          dpr[k * H + i] = gr.dp[k];
          dqr[k * H + i] = gr.dq[k];
          bxr[k * H + i] = gr.dbx[k];
          brr[k * H + i] = gr.dbr[k];
        }
        dh_next[n * H + i] = gr.dhprev;
      }
    }
    if (n1 > n0 && H > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(n1 - n0), (int)H, (int)H3, 1.0f, dq + (s * N + n0) * H3,
                  (int)H3, g->fq[QG_W_R], (int)H, 1.0f, dh_next + n0 * H, (int)H);
    float *tmp = dh; dh = dh_next; dh_next = tmp;
  }
  return dh;
}

/* ---- the vectorized STE backward ----------------------------------------------------------
 * For narrow saved states with tables (every layer the 32-bit forward runs, and more): per step
 * and row one pass over the units (qg_cell_backward_values, vectorized), the bias gradients
 * accumulated per row in double (acc [N, 4H]: z, r, g pre-activations and Rh_g + br_g), summed
 * over rows in row order afterwards, so no sum depends on the thread split. */

typedef struct {
  const float *val[3], *der[3];
  double sh, srh;          /* 2^-e of output.h and matmul.Rh */
  int32_t zh, zrh, rh_qmin;
} ste_consts;

QG_INLINE void ste_row_body(const ste_consts *k, int64_t H, const uint32_t *restrict rec, const int32_t *restrict hprev,
                            const float *restrict dh, const float *restrict dy, float *restrict dp, float *restrict dq,
                            double *restrict acc, float *restrict dh_next, const int has_dy) {
  QG_PRAGMA(omp simd)
  for (int64_t i = 0; i < H; i++) {
    const uint32_t w0 = rec[3 * i], w1 = rec[3 * i + 1], mk = rec[3 * i + 2];
    const uint32_t iz = w0 & 0xFFFFu, ir = w0 >> 16, ig = w1 & 0xFFFFu;
    const int32_t rhb_code = (int32_t)(w1 >> 16) + k->rh_qmin;
    const float hp = (float)((double)(hprev[i] - k->zh) * k->sh);
    const float rhb = (float)((double)(rhb_code - k->zrh) * k->srh);
    const float dH = dh[i] + (has_dy ? dy[i] : 0.0f);
    qg_cell_grad gr;
    qg_cell_backward_values(mk, k->val[0][iz], k->val[1][ir], k->val[2][ig], k->der[0][iz], k->der[1][ir], k->der[2][ig], hp, rhb,
                            dH, &gr);
    dp[i] = gr.dp[0]; dp[H + i] = gr.dp[1]; dp[2 * H + i] = gr.dp[2];
    dq[i] = gr.dq[0]; dq[H + i] = gr.dq[1]; dq[2 * H + i] = gr.dq[2];
    acc[i] += (double)gr.dbx[0]; acc[H + i] += (double)gr.dbx[1]; acc[2 * H + i] += (double)gr.dbx[2];
    acc[3 * H + i] += (double)gr.dbr[2];
    dh_next[i] = gr.dhprev;
  }
}

QG_CLONES static void ste_row_dy(const ste_consts *k, int64_t H, const uint32_t *rec, const int32_t *hprev, const float *dh,
                                 const float *dy, float *dp, float *dq, double *acc, float *dh_next) {
  ste_row_body(k, H, rec, hprev, dh, dy, dp, dq, acc, dh_next, 1);
}

QG_CLONES static void ste_row_nody(const ste_consts *k, int64_t H, const uint32_t *rec, const int32_t *hprev, const float *dh,
                                   float *dp, float *dq, double *acc, float *dh_next) {
  ste_row_body(k, H, rec, hprev, dh, NULL, dp, dq, acc, dh_next, 0);
}

/* Everything the vectorized backward's threads share. */
typedef struct {
  const qg_int_gru *g;
  ste_consts k;
  int64_t T, N, C, H, Hy;
  int y_offset, reverse, nt;
  const int64_t *L;
  const int32_t *hq, *xq;
  const uint8_t *cells, *xmask;
  const float *dy;
  float *dp, *dq, *dh, *dh_next, *Xf, *Hf, *tmpX, *tmpW, *tmpR;
  double *acc;                          /* per-row bias sums [N, 4H] */
  float *dx, *dW, *dR, *dbx, *dbr;
  float *dh_first;
  int pack;                             /* GEMM operands packed (cpu_gemm.h), else CBLAS */
  gmat Br, Bw;                          /* R~ [3H, H] (dq R~), W~ [3H, C] (dx) */
  gmat Bh, Bx;                          /* h~ [TN, H] (dR), x~ [TN, C] (dW): packed from the codes */
} bwd32_args;


/* Panels [p0, p1) of b (non-transposed, [K, Nc]) whose element (k, n) is deq(codes[k Nc + n]):
 * the dequantized inputs packed straight from the saved codes. */
QG_CLONES static void pack_deq(const gmat *b, const int32_t *restrict codes, qg_qp q, int64_t p0, int64_t p1) {
  const int64_t Nc = b->Nc, K = b->K;
  const double sc = ldexp(1.0, -q.e);
  const int32_t z = q.z;
  for (int64_t p = p0; p < p1; p++)
    for (int64_t k = 0; k < K; k++) {
      float *dst = b->packed + (p * K + k) * 16;
      for (int64_t c = 0; c < 16; c++) {
        const int64_t n = p * 16 + c;
        dst[c] = n < Nc ? (float)((double)((int64_t)codes[k * Nc + n] - z) * sc) : 0.0f;
      }
    }
}

/* The time loop for rows [n0, n1), dh and dh_next swapping after each step (dL/dh_0 ends in dh
 * when T is even). Also the dequantized x and h_{t-1} of these rows (dW, dR) without packing. */
static void backward_fast_rows(const bwd32_args *a, int64_t n0, int64_t n1) {
  const qg_int_gru *g = a->g;
  const int64_t T = a->T, N = a->N, C = a->C, H = a->H, H3 = 3 * H, nb = n1 - n0;
  const int cb = qg_cell_bytes(1);
  const qg_qp QX = g->cell.a[QG_Q_INPUT_X], QH = g->cell.a[QG_Q_OUTPUT_H];
  float *dh = a->dh, *dh_next = a->dh_next, *dp = a->dp, *dq = a->dq;
  for (int64_t s = 0; s < T && nb > 0 && !a->pack; s++) {
    deq_codes(a->xq + (s * N + n0) * C, nb * C, QX, a->Xf + (s * N + n0) * C);
    deq_codes(a->hq + (s * N + n0) * H, nb * H, QH, a->Hf + (s * N + n0) * H);
  }
  for (int64_t s = T - 1; s >= 0; s--) {
    const int32_t *hprev = a->hq + s * N * H;
    for (int64_t n = n0; n < n1; n++) {
      const int64_t Ln = length_of(a->L, n, T);
      float *dqr = dq + (s * N + n) * H3;
      if (s >= Ln) {   /* padded step: the gradient passes through, nothing else */
        memset(dqr, 0, (size_t)H3 * sizeof(float));
        memset(dp + (s * N + n) * H3, 0, (size_t)H3 * sizeof(float));   /* time index s is padded too */
        memcpy(dh_next + n * H, dh + n * H, (size_t)H * sizeof(float));
        continue;
      }
      const int64_t t = a->reverse ? Ln - 1 - s : s;
      const uint32_t *rec = (const uint32_t *)(a->cells + (s * N + n) * H * cb);
      if (a->dy)
        ste_row_dy(&a->k, H, rec, hprev + n * H, dh + n * H, a->dy + (t * N + n) * a->Hy + a->y_offset, dp + (t * N + n) * H3, dqr,
                   a->acc + n * 4 * H, dh_next + n * H);
      else
        ste_row_nody(&a->k, H, rec, hprev + n * H, dh + n * H, dp + (t * N + n) * H3, dqr, a->acc + n * 4 * H, dh_next + n * H);
    }
    if (nb > 0 && H > 0) gemm_b(nb, dq + (s * N + n0) * H3, H3, &a->Br, dh_next + n0 * H, H, 1);
    float *tmp = dh; dh = dh_next; dh_next = tmp;
  }
}

/* The weight-gradient tasks: task i of QG_BWD_TASKS takes its share of the rows of dx, of the
 * rows of dW and dR (one GEMM each, masked by the weights' masks) and of the bias columns (the
 * rows' sums added in row order). The shares depend only on i, so the results do not depend on
 * the thread count or on which thread runs which task. */
enum { QG_BWD_TASKS = 8 };

/* out [nj, Nc] = A^T B over the TN sums, A = the columns of dp or dq from a0 (ld 3H), B = b's
 * operand (packed: in blocks of 256 sums, so a block of it stays in the cache; else CBLAS on the
 * unpacked copy). */
static void gemm_sums(const bwd32_args *a, int64_t nj, const float *a0, const gmat *b, const float *unpacked, float *out) {
  const int64_t TN = a->T * a->N, H3 = 3 * a->H, Nc = b->Nc;
#ifdef QG_HAVE_AVX512_KERNEL
  if (a->pack) {
    for (int64_t k0 = 0; k0 < TN; k0 += 256)
      gemm_packed(nj, a0, 1, H3, b, k0, k0 + 256 < TN ? k0 + 256 : TN, out, Nc, k0 > 0);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nj, (int)Nc, (int)TN, 1.0f, a0, (int)H3, unpacked, (int)Nc, 0.0f, out,
              (int)Nc);
}

static void backward_fast_task(const bwd32_args *a, int i) {
  const qg_int_gru *g = a->g;
  const int64_t T = a->T, N = a->N, C = a->C, H = a->H, H3 = 3 * H, TN = T * N;
  const int64_t r0 = qg_cpu_part(TN, i, QG_BWD_TASKS), r1 = qg_cpu_part(TN, i + 1, QG_BWD_TASKS);
  const int64_t j0 = qg_cpu_part(H3, i, QG_BWD_TASKS), j1 = qg_cpu_part(H3, i + 1, QG_BWD_TASKS);
  if (TN <= 0 || H <= 0) return;
  if (a->dx && C > 0 && r1 > r0) {
    gemm_b(r1 - r0, a->dp + r0 * H3, H3, &a->Bw, a->tmpX + r0 * C, C, 0);
    const uint8_t *xm = a->xmask;
    for (int64_t e = r0 * C; e < r1 * C; e++) a->dx[e] += xm[e] ? a->tmpX[e] : 0.0f;
  }
  if (j1 <= j0) return;
  const int64_t nj = j1 - j0;
  if (C > 0) {
    gemm_sums(a, nj, a->dp + j0, &a->Bx, a->Xf, a->tmpW + j0 * C);
    const uint8_t *wm = g->mask[QG_W_W];
    for (int64_t e = j0 * C; e < j1 * C; e++) a->dW[e] += wm[e] ? a->tmpW[e] : 0.0f;
  }
  gemm_sums(a, nj, a->dq + j0, &a->Bh, a->Hf, a->tmpR + j0 * H);
  const uint8_t *rm = g->mask[QG_W_R];
  for (int64_t e = j0 * H; e < j1 * H; e++) a->dR[e] += rm[e] ? a->tmpR[e] : 0.0f;
  /* biases: dbx gets the z, r, g pre-activation sums, dbr those of z, r and of Rh_g + br_g */
  const uint8_t *bxm = g->mask[QG_W_BX], *brm = g->mask[QG_W_BR];
  for (int64_t j = j0; j < j1; j++) {
    const int64_t jr = j < 2 * H ? j : j + H;
    double sx = 0.0, sr = 0.0;
    for (int64_t n = 0; n < N; n++) { sx += a->acc[n * 4 * H + j]; sr += a->acc[n * 4 * H + jr]; }
    a->dbx[j] += bxm[j] ? (float)sx : 0.0f;
    a->dbr[j] += brm[j] ? (float)sr : 0.0f;
  }
}

static void backward_fast_thread(bwd32_args *a, int k) {
  const int nt = a->nt;
  if (a->pack) {   /* x~ and h~ packed from the codes, split by panels */
    const qg_qp QX = a->g->cell.a[QG_Q_INPUT_X], QH = a->g->cell.a[QG_Q_OUTPUT_H];
    const int64_t px = (a->C + 15) / 16, ph = (a->H + 15) / 16;
    pack_deq(&a->Bx, a->xq, QX, qg_cpu_part(px, k, nt), qg_cpu_part(px, k + 1, nt));
    pack_deq(&a->Bh, a->hq, QH, qg_cpu_part(ph, k, nt), qg_cpu_part(ph, k + 1, nt));
  }
  QG_PRAGMA(omp for schedule(dynamic, 1))
  for (int64_t ch = 0; ch < row_chunks(a->N); ch++) backward_fast_rows(a, ch * QG_ROW_CHUNK, chunk_end(a->N, ch));
  /* (the implicit barrier: every row's dp, dq, sums and dequantized inputs are complete) */
  QG_PRAGMA(omp for schedule(dynamic, 1))
  for (int i = 0; i < QG_BWD_TASKS; i++) backward_fast_task(a, i);
}

/* The vectorized backward (narrow saved state, tables built). */
static qg_status backward_fast(qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx,
                               qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn,
                               const qg_int_gru_saved *saved, const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_int_gru_backward";
  const qg_cell_q *cq = &g->cell;
  bwd32_args a;
  memset(&a, 0, sizeof a);
  a.g = g;
  a.T = saved->xq->dims[0]; a.N = saved->xq->dims[1]; a.C = g->C; a.H = g->H;
  const int64_t T = a.T, N = a.N, C = a.C, H = a.H, H3 = 3 * H, TN = T * N;
  a.Hy = dy ? dy->dims[2] : 0;
  a.y_offset = y_offset; a.reverse = reverse;
  a.nt = qg_cpu_row_threads(N);
  a.L = lengths ? (const int64_t *)lengths->data : NULL;
  a.hq = (const int32_t *)saved->hq->data; a.xq = (const int32_t *)saved->xq->data;
  a.cells = (const uint8_t *)saved->cell->data; a.xmask = (const uint8_t *)saved->xmask->data;
  a.dy = dy ? (const float *)dy->data : NULL;
  a.dx = dx ? (float *)dx->data : NULL; a.dW = (float *)dW->data; a.dR = (float *)dR->data;
  a.dbx = (float *)dbx->data; a.dbr = (float *)dbr->data;
  const qg_qp QH = cq->a[QG_Q_OUTPUT_H], QRH = cq->a[QG_Q_MATMUL_RH];
  for (int j = 0; j < 3; j++) { a.k.val[j] = g->bwd.val[j]; a.k.der[j] = g->bwd.der[j]; }
  a.k.sh = ldexp(1.0, -QH.e); a.k.srh = ldexp(1.0, -QRH.e);
  a.k.zh = QH.z; a.k.zrh = QRH.z; a.k.rh_qmin = (int32_t)QRH.qmin;
  /* workspace: doubles acc [N, 4H]; floats dp, dq [TN, 3H], dh, dh_next [N, H], tmpX [TN, C],
   * tmpW [3H, C], tmpR [3H, H], then Xf [TN, C] and Hf [TN, H] (CBLAS) or the packed operands */
  a.pack = use_packed();
  const int64_t nop = a.pack ? packed_floats(H, H3) + packed_floats(C, H3) + packed_floats(H, TN) + packed_floats(C, TN) : TN * C + TN * H;
  const int64_t nf = 2 * TN * H3 + 2 * N * H + TN * C + H3 * C + H3 * H + nop;
  double *ws;
  QG_CHECK(qg_workspace(ctx, fn, 4 * N * H * 8 + nf * 4 + 128, (void **)&ws));
  a.acc = ws;
  memset(a.acc, 0, (size_t)(4 * N * H) * sizeof(double));
  a.dp = (float *)(ws + 4 * N * H); a.dq = a.dp + TN * H3; a.dh = a.dq + TN * H3; a.dh_next = a.dh + N * H;
  a.tmpX = a.dh_next + N * H; a.tmpW = a.tmpX + TN * C; a.tmpR = a.tmpW + H3 * C;
  float *ops = (float *)(((uintptr_t)(a.tmpR + H3 * H) + 63) & ~(uintptr_t)63);
  a.Br = (gmat){g->fq[QG_W_R], 0, H, H3, NULL};
  a.Bw = (gmat){g->fq[QG_W_W], 0, C, H3, NULL};
  if (a.pack) {
    a.Br.packed = ops; a.Bw.packed = a.Br.packed + packed_floats(H, H3);
    a.Bh = (gmat){NULL, 0, H, TN, a.Bw.packed + packed_floats(C, H3)};
    a.Bx = (gmat){NULL, 0, C, TN, a.Bh.packed + packed_floats(H, TN)};
    pack_b(&a.Br);
    pack_b(&a.Bw);
  } else {   /* gemm_sums' CBLAS path reads the shapes of Bh and Bx */
    a.Xf = ops; a.Hf = a.Xf + TN * C;
    a.Bh = (gmat){NULL, 0, H, TN, NULL};
    a.Bx = (gmat){NULL, 0, C, TN, NULL};
  }
  if (dhn) memcpy(a.dh, dhn->data, (size_t)(N * H) * sizeof(float));
  else memset(a.dh, 0, (size_t)(N * H) * sizeof(float));
  a.dh_first = T % 2 == 0 ? a.dh : a.dh_next;
  if (a.nt > 1) {
    const int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    QG_PRAGMA(omp parallel num_threads(a.nt))
    backward_fast_thread(&a, QG_THREAD_NUM());
    openblas_set_num_threads(blas);
  } else {
    backward_fast_thread(&a, 0);
  }
  if (dh0) {
    float *o = (float *)dh0->data;
    for (int64_t i = 0; i < N * H; i++) {
      int m = 1;
      if (h0) qg_quant_real((double)((const float *)h0->data)[i], QH, &m);
      o[i] = a.dh_first[i] * (float)m;
    }
  }
  return QG_OK;
}

qg_status qg_cpu_int_gru_backward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                                  qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                                  const qg_tensor *dhn, const qg_int_gru_saved *saved, const qg_tensor *h0,
                                  const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_int_gru_backward";
  const qg_tensor *xq = saved->xq;
  const int64_t T = xq->dims[0], N = xq->dims[1], C = g->C, H = g->H, H3 = 3 * H, TN = T * N;
  const int64_t *L = lengths ? (const int64_t *)lengths->data : NULL;
  const qg_cell_q *cq = &g->cell;
  if (cq->narrow && g->bwd.val[0])   /* the vectorized STE */
    return backward_fast(ctx, g, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, saved, h0, lengths, reverse);

  /* workspace floats: dp [TN, 3H], dq [TN, 3H], bias contributions bcx, bcr [TN, 3H], dh, dh_next
   * [N, H], Xf [TN, C], Hf [TN, H], tmpX [TN, C], tmpW [3H, C], tmpR [3H, H]; doubles dbx~, dbr~ [3H] */
  const int64_t nf = 4 * TN * H3 + 2 * N * H + 2 * TN * C + TN * H + H3 * C + H3 * H;
  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, nf * 4 + 2 * H3 * 8 + 64, (void **)&ws));
  float *dp = ws, *dq = dp + TN * H3, *bcx = dq + TN * H3, *bcr = bcx + TN * H3, *dh = bcr + TN * H3, *dh_next = dh + N * H;
  float *Xf = dh_next + N * H, *Hf = Xf + TN * C;
  float *tmpX = Hf + TN * H, *tmpW = tmpX + TN * C, *tmpR = tmpW + H3 * C;
  double *sbx = (double *)(((uintptr_t)(tmpR + H3 * H) + 7) & ~(uintptr_t)7), *sbr = sbx + H3;
  memset(sbx, 0, (size_t)(2 * H3) * sizeof(double));
  if (L) memset(dp, 0, (size_t)(TN * H3) * sizeof(float));   /* padded (t, n) rows stay zero */

  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H];
  const int32_t *hqp = (const int32_t *)saved->hq->data;
  const uint8_t *sp = (const uint8_t *)saved->cell->data;
  const float *dyp = dy ? (const float *)dy->data : NULL;
  const int64_t Hy = dy ? dy->dims[2] : 0;
  if (dhn) memcpy(dh, dhn->data, (size_t)(N * H) * sizeof(float));
  else memset(dh, 0, (size_t)(N * H) * sizeof(float));

  const int nt = qg_cpu_row_threads(N);
  float *dh_first = dh;
  if (nt > 1) {
    const int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    QG_PRAGMA(omp parallel num_threads(nt)) {
      const int k = QG_THREAD_NUM();
      float *r = backward_rows(g, T, N, qg_cpu_part(N, k, nt), qg_cpu_part(N, k + 1, nt), L, reverse, hqp, sp, dyp, Hy, y_offset, dp, dq, dh,
                               dh_next, bcx, bcr);
      if (k == 0) dh_first = r;
    }
    openblas_set_num_threads(blas);
  } else {
    dh_first = backward_rows(g, T, N, 0, N, L, reverse, hqp, sp, dyp, Hy, y_offset, dp, dq, dh, dh_next, bcx, bcr);
  }
  dh = dh_first;
  /* bias gradients: in the order the serial loop visits (s descending, rows ascending), in double */
  for (int64_t s = T - 1; s >= 0; s--)
    for (int64_t n = 0; n < N; n++) {
      const float *bxr = bcx + (s * N + n) * H3, *brr = bcr + (s * N + n) * H3;
      for (int64_t j = 0; j < H3; j++) { sbx[j] += bxr[j]; sbr[j] += brr[j]; }
    }
  if (dh0) {
    float *o = (float *)dh0->data;
    for (int64_t i = 0; i < N * H; i++) {
      int m = 1;
      if (h0) qg_quant_real((double)((const float *)h0->data)[i], QH, &m);
      o[i] = dh[i] * (float)m;
    }
  }
  /* dequantized x and h_{t-1} for the weight gradients */
  const int32_t *xqp = (const int32_t *)xq->data;
  for (int64_t i = 0; i < TN * C; i++) Xf[i] = (float)qg_deq(xqp[i], QX);
  for (int64_t i = 0; i < TN * H; i++) Hf[i] = (float)qg_deq(hqp[i], QH);
  const uint8_t *xm = (const uint8_t *)saved->xmask->data, *wm = g->mask[QG_W_W], *rm = g->mask[QG_W_R];
  if (TN > 0 && H > 0) {
    if (dx && C > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)TN, (int)C, (int)H3, 1.0f, dp, (int)H3, g->fq[QG_W_W], (int)C,
                  0.0f, tmpX, (int)C);
      float *o = (float *)dx->data;
      for (int64_t i = 0; i < TN * C; i++) o[i] += xm[i] ? tmpX[i] : 0.0f;
    }
    if (C > 0) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H3, (int)C, (int)TN, 1.0f, dp, (int)H3, Xf, (int)C, 0.0f, tmpW, (int)C);
      float *o = (float *)dW->data;
      for (int64_t i = 0; i < H3 * C; i++) o[i] += wm[i] ? tmpW[i] : 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H3, (int)H, (int)TN, 1.0f, dq, (int)H3, Hf, (int)H, 0.0f, tmpR, (int)H);
    float *o = (float *)dR->data;
    for (int64_t i = 0; i < H3 * H; i++) o[i] += rm[i] ? tmpR[i] : 0.0f;
  }
  const uint8_t *bxm = g->mask[QG_W_BX], *brm = g->mask[QG_W_BR];
  for (int64_t j = 0; j < H3; j++) {
    ((float *)dbx->data)[j] += bxm[j] ? (float)sbx[j] : 0.0f;
    ((float *)dbr->data)[j] += brm[j] ? (float)sbr[j] : 0.0f;
  }
  return QG_OK;
}

/* Both directions of a bidirectional layer: one after the other, direction 0 first (what the GPU
 * backend's concurrent form must equal). */
qg_status qg_cpu_int_gru_forward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *y, qg_tensor *const *hn,
                                       const qg_int_gru_saved *const *saved, const qg_tensor *x, const qg_tensor *const *h0,
                                       const qg_tensor *lengths) {
  for (int d = 0; d < 2; d++)
    QG_CHECK(qg_cpu_int_gru_forward(ctx, g[d], y, d ? (int)g[0]->H : 0, hn ? hn[d] : NULL, saved ? saved[d] : NULL, NULL, x,
                                    h0 ? h0[d] : NULL, lengths, d));
  return QG_OK;
}

qg_status qg_cpu_int_gru_backward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *dx, qg_tensor *const *dW,
                                        qg_tensor *const *dR, qg_tensor *const *dbx, qg_tensor *const *dbr, qg_tensor *const *dh0,
                                        const qg_tensor *dy, const qg_tensor *const *dhn, const qg_int_gru_saved *const *saved,
                                        const qg_tensor *const *h0, const qg_tensor *lengths) {
  for (int d = 0; d < 2; d++)
    QG_CHECK(qg_cpu_int_gru_backward(ctx, g[d], dx, dW[d], dR[d], dbx[d], dbr[d], dh0 ? dh0[d] : NULL, dy, d ? (int)g[0]->H : 0,
                                     dhn ? dhn[d] : NULL, saved[d], h0 ? h0[d] : NULL, lengths, d));
  return QG_OK;
}
