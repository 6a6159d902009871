/*
 * bf16_split_gemm.cu: can the STE backward's float GEMMs at the large bench shape (T100 N256 C512
 * H1024) run on bf16 tensor cores without losing precision? Each of those products has one
 * operand that is a fake-quantized tensor of at most 8 bits, (q - z) 2^-e, exact in bf16 (at most
 * 8 significant bits, fp32's exponent range), and one float operand (dq or dp). Splitting the float
 * operand into P bf16 pieces (hi = bf16(x), mid = bf16(x - hi), lo = ...) makes every product
 * exact: P = 2 carries 16 significant bits (TF32 carries 11), P = 3 all 24 (fp32's). Here each
 * product runs as the code runs it today (TF32 and strict fp32 SGEMM) and as P = 2 and P = 3 bf16
 * GEMMs (the pieces as extra columns of the float operand, "M-concat": the consumer adds the P
 * partial results in a fixed order; or as extra K, "K-concat": the exact operand repeated P times,
 * one accumulation), each timed (cublasGemmEx's default and the best of cuBLASLt's heuristic, CUDA
 * events, median of 30 after a 0.3-s warm-up) and compared with an fp64 GEMM of the same operands
 * (largest |error| over the largest |value|, and the mean |error| over the mean |value|).
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 bench/bf16_split_gemm.cu -lcublasLt -lcublas -o bf16_split_gemm
 */
#include "cuda_bench.cuh"

#include <algorithm>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

/* the float operand: normal-ish values over ~10 binades; the exact one: integers in [-127, 127] 2^-7 */
__global__ void fill_kernel(float *x, double *xd, size_t n, unsigned seed, int exact) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    float v;
    if (exact) v = (float)((int)(h % 255u) - 127) * (1.0f / 128.0f);
    else v = ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * exp2f(-(float)((h >> 24) % 10u));
    x[i] = v;
    xd[i] = (double)v;
  }
}

/* pieces [P][n] of x: piece k = bf16(x - pieces before it) */
__global__ void split_kernel(__nv_bfloat16 *p, const float *x, size_t n, int P) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float r = x[i];
    for (int k = 0; k < P; k++) {
      const __nv_bfloat16 b = __float2bfloat16_rn(r);
      p[k * n + i] = b;
      r -= __bfloat162float(b);
    }
  }
}
/* K-concat layout: rows of x [rows][cols] become [rows][P cols] (piece k at column block k) */
__global__ void split_k_kernel(__nv_bfloat16 *p, const float *x, size_t rows, size_t cols, int P) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * cols; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r0 = i / cols, c0 = i % cols;
    float r = x[i];
    for (int k = 0; k < P; k++) {
      const __nv_bfloat16 b = __float2bfloat16_rn(r);
      p[r0 * P * cols + k * cols + c0] = b;
      r -= __bfloat162float(b);
    }
  }
}
__global__ void to_bf16_kernel(__nv_bfloat16 *o, const float *x, size_t n, int reps, size_t rep_stride) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    for (int k = 0; k < reps; k++) o[k * rep_stride + i] = __float2bfloat16_rn(x[i]);
}
/* out[i] = sum over pieces k (in order) of part[k][i] */
__global__ void sum_pieces_kernel(float *o, const float *part, size_t n, int P) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float s = part[i];
    for (int k = 1; k < P; k++) s += part[k * n + i];
    o[i] = s;
  }
}

struct errs { double max_rel, mean_rel; };
static errs compare(const float *d, const double *ref, size_t n) {
  std::vector<float> a(n); std::vector<double> r(n);
  CK(cudaMemcpy(a.data(), d, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.data(), ref, n * 8, cudaMemcpyDeviceToHost));
  double mx = 0, me = 0, sa = 0, se = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - r[i]);
    mx = std::max(mx, fabs(r[i])); me = std::max(me, e); sa += fabs(r[i]); se += e;
  }
  return {me / mx, se / sa};
}

/* Product: column-major C [m, n] = A [m, k] (lda, op N or T as stored) x B [k, n] (op N or T). One
 * row-major view for each as int_gru_backward.cu calls them. */
