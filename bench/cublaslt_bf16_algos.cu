/*
 * cublaslt_bf16_algos.cu: the TF32 mode's bf16 split GEMMs (kernels/int_gru_backward.cu: dx's rows,
 * dW, dR after the loop, the per-step strided-batched product) as cuBLASLt sees them: for each
 * shape, cublasGemmEx's default choice and every algorithm cuBLASLt's heuristic offers, with the
 * algorithm's attributes and its time (median of 21 launches, CUDA events). One (shape, algorithm)
 * can be run alone once, so that compute-sanitizer racecheck and ncu (kernel names) see only it.
 * Why: racecheck reports hazards inside some of cuBLAS's nvjet bf16 kernels even when cuBLAS runs
 * alone (bench/racecheck_cublas_bf16_probe.cu, bench/sanitize.md run 44); this finds which
 * algorithms report, what their kernels are, and what choosing another costs.
 *   cublaslt_bf16_algos list [ALIGN]      every shape: the default, then the heuristic's algorithms for
 *                                         operands promised ALIGN-byte aligned (default 16)
 *   cublaslt_bf16_algos run S A [ALIGN]   shape S, algorithm A once (A = -1: cublasGemmEx's default)
 * Build: nvcc -arch=sm_90 -O2 -o cublaslt_bf16_algos bench/cublaslt_bf16_algos.cu -lcublasLt -lcublas
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>

/* column-major C [M, N] (ld ldc) = op(A) op(B), batch of them at the given strides */
struct shape {
  const char *name;
  int ta, tb;
  long long M, N, K, lda, ldb, ldc, batch, sA, sB, sC;
};
/* T3 N130 C40 H600 (H3 1800, T N 390; int_gru_bidir_spec's TF32 case), T100 N256 C512 H1024 (large:
 * side chunks of 2048 rows for dx), T3 N130 H33 (the forced per-step case) */
static const shape shapes[] = {
  {"t dx rows", 0, 0, 40, 780, 1800, 40, 1800, 40, 1, 0, 0, 0},
  {"t dW", 0, 1, 40, 3600, 390, 40, 3600, 40, 1, 0, 0, 0},
  {"t dR", 0, 1, 600, 3600, 390, 600, 3600, 600, 1, 0, 0, 0},
  {"t step x4", 0, 0, 600, 260, 450, 600, 1800, 600, 4, 450 * 600, 450, 260 * 600},
  {"f step", 0, 0, 33, 260, 99, 33, 99, 33, 1, 0, 0, 0},
  {"f dR", 0, 1, 33, 198, 390, 33, 198, 33, 1, 0, 0, 0},
  {"l dx rows", 0, 0, 512, 4096, 3072, 512, 3072, 512, 1, 0, 0, 0},
  {"l dW", 0, 1, 512, 6144, 25600, 512, 6144, 512, 1, 0, 0, 0},
  {"l dR", 0, 1, 1024, 6144, 25600, 1024, 6144, 1024, 1, 0, 0, 0},
  {"l step x4", 0, 0, 1024, 512, 768, 1024, 3072, 1024, 4, 768 * 1024, 768, 512 * 1024},
};
enum { NSHAPES = sizeof shapes / sizeof shapes[0], MAXALGO = 16 };
static const size_t WS = (size_t)32 << 20;

struct plan {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t la, lb, lc;
  cublasLtMatmulHeuristicResult_t res[MAXALGO];
  int n;
};

static void die(const char *what, int s) {
  if (s) { fprintf(stderr, "%s failed: %d\n", what, s); exit(2); }
}

