/*
 * test_igemm.cu: the int8 wgmma GEMM of kernels/igemm.cuh against int64 sums computed here on the
 * host, on the GPU. Without a CUDA device, or on one that cannot run it (not sm_90: ig_available),
 * it prints a skip line and succeeds (CI); tests/gpu/device_check.sh runs it on the GPU machine,
 * also under compute-sanitizer.
 *
 * What is checked, for every output element: C equals the exact integer product (the sums of K
 * products of two int8 values, slices added on the host), and every C element outside the matrix
 * (columns from N to ldc, rows of unused slices) keeps the sentinel it had: nothing is written
 * beyond M, N. The operands' row padding (bytes K..ld) holds nonzero bytes that must not be read.
 * Cases: full tiles (the strict backward's per-step shape at half size), M, N, K that are not
 * multiples of the 128 x 64 / 128 x 128 tiles or the 128-byte K tile, one element, K slices (the
 * plan's count is checked), the extreme codes (-128 x -128 over K = 16384: 2^28, near int32's
 * range at the largest K the exact split allows per slice), and the programmatic-dependent launch:
 * a kernel writes A just before it, and A's new values must be the ones multiplied (with B loaded
 * before the wait, b_first). Layouts it cannot take (row strides, alignment, empty sizes, a tile
 * width it has no kernel for) must be refused with the plan left as it was.
 */
#include "igemm.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static int failures = 0;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2); } } while (0)

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static unsigned next_u32(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned)(rng >> 11); }

enum { SENTINEL = 0x7e57c0de };

struct spec {
  const char *name;
  int64_t M, N, K;
  int bn, slices, expect_slices;
  int extreme;   /* every code -128 */
  int pdl;       /* A written by a kernel launched just before, igemm as its programmatic dependent (b_first) */
};

/* A's new values, written on the device right before the product: a[i] = ~a[i] (not the values uploaded) */
__global__ void invert_kernel(int8_t *a, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) a[i] = (int8_t)~a[i];
}

static void run(const spec &c, cudaStream_t st) {
  const int64_t ld = (c.K + 15) / 16 * 16 + 16, ldc = c.N + 3;   /* padded rows: bytes K..ld are garbage, columns N..ldc sentinels */
  std::vector<int8_t> A((size_t)(c.M * ld)), B((size_t)(c.N * ld));
  for (auto &v : A) v = c.extreme ? (int8_t)-128 : (int8_t)next_u32();
  for (auto &v : B) v = c.extreme ? (int8_t)-128 : (int8_t)next_u32();
  for (int64_t r = 0; r < c.M; r++) for (int64_t k = c.K; k < ld; k++) A[(size_t)(r * ld + k)] = (int8_t)(1 + next_u32() % 120);
  for (int64_t r = 0; r < c.N; r++) for (int64_t k = c.K; k < ld; k++) B[(size_t)(r * ld + k)] = (int8_t)(1 + next_u32() % 120);
  const int64_t sstride = c.M * ldc, cn = (int64_t)c.slices * sstride;
  int8_t *dA, *dB;
  int32_t *dC;
  CK(cudaMalloc(&dA, A.size())); CK(cudaMalloc(&dB, B.size())); CK(cudaMalloc(&dC, cn * 4));
  CK(cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice));
  std::vector<int32_t> C((size_t)cn, SENTINEL);
  CK(cudaMemcpy(dC, C.data(), cn * 4, cudaMemcpyHostToDevice));
  ig_plan p;
  if (ig_plan_init(&p, dA, ld, dB, ld, c.M, c.N, c.K, ldc, c.slices, sstride, c.bn)) {
    printf("FAIL %s: ig_plan_init refused a valid layout\n", c.name);
    failures++;
    return;
  }
  int bad = 0;
  if (p.slices != c.expect_slices) {
    printf("FAIL %s: %d slices planned, expected %d\n", c.name, p.slices, c.expect_slices);
    bad++;
  }
  if (c.pdl) {
    invert_kernel<<<64, 256, 0, st>>>(dA, c.M * ld);
    CK(cudaGetLastError());
    for (auto &v : A) v = (int8_t)~v;
  }
  CK(ig_launch(&p, dC, st, c.pdl, c.pdl));
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(C.data(), dC, cn * 4, cudaMemcpyDeviceToHost));
  for (int64_t m = 0; m < c.M; m++)
    for (int64_t n = 0; n < ldc; n++) {
      if (n >= c.N) {   /* outside the matrix: untouched in every slice */
        for (int s = 0; s < c.slices; s++)
          if (C[(size_t)(s * sstride + m * ldc + n)] != SENTINEL && bad++ < 5) printf("  %s: C[%d][%lld][%lld] written\n", c.name, s, (long long)m, (long long)n);
        continue;
      }
      int64_t ref = 0;
      for (int64_t k = 0; k < c.K; k++) ref += (int64_t)A[(size_t)(m * ld + k)] * B[(size_t)(n * ld + k)];
      int64_t got = 0;
      for (int s = 0; s < p.slices; s++) got += C[(size_t)(s * sstride + m * ldc + n)];
      if (got != ref && bad++ < 5) printf("  %s: C[%lld][%lld] = %lld, expected %lld\n", c.name, (long long)m, (long long)n, (long long)got, (long long)ref);
    }
  for (int s = p.slices; s < c.slices; s++)   /* slices the plan does not use: untouched */
    for (int64_t i = 0; i < sstride; i++)
      if (C[(size_t)(s * sstride + i)] != SENTINEL && bad++ < 5) printf("  %s: unused slice %d written\n", c.name, s);
  printf("%s %s: M %lld N %lld K %lld, tile 128 x %d, %d slice(s)%s\n", bad ? "FAIL" : "ok  ", c.name, (long long)c.M, (long long)c.N,
         (long long)c.K, c.bn, p.slices, c.pdl ? ", programmatic dependent" : "");
  if (bad) failures++;
  cudaFree(dA); cudaFree(dB); cudaFree(dC);
}

