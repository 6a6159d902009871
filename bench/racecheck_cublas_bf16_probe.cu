/*
 * racecheck_cublas_bf16_probe.cu: cuBLAS's bf16 GEMMs alone (no qgru code), as the TF32 mode's STE
 * backward calls them (kernels/int_gru_bwd_after.cuh gemm_bf16_rm_on: row-major C [m, n] f32 =
 * op(A) op(B), bf16 A and B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), at the sizes of
 * tests/lua/int_gru_bidir_spec.lua's T3 N130 C40 H600 case, to be run under
 *   compute-sanitizer --tool racecheck ./racecheck_cublas_bf16_probe
 * Why: racecheck reported shared-memory hazards inside cuBLAS's own nvjet_sm90_tss_* kernels in
 * that case (bench/sanitize.md, session 43); this says whether cuBLAS reports them without us.
 * Build: nvcc -arch=sm_90 -O2 -o racecheck_cublas_bf16_probe bench/racecheck_cublas_bf16_probe.cu -lcublas
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>

static int gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B,
                int ldb, float *C) {
  const float one = 1.0f, zero = 0.0f;
  return (int)cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, B, CUDA_R_16BF, ldb, A,
                           CUDA_R_16BF, lda, &zero, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

int main(void) {
  const int T = 3, N = 130, C = 40, H = 600, H3 = 3 * H, TN = T * N;
  const size_t big = (size_t)8 << 20;
  __nv_bfloat16 *A, *B;
  float *Cm;
  if (cudaMalloc(&A, big * 2) || cudaMalloc(&B, big * 2) || cudaMalloc(&Cm, big * 4)) { printf("cudaMalloc failed\n"); return 1; }
  cudaMemset(A, 0, big * 2);
  cudaMemset(B, 0, big * 2);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { printf("cublasCreate failed\n"); return 1; }
  struct { const char *what; int ta, tb, m, n, k, lda, ldb; } calls[] = {
    {"dx rows: [2 rows, 3H] x W~ [3H, C]", 0, 0, 2 * TN, C, H3, H3, C},
    {"dW: dp^T [2 3H, TN] x x~ [TN, C]", 1, 0, 2 * H3, C, TN, 2 * H3, C},
    {"dR: dq^T [2 3H, TN] x h~ [TN, H]", 1, 0, 2 * H3, H, TN, 2 * H3, H},
    {"per step, rows 0-71: [2 72, 3H] x R~ [3H, H]", 0, 0, 2 * 72, H, H3, H3, H},
    {"per step, rows 72-129: [2 58, 3H] x R~ [3H, H]", 0, 0, 2 * 58, H, H3, H3, H},
  };
  int bad = 0;
  for (unsigned i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    const int s = gemm(h, calls[i].ta, calls[i].tb, calls[i].m, calls[i].n, calls[i].k, A, calls[i].lda, B, calls[i].ldb, Cm);
    const cudaError_t e = cudaDeviceSynchronize();
    printf("%-48s m %5d n %4d k %5d: cublas %d, %s\n", calls[i].what, calls[i].m, calls[i].n, calls[i].k, s, cudaGetErrorString(e));
    bad += s != 0 || e != cudaSuccess;
  }
  cublasDestroy(h);
  printf("racecheck_cublas_bf16_probe: %d failing call(s)\n", bad);
  return bad != 0;
}
