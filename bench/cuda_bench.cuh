/*
 * cuda_bench.cuh: what the standalone GPU bench programs (bench/*.cu) share: error checks that
 * print the failing call and exit (CK for the runtime, BK for cuBLAS), median_call_ms (the median
 * of single calls timed with CUDA events), warm_up (runs a call until the clocks have ramped up:
 * an idle H200 sits at 345 MHz, and the first calls' times were 2.5x the in-loop ones), time_ms
 * (the median of 30 calls after 0.3 s of warm_up), and lt_heuristic (cuBLASLt's heuristic
 * configurations for a matmul). Bench programs only: the library returns status codes instead.
 */
#ifndef QGRU_CUDA_BENCH_CUH
#define QGRU_CUDA_BENCH_CUH

#include <algorithm>
#include <cublasLt.h>
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

/* Runs f (in bursts of 20) until about budget_ms of device time have passed: the clocks ramp up. */
template <class F>
static void warm_up(F f, cudaStream_t st, float budget_ms) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float ms = 0;
  while (ms < budget_ms) {
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < 20; i++) f();
    CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
    float m; CK(cudaEventElapsedTime(&m, a, b)); ms += m;
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
}

template <class F>
static float time_ms(F f, cudaStream_t st) {
  warm_up(f, st, 300.0f);
  return median_call_ms(f, st, 30, 0);
}

/* cuBLASLt's heuristic for the matmul md (layouts la, lb, and lc for C and D), with a workspace of
 * at most wsb bytes: its first n configurations into res; returns how many it gave. */
static int lt_heuristic(cublasLtHandle_t lt, cublasLtMatmulDesc_t md, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                        cublasLtMatrixLayout_t lc, size_t wsb, int n, cublasLtMatmulHeuristicResult_t *res) {
  cublasLtMatmulPreference_t pref;
  BK(cublasLtMatmulPreferenceCreate(&pref));
  BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  int got = 0;
  BK(cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pref, n, res, &got));
  BK(cublasLtMatmulPreferenceDestroy(pref));
  return got;
}

#endif
