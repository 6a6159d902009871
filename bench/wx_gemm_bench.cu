/*
 * wx_gemm_bench.cu: the integer W x GEMM of the QAT forward (kernels/wx_gemm.cuh) against the
 * kernel it replaced (a verbatim copy below, "old": 128 x 64 tiles, no cp.async pipeline) and
 * cuBLASLt's int8 GEMM (CUDA_R_8I in, CUDA_R_32I out, TN, the same product without the zero-point
 * terms and the requantization) at the W x sizes of the five bench shapes (M = 3H, N = T N, K = C).
 * For each size: random int8 planes (zeros in the padding), random zero-point terms and
 * exponents; the old and the new kernel in the 32-bit accumulator mode and in the codes mode
 * and two-plane operands) must give identical bytes, for every tile variant of the new kernel
 * (wx_gemm_variant), and the new kernel without the zero-point terms must equal cuBLASLt's
 * product; then median times of 20 launches after 3 warm-up ones (CUDA events). The extra size
 * odd-large has partial tiles along every dimension and an odd 3H. `--ncu`: at the large size
 * only, one launch each of the old kernel, the new one (auto variant), cuBLASLt, variant 1. Build: nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -I. bench/wx_gemm_bench.cu -lcublasLt
 */
#include "../kernels/wx_gemm.cuh"

#include <algorithm>
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

/* ---- the previous kernel, verbatim but for names ---- */
enum { OWX_BM = 128, OWX_BN = 64, OWX_BK = 64, OWX_LD = OWX_BK + 16 };
__device__ __forceinline__ void old_mma_s8(int32_t *d, const uint32_t *a, const uint32_t *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ uint32_t old_lds32(const int8_t *p) { return *(const uint32_t *)p; }
/* SINGLE: one plane pair (operands of <= 8 bits), no int64 accumulators. */
template <int OBS, int SINGLE>
__global__ void __launch_bounds__(256) wx_gemm_old_kernel(const __grid_constant__ wx_params p) {
  __shared__ __align__(16) int8_t As[OWX_BM * OWX_LD], Bs[OWX_BN * OWX_LD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;   /* warp tile rows wm*32, cols wn*32 */
  const int64_t m0 = (int64_t)blockIdx.y * OWX_BM, n0 = (int64_t)blockIdx.x * OWX_BN;
  int64_t acc64[2][4][4];
  int32_t acc[2][4][4];
  if (!SINGLE) {
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int b = 0; b < 4; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc64[a][b][e] = 0;
  }
  const int PA = SINGLE ? 1 : p.PA, PB = SINGLE ? 1 : p.PB;
  for (int pa = 0; pa < PA; pa++)
    for (int pb = 0; pb < PB; pb++) {
#pragma unroll
      for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[a][b][e] = 0;
      const int8_t *Ab = p.Wp + (pa * p.Mp + m0) * p.Kp, *Bb = p.Xp + (pb * p.Np + n0) * p.Kp;
      for (int64_t k0 = 0; k0 < p.Kp; k0 += OWX_BK) {
        for (int c = threadIdx.x; c < OWX_BM * 4; c += 256) {
          const int row = c >> 2, cv = c & 3;
          *(int4 *)&As[row * OWX_LD + cv * 16] = *(const int4 *)&Ab[row * p.Kp + k0 + cv * 16];
        }
        {
          const int row = threadIdx.x >> 2, cv = threadIdx.x & 3;
          *(int4 *)&Bs[row * OWX_LD + cv * 16] = *(const int4 *)&Bb[row * p.Kp + k0 + cv * 16];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < OWX_BK; kk += 32) {
          uint32_t af[2][4], bf[4][2];
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            const int8_t *a = As + (wm * 32 + mt * 16 + g) * OWX_LD + kk + 4 * tq;
            af[mt][0] = old_lds32(a);
            af[mt][1] = old_lds32(a + 8 * OWX_LD);
            af[mt][2] = old_lds32(a + 16);
            af[mt][3] = old_lds32(a + 8 * OWX_LD + 16);
          }
#pragma unroll
          for (int nt = 0; nt < 4; nt++) {
            const int8_t *b = Bs + (wn * 32 + nt * 8 + g) * OWX_LD + kk + 4 * tq;
            bf[nt][0] = old_lds32(b);
            bf[nt][1] = old_lds32(b + 16);
          }
#pragma unroll
          for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++) old_mma_s8(acc[mt][nt], af[mt], bf[nt]);
        }
        __syncthreads();
      }
      if (!SINGLE) {
        const int64_t sc = (int64_t)((p.PA == 2 && pa == 0) ? 256 : 1) * ((p.PB == 2 && pb == 0) ? 256 : 1);
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
          for (int b = 0; b < 4; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc64[a][b][e] += sc * acc[a][b][e];
      }
    }
  /* epilogue: every load first (4 rows j, 8 columns tn per thread), then the requantization and
   * the stores, so that no load waits behind a store it might alias */
  const int64_t TN = p.T * p.N;
  int64_t bc[2][2], ow[2][2], sx[4][2];
  int ew[2][2];
  bool vt[4][2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t j = m0 + wm * 32 + mt * 16 + g + 8 * h;
      const bool ok = j < p.H3;
      bc[mt][h] = ok ? p.bconst[j] : 0;
      ow[mt][h] = ok ? p.offW[j] : 0;
      ew[mt][h] = ok ? p.eW[j] : 0;
    }
#pragma unroll
  for (int nt = 0; nt < 4; nt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t tn = n0 + wn * 32 + nt * 8 + 2 * tq + h;
      sx[nt][h] = tn < TN ? p.SX[tn] : 0;
      vt[nt][h] = OBS && tn < TN && tn / p.N < length_at(p.L, tn % p.N, p.T);
    }
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int hj = e >> 1, ht = e & 1;
        const int64_t j = m0 + wm * 32 + mt * 16 + g + 8 * hj;
        const int64_t tn = n0 + wn * 32 + nt * 8 + 2 * tq + ht;
        if (j >= p.H3 || tn >= TN) continue;
        const int64_t v = (SINGLE ? (int64_t)acc[mt][nt][e] : acc64[mt][nt][e]) + bc[mt][hj] + ow[mt][hj] * sx[nt][ht];
        if (!OBS && p.acc_out) { p.qwx[tn * p.H3 + j] = (int32_t)v; continue; }
        const int s = ew[mt][hj] + p.eX;
        int m;
        const int64_t code = qg_requant64(v, s, p.Q, &m);
        p.qwx[tn * p.H3 + j] = (int32_t)code;
        p.mwx[tn * p.H3 + j] = (uint8_t)m;
        if (OBS && vt[nt][ht]) qg_stats_observe_dev(p.range + 4 * QG_Q_MATMUL_WX, p.counts + (int64_t)QG_STATS_BINS * QG_Q_MATMUL_WX, ldexp((double)v, -s));
      }
}


