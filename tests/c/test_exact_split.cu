/*
 * test_exact_split.cu: the exact int8 split products of kernels/exact_split.cuh (the strict mode's
 * STE backward GEMMs) against float64 products computed here on the host, on the GPU. Without a
 * CUDA device it prints a skip line and succeeds (CI); tests/gpu/device_check.sh runs it on the GPU
 * machine, also under compute-sanitizer.
 *
 * What is checked, for every output element: the method's promise (exact_split.cuh, top) made into a
 * bound from first principles. Each float value x of a row is rounded to the integer grid 2^-sh
 * with sh = 30 - ex, 2^(ex-1) <= the row's largest |value| < 2^ex, so it moves by at most 2^-(sh+1);
 * the integer sums are exact; the result is rounded once to float. So
 *   |got - ref| <= 2^-(sh+1) sum_k |q_k - z_k| 2^-oe + 1/2 ulp of the float result
 * (ref: the float64 product of the unrounded operands; a slack of 2^-40 relative for the float64
 * reference's own rounding). Where every value is already on the grid (the "exact" cases) the first
 * term is 0 and the result must be the float64 product rounded to float, bit for bit. An SGEMM
 * (every FMA rounding) breaks that bound by many ulps at these K; a wrong digit, shift, offset,
 * zero-point correction or padding breaks it by far more.
 * Cases: both kernels (rows with per-K exponents and zero points; columns with a per-tensor zero
 * point), K and column counts that are not multiples of the 16-byte padding or the 64 x 64 tiles,
 * split-K slices, unsigned 8-bit codes (offset 128), rows of zeros, values spanning 2^-140..2^100
 * (shifts past float's exponent range: the double path), integers on the grid (exact), ties, and
 * a NaN in one row and an Inf in another: every product of those rows must be NaN (as an SGEMM's
 * would be Inf or NaN), the other rows unaffected.
 */
#include "exact_split.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static int failures = 0;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(2); } } while (0)

static unsigned long long rng = 88172645463325252ull;
static unsigned next_u32(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned)(rng >> 11); }
static double uniform(void) { return (next_u32() & 0xffffff) / 16777216.0; }

