/*
 * int_gru_wx_lt.cuh: the integer GRU forward's W x product on cuBLASLt (int8 x int8 -> int32) for
 * the GPU-wide recurrence (tc_grid_kernel): the plans cached by size in the context, and the call
 * launched as a captured graph from its second use (qg_cuda_graphed), since cublasLtMatmul's host
 * time (58-68 us a call, bench/cuda_int_gru.md session 49) kept the GPU waiting.
 * Included once by kernels/int_gru.cu (after its includes); qg_cuda_int_gru_forward calls
 * lt_wx_usable and lt_wx_run.
 */

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