static void launch_old(const wx_params &p, int obs, int single) {
  const dim3 grid((unsigned)(p.Np / OWX_BN), (unsigned)(p.Mp / OWX_BM));
  if (obs) { if (single) wx_gemm_old_kernel<1, 1><<<grid, 256>>>(p); else wx_gemm_old_kernel<1, 0><<<grid, 256>>>(p); }
  else { if (single) wx_gemm_old_kernel<0, 1><<<grid, 256>>>(p); else wx_gemm_old_kernel<0, 0><<<grid, 256>>>(p); }
  CK(cudaGetLastError());
}
static int g_sms;
static void launch_new(const wx_params &p, int obs, int single, int variant = -1) {
  CK(wx_gemm_launch(p, obs, single, 0, g_sms, variant));
  CK(cudaGetLastError());
}

/* ---- random operands ---- */
__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return (uint32_t)x;
}
/* planes [np][rowsp][Kp]: random in [-lim, lim] for row < rows, k < K; zeros elsewhere */
__global__ void fill_planes(int8_t *d, int np, int64_t rows, int64_t rowsp, int64_t K, int64_t Kp, int lim, uint64_t seed) {
  const int64_t n = (int64_t)np * rowsp * Kp;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = e % Kp, r = (e / Kp) % rowsp;
    d[e] = (r < rows && k < K) ? (int8_t)((int)(hash32(seed * 0x9e3779b97f4a7c15ULL + e) % (2 * lim + 1)) - lim) : 0;
  }
}
__global__ void fill_i64(int64_t *d, int64_t n, int lim, uint64_t seed) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
    d[e] = (int64_t)(hash32(seed * 0x9e3779b97f4a7c15ULL + e) % (2 * lim + 1)) - lim;
}
__global__ void fill_i32(int32_t *d, int64_t n, int lo, int span, uint64_t seed) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
    d[e] = lo + (int32_t)(hash32(seed * 0x9e3779b97f4a7c15ULL + e) % span);
}

struct shape { const char *name; int64_t M, N, K; };
static const shape SHAPES[] = { { "seed-small", 768, 400, 128 }, { "seed-qat", 384, 1600, 64 }, { "medium", 1536, 6400, 256 },
                                { "large", 3072, 25600, 512 }, { "long-kws", 192, 16000, 40 },
                                { "odd-large", 3069, 25555, 500 } };   /* partial tiles along every dimension, odd 3H */


