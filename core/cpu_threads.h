/*
 * cpu_threads.h: how the CPU backends split a recurrence over threads (float and integer GRU):
 * batch rows are independent recurrences, so each thread takes a contiguous block of rows for the
 * whole time loop and calls single-threaded BLAS on it. The thread count is OpenBLAS's setting
 * (qg_set_num_threads), at most one per row; 1 without OpenMP.
 */
#ifndef QGRU_CPU_THREADS_H
#define QGRU_CPU_THREADS_H

#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#define QG_PRAGMA(x) _Pragma(#x)
#define QG_THREAD_NUM() omp_get_thread_num()
#else
#define QG_PRAGMA(x)
#define QG_THREAD_NUM() 0
#endif

/* OpenBLAS exports these (see context.c). */
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);

/* Threads for a recurrence over N rows. */
static inline int qg_cpu_row_threads(int64_t N) {
#ifdef _OPENMP
  int nt = openblas_get_num_threads();
  if (nt < 1) nt = 1;
  if (nt > N) nt = N < 1 ? 1 : (int)N;
  return nt;
#else
  (void)N;
  return 1;
#endif
}

/* First row of block k of nt over n rows (block k is [part(k), part(k + 1))). */
static inline int64_t qg_cpu_part(int64_t n, int k, int nt) { return n * k / nt; }

#endif
