/*
 * cuda_bench.cuh: what the standalone GPU bench programs (bench/*.cu) share: error checks that
 * print the failing call and exit (CK for the runtime, BK for cuBLAS), median_call_ms (the median
 * of single calls timed with CUDA events), and time_ms, the same over 30 calls after the clocks
 * have ramped up (an idle H200 sits at 345 MHz: the function runs for 0.3 s first, else the first
 * calls' times were 2.5x the in-loop ones). Bench programs only: the library returns status codes instead.
 */
#ifndef QGRU_CUDA_BENCH_CUH
#define QGRU_CUDA_BENCH_CUH

#include <algorithm>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

/* The median of reps single calls of f, each timed with CUDA events on st, after warm untimed ones. */
template <class F>
static float median_call_ms(F f, cudaStream_t st, int reps, int warm) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; i++) f();
  std::vector<float> t;
  for (int r = 0; r < reps; r++) {
    CK(cudaEventRecord(a, st)); f(); CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms);
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  return median(t);
}

template <class F>
static float time_ms(F f, cudaStream_t st) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float warm = 0;
  while (warm < 300.0f) {
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < 20; i++) f();
    CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
    float m; CK(cudaEventElapsedTime(&m, a, b)); warm += m;
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  return median_call_ms(f, st, 30, 0);
}

#endif