struct prod {
  const char *name;
  cublasOperation_t ta, tb;
  int m, n, k;
  size_t arows, acols, brows, bcols;   /* A and B as stored, column-major: lda = arows, ldb = brows */
  int exact_is_a;                      /* which operand is the fake-quantized one */
};

static cublasLtHandle_t lt;
static void *ws;
static const size_t wsb = 64u << 20;

/* best of cublasGemmEx and cuBLASLt's heuristic for a bf16 or fp32 product */
static float best_time(cublasHandle_t hb, cudaStream_t st, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                       const void *A, int lda, const void *B, int ldb, float *C, int ldc, cudaDataType dt,
                       cublasComputeType_t ct, int *best_algo) {
  const float one = 1.0f, zero = 0.0f;
  float best = time_ms([&] { BK(cublasGemmEx(hb, ta, tb, m, n, k, &one, A, dt, lda, B, dt, ldb, &zero, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT)); }, st);
  *best_algo = -1;
  cublasLtMatmulDesc_t md;
  BK(cublasLtMatmulDescCreate(&md, ct, CUDA_R_32F));
  BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  BK(cublasLtMatrixLayoutCreate(&la, dt, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
  BK(cublasLtMatrixLayoutCreate(&lb, dt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
  BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc));
  cublasLtMatmulPreference_t pref;
  BK(cublasLtMatmulPreferenceCreate(&pref));
  BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  cublasLtMatmulHeuristicResult_t res[8];
  int got = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pref, 8, res, &got) != CUBLAS_STATUS_SUCCESS) got = 0;
  for (int r = 0; r < got; r++) {
    const float t = time_ms([&] { BK(cublasLtMatmul(lt, md, &one, A, la, B, lb, &zero, C, lc, C, lc, &res[r].algo, ws, wsb, st)); }, st);
    if (t < best) { best = t; *best_algo = r; }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(md);
  return best;
}

int main() {
  const int T = 100, N = 256, C = 512, H = 1024, H3 = 3 * H, TN = T * N;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# %s, %d SMs; ms = best of cublasGemmEx and cuBLASLt's first 8 heuristic algorithms, median of 30\n", prop.name, prop.multiProcessorCount);
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cublasHandle_t hb; BK(cublasCreate(&hb)); BK(cublasSetStream(hb, st));
  BK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, wsb));
  /* row-major: R~ [3H, H], dq_s [N, 3H] (one step), dq [TN, 3H], Hf [TN, H], Xf [TN, C], W~ [3H, C], dp [TN, 3H] */
  /* column-major products (as cuBLAS sees the row-major buffers):
   *   step: dh^T [H, N] = R~^T [H, 3H] (R~ row-major = col-major [H, 3H], op N) x dq_s^T [3H, N] (op N)
   *   dR:   dR^T [H, 3H] = Hf^T [H, TN] (op N) x dq [TN, 3H] (stored col-major [3H, TN], op T)
   *   dW:   dW^T [C, 3H] = Xf^T [C, TN] (op N) x dp (op T)
   *   dx:   dx^T [C, TN] = W~^T [C, 3H] (op N) x dp^T [3H, TN] (op N) */
  const prod P[] = {
      {"step dq_s R~ (one GEMM)", CUBLAS_OP_N, CUBLAS_OP_N, H, N, H3, H, H3, H3, N, 1},
      {"dR = dq^T Hf", CUBLAS_OP_N, CUBLAS_OP_T, H, H3, TN, H, TN, H3, TN, 1},
      {"dW = dp^T Xf", CUBLAS_OP_N, CUBLAS_OP_T, C, H3, TN, C, TN, H3, TN, 1},
      {"dx = dp W~", CUBLAS_OP_N, CUBLAS_OP_N, C, TN, H3, C, H3, H3, TN, 1},
  };
  const size_t maxA = (size_t)TN * H3, maxOut = (size_t)C * TN * 4;
  float *Af, *Bf, *Cf; double *Ad, *Bd, *Cd;
  __nv_bfloat16 *Ab, *Bb;
  CK(cudaMalloc(&Af, maxA * 4)); CK(cudaMalloc(&Bf, maxA * 4)); CK(cudaMalloc(&Cf, maxOut * 4));
  CK(cudaMalloc(&Ad, maxA * 8)); CK(cudaMalloc(&Bd, maxA * 8)); CK(cudaMalloc(&Cd, (size_t)C * TN * 8));
  CK(cudaMalloc(&Ab, maxA * 2 * 3)); CK(cudaMalloc(&Bb, maxA * 2 * 3));
  for (const prod &p : P) {
    const size_t an = p.arows * p.acols, bn = p.brows * p.bcols, cn = (size_t)p.m * p.n;
    fill_kernel<<<1024, 256, 0, st>>>(Af, Ad, an, 11, 1);   /* A: the fake-quantized operand in all four */
    fill_kernel<<<1024, 256, 0, st>>>(Bf, Bd, bn, 23, 0);
    const double one = 1.0, zero = 0.0;
    BK(cublasDgemm(hb, p.ta, p.tb, p.m, p.n, p.k, &one, Ad, (int)p.arows, Bd, (int)p.brows, &zero, Cd, p.m));
    CK(cudaStreamSynchronize(st));
    const double gflop = 2.0 * p.m * p.n * (double)p.k * 1e-9;
    printf("\n## %s: m %d n %d k %d, %.2f GFLOP (one pass)\n", p.name, p.m, p.n, p.k, gflop);
    printf("%-34s %9s %5s %11s %11s\n", "variant", "ms", "algo", "max rel err", "mean rel err");
    int al;
    float t;
    errs e;
    BK(cublasSetMathMode(hb, CUBLAS_DEFAULT_MATH));
    t = best_time(hb, st, p.ta, p.tb, p.m, p.n, p.k, Af, (int)p.arows, Bf, (int)p.brows, Cf, p.m, CUDA_R_32F, CUBLAS_COMPUTE_32F, &al);
    e = compare(Cf, Cd, cn);
    printf("%-34s %9.4f %5d %11.2e %11.2e\n", "fp32 strict (SGEMM)", t, al, e.max_rel, e.mean_rel);
    t = best_time(hb, st, p.ta, p.tb, p.m, p.n, p.k, Af, (int)p.arows, Bf, (int)p.brows, Cf, p.m, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, &al);
    e = compare(Cf, Cd, cn);
    printf("%-34s %9.4f %5d %11.2e %11.2e\n", "tf32", t, al, e.max_rel, e.mean_rel);
    for (int np = 1; np <= 3; np++) {
      /* M-concat: B's pieces as P times the columns (B [k, n] col-major: pieces along n when op N;
       * when op T B is stored [n, k] col-major: pieces along its rows (ld P n)). */
      to_bf16_kernel<<<1024, 256, 0, st>>>(Ab, Af, an, 1, 0);
      float *parts = Cf + cn;   /* [P][m n] */
      if (p.tb == CUBLAS_OP_N) {
        split_kernel<<<1024, 256, 0, st>>>(Bb, Bf, bn, np);   /* [P][bcols][brows]: columns appended */
        t = best_time(hb, st, p.ta, p.tb, p.m, np * p.n, p.k, Ab, (int)p.arows, Bb, (int)p.brows, parts, p.m, CUDA_R_16BF, CUBLAS_COMPUTE_32F, &al);
      } else {
        /* B stored col-major [n rows, k cols] (ld n): pieces stacked per column -> ld P n */
        split_k_kernel<<<1024, 256, 0, st>>>(Bb, Bf, p.bcols, p.brows, np);   /* [k][P][n] */
        /* parts is then [P n rows][m]? no: C [m, P n] col-major with ldc m: piece k = columns k n .. */
        t = best_time(hb, st, p.ta, p.tb, p.m, np * p.n, p.k, Ab, (int)p.arows, Bb, (int)(np * p.brows), parts, p.m, CUDA_R_16BF, CUBLAS_COMPUTE_32F, &al);
      }
      sum_pieces_kernel<<<1024, 256, 0, st>>>(Cf, parts, cn, np);
      CK(cudaStreamSynchronize(st));
      e = compare(Cf, Cd, cn);
      char nm[64];
      snprintf(nm, sizeof nm, "bf16 x%d, M-concat (+%d-piece sum)", np, np);
      printf("%-34s %9.4f %5d %11.2e %11.2e\n", nm, t, al, e.max_rel, e.mean_rel);
    }
  }
  return 0;
}