template <typename F>
static double median_ms(F f, int reps = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) f();
  std::vector<float> t;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms);
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static int64_t rup(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct lt_gemm {
  cublasLtHandle_t h; cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t la, lb, lc; cublasLtMatmulAlgo_t algo; void *ws; size_t wsz;
};
static void lt_setup(lt_gemm *g, int64_t M, int64_t N, int64_t K) {
  LK(cublasLtCreate(&g->h));
  LK(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const int64_t Kp = rup(K, WX_BK);   /* the planes' row stride */
  LK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_8I, K, M, Kp));   /* W [M][Kp] row-major = K x M column-major, op T */
  LK(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_8I, K, N, Kp));   /* X [N][Kp] */
  LK(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32I, M, N, M));  /* D [N][M]: j contiguous, as qwx */
  g->wsz = 64 << 20;
  CK(cudaMalloc(&g->ws, g->wsz));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->wsz, sizeof g->wsz));
  cublasLtMatmulHeuristicResult_t res[1];
  int n = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(g->h, g->op, g->la, g->lb, g->lc, g->lc, pref, 1, res, &n));
  if (n < 1) { fprintf(stderr, "cuBLASLt: no int8 algorithm for %lld x %lld x %lld\n", (long long)M, (long long)N, (long long)K); exit(1); }
  g->algo = res[0].algo;
  LK(cublasLtMatmulPreferenceDestroy(pref));
}
static void lt_run(lt_gemm *g, const int8_t *W, const int8_t *X, int32_t *D) {
  const int32_t one = 1, zero = 0;
  LK(cublasLtMatmul(g->h, g->op, &one, W, g->la, X, g->lb, &zero, D, g->lc, D, g->lc, &g->algo, g->ws, g->wsz, 0));
}
static void lt_free(lt_gemm *g) {
  cublasLtMatrixLayoutDestroy(g->la); cublasLtMatrixLayoutDestroy(g->lb); cublasLtMatrixLayoutDestroy(g->lc);
  cublasLtMatmulDescDestroy(g->op); cublasLtDestroy(g->h); cudaFree(g->ws);
}

/* compare the first n bytes of two device buffers */
static int64_t diff_bytes(const void *a, const void *b, size_t n) {
  std::vector<unsigned char> x(n), y(n);
  CK(cudaMemcpy(x.data(), a, n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), b, n, cudaMemcpyDeviceToHost));
  int64_t d = 0;
  for (size_t i = 0; i < n; i++) d += x[i] != y[i];
  return d;
}

