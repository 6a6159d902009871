/*
 * igemm_bench.cu: kernels/igemm_sm90.cuh's int8 wgmma GEMM against cublasGemmEx (CUBLAS_COMPUTE_32I)
 * on the exact split's shapes: bits first (integer sums: every element must equal cuBLAS's, at
 * full and partial tiles, with K slices summed), then the time of one product alone (median of
 * 30 after warm-up), then the strict backward's per-step chain as the loop runs it.
 *
 * The chain (one row group, 100 steps, one stream): a stand-in step kernel (griddepcontrol.wait,
 * then each block reads its rows of P [4 nr, H] and writes the digit rows D [4 nr, Kp] from them:
 * the memory the real step kernel's product edges carry), then the product P = D RT^T, either
 * cublasGemmEx (a plain launch after the step kernel, the step kernel a programmatic dependent of
 * it, as the library runs it) or igemm as a programmatic dependent with R's codes (B) loaded
 * before its wait. The stand-in takes about as long as its memory; what the chain adds over the
 * step kernels alone is the product and both edges.
 *
 * Build: cmake --build build --target bench_igemm_bench (or by hand: nvcc -O3 -std=c++17
 *        -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ibench bench/igemm_bench.cu
 *        kernels/igemm_sm90.cu -lcublasLt -lcublas -o igemm_bench)
 * Run:   ./igemm_bench
 */
#include "cuda_bench.cuh"   /* CK, BK, time_ms, median_call_ms */
#include "igemm.cuh"
#include "ptx.cuh"

#include <stdint.h>
#include <string.h>

static void fill(int8_t *d, int64_t rows, int64_t K, int64_t ld, uint32_t seed) {
  std::vector<int8_t> h((size_t)(rows * ld), 0);
  uint32_t x = seed;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < K; k++) {
      x = x * 1664525u + 1013904223u;
      h[(size_t)(r * ld + k)] = (int8_t)(x >> 24);
    }
  CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
}

