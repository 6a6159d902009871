/*
 * xs_step_lt.cu: the strict STE backward's per-step int8 product (kernels/exact_split.cuh's
 * xs_gemm: P [4 nr, H] int32 = Dq [4 nr, Kp] RT [H, Kp]^T, both K-contiguous) at the large bench
 * shape, timed as the loop runs it: the two row groups' products on two streams at once, 100
 * steps captured in one CUDA graph, against every configuration cuBLASLt accepts for the product.
 *
 * Why: in session 27's breakdown the per-step products alone took 19 us a step for the two groups
 * (1.92 ms of the 3.2-ms loop), about 355 TOPS, while the product is 6.4 GOP a step; at 128 x 64
 * tiles each CTA reads (128 + 64) K bytes from L2, 75 MB a step in all. Larger tiles, cluster
 * multicast or split-K trade that traffic against how many multiprocessors work; this sweep
 * measures which trade wins where the two groups share the GPU. The sums are integers, so every
 * configuration must give the same bits as cublasGemmEx (checked for each).
 *
 * Phase 1: every (algo id, tile, stages, split-K, cluster shape, swizzle) that
 * cublasLtMatmulAlgoCheck accepts, timed alone (median of 9 bursts of 20 launches). Phase 2: the
 * fastest 16 of phase 1 and the heuristic's first 8, each run as the loop runs it (two groups of nr
 * rows on two streams, 100 steps in a graph; median of 15 graph launches), against cublasGemmEx.
 * One group of all 2 nr rows is measured the same way.
 * With S > 1 K slices (the library's `slices`, summed by the next step kernel) each group's product
 * is S products of K / S as one strided batch into S separate outputs, no reduction: larger tiles
 * with the device still full (session 30's question); the bits checked are the slices' sum.
 *
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 bench/xs_step_lt.cu -lcublasLt -lcublas -o xs_step_lt
 * Run:   ./xs_step_lt [nr=128] [H=1024] [S=1]
 */
#include <cublasLt.h>
#include <stdint.h>
#include <string.h>

#include "cuda_bench.cuh"   /* CK, BK, median, lt_heuristic */

enum { GROUPS = 2, STEPS = 100 };

struct config {
  cublasLtMatmulAlgo_t algo;
  int id, tile, stages, splitk, cluster, swizzle;
  float alone_us, loop_us;
  int same;
};

static int8_t *dev_digits(size_t n, unsigned seed) {
  std::vector<int8_t> h(n);
  srand(seed);
  for (size_t i = 0; i < n; i++) h[i] = (int8_t)(rand() % 256 - 128);
  int8_t *d;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice));
  return d;
}

static int cfg_get(const cublasLtMatmulAlgo_t *al, cublasLtMatmulAlgoConfigAttributes_t at) {
  uint32_t u = 0;
  uint16_t s = 0;
  int32_t v = 0;
  size_t w = 0;
  if (at == CUBLASLT_ALGO_CONFIG_ID || at == CUBLASLT_ALGO_CONFIG_SPLITK_NUM || at == CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) {
    cublasLtMatmulAlgoConfigGetAttribute(al, at, &v, sizeof v, &w);
    return v;
  }
  cublasLtMatmulAlgoConfigGetAttribute(al, at, &s, sizeof s, &w);
  if (w != sizeof s) {
    cublasLtMatmulAlgoConfigGetAttribute(al, at, &u, sizeof u, &w);
    return (int)u;
  }
  return s;
}