template <class T> static T *up(const std::vector<T> &h) {
  T *d;
  CK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/* the float operand's values by kind */
enum { V_WIDE, V_SPAN, V_INT, V_TIES };
static float value(int kind, int64_t r, int64_t k) {
  switch (kind) {
    case V_WIDE: return (float)((uniform() - 0.5) * ldexp(1.0, -(int)(next_u32() % 12)));   /* ~12 binades */
    case V_SPAN: {   /* rows at very different scales: 2^-140 .. 2^100 (shifts past float's range) */
      const int e = (int)(r % 4 == 0 ? -140 : r % 4 == 1 ? 100 : r % 4 == 2 ? -20 : 0) - (int)(next_u32() % 40);
      return (float)((uniform() - 0.5) * ldexp(1.0, e));
    }
    case V_INT: return (float)((int)(next_u32() % 2001) - 1000);   /* |x| < 2^10: on the grid (sh = 20) */
    default:   /* ties: the largest value 1 (grid 2^-29), the others odd multiples of 2^-30 */
      return k == 0 ? 1.0f : (float)(2 * (int)(next_u32() % 64) + 1) * (next_u32() % 2 ? 1.0f : -1.0f) * ldexpf(1.0f, -30);
  }
}

struct spec {
  const char *name;
  int rows;           /* 1: xs_rows_kernel (X [R, K], per-K exponents and zero points); 0: xs_cols_kernel (X [K, R]) */
  int64_t R, K, Cc;
  int kind, uns, slices, zero_row, zpt;   /* zpt: the columns case's zero point */
  int exact;          /* every value on the grid: the result must be the float64 product rounded once */
  int nonfinite;      /* row 2 gets a NaN, row 3 an Inf */
};

static void run(const spec &c, cublasHandle_t hb, cudaStream_t st) {
  const int64_t R = c.R, K = c.K, Cc = c.Cc, Kp = xs_kpad(K);
  /* X: rows case [R][K], columns case [K][R] (row t, column j) */
  std::vector<float> X((size_t)(R * K));
  for (int64_t r = 0; r < R; r++)
    for (int64_t k = 0; k < K; k++) {
      const float v = c.zero_row && r == 1 ? 0.0f : value(c.kind, r, k);
      if (c.rows) X[(size_t)(r * K + k)] = v;
      else X[(size_t)(k * R + r)] = v;
    }
  if (c.nonfinite) {   /* rows 2 and 3 of the float operand (columns 2 and 3 of X in the columns case) */
    const int64_t k2 = K / 3, k3 = K - 1;
    if (c.rows) { X[(size_t)(2 * K + k2)] = nanf(""); X[(size_t)(3 * K + k3)] = INFINITY; }
    else { X[(size_t)(k2 * R + 2)] = nanf(""); X[(size_t)(k3 * R + 3)] = -INFINITY; }
  }
  /* the integer operand: codes q [K][Cc] of an 8-bit grid, row exponents ke and zero points kz
   * (rows case), one zero point (columns case) */
  const int qmin = c.uns ? 0 : -128, off = c.uns ? 128 : 0;
  std::vector<int32_t> q((size_t)(K * Cc)), ke((size_t)K), kz((size_t)K);
  for (size_t i = 0; i < q.size(); i++) q[i] = qmin + (int32_t)(next_u32() % 256);
  for (int64_t k = 0; k < K; k++) {
    ke[k] = c.rows ? (int)(next_u32() % 9) - 2 : 0;
    kz[k] = c.rows ? (int)(next_u32() % 7) - 3 + off : c.zpt;
  }
  const int oe = c.rows ? 0 : 5;   /* the output's scale 2^-oe (the columns case's activation exponent) */
  /* float64 reference, each row's shift and the bound's sum */
  std::vector<double> ref((size_t)(R * Cc)), qsum((size_t)(R * Cc), 0.0);
  std::vector<int> shift((size_t)R);
  for (int64_t r = 0; r < R; r++) {
    double m = 0;
    for (int64_t k = 0; k < K; k++) {
      const double x = c.rows ? ldexp((double)X[(size_t)(r * K + k)], -ke[k]) : (double)X[(size_t)(k * R + r)];
      m = fmax(m, fabs(x));
    }
    int ex = 0;
    if (m > 0) frexp(m, &ex);
    shift[r] = m > 0 ? 30 - ex : 0;
    for (int64_t cc = 0; cc < Cc; cc++) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; k++) {
        const double x = c.rows ? ldexp((double)X[(size_t)(r * K + k)], -ke[k]) : (double)X[(size_t)(k * R + r)];
        const double w = (double)(q[(size_t)(k * Cc + cc)] - kz[k]);
        s += x * w;
        a += fabs(w);
      }
      ref[(size_t)(r * Cc + cc)] = ldexp(s, -oe);
      qsum[(size_t)(r * Cc + cc)] = ldexp(a, -oe);
    }
  }
  /* the GPU: codes, split, int8 GEMM, combine */
  float *dX = up(X), *out;
  int32_t *dq = up(q), *dke = up(ke), *dkz = up(kz), *P;
  int8_t *D, *Y;
  int *sh;
  long long *corr;
  unsigned *mb;
  CK(cudaMalloc(&out, R * Cc * 4));
  CK(cudaMalloc(&P, (size_t)c.slices * XS_DIGITS * R * Cc * 4));
  CK(cudaMalloc(&D, XS_DIGITS * R * Kp));
  CK(cudaMalloc(&Y, Cc * Kp));
  CK(cudaMalloc(&sh, R * 4));
  CK(cudaMalloc(&corr, R * 8));
  CK(cudaMalloc(&mb, R * 4));
  CK(cudaMemsetAsync(D, 0x5a, XS_DIGITS * R * Kp, st));   /* garbage where the kernels must write (padding included) */
  CK(cudaMemsetAsync(Y, 0x5a, Cc * Kp, st));
  xs_codes_t_kernel<<<dim3((unsigned)((Kp + XS_TILE - 1) / XS_TILE), (unsigned)((Cc + XS_TILE - 1) / XS_TILE)), XS_THREADS, 0, st>>>(Y, dq, K, Cc, Kp, off);
  if (c.rows) {
    xs_rows_kernel<<<(unsigned)R, XS_THREADS, 0, st>>>(D, sh, corr, dX, K, R, K, Kp, dke, dkz, off);
  } else {
    CK(cudaMemsetAsync(mb, 0, R * 4, st));
    CK(cudaMemsetAsync(corr, 0, R * 8, st));
    const int64_t rpb = 7;   /* several row chunks per column */
    xs_colmax_kernel<<<dim3((unsigned)((R + XS_THREADS - 1) / XS_THREADS), (unsigned)((K + rpb - 1) / rpb)), XS_THREADS, 0, st>>>(mb, dX, K, R, rpb);
    CK(xs_cols(D, sh, corr, dX, mb, K, R, Kp, off - c.zpt, st));
  }
  CK(cudaGetLastError());
  BK(xs_gemm(hb, P, D, Y, XS_DIGITS * R, Cc, Kp, c.slices));
  xs_combine_kernel<<<(unsigned)((R * Cc + 255) / 256), 256, 0, st>>>(out, P, c.slices, sh, corr, NULL, R, Cc, oe, 0);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(st));
  std::vector<float> got((size_t)(R * Cc));
  std::vector<int> gsh((size_t)R);
  CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gsh.data(), sh, gsh.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  double worst = 0;
  for (int64_t r = 0; r < R; r++) {
    if (c.nonfinite && (r == 2 || r == 3)) {
      for (int64_t cc = 0; cc < Cc; cc++)
        if (!isnan(got[(size_t)(r * Cc + cc)]) && bad++ < 3)
          fprintf(stderr, "  %s: (%lld, %lld) got %.9g from a row with a NaN or an Inf, expected NaN\n", c.name, (long long)r, (long long)cc,
                  (double)got[(size_t)(r * Cc + cc)]);
      continue;
    }
    if (gsh[r] != shift[r] && bad++ < 3) fprintf(stderr, "  %s: row %lld shift %d, expected %d\n", c.name, (long long)r, gsh[r], shift[r]);
    for (int64_t cc = 0; cc < Cc; cc++) {
      const size_t i = (size_t)(r * Cc + cc);
      const double g = got[i], e = ref[i];
      int fe = 0;
      frexp(fabs(e) > 0 ? fabs(e) : 1e-300, &fe);
      const double half_ulp = fmax(ldexp(1.0, fe - 25), ldexp(1.0, -150)) /* float's subnormals */, grid = c.exact ? 0.0 : ldexp(qsum[i], -(shift[r] + 1));
      const double bound = grid + half_ulp + fabs(e) * ldexp(1.0, -40);
      const double err = fabs(g - e);
      if (c.exact && g != (double)(float)e) {
        if (bad++ < 3) fprintf(stderr, "  %s: (%lld, %lld) got %.9g, the exact product rounded once is %.9g\n", c.name, (long long)r, (long long)cc, g, (double)(float)e);
      } else if (!(err <= bound)) {
        if (bad++ < 3) fprintf(stderr, "  %s: (%lld, %lld) got %.9g, float64 %.9g: error %.3g over the bound %.3g\n", c.name, (long long)r, (long long)cc, g, e, err, bound);
      }
      if (bound > 0) worst = fmax(worst, err / bound);
    }
  }
  printf("%s %s: %lld x %lld, K %lld, %d slice(s): largest error / bound %.3f\n", bad ? "FAIL" : "ok  ", c.name, (long long)R, (long long)Cc,
         (long long)K, c.slices, worst);
  if (bad) failures++;
  cudaFree(dX); cudaFree(out); cudaFree(dq); cudaFree(dke); cudaFree(dkz); cudaFree(P); cudaFree(D); cudaFree(Y);
  cudaFree(sh); cudaFree(corr); cudaFree(mb);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("test_exact_split: skipped (no CUDA device)\n");
    return 0;
  }
  cudaStream_t st;
  cublasHandle_t hb;
  CK(cudaStreamCreate(&st));
  BK(cublasCreate(&hb));
  BK(cublasSetStream(hb, st));
  const spec cases[] = {
      /* name                            rows  R    K     Cc  kind    uns sl zr zpt exact nonfinite */
      {"rows, wide values",               1,   37,  390,  70, V_WIDE, 0, 1, 1, 0, 0},
      {"rows, split-K 2",                 1,   17,  2048, 33, V_WIDE, 0, 2, 0, 0, 0},
      {"rows, split-K 4, unsigned codes", 1,   9,   1024, 130, V_WIDE, 1, 4, 1, 0, 0},
      {"rows, 2^-140 .. 2^100",           1,   8,   300,  21, V_SPAN, 0, 1, 0, 0, 0},
      {"rows, integers (exact)",          1,   13,  77,   19, V_INT,  0, 1, 1, 0, 1},
      {"columns, wide values, z = 5",     0,   70,  1000, 33, V_WIDE, 0, 1, 1, 5, 0},
      {"columns, unsigned codes, z = 131",0,   130, 517,  65, V_WIDE, 1, 1, 0, 131, 0},
      {"columns, 2^-140 .. 2^100",        0,   12,  333,  7,  V_SPAN, 0, 1, 0, -3, 0},
      {"columns, integers (exact)",       0,   65,  129,  3,  V_INT,  0, 1, 1, 0, 1},
      {"columns, ties at half the grid",  0,   6,   64,   9,  V_TIES, 0, 1, 0, 0, 0},
      {"rows, a NaN and an Inf",          1,   7,   224,  13, V_WIDE, 0, 2, 0, 0, 0, 1},
      {"columns, a NaN and an -Inf",      0,   9,   150,  11, V_WIDE, 0, 1, 0, 7, 0, 1},
  };
  for (const spec &c : cases) run(c, hb, st);
  cublasDestroy(hb);
  cudaStreamDestroy(st);
  printf("test_exact_split: %s (%d failing case(s))\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