/* C = A B^T by cuBLAS: column-major C^T [N][M] = B [N][K] x A^T */
static void ref_gemm(cublasHandle_t hb, int32_t *C, const int8_t *A, int64_t lda, const int8_t *B, int64_t ldb, int64_t M, int64_t N,
                     int64_t K, cudaStream_t st) {
  const int32_t one = 1, zero = 0;
  BK(cublasSetStream(hb, st));
  BK(cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, B, CUDA_R_8I, (int)ldb, A, CUDA_R_8I, (int)lda, &zero, C,
                  CUDA_R_32I, (int)N, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
}

struct shape { const char *name; int64_t M, N, K; int bn, slices; };

/* bits: igemm (slices summed on the host) against cuBLAS; returns the number of differing elements */
static int64_t check(cublasHandle_t hb, const shape &s, cudaStream_t st, int pdl, int b_first) {
  const int64_t ld = (s.K + 15) / 16 * 16;
  int8_t *A, *B;
  int32_t *C, *R;
  CK(cudaMalloc(&A, s.M * ld)); CK(cudaMalloc(&B, s.N * ld));
  CK(cudaMalloc(&C, s.slices * s.M * s.N * 4)); CK(cudaMalloc(&R, s.M * s.N * 4));
  fill(A, s.M, s.K, ld, 7u + (uint32_t)s.M);
  fill(B, s.N, s.K, ld, 11u + (uint32_t)s.N);
  CK(cudaMemsetAsync(C, 0x5a, s.slices * s.M * s.N * 4, st));
  ig_plan p;
  if (ig_plan_init(&p, A, ld, B, ld, s.M, s.N, s.K, s.N, s.slices, s.M * s.N, s.bn)) { fprintf(stderr, "plan failed\n"); exit(1); }
  CK(ig_launch(&p, C, st, pdl, b_first));
  ref_gemm(hb, R, A, ld, B, ld, s.M, s.N, s.K, st);
  CK(cudaStreamSynchronize(st));
  std::vector<int32_t> hc((size_t)(p.slices * s.M * s.N)), hr((size_t)(s.M * s.N));
  CK(cudaMemcpy(hc.data(), C, hc.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hr.data(), R, hr.size() * 4, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (int64_t i = 0; i < s.M * s.N; i++) {
    int32_t v = 0;
    for (int sl = 0; sl < p.slices; sl++) v += hc[(size_t)(sl * s.M * s.N + i)];
    if (v != hr[(size_t)i] && bad++ < 5)
      fprintf(stderr, "  %s: C[%lld][%lld] = %d, cuBLAS %d\n", s.name, (long long)(i / s.N), (long long)(i % s.N), v, hr[(size_t)i]);
  }
  CK(cudaFree(A)); CK(cudaFree(B)); CK(cudaFree(C)); CK(cudaFree(R));
  return bad;
}

static void timing(cublasHandle_t hb, const shape &s, cudaStream_t st) {
  const int64_t ld = (s.K + 15) / 16 * 16;
  int8_t *A, *B;
  int32_t *C, *R;
  CK(cudaMalloc(&A, s.M * ld)); CK(cudaMalloc(&B, s.N * ld));
  CK(cudaMalloc(&C, s.slices * s.M * s.N * 4)); CK(cudaMalloc(&R, s.M * s.N * 4));
  fill(A, s.M, s.K, ld, 3u); fill(B, s.N, s.K, ld, 5u);
  ig_plan p;
  if (ig_plan_init(&p, A, ld, B, ld, s.M, s.N, s.K, s.N, s.slices, s.M * s.N, s.bn)) { fprintf(stderr, "plan failed\n"); exit(1); }
  const float tc = time_ms([&] { ref_gemm(hb, R, A, ld, B, ld, s.M, s.N, s.K, st); }, st);
  const float ti = time_ms([&] { CK(ig_launch(&p, C, st, 0, 0)); }, st);
  const double ops = 2.0 * s.M * s.N * s.K;
  printf("time %-10s M %6lld N %5lld K %6lld bn %3d slices %d: cuBLAS %8.4f ms (%6.1f TOPS)  igemm %8.4f ms (%6.1f TOPS)  ratio %.3f\n", s.name,
         (long long)s.M, (long long)s.N, (long long)s.K, s.bn, p.slices, tc, ops / tc * 1e-9, ti, ops / ti * 1e-9, ti / tc);
  CK(cudaFree(A)); CK(cudaFree(B)); CK(cudaFree(C)); CK(cudaFree(R));
}

/* The stand-in step kernel: block b owns rows r of D [M][Kp] (and of P [M][H]); D[r][k] from P's
 * row (a hash of P[r][k % H]); trigger: launch the dependents right after the wait. */
__global__ void stand_in_step_kernel(int8_t *D, const int32_t *P, int M, int H, int Kp, int rows_per_block, int trigger) {
  griddep_wait();
  if (trigger) griddep_launch();
  for (int r = blockIdx.x * rows_per_block; r < min(M, (blockIdx.x + 1) * rows_per_block); r++)
    for (int k4 = threadIdx.x; k4 < Kp / 4; k4 += blockDim.x) {
      uint32_t w = 0;
#pragma unroll
      for (int e = 0; e < 4; e++) w |= (uint32_t)((P[(int64_t)r * H + (4 * k4 + e) % H] * 2654435761u) >> 29) << (8 * e);
      ((uint32_t *)(D + (int64_t)r * Kp))[k4] = w;
    }
}

static void launch_step(int8_t *D, const int32_t *P, int M, int H, int Kp, int trigger, cudaStream_t st) {
  cudaLaunchConfig_t lc = {};
  cudaLaunchAttribute at[1];
  lc.gridDim = dim3(128);
  lc.blockDim = dim3(256);
  lc.stream = st;
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = at;
  lc.numAttrs = 1;
  CK(cudaLaunchKernelEx(&lc, stand_in_step_kernel, D, P, M, H, Kp, (M + 127) / 128, trigger));
}

static void chain(cublasHandle_t hb, int64_t nr, int64_t H, cudaStream_t st) {
  const int64_t M = 4 * nr, Kp = 3 * H, steps = 100;
  int8_t *D, *RT;
  int32_t *P;
  CK(cudaMalloc(&D, M * Kp)); CK(cudaMalloc(&RT, H * Kp)); CK(cudaMalloc(&P, M * H * 4));
  fill(RT, H, Kp, Kp, 9u);
  CK(cudaMemsetAsync(P, 0, M * H * 4, st)); CK(cudaMemsetAsync(D, 0, M * Kp, st));
  ig_plan p64, p128;
  if (ig_plan_init(&p64, D, Kp, RT, Kp, M, H, Kp, H, 1, 0, 64) || ig_plan_init(&p128, D, Kp, RT, Kp, M, H, Kp, H, 1, 0, 128)) exit(1);
  auto steps_only = [&] { for (int s = 0; s < steps; s++) launch_step(D, P, (int)M, (int)H, (int)Kp, 0, st); };
  auto with_cublas = [&] {
    for (int s = 0; s < steps; s++) { launch_step(D, P, (int)M, (int)H, (int)Kp, 0, st); ref_gemm(hb, P, D, Kp, RT, Kp, M, H, Kp, st); }
  };
  auto with_ig = [&](const ig_plan *p, int trigger, int b_first) {
    for (int s = 0; s < steps; s++) { launch_step(D, P, (int)M, (int)H, (int)Kp, trigger, st); CK(ig_launch(p, P, st, 1, b_first)); }
  };
  /* the two chains give the same P (integer sums): checked after one run of each from zeros */
  std::vector<int32_t> h1((size_t)(M * H)), h2((size_t)(M * H));
  CK(cudaMemsetAsync(P, 0, M * H * 4, st)); with_cublas(); CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(h1.data(), P, h1.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemsetAsync(P, 0, M * H * 4, st)); with_ig(&p64, 1, 1); CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(h2.data(), P, h2.size() * 4, cudaMemcpyDeviceToHost));
  printf("chain nr %lld H %lld: P after 100 steps %s\n", (long long)nr, (long long)H, memcmp(h1.data(), h2.data(), h1.size() * 4) ? "DIFFERS" : "same as cuBLAS's chain");
  const float t0 = time_ms(steps_only, st), tc = time_ms(with_cublas, st);
  printf("chain: step kernels alone %.2f us a step; + cuBLAS product %.2f us a step (adds %.2f)\n", t0 * 10, tc * 10, (tc - t0) * 10);
  const int variants[6][3] = {{64, 0, 0}, {64, 0, 1}, {64, 1, 1}, {128, 0, 0}, {128, 0, 1}, {128, 1, 1}};
  for (auto &v : variants) {
    const float t = time_ms([&] { with_ig(v[0] == 64 ? &p64 : &p128, v[1], v[2]); }, st);
    printf("chain: + igemm bn %3d trigger %d b_first %d: %.2f us a step (adds %.2f)\n", v[0], v[1], v[2], t * 10, (t - t0) * 10);
  }
  CK(cudaFree(D)); CK(cudaFree(RT)); CK(cudaFree(P));
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasHandle_t hb;
  BK(cublasCreate(&hb));
  const shape bits[] = {{"step", 512, 1024, 3072, 64, 1},  {"step", 512, 1024, 3072, 128, 1}, {"step-s2", 512, 1024, 3072, 64, 2},
                        {"odd", 517, 1001, 3000, 64, 1},   {"odd", 130, 77, 40, 128, 1},      {"odd-s3", 300, 200, 5000, 64, 3},
                        {"tiny", 1, 1, 16, 64, 1},         {"dR", 4096, 1024, 25600, 128, 1}};
  int64_t bad_all = 0;
  for (const shape &s : bits)
    for (int mode = 0; mode < 2; mode++) {
      const int64_t bad = check(hb, s, st, mode, mode);
      bad_all += bad;
      printf("bits %-8s M %5lld N %5lld K %6lld bn %3d slices %d pdl/b_first %d: %s (%lld differ)\n", s.name, (long long)s.M, (long long)s.N,
             (long long)s.K, s.bn, s.slices, mode, bad ? "DIFFER" : "same as cuBLAS", (long long)bad);
    }
  printf("bits: %s\n", bad_all ? "FAILED" : "all same as cuBLAS");
  const shape times[] = {{"step", 512, 1024, 3072, 64, 1},      {"step", 512, 1024, 3072, 128, 1},     {"step-s2", 512, 1024, 3072, 64, 2},
                         {"step-1g", 1024, 1024, 3072, 64, 1},  {"dR", 12288, 1024, 25600, 128, 1},    {"dW", 12288, 512, 25600, 128, 1},
                         {"Wx", 25600, 3072, 512, 128, 1},      {"med-step", 256, 512, 1536, 64, 1}};
  for (const shape &s : times) timing(hb, s, st);
  chain(hb, 128, 1024, st);
  chain(hb, 256, 1024, st);
  BK(cublasDestroy(hb));
  CK(cudaStreamDestroy(st));
  return bad_all ? 1 : 0;
}
