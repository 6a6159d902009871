/*
 * xs_gemm.cu: the strict mode's exact int8 split products (kernels/exact_split.cuh) against fp32
 * SGEMM and an fp64 GEMM, on the four float GEMMs of the integer GRU's STE backward at the large
 * bench shape (T100 N256 C512 H1024), with the kernels int_gru_backward.cu runs:
 *   step: dh [N, H] = dq_s [N, 3H] R~ [3H, H]     (rows split, R~'s per-row exponents along K)
 *   dR:   [3H, H]   = dq [TN, 3H]^T h~ [TN, H]    (columns split, h~ asymmetric: z = 5)
 *   dW:   [3H, C]   = dp [TN, 3H]^T x~ [TN, C]    (columns split, x~ asymmetric: z = -3)
 *   dx:   [TN, C]   = dp [TN, 3H] W~ [3H, C]      (rows split, W~'s per-row exponents along K)
 * The float operand spans ~10 binades (as bench/bf16_split_gemm.cu's), the weights' exponents
 * 5..8 by row. For each: SGEMM (cublasGemmEx, strict fp32) and the split path's time (CUDA
 * events, median of 30 after a 0.3-s warm-up; the split, the int8 GEMM and the combine, each and
 * together), both compared with the fp64 GEMM of the same operands (largest |error| over the
 * largest |value|, mean |error| over mean |value|), and whether two runs gave the same bits.
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels -Ibench bench/xs_gemm.cu -lcublasLt -lcublas -o xs_gemm
 */
#include "exact_split.cuh"
#include "cuda_bench.cuh"

#include <algorithm>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static unsigned mix(unsigned h) { h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16; return h; }

/* the float operand: ~10 binades, both signs */
static void fill_float(std::vector<float> &x, unsigned seed) {
  for (size_t i = 0; i < x.size(); i++) {
    const unsigned h = mix((unsigned)i * 2654435761u ^ seed);
    x[i] = ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * exp2f(-(float)((h >> 24) % 10u));
  }
}
/* codes in [-128, 127] */
static void fill_codes(std::vector<int32_t> &q, unsigned seed) {
  for (size_t i = 0; i < q.size(); i++) q[i] = (int32_t)(mix((unsigned)i * 2246822519u ^ seed) % 256u) - 128;
}

struct errs { double max_rel, mean_rel; };
static errs compare(const std::vector<float> &a, const std::vector<double> &r) {
  double mx = 0, me = 0, sa = 0, se = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double e = fabs((double)a[i] - r[i]);
    mx = std::max(mx, fabs(r[i])); me = std::max(me, e); sa += fabs(r[i]); se += e;
  }
  return {me / mx, se / sa};
}

template <class T> static T *up(const std::vector<T> &h) {
  T *d; CK(cudaMalloc(&d, h.size() * sizeof(T) + 16)); CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); return d;
}
template <class T> static std::vector<T> down(const T *d, size_t n) {
  std::vector<T> h(n); CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost)); return h;
}

static cublasHandle_t hb;
static cublasLtHandle_t lt;
static cudaStream_t st;
static void *lt_ws;
static const size_t lt_wsb = 64u << 20;

/* cuBLASLt's heuristic algorithms (up to 16) for the same int8 product as xs_gemm with S = 1: the
 * fastest one's time and configuration, and whether its result equals cublasGemmEx's */
static void lt_search(const char *name, int32_t *C, int32_t *Cref, const int8_t *D, const int8_t *Y, int64_t M, int64_t Nc, int64_t Kp) {
  cublasLtMatmulDesc_t md;
  BK(cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, Kp, Nc, Kp));
  BK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, Kp, M, Kp));
  BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32I, Nc, M, Nc));
  cublasLtMatmulPreference_t pref;
  BK(cublasLtMatmulPreferenceCreate(&pref));
  BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_wsb, sizeof lt_wsb));
  cublasLtMatmulHeuristicResult_t res[16];
  int got = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pref, 16, res, &got) != CUBLAS_STATUS_SUCCESS) got = 0;
  const int32_t one = 1, zero = 0;
  float best = 1e30f;
  int bi = -1, same = 0;
  for (int r = 0; r < got; r++) {
    if (cublasLtMatmul(lt, md, &one, Y, la, D, lb, &zero, C, lc, C, lc, &res[r].algo, lt_ws, lt_wsb, st) != CUBLAS_STATUS_SUCCESS) continue;
    const float t = time_ms([&] { BK(cublasLtMatmul(lt, md, &one, Y, la, D, lb, &zero, C, lc, C, lc, &res[r].algo, lt_ws, lt_wsb, st)); }, st);
    if (t < best) {
      best = t; bi = r;
      CK(cudaStreamSynchronize(st));
      const size_t n = (size_t)(M * Nc);
      same = down(C, n) == down(Cref, n);
    }
  }
  if (bi >= 0) {
    int id = 0, tile = 0, sk = 0, stages = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    printf("# %s: cuBLASLt best of %d: %.4f ms (heuristic #%d: algo %d tile %d split-K %d stages %d; result %s cublasGemmEx's)\n", name, got,
           best, bi, id, tile, sk, stages, same ? "equals" : "DIFFERS FROM");
  } else {
    printf("# %s: cuBLASLt offered no algorithm (%d)\n", name, got);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(md);
}

