/*
 * step_gemm_lt.cu: the float GEMMs of the integer GRU's STE backward at the large bench shape
 * (T100 N256 C512 H1024), TF32, timed as kernels/int_gru_backward.cu runs them against what
 * cuBLASLt's heuristic offers for the same product. Why: the per-step GEMM dq_s R~ (M = H, N = N,
 * K = 3H) is ~60% of the backward's per-step time and runs as an 8-slice strided-batched GEMM whose
 * partial products the next step kernel re-reads; the after-loop GEMMs (dW, dR, dx) are the rest.
 * For each product: cublasGemmEx (what the code runs), then every algorithm cuBLASLt's heuristic
 * returns (up to 24), each with its configuration (algo id, tile, split-K, reduction scheme,
 * stages), its median time of 30 launches after 5 (CUDA events), whether two runs gave the same
 * bits, and its largest difference from cublasGemmEx's result relative to the largest |value|.
 * Each product first runs for ~0.3 s so that the clocks have ramped up (an idle H200 sits at 345
 * MHz; without this the first call's times were 2.5x the in-loop ones). The sliced per-step
 * product is also swept through cuBLASLt as a strided batch (4, 8 and 16 slices), and dR and dW
 * also from K-major (transposed) copies of their operands.
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 bench/step_gemm_lt.cu -lcublasLt -lcublas -o step_gemm_lt
 */
#include <algorithm>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "cuda_bench.cuh"   /* CK, BK, median_call_ms, warm_up, lt_heuristic */

/* A column-major product C[m, n] = op(A) op(B) (+ beta C), as cublasGemmEx takes it. */
struct prod {
  const char *name;
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  float beta;
  int batch;             /* > 1: strided-batched over K slices (the current per-step GEMM) */
  long long sa, sb, sc;  /* strides of the batch */
};

static float *dev_random(size_t n, unsigned seed) {
  std::vector<float> h(n);
  srand(seed);
  for (size_t i = 0; i < n; i++) h[i] = (float)rand() / RAND_MAX - 0.5f;
  float *d;
  CK(cudaMalloc(&d, n * 4));
  CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  return d;
}

static std::vector<float> fetch(const float *d, size_t n) {
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

static double rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < a.size(); i++) {
    mx = std::max(mx, (double)fabsf(b[i]));
    d = std::max(d, (double)fabsf(a[i] - b[i]));
  }
  return mx > 0 ? d / mx : d;
}

static int cfg(const cublasLtMatmulAlgo_t *al, cublasLtMatmulAlgoConfigAttributes_t at) {
  int v = 0;
  size_t w = 0;
  uint32_t u = 0;
  uint16_t s = 0;
  if (at == CUBLASLT_ALGO_CONFIG_ID || at == CUBLASLT_ALGO_CONFIG_SPLITK_NUM) {
    cublasLtMatmulAlgoConfigGetAttribute(al, at, &v, sizeof v, &w);
    return v;
  }
  if (at == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) {
    cublasLtMatmulAlgoConfigGetAttribute(al, at, &u, sizeof u, &w);
    return (int)u;
  }
  cublasLtMatmulAlgoConfigGetAttribute(al, at, &s, sizeof s, &w);   /* tile, stages, cluster: uint16 */
  if (w != sizeof s) {
    cublasLtMatmulAlgoConfigGetAttribute(al, at, &u, sizeof u, &w);
    return (int)u;
  }
  return (int)s;
}