static void layout(cublasLtMatrixLayoutOpaque_t *l, long long rows, long long cols, long long ld, long long batch, long long stride, cudaDataType t) {
  die("layout", cublasLtMatrixLayoutInit(l, t, (uint64_t)rows, (uint64_t)cols, ld));
  if (batch > 1) {
    int b = (int)batch;
    die("batch", cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
    die("stride", cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

static void make_plan(cublasLtHandle_t h, const shape &s, plan *p, uint32_t align) {
  const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  die("desc", cublasLtMatmulDescInit(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  die("ta", cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  die("tb", cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  layout(&p->la, s.ta ? s.K : s.M, s.ta ? s.M : s.K, s.lda, s.batch, s.sA, CUDA_R_16BF);
  layout(&p->lb, s.tb ? s.N : s.K, s.tb ? s.K : s.N, s.ldb, s.batch, s.sB, CUDA_R_16BF);
  layout(&p->lc, s.M, s.N, s.ldc, s.batch, s.sC, CUDA_R_32F);
  cublasLtMatmulPreferenceOpaque_t pref;
  size_t wsz = WS;
  die("pref", cublasLtMatmulPreferenceInit(&pref));
  die("pref ws", cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
  /* the operands' promised alignment: below 16 bytes, the kernels that load by TMA (nvjet) are out */
  die("pref align A", cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align));
  die("pref align B", cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align));
  p->n = 0;
  die("heuristic", cublasLtMatmulAlgoGetHeuristic(h, &p->op, &p->la, &p->lb, &p->lc, &p->lc, &pref, MAXALGO, p->res, &p->n));
}

static void *A, *B, *Cm, *ws;

static int run_one(cublasHandle_t hb, cublasLtHandle_t h, const shape &s, plan *p, int a, cudaStream_t st) {
  const float one = 1.0f, zero = 0.0f;
  if (a < 0)
    return (int)cublasGemmStridedBatchedEx(hb, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)s.M, (int)s.N, (int)s.K,
                                           &one, A, CUDA_R_16BF, (int)s.lda, s.sA, B, CUDA_R_16BF, (int)s.ldb, s.sB, &zero, Cm, CUDA_R_32F,
                                           (int)s.ldc, s.sC, (int)s.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return (int)cublasLtMatmul(h, &p->op, &one, A, &p->la, B, &p->lb, &zero, Cm, &p->lc, Cm, &p->lc, &p->res[a].algo, ws, WS, st);
}

static int attr(const cublasLtMatmulAlgo_t *al, cublasLtMatmulAlgoConfigAttributes_t k) {
  int v = 0;
  size_t w = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(al, k, &v, sizeof v, &w) != CUBLAS_STATUS_SUCCESS) return -1;
  return v;
}

static double time_one(cublasHandle_t hb, cublasLtHandle_t h, const shape &s, plan *p, int a, cudaStream_t st) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float t[21];
  for (int w = 0; w < 3; w++)
    if (run_one(hb, h, s, p, a, st)) return -1;
  for (int r = 0; r < 21; r++) {
    cudaEventRecord(e0, st);
    run_one(hb, h, s, p, a, st);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&t[r], e0, e1);
  }
  std::sort(t, t + 21);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1e3 * t[10];
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s list | run S A\n", argv[0]); return 2; }
  const size_t big = (size_t)256 << 20;
  die("malloc", cudaMalloc(&A, big) || cudaMalloc(&B, big) || cudaMalloc(&Cm, big) || cudaMalloc(&ws, WS));
  cudaMemset(A, 0, big);
  cudaMemset(B, 0, big);
  cublasHandle_t hb;
  die("cublasCreate", cublasCreate(&hb));
  cublasSetWorkspace(hb, ws, WS);
  cudaStream_t st = 0;
  const cublasLtHandle_t h = (cublasLtHandle_t)hb;
  static plan plans[NSHAPES];
  if (argv[1][0] == 'r' && argc >= 4) {
    const int si = atoi(argv[2]), a = atoi(argv[3]);
    const uint32_t align = argc > 4 ? (uint32_t)atoi(argv[4]) : 16;
    if (si < 0 || si >= NSHAPES) return 2;
    make_plan(h, shapes[si], &plans[si], align);
    if (a >= plans[si].n) return 3;
    const int s = run_one(hb, h, shapes[si], &plans[si], a, st);
    const cudaError_t e = cudaDeviceSynchronize();
    printf("run %d %s algo %d: status %d, %s\n", si, shapes[si].name, a, s, cudaGetErrorString(e));
    return s != 0 || e != cudaSuccess;
  }
  const uint32_t align = argc > 2 ? (uint32_t)atoi(argv[2]) : 16;
  printf("operands promised %u-byte aligned\n", align);
  for (int si = 0; si < NSHAPES; si++) {
    const shape &s = shapes[si];
    plan *p = &plans[si];
    make_plan(h, s, p, align);
    printf("shape %d %-10s M %5lld N %5lld K %5lld batch %lld: %d algorithms; default %.2f us\n", si, s.name, s.M, s.N, s.K, s.batch, p->n,
           time_one(hb, h, s, p, -1, st));
    for (int a = 0; a < p->n; a++) {
      const cublasLtMatmulAlgo_t *al = &p->res[a].algo;
      printf("  algo %2d id %3d tile %3d stages %3d splitk %2d red %d swz %d custom %d cluster %2d inner %2d waves %.2f ws %zu: %.2f us\n", a,
             attr(al, CUBLASLT_ALGO_CONFIG_ID), attr(al, CUBLASLT_ALGO_CONFIG_TILE_ID), attr(al, CUBLASLT_ALGO_CONFIG_STAGES_ID),
             attr(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), attr(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
             attr(al, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), attr(al, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
             attr(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), attr(al, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID), p->res[a].wavesCount,
             p->res[a].workspaceSize, time_one(hb, h, s, p, a, st));
    }
  }
  cublasDestroy(hb);
  return 0;
}