int main(int argc, char **argv) {
  const int nr = argc > 1 ? atoi(argv[1]) : 128, H = argc > 2 ? atoi(argv[2]) : 1024, S = argc > 3 ? atoi(argv[3]) : 1;
  const int M = 4 * nr, Kp = (3 * H + 15) / 16 * 16, Kc = Kp / S;
  if (S < 1 || Kp % (16 * S)) { fprintf(stderr, "S = %d must divide K = %d into multiples of 16\n", S, Kp); return 2; }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double gop = 2.0 * M * (double)H * Kp * 1e-9;
  printf("# %s, %d SMs, L2 %d MB; per group: M %d (4 digits x %d rows), N %d, K %d in %d slices: %.2f GOP; %d groups\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, M, nr, H, Kp, S, gop, GROUPS);
  cudaStream_t st[GROUPS];
  cublasHandle_t hb[GROUPS];
  for (int g = 0; g < GROUPS; g++) {
    CK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
    BK(cublasCreate(&hb[g]));
    BK(cublasSetStream(hb[g], st[g]));
  }
  cublasLtHandle_t lt;
  BK(cublasLtCreate(&lt));
  const size_t wsb = 32u << 20;
  void *ws[GROUPS];
  int8_t *D[GROUPS];
  int32_t *P[GROUPS];
  int8_t *RT = dev_digits((size_t)H * Kp, 1);
  for (int g = 0; g < GROUPS; g++) {
    CK(cudaMalloc(&ws[g], wsb));
    D[g] = dev_digits((size_t)M * Kp, 2 + g);
    CK(cudaMalloc(&P[g], (size_t)S * M * H * 4));
  }
  int32_t *Pall;   /* one group of all rows */
  int8_t *Dall = dev_digits((size_t)2 * M * Kp, 7);
  CK(cudaMalloc(&Pall, (size_t)S * 2 * M * H * 4));
  const int32_t one = 1, zero = 0;

  /* cublasGemmEx as xs_gemm runs it: column-major C^T [H, M] = RT^T D (S > 1: slice j of K into C + j M H) */
  auto gemm_ex = [&](int g, int32_t *C, const int8_t *A, int m) {
    if (S == 1)
      BK(cublasGemmEx(hb[g], CUBLAS_OP_T, CUBLAS_OP_N, H, m, Kp, &one, RT, CUDA_R_8I, Kp, A, CUDA_R_8I, Kp, &zero, C, CUDA_R_32I, H,
                      CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
    else
      BK(cublasGemmStridedBatchedEx(hb[g], CUBLAS_OP_T, CUBLAS_OP_N, H, m, Kc, &one, RT, CUDA_R_8I, Kp, Kc, A, CUDA_R_8I, Kp, Kc, &zero, C,
                                    CUDA_R_32I, H, (long long)m * H, S, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
  };
  /* the slices' sum of group 0's product (what the step kernel adds) */
  auto sum_of = [&](std::vector<int32_t> &out) {
    std::vector<int32_t> all((size_t)S * M * H);
    CK(cudaMemcpy(all.data(), P[0], all.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < out.size(); e++) {
      int32_t v = 0;
      for (int j = 0; j < S; j++) v += all[(size_t)j * M * H + e];
      out[e] = v;
    }
  };
  gemm_ex(0, P[0], D[0], M);
  CK(cudaStreamSynchronize(st[0]));
  std::vector<int32_t> ref((size_t)M * H), got((size_t)M * H);
  sum_of(ref);

  cublasLtMatmulDesc_t md;
  BK(cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  BK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc, lb2, lc2;
  BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, Kc, H, Kp));
  BK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, Kc, M, Kp));
  BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32I, H, M, H));
  BK(cublasLtMatrixLayoutCreate(&lb2, CUDA_R_8I, Kc, 2 * M, Kp));
  BK(cublasLtMatrixLayoutCreate(&lc2, CUDA_R_32I, H, 2 * M, H));
  if (S > 1) {   /* the K slices as a strided batch: operands step Kc along K, outputs one product apart */
    const int32_t bc = S;
    const int64_t sk = Kc, sc = (int64_t)M * H, sc2 = 2 * sc;
    for (cublasLtMatrixLayout_t l : {la, lb, lc, lb2, lc2}) BK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    for (cublasLtMatrixLayout_t l : {la, lb, lb2}) BK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sk, sizeof sk));
    BK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc));
    BK(cublasLtMatrixLayoutSetAttribute(lc2, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc2, sizeof sc2));
  }
  auto lt_run = [&](const cublasLtMatmulAlgo_t *al, int g, int32_t *C, const int8_t *A, int all) {
    return cublasLtMatmul(lt, md, &one, RT, la, A, all ? lb2 : lb, &zero, C, all ? lc2 : lc, C, all ? lc2 : lc, al, ws[g], wsb, st[g]);
  };

  /* us a step of a graph of STEPS steps captured on st[0] by capture() (median of 15 launches) */
  auto graph_us = [&](auto capture) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st[0], cudaStreamCaptureModeThreadLocal));
    capture();
    CK(cudaStreamEndCapture(st[0], &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st[0]));
    const float ms = median_call_ms([&] { CK(cudaGraphLaunch(ge, st[0])); }, st[0], 15, 1);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    return ms * 1e3f / STEPS;
  };
  /* the loop as the backward runs it: per step, each group's product on its stream */
  auto loop_graph = [&](auto prod_of_group) {
    cudaEvent_t fork, join[GROUPS];
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int g = 0; g < GROUPS; g++) CK(cudaEventCreateWithFlags(&join[g], cudaEventDisableTiming));
    const float us = graph_us([&] {
      CK(cudaEventRecord(fork, st[0]));
      for (int g = 1; g < GROUPS; g++) CK(cudaStreamWaitEvent(st[g], fork, 0));
      for (int s = 0; s < STEPS; s++)
        for (int g = 0; g < GROUPS; g++) prod_of_group(g);
      for (int g = 1; g < GROUPS; g++) {
        CK(cudaEventRecord(join[g], st[g]));
        CK(cudaStreamWaitEvent(st[0], join[g], 0));
      }
    });
    CK(cudaEventDestroy(fork));
    for (int g = 0; g < GROUPS; g++) CK(cudaEventDestroy(join[g]));
    return us;
  };
  auto one_group_graph = [&](auto prod_all) {
    return graph_us([&] { for (int s = 0; s < STEPS; s++) prod_all(); });
  };
  /* warm the clocks */
  for (int i = 0; i < 20; i++) loop_graph([&](int g) { gemm_ex(g, P[g], D[g], M); });
  const float ex_alone = median_call_ms([&] { for (int i = 0; i < 20; i++) gemm_ex(0, P[0], D[0], M); }, st[0], 9, 1) * 1e3f / 20;
  const float ex_loop = loop_graph([&](int g) { gemm_ex(g, P[g], D[g], M); });
  const float ex_one = one_group_graph([&] { gemm_ex(0, Pall, Dall, 2 * M); });
  printf("cublasGemmEx: alone %.2f us (%.0f TOPS); loop of %d groups %.2f us a step; one group of %d rows %.2f us a step\n", ex_alone,
         gop / ex_alone * 1e3, GROUPS, ex_loop, 2 * nr, ex_one);

  /* phase 1: every configuration cublasLtMatmulAlgoCheck accepts */
  int ids[128], nid = 0;
  BK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_8I, CUDA_R_32I, CUDA_R_32I, 128, ids, &nid));
  std::vector<config> cfgs;
  int checked = 0;
  for (int a = 0; a < nid; a++) {
    cublasLtMatmulAlgo_t al;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_8I, CUDA_R_32I, CUDA_R_32I, ids[a], &al) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    uint32_t tiles[128], stages[128];
    size_t wt = 0, wsg = 0;
    cublasLtMatmulAlgoCapGetAttribute(&al, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &wt);
    cublasLtMatmulAlgoCapGetAttribute(&al, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof stages, &wsg);
    int nt = (int)(wt / 4), ns = (int)(wsg / 4);
    if (nt == 0) { tiles[0] = CUBLASLT_MATMUL_TILE_UNDEFINED; nt = 1; }
    if (ns == 0) { stages[0] = CUBLASLT_MATMUL_STAGES_UNDEFINED; ns = 1; }
    int32_t splitk_ok = 0, swz_ok = 0;
    size_t w1;
    cublasLtMatmulAlgoCapGetAttribute(&al, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, &w1);
    cublasLtMatmulAlgoCapGetAttribute(&al, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &w1);
    const int splits[] = {1, 2, 3, 4};
    for (int t = 0; t < nt; t++)
      for (int s = 0; s < ns; s++)
        for (int k = 0; k < (splitk_ok ? 4 : 1); k++)
          for (int c = 0; c < CUBLASLT_CLUSTER_SHAPE_END; c++)
            for (int z = 0; z <= (swz_ok ? 1 : 0); z++) {
              cublasLtMatmulAlgo_t x = al;
              const uint16_t tile = (uint16_t)tiles[t], stg = (uint16_t)stages[s], cl = (uint16_t)c;
              const int32_t sk = splits[k], sw = z;
              const uint32_t redux = sk > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
              uint32_t tile32 = tiles[t], stg32 = stages[s];
              if (cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile32, sizeof tile32) != CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) != CUBLAS_STATUS_SUCCESS)
                continue;
              if (cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stg32, sizeof stg32) != CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stg, sizeof stg) != CUBLAS_STATUS_SUCCESS)
                continue;
              uint32_t cl32 = cl;
              if (cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl32, sizeof cl32) != CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl) != CUBLAS_STATUS_SUCCESS &&
                  c != 0)
                continue;
              cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk);
              cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &redux, sizeof redux);
              cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof sw);
              cublasLtMatmulHeuristicResult_t hr;
              checked++;
              if (cublasLtMatmulAlgoCheck(lt, md, la, lb, lc, lc, &x, &hr) != CUBLAS_STATUS_SUCCESS || hr.workspaceSize > wsb) continue;
              config cf = {};
              cf.algo = x;
              cf.id = ids[a]; cf.tile = tiles[t]; cf.stages = stages[s]; cf.splitk = sk; cf.cluster = c; cf.swizzle = z;
              cfgs.push_back(cf);
            }
  }
  /* the heuristic's first 8 as well */
  cublasLtMatmulHeuristicResult_t hres[8];
  const int nh = lt_heuristic(lt, md, la, lb, lc, wsb, 8, hres);
  const size_t heur0 = cfgs.size();
  for (int i = 0; i < nh; i++) {
    config cf = {};
    cf.algo = hres[i].algo;
    cf.id = cfg_get(&cf.algo, CUBLASLT_ALGO_CONFIG_ID);
    cf.tile = cfg_get(&cf.algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
    cf.stages = cfg_get(&cf.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID);
    cf.splitk = cfg_get(&cf.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    cf.cluster = cfg_get(&cf.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
    cf.swizzle = cfg_get(&cf.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
    cfgs.push_back(cf);
  }
  printf("# %d algo ids, %d configurations tried, %zu accepted, %d from the heuristic\n", nid, checked, heur0, nh);
  fflush(stdout);
  for (size_t i = 0; i < cfgs.size(); i++) {
    config &cf = cfgs[i];
    if (lt_run(&cf.algo, 0, P[0], D[0], 0) != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(st[0]) != cudaSuccess) {
      (void)cudaGetLastError();
      cf.alone_us = 1e9f;
      continue;
    }
    sum_of(got);
    cf.same = memcmp(got.data(), ref.data(), got.size() * 4) == 0;
    cf.alone_us = median_call_ms([&] { for (int r = 0; r < 20; r++) lt_run(&cf.algo, 0, P[0], D[0], 0); }, st[0], 9, 1) * 1e3f / 20;
  }
  std::vector<size_t> order(heur0);
  for (size_t i = 0; i < heur0; i++) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cfgs[a].alone_us < cfgs[b].alone_us; });
  std::vector<size_t> sel(order.begin(), order.begin() + std::min<size_t>(16, order.size()));
  for (size_t i = heur0; i < cfgs.size(); i++) sel.push_back(i);

  /* phase 2: as the loop runs them */
  for (size_t i : sel) {
    config &cf = cfgs[i];
    if (cf.alone_us >= 1e9f) continue;
    cf.loop_us = loop_graph([&](int g) { BK(lt_run(&cf.algo, g, P[g], D[g], 0)); });
  }
  printf("\n%-5s %5s %5s %6s %6s %7s %4s %9s %7s %10s %5s\n", "", "algo", "tile", "stages", "splitK", "cluster", "swz", "alone us",
         "TOPS", "loop us/st", "same");
  for (size_t i : sel) {
    const config &cf = cfgs[i];
    printf("%-5s %5d %5d %6d %6d %7d %4d %9.2f %7.0f %10.2f %5s\n", i >= heur0 ? "heur" : "sweep", cf.id, cf.tile, cf.stages, cf.splitk,
           cf.cluster, cf.swizzle, cf.alone_us, gop / cf.alone_us * 1e3, cf.loop_us, cf.same ? "yes" : "NO");
  }
  /* the best loop configuration, as one group of all rows too */
  size_t best = sel[0];
  for (size_t i : sel)
    if (cfgs[i].loop_us > 0 && cfgs[i].loop_us < cfgs[best].loop_us) best = i;
  const config &b = cfgs[best];
  cublasLtMatmulHeuristicResult_t hr;
  if (cublasLtMatmulAlgoCheck(lt, md, la, lb2, lc2, lc2, &b.algo, &hr) == CUBLAS_STATUS_SUCCESS)
    printf("\nbest in the loop (algo %d tile %d stages %d splitK %d cluster %d): one group of %d rows %.2f us a step\n", b.id, b.tile,
           b.stages, b.splitk, b.cluster, 2 * nr, one_group_graph([&] { BK(lt_run(&b.algo, 0, Pall, Dall, 1)); }));
  /* the full sweep, sorted by time alone */
  printf("\n# every accepted configuration, alone (us): algo tile stages splitK cluster swizzle us same\n");
  for (size_t i : order)
    printf("%d %d %d %d %d %d %.2f %d\n", cfgs[i].id, cfgs[i].tile, cfgs[i].stages, cfgs[i].splitk, cfgs[i].cluster, cfgs[i].swizzle,
           cfgs[i].alone_us, cfgs[i].same);
  return 0;
}