/* Layouts TMA or the kernel cannot take: ig_plan_init returns -1 and leaves the plan as it was. */
static void rejections(void) {
  int8_t *d;
  CK(cudaMalloc(&d, 1 << 16));
  struct bad { const char *name; const int8_t *A; int64_t lda, M, N, K, ldc; int slices, bn; };
  const bad cases[] = {
      {"row stride not a multiple of 16", d, 40, 4, 4, 40, 4, 1, 64},
      {"row stride below K", d, 32, 4, 4, 40, 4, 1, 64},
      {"base not 16-byte aligned", d + 8, 48, 4, 4, 40, 4, 1, 64},
      {"no rows", d, 48, 0, 4, 40, 4, 1, 64},
      {"K of 0", d, 48, 4, 4, 0, 4, 1, 64},
      {"ldc below N", d, 48, 4, 8, 40, 4, 1, 64},
      {"no slices", d, 48, 4, 4, 40, 4, 0, 64},
      {"tile of 96 columns", d, 48, 4, 4, 40, 4, 1, 96},
  };
  for (const bad &b : cases) {
    ig_plan p;
    memset(&p, 0x3c, sizeof p);
    ig_plan before;
    memcpy(&before, &p, sizeof p);
    const int r = ig_plan_init(&p, b.A, b.lda, d, 48, b.M, b.N, b.K, b.ldc, b.slices, 0, b.bn);
    const int ok = r == -1 && memcmp(&p, &before, sizeof p) == 0;
    printf("%s rejected: %s (returned %d, plan %s)\n", ok ? "ok  " : "FAIL", b.name, r, memcmp(&p, &before, sizeof p) ? "changed" : "unchanged");
    if (!ok) failures++;
  }
  cudaFree(d);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("test_igemm: skipped (no CUDA device)\n");
    return 0;
  }
  if (!ig_available()) {
    printf("test_igemm: skipped (the device is not sm_90: igemm's callers keep cuBLAS)\n");
    return 0;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const spec cases[] = {
      /* name                          M     N     K      bn   sl exp extreme pdl */
      {"full tiles",                   256,  512,  1536,  64,  1, 1, 0, 0},
      {"full tiles, 128 columns",      256,  512,  1536,  128, 1, 1, 0, 0},
      {"partial tiles",                517,  201,  3000,  64,  1, 1, 0, 0},
      {"partial tiles, 128 columns",   130,  77,   40,    128, 1, 1, 0, 0},
      {"one element",                  1,    1,    16,    64,  1, 1, 0, 0},
      {"K slices",                     300,  200,  5000,  64,  3, 3, 0, 0},
      {"K slices, fewer K tiles",      70,   65,   300,   64,  4, 3, 0, 0},
      {"extreme codes, K 16384",       129,  65,   16384, 64,  1, 1, 1, 0},
      {"programmatic dependent",       384,  256,  3072,  64,  1, 1, 0, 1},
      {"programmatic dependent, K slices", 200, 129, 2000, 128, 2, 2, 0, 1},
  };
  for (const spec &c : cases) run(c, st);
  rejections();
  cudaStreamDestroy(st);
  printf("test_igemm: %s (%d failing case(s))\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
