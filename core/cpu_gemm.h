/*
 * cpu_gemm.h: small float32 GEMMs with the weight-like operand packed once per call, shared by
 * the CPU backends of the float GRU (gru_cpu.c) and the integer GRU's STE backward
 * (int_gru_cpu.c). Static inline, so each file gets its own copy and nothing is exported.
 */
#ifndef QGRU_CPU_GEMM_H
#define QGRU_CPU_GEMM_H

#include <cblas.h>
#include <stdint.h>
#include <string.h>

/* ---- small GEMMs with the weight matrix packed once per call ---------------------------------
 * The per-step products (R h, dq R) and the per-thread W x multiply a few dozen rows by the same
 * weight matrix every step. BLAS repacks that matrix on every call, and the OpenBLAS this runs
 * with may use AVX2 kernels on a CPU that has AVX-512. So where the CPU has AVX-512F the weights
 * are packed once per call into panels of 16 columns, Bp[p][k][0..15] = B[k][16p + c] (zero
 * past the last column), and a register-blocked kernel (4 rows x 64 columns of accumulators)
 * multiplies; elsewhere (and in a build with QGRU_NO_PACKED_GEMM) CBLAS does. Each output is one fused multiply-add chain over k in order,
 * whatever the row grouping, so a row's result does not depend on how rows are split.
 * gmat: B as given to CBLAS (trans: B = mat^T with mat [Nc, K], else mat is [K, Nc]) and its
 * packed copy (NULL: use CBLAS). */
typedef struct {
  const float *mat;
  int trans;
  int64_t Nc, K;
  float *packed;
} gmat;

static inline int64_t packed_floats(int64_t Nc, int64_t K) { return (Nc + 15) / 16 * 16 * K; }
static inline void pack_panels(const gmat *b, int64_t p0, int64_t p1);
static inline void pack_b(const gmat *b) { pack_panels(b, 0, (b->Nc + 15) / 16); }

/* Packs panels [p0, p1) of b. */
static inline void pack_panels(const gmat *b, int64_t p0, int64_t p1) {
  const int64_t Nc = b->Nc, K = b->K;
  for (int64_t p = p0; p < p1; p++)
    for (int64_t k = 0; k < K; k++)
      for (int64_t c = 0; c < 16; c++) {
        const int64_t n = p * 16 + c;
        b->packed[(p * K + k) * 16 + c] = n >= Nc ? 0.0f : (b->trans ? b->mat[n * K + k] : b->mat[k * Nc + n]);
      }
}

/* QGRU_NO_PACKED_GEMM compiles the packed kernel out, so CBLAS runs everywhere: the build the
 * CBLAS path's tests use on CPUs that have AVX-512 (CMakeLists.txt, qgru_blas). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(QGRU_NO_PACKED_GEMM)
#include <immintrin.h>
#define QG_HAVE_AVX512_KERNEL 1

/* C [M, Nc] (ldc) = (beta ? C : 0) + sum over k in [k0, k1) of A(m, k) B[k], B packed; A(m, k)
 * is A[m * sm + k * sk] (sm = lda, sk = 1 for a row-major A; sm = 1, sk = ld for a transposed one). */
__attribute__((target("avx512f"))) static inline void gemm_packed(int64_t M, const float *A, int64_t sm, int64_t sk, const gmat *b,
                                                            int64_t k0, int64_t k1, float *Cm, int64_t ldc, int beta) {
  enum { MR = 4 };
  const int64_t K = b->K, Nc = b->Nc, P = (Nc + 15) / 16;
  for (int64_t p0 = 0; p0 < P; p0 += 4) {
    const int64_t np = P - p0 < 4 ? P - p0 : 4;
    __mmask16 mk[4];
    for (int64_t q = 0; q < 4; q++) {
      const int64_t rem = Nc - (p0 + q) * 16;
      mk[q] = q >= np ? 0 : (rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1));
    }
    const float *B0 = b->packed + p0 * K * 16;
    int64_t m = 0;
    if (np == 4) {
      for (; m + MR <= M; m += MR) {
        __m512 c[MR][4];
        for (int r = 0; r < MR; r++)
          for (int q = 0; q < 4; q++) c[r][q] = _mm512_setzero_ps();
        const float *a0 = A + m * sm;
        for (int64_t k = k0; k < k1; k++) {
          const __m512 b0 = _mm512_loadu_ps(B0 + k * 16), b1 = _mm512_loadu_ps(B0 + (K + k) * 16),
                       b2 = _mm512_loadu_ps(B0 + (2 * K + k) * 16), b3 = _mm512_loadu_ps(B0 + (3 * K + k) * 16);
          for (int r = 0; r < MR; r++) {
            const __m512 av = _mm512_set1_ps(a0[r * sm + k * sk]);
            c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(av, b2, c[r][2]);
            c[r][3] = _mm512_fmadd_ps(av, b3, c[r][3]);
          }
        }
        for (int r = 0; r < MR; r++)
          for (int q = 0; q < 4; q++) {
            float *cp = Cm + (m + r) * ldc + (p0 + q) * 16;
            __m512 v = c[r][q];
            if (beta) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk[q], cp), v);
            _mm512_mask_storeu_ps(cp, mk[q], v);
          }
      }
    }
    for (; m < M; m++) {   /* remaining rows, or fewer than 64 remaining columns */
      __m512 c[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      const float *a0 = A + m * sm;
      for (int64_t k = k0; k < k1; k++) {
        const __m512 av = _mm512_set1_ps(a0[k * sk]);
        for (int64_t q = 0; q < np; q++) c[q] = _mm512_fmadd_ps(av, _mm512_loadu_ps(B0 + (q * K + k) * 16), c[q]);
      }
      for (int64_t q = 0; q < np; q++) {
        float *cp = Cm + m * ldc + (p0 + q) * 16;
        __m512 v = c[q];
        if (beta) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk[q], cp), v);
        _mm512_mask_storeu_ps(cp, mk[q], v);
      }
    }
  }
}

static inline int cpu_has_avx512(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
#else
static inline int cpu_has_avx512(void) { return 0; }
#endif

/* Whether this call packs its weights (b->packed must then be given workspace of packed_floats). */
static inline int use_packed(void) {
  static int cached = -1;
  if (cached < 0) cached = cpu_has_avx512();
  return cached;
}

/* C [M, Nc] (ldc) = (beta ? C : 0) + A [M, K] (lda) B. */
static inline void gemm_b(int64_t M, const float *A, int64_t lda, const gmat *b, float *Cm, int64_t ldc, int beta) {
  if (M <= 0 || b->Nc <= 0) return;
  if (b->K <= 0) {
    if (!beta) for (int64_t m = 0; m < M; m++) memset(Cm + m * ldc, 0, (size_t)b->Nc * sizeof(float));
    return;
  }
#ifdef QG_HAVE_AVX512_KERNEL
  if (b->packed) { gemm_packed(M, A, lda, 1, b, 0, b->K, Cm, ldc, beta); return; }
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b->trans ? CblasTrans : CblasNoTrans, (int)M, (int)b->Nc, (int)b->K, 1.0f, A,
              (int)lda, b->mat, b->trans ? (int)b->K : (int)b->Nc, beta ? 1.0f : 0.0f, Cm, (int)ldc);
}

#endif