/* rows = 1: out [R, Cc] = X [R, K] (Y~ [K, Cc], per-row exponents ke, zero points 0);
 * rows = 0: out [J, Cc] = X [T, J]^T (Y~ [T, Cc], one exponent ye, zero point z). */
static void run(const char *name, int rows, int64_t A, int64_t B, int64_t Cc, int ye, int z) {
  /* rows: R = A, K = B; cols: T = A, J = B */
  const int64_t R = rows ? A : B, K = rows ? B : A, Kp = xs_kpad(K), nout = R * Cc;
  std::vector<float> X((size_t)(A * B));
  fill_float(X, 11u + (unsigned)rows);
  std::vector<int32_t> q((size_t)(K * Cc)), ke((size_t)K, 0);
  fill_codes(q, 23u + (unsigned)rows);
  for (int64_t k = 0; k < K; k++) ke[k] = rows ? 5 + (int)(k % 4) : ye;
  /* the fake-quantized operand Y~ [K, Cc] (row k: (q - z) 2^-ke[k]) and the double copies */
  std::vector<float> Yf((size_t)(K * Cc));
  std::vector<double> Yd(Yf.size()), Xd(X.size());
  for (int64_t k = 0; k < K; k++)
    for (int64_t c = 0; c < Cc; c++) Yf[k * Cc + c] = (float)ldexp((double)(q[k * Cc + c] - (rows ? 0 : z)), -ke[k]);
  for (size_t i = 0; i < Yf.size(); i++) Yd[i] = Yf[i];
  for (size_t i = 0; i < X.size(); i++) Xd[i] = X[i];
  float *dX = up(X), *dYf = up(Yf), *dC;
  double *dXd = up(Xd), *dYd = up(Yd), *dCd;
  int32_t *dq = up(q), *dke = up(ke), *P;
  CK(cudaMalloc(&dC, nout * 4)); CK(cudaMalloc(&dCd, nout * 8)); CK(cudaMalloc(&P, 4 * XS_DIGITS * nout * 4));
  int8_t *D, *Y;
  CK(cudaMalloc(&D, XS_DIGITS * R * Kp)); CK(cudaMalloc(&Y, Cc * Kp));
  int *sh; long long *corr; unsigned *mb;
  CK(cudaMalloc(&sh, R * 4)); CK(cudaMalloc(&corr, R * 8)); CK(cudaMalloc(&mb, R * 4));
  /* fp64 and SGEMM (column-major views of the row-major buffers) */
  const double d1 = 1, d0 = 0;
  const float f1 = 1, f0 = 0;
  if (rows) BK(cublasDgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, (int)Cc, (int)R, (int)K, &d1, dYd, (int)Cc, dXd, (int)K, &d0, dCd, (int)Cc));
  else BK(cublasDgemm(hb, CUBLAS_OP_N, CUBLAS_OP_T, (int)Cc, (int)R, (int)K, &d1, dYd, (int)Cc, dXd, (int)R, &d0, dCd, (int)Cc));
  const std::vector<double> ref = down(dCd, (size_t)nout);
  auto sgemm = [&] {
    if (rows) BK(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, (int)Cc, (int)R, (int)K, &f1, dYf, CUDA_R_32F, (int)Cc, dX, CUDA_R_32F, (int)K, &f0, dC,
                              CUDA_R_32F, (int)Cc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else BK(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_T, (int)Cc, (int)R, (int)K, &f1, dYf, CUDA_R_32F, (int)Cc, dX, CUDA_R_32F, (int)R, &f0, dC,
                         CUDA_R_32F, (int)Cc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  const float t_sg = time_ms(sgemm, st);
  CK(cudaStreamSynchronize(st));
  const errs e_sg = compare(down(dC, (size_t)nout), ref);
  /* the split path: codes (once per weight update / per call), split, GEMM, combine */
  xs_codes_t_kernel<<<dim3((unsigned)((K + XS_TILE - 1) / XS_TILE), (unsigned)((Cc + XS_TILE - 1) / XS_TILE)), XS_THREADS, 0, st>>>(Y, dq, K, Cc, Kp, 0);
  auto split = [&] {
    if (rows) {
      xs_rows_kernel<<<(unsigned)R, XS_THREADS, 0, st>>>(D, sh, corr, dX, K, R, K, Kp, dke, nullptr, 0);
    } else {
      CK(cudaMemsetAsync(mb, 0, R * 4, st));
      CK(cudaMemsetAsync(corr, 0, R * 8, st));
      const int64_t rpb = 256;
      xs_colmax_kernel<<<dim3((unsigned)((R + XS_THREADS - 1) / XS_THREADS), (unsigned)((K + rpb - 1) / rpb)), XS_THREADS, 0, st>>>(mb, dX, K, R, rpb);
      CK(xs_cols(D, sh, corr, dX, mb, K, R, Kp, -z, st));
    }
  };
  int S = 1;
  auto gemm = [&] { BK(xs_gemm(hb, P, D, Y, XS_DIGITS * R, Cc, Kp, S)); };
  auto combine = [&] {
    xs_combine_kernel<<<(unsigned)((nout + 255) / 256), 256, 0, st>>>(dC, P, S, sh, corr, nullptr, R, Cc, rows ? 0 : ye, 0);
  };
  if (rows && R <= 1024) {   /* the per-step product: split-K slices (the output alone has few tiles) */
    split();
    for (S = 1; S <= XS_MAX_SLICES; S *= 2) {
      if ((Kp / S) % XS_KPAD) continue;
      const float tg = time_ms(gemm, st), tc = time_ms(combine, st);
      CK(cudaStreamSynchronize(st));
      const errs e = compare(down(dC, (size_t)nout), ref);
      printf("# %s: %d K slices: int8 GEMM %.4f ms, combine %.4f ms, max rel err %.2e\n", name, S, tg, tc, e.max_rel);
    }
    S = 1;
  }
  const float t_split = time_ms(split, st), t_gemm = time_ms(gemm, st), t_comb = time_ms(combine, st);
  {
    int32_t *Pl;
    CK(cudaMalloc(&Pl, XS_DIGITS * nout * 4));
    CK(cudaStreamSynchronize(st));
    lt_search(name, Pl, P, D, Y, XS_DIGITS * R, Cc, Kp);
    cudaFree(Pl);
  }
  const float t_all = time_ms([&] { split(); gemm(); combine(); }, st);
  CK(cudaStreamSynchronize(st));
  const std::vector<float> r1 = down(dC, (size_t)nout);
  CK(cudaMemset(dC, 0, nout * 4));
  split(); gemm(); combine();
  CK(cudaStreamSynchronize(st));
  const std::vector<float> r2 = down(dC, (size_t)nout);
  const errs e_xs = compare(r1, ref);
  const double gflop = 2.0 * R * Cc * (double)K * 1e-9;
  printf("\n## %s: %lld x %lld, K %lld, %.2f GFLOP\n", name, (long long)R, (long long)Cc, (long long)K, gflop);
  printf("%-28s %9s %11s %11s\n", "variant", "ms", "max rel err", "mean rel err");
  printf("%-28s %9.4f %11.2e %11.2e\n", "fp32 SGEMM", t_sg, e_sg.max_rel, e_sg.mean_rel);
  printf("%-28s %9.4f %11.2e %11.2e   (split %.4f, int8 GEMM %.4f, combine %.4f; two runs %s)\n", "exact int8 split", t_all, e_xs.max_rel,
         e_xs.mean_rel, t_split, t_gemm, t_comb, memcmp(r1.data(), r2.data(), r1.size() * 4) ? "DIFFER" : "bit-identical");
  cudaFree(dX); cudaFree(dYf); cudaFree(dC); cudaFree(dXd); cudaFree(dYd); cudaFree(dCd); cudaFree(dq); cudaFree(dke); cudaFree(P);
  cudaFree(D); cudaFree(Y); cudaFree(sh); cudaFree(corr); cudaFree(mb);
}

int main() {
  const int64_t T = 100, N = 256, C = 512, H = 1024, H3 = 3 * H, TN = T * N;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# %s, %d SMs; median of 30 (CUDA events) after a 0.3-s warm-up; errors against an fp64 GEMM of the same operands\n", prop.name,
         prop.multiProcessorCount);
  CK(cudaStreamCreate(&st));
  BK(cublasCreate(&hb)); BK(cublasSetStream(hb, st));
  BK(cublasLtCreate(&lt));
  CK(cudaMalloc(&lt_ws, lt_wsb));
  run("step: dq_s R~", 1, N, H3, H, 0, 0);
  run("dR = dq^T h~", 0, TN, H3, H, 7, 5);
  run("dW = dp^T x~", 0, TN, H3, C, 6, -3);
  run("dx = dp W~", 1, TN, H3, C, 0, 0);
  return 0;
}