int main() {
  const int T = 100, N = 256, C = 512, H = 1024, H3 = 3 * H, TN = T * N;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# %s, %d SMs, L2 %d MB; TF32 (CUBLAS_COMPUTE_32F_FAST_TF32); median of 30 after 5, ms\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cublasHandle_t hb;
  BK(cublasCreate(&hb));
  BK(cublasSetStream(hb, st));
  BK(cublasSetMathMode(hb, CUBLAS_TF32_TENSOR_OP_MATH));
  cublasLtHandle_t lt;
  BK(cublasLtCreate(&lt));
  const size_t wsb = 64u << 20;
  void *ws;
  CK(cudaMalloc(&ws, wsb));

  /* operands: R~ [3H, H] row-major, dq [TN, 3H], dp [TN, 3H], Xf [TN, C], Hf [TN, H], W~ [3H, C] */
  float *R = dev_random((size_t)H3 * H, 1), *dq = dev_random((size_t)TN * H3, 2), *dp = dev_random((size_t)TN * H3, 3);
  float *Xf = dev_random((size_t)TN * C, 4), *Hf = dev_random((size_t)TN * H, 5), *W = dev_random((size_t)H3 * C, 6);
  float *out, *out2;
  CK(cudaMalloc(&out, (size_t)TN * C * 4 * 8));
  CK(cudaMalloc(&out2, (size_t)TN * C * 4 * 8));
  const float *dqs = dq + (size_t)(T - 1) * N * H3;

  /* as int_gru_backward.cu calls them (row-major products through column-major cuBLAS) */
  const prod P[] = {
      /* per step: dh [N, H] = dq_s [N, 3H] R~ [3H, H]; column-major C^T [H, N] = R~^T dq_s^T */
      {"step 8 slices", CUBLAS_OP_N, CUBLAS_OP_N, H, N, H3 / 8, H, H3, H, 0.0f, 8, (long long)(H3 / 8) * H, H3 / 8, (long long)N * H},
      {"step 4 slices", CUBLAS_OP_N, CUBLAS_OP_N, H, N, H3 / 4, H, H3, H, 0.0f, 4, (long long)(H3 / 4) * H, H3 / 4, (long long)N * H},
      {"step 16 slices", CUBLAS_OP_N, CUBLAS_OP_N, H, N, H3 / 16, H, H3, H, 0.0f, 16, (long long)(H3 / 16) * H, H3 / 16, (long long)N * H},
      {"step one GEMM beta 1", CUBLAS_OP_N, CUBLAS_OP_N, H, N, H3, H, H3, H, 1.0f, 1, 0, 0, 0},
      /* dW [3H, C] = dp^T Xf: column-major [C, 3H] = Xf^T-as-stored (N) x dp (T) */
      {"dW", CUBLAS_OP_N, CUBLAS_OP_T, C, H3, TN, C, H3, C, 0.0f, 1, 0, 0, 0},
      /* dR [3H, H] = dq^T Hf */
      {"dR", CUBLAS_OP_N, CUBLAS_OP_T, H, H3, TN, H, H3, H, 0.0f, 1, 0, 0, 0},
      /* dx [TN, C] = dp W~ */
      {"dx", CUBLAS_OP_N, CUBLAS_OP_N, C, TN, H3, C, H3, C, 0.0f, 1, 0, 0, 0},
      /* the same dR and dW from transposed copies (dq^T [3H, TN], Hf^T [H, TN], dp^T, Xf^T: K = TN
       * contiguous in both operands, the layout TF32 wgmma reads without a transpose) */
      {"dR from K-major copies", CUBLAS_OP_T, CUBLAS_OP_N, H, H3, TN, TN, TN, H, 0.0f, 1, 0, 0, 0},
      {"dW from K-major copies", CUBLAS_OP_T, CUBLAS_OP_N, C, H3, TN, TN, TN, C, 0.0f, 1, 0, 0, 0},
  };
  const float *opA[] = {R, R, R, R, Xf, Hf, W, Hf, Xf}, *opB[] = {dqs, dqs, dqs, dqs, dp, dq, dp, dq, dp};
  for (int pi = 0; pi < 9; pi++) {
    const prod &p = P[pi];
    const double gflop = 2.0 * p.m * p.n * (double)p.k * p.batch * 1e-9;
    const size_t outn = (size_t)p.m * p.n * p.batch;
    const float one = 1.0f;
    auto run_ex = [&](float *o) {
      if (p.batch > 1)
        BK(cublasGemmStridedBatchedEx(hb, p.ta, p.tb, p.m, p.n, p.k, &one, opA[pi], CUDA_R_32F, p.lda, p.sa, opB[pi], CUDA_R_32F,
                                      p.ldb, p.sb, &p.beta, o, CUDA_R_32F, p.ldc, p.sc, p.batch, CUBLAS_COMPUTE_32F_FAST_TF32,
                                      CUBLAS_GEMM_DEFAULT));
      else
        BK(cublasGemmEx(hb, p.ta, p.tb, p.m, p.n, p.k, &one, opA[pi], CUDA_R_32F, p.lda, opB[pi], CUDA_R_32F, p.ldb, &p.beta, o,
                        CUDA_R_32F, p.ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    };
    warm_up([&] { run_ex(out); }, st, 300.0f);
    CK(cudaMemsetAsync(out, 0, outn * 4, st));
    run_ex(out);
    CK(cudaStreamSynchronize(st));
    std::vector<float> ref = fetch(out, outn);
    const float tex = median_call_ms([&] { run_ex(out); }, st, 30, 5);
    printf("\n## %s: m %d n %d k %d batch %d, %.2f GFLOP\n", p.name, p.m, p.n, p.k, p.batch, gflop);
    printf("cublasGemmEx%s: %.4f ms (%.0f TFLOPS)\n", p.batch > 1 ? " strided-batched" : "", tex, gflop / tex);

    cublasLtMatmulDesc_t md;
    BK(cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
    BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof p.ta));
    BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof p.tb));
    cublasLtMatrixLayout_t la, lb, lc;
    BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, p.ta == CUBLAS_OP_N ? p.m : p.k, p.ta == CUBLAS_OP_N ? p.k : p.m, p.lda));
    BK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, p.tb == CUBLAS_OP_N ? p.k : p.n, p.tb == CUBLAS_OP_N ? p.n : p.k, p.ldb));
    BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, p.m, p.n, p.ldc));
    if (p.batch > 1) {
      const int32_t bc = p.batch;
      BK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
      BK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
      BK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
      BK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &p.sa, sizeof p.sa));
      BK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &p.sb, sizeof p.sb));
      BK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &p.sc, sizeof p.sc));
    }
    cublasLtMatmulHeuristicResult_t res[32];
    const int got = lt_heuristic(lt, md, la, lb, lc, wsb, 32, res);
    printf("%-3s %5s %5s %6s %6s %6s %7s %9s %8s %6s %10s\n", "#", "algo", "tile", "splitK", "redux", "stages", "cluster", "ms",
           "TFLOPS", "same", "rel diff");
    for (int r = 0; r < got; r++) {
      const cublasLtMatmulAlgo_t *al = &res[r].algo;
      auto run_lt = [&](float *o) {
        BK(cublasLtMatmul(lt, md, &one, opA[pi], la, opB[pi], lb, &p.beta, o, lc, o, lc, al, ws, wsb, st));
      };
      CK(cudaMemsetAsync(out, 0, outn * 4, st));
      run_lt(out);
      CK(cudaMemsetAsync(out2, 0, outn * 4, st));
      run_lt(out2);
      CK(cudaStreamSynchronize(st));
      std::vector<float> a = fetch(out, outn), b = fetch(out2, outn);
      const int same = memcmp(a.data(), b.data(), outn * 4) == 0;
      const double rd = rel_diff(a, ref);
      warm_up([&] { run_lt(out); }, st, 30.0f);
      const float t = median_call_ms([&] { run_lt(out); }, st, 30, 5);
      printf("%-3d %5d %5d %6d %6d %6d %7d %9.4f %8.0f %6s %10.2e\n", r, cfg(al, CUBLASLT_ALGO_CONFIG_ID),
             cfg(al, CUBLASLT_ALGO_CONFIG_TILE_ID), cfg(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
             cfg(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), cfg(al, CUBLASLT_ALGO_CONFIG_STAGES_ID),
             cfg(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), t, gflop / t, same ? "yes" : "NO", rd);
    }
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(md);
  }
  return 0;
}