int main(int argc, char **argv) {
  const bool ncu = argc > 1 && !strcmp(argv[1], "--ncu");
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  int fails = 0;
  printf("%-10s %6s %6s %4s | %-22s | %9s %9s %9s | %8s %7s | %s | %s | %8s %8s %8s\n", "shape", "M", "N", "K", "mode", "old ms", "new ms", "cuBLASLt", "new TOPS",
         "old/new", "old == new", "auto variant", "v0 ms", "v1 ms", "v2 ms");
  for (const shape &s : SHAPES) {
    if (ncu && strcmp(s.name, "large")) continue;
    const int64_t M = s.M, TN = s.N, K = s.K;
    const int64_t Mp = rup(M, WX_BJ), Np = rup(TN, WX_BT), Kp = rup(K, WX_BK);
    int8_t *Wp, *Xp; int64_t *bc, *ow, *sx; int32_t *eW, *q_old, *q_new, *q_lt; uint8_t *m_old, *m_new;
    CK(cudaMalloc(&Wp, 2 * Mp * Kp)); CK(cudaMalloc(&Xp, 2 * Np * Kp));
    CK(cudaMalloc(&bc, Mp * 8)); CK(cudaMalloc(&ow, Mp * 8)); CK(cudaMalloc(&sx, Np * 8)); CK(cudaMalloc(&eW, Mp * 4));
    int64_t *z64; CK(cudaMalloc(&z64, Mp * 8)); CK(cudaMemset(z64, 0, Mp * 8));
    CK(cudaMalloc(&q_old, TN * M * 4)); CK(cudaMalloc(&q_new, TN * M * 4)); CK(cudaMalloc(&q_lt, TN * M * 4));
    CK(cudaMalloc(&m_old, TN * M)); CK(cudaMalloc(&m_new, TN * M));
    fill_i64<<<1024, 256>>>(bc, Mp, 1 << 20, 3); fill_i64<<<1024, 256>>>(ow, Mp, 40, 4); fill_i64<<<1024, 256>>>(sx, Np, 1 << 12, 5);
    fill_i32<<<64, 256>>>(eW, Mp, 10, 8, 6);
    CK(cudaGetLastError());
    wx_params p;
    memset(&p, 0, sizeof p);
    p.Wp = Wp; p.Xp = Xp; p.Mp = Mp; p.Np = Np; p.Kp = Kp; p.H3 = M; p.T = 1; p.N = TN;
    p.bconst = bc; p.offW = ow; p.SX = sx; p.eW = eW; p.eX = 3; p.Q = qg_qp_make(8, 0, 2, 3); p.L = NULL;
    p.mwx = NULL;
    /* modes: 32-bit accumulators (single planes), codes (single), codes (two planes) */
    for (int mode = 0; mode < 3; mode++) {
      if (ncu && mode > 0) break;
      const int single = mode < 2, np = single ? 1 : 2;
      fill_planes<<<4096, 256>>>(Wp, np, M, Mp, K, Kp, 127, 1 + mode); fill_planes<<<4096, 256>>>(Xp, np, TN, Np, K, Kp, 127, 2 + mode);
      CK(cudaGetLastError());
      p.PA = p.PB = np; p.acc_out = mode == 0;
      CK(cudaMemset(q_old, 0x5a, TN * M * 4)); CK(cudaMemset(q_new, 0xa5, TN * M * 4));
      CK(cudaMemset(m_old, 0x5a, TN * M)); CK(cudaMemset(m_new, 0xa5, TN * M));
      p.qwx = q_old; p.mwx = m_old; launch_old(p, 0, single);
      wx_params pn = p; pn.qwx = q_new; pn.mwx = m_new; launch_new(pn, 0, single);
      lt_gemm g;
      if (mode == 0) { lt_setup(&g, M, TN, K); lt_run(&g, Wp, Xp, q_lt); }
      CK(cudaDeviceSynchronize());
      if (ncu) { launch_new(pn, 0, single, 1); CK(cudaDeviceSynchronize()); lt_free(&g); continue; }
      int64_t d = diff_bytes(q_old, q_new, TN * M * 4);
      if (mode > 0) d += diff_bytes(m_old, m_new, TN * M);
      if (mode == 0) {   /* without the zero-point terms the accumulators are cuBLASLt's product */
        wx_params pz = pn;
        pz.bconst = z64; pz.offW = z64;
        launch_new(pz, 0, 1);
        CK(cudaDeviceSynchronize());
        const int64_t dl = diff_bytes(q_new, q_lt, TN * M * 4);
        if (dl) { printf("  %s: %lld bytes differ from cuBLASLt's product\n", s.name, (long long)dl); fails++; }
        launch_new(pn, 0, 1);
      }
      /* every variant of the new kernel: identical bytes, and its time */
      double tv[3] = { 0, 0, 0 };
      for (int v = 0; v < (single ? 3 : 1); v++) {
        CK(cudaMemset(q_new, 0xa5, TN * M * 4)); CK(cudaMemset(m_new, 0xa5, TN * M));
        launch_new(pn, 0, single, v);
        CK(cudaDeviceSynchronize());
        int64_t dv = diff_bytes(q_old, q_new, TN * M * 4);
        if (mode > 0) dv += diff_bytes(m_old, m_new, TN * M);
        if (dv) { printf("  %s mode %d variant %d: %lld bytes differ from the old kernel's\n", s.name, mode, v, (long long)dv); fails++; }
        tv[v] = median_ms([&] { launch_new(pn, 0, single, v); });
      }
      const int va = wx_gemm_variant(Np, Mp, M, single, g_sms, -1);
      double to = median_ms([&] { launch_old(p, 0, single); });
      double tn = median_ms([&] { launch_new(pn, 0, single); });
      double tl = mode == 0 ? median_ms([&] { lt_run(&g, Wp, Xp, q_lt); }) : 0.0;
      if (mode == 0) lt_free(&g);
      const double ops = 2.0 * M * TN * K * np * np;
      const char *mn = mode == 0 ? "int32 acc, 1 plane" : mode == 1 ? "codes+masks, 1 plane" : "codes+masks, 2 planes";
      char lt[32] = "-";
      if (mode == 0) snprintf(lt, sizeof lt, "%.4f", tl);
      printf("%-10s %6lld %6lld %4lld | %-22s | %9.4f %9.4f %9s | %8.1f %7.2f | %-3s | v%d | %8.4f %8.4f %8.4f\n", s.name, (long long)M, (long long)TN,
             (long long)K, mn, to, tn, lt, ops / (tn * 1e-3) / 1e12, to / tn, d == 0 ? "yes" : "NO", va, tv[0], tv[1], tv[2]);
      if (d) { printf("  %lld bytes differ\n", (long long)d); fails++; }
    }
    cudaFree(Wp); cudaFree(Xp); cudaFree(bc); cudaFree(ow); cudaFree(sx); cudaFree(eW); cudaFree(z64);
    cudaFree(q_old); cudaFree(q_new); cudaFree(q_lt); cudaFree(m_old); cudaFree(m_new);
  }
  if (!ncu) printf(fails ? "FAILED: %d comparisons differ\n" : "all comparisons bit-identical\n", fails);
  return fails ? 1 : 0;
}
