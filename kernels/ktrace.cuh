/*
 * ktrace.cuh: a timing-only experiment build's per-launch kernel trace (-DQG_KTRACE=1; never in
 * normal builds, where every macro here is empty). The device machine has no nsys, and ncu
 * serializes kernels, so neither shows how the strict split loop's kernels of two row groups
 * overlap. Each traced launch owns one kt_rec; thread 0 of each of its blocks folds %globaltimer
 * (ns, one clock for the whole device) into it with atomicMin / atomicMax:
 *   t0: the first block's start, w0 / w1: the first / last block past griddepcontrol.wait (the
 *   kernel it depends on has completed), t1: the last block's end.
 * The host zeroes the maxima and sets the minima to ~0 before the launches and reads the records
 * after them (kernels/int_gru_backward.cu prints a summary per call).
 */
#ifndef QGRU_KTRACE_CUH
#define QGRU_KTRACE_CUH

#ifndef QG_KTRACE
#define QG_KTRACE 0
#endif

struct kt_rec {
  unsigned long long t0, w0, w1, t1;
};

#if QG_KTRACE
__device__ __forceinline__ unsigned long long kt_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
/* thread 0 of the block (flattened index `tid`) records */
#define KT_START(r, tid) do { if ((r) && (tid) == 0) atomicMin(&(r)->t0, kt_now()); } while (0)
#define KT_WAITED(r, tid) do { if ((r) && (tid) == 0) { const unsigned long long _t = kt_now(); atomicMin(&(r)->w0, _t); atomicMax(&(r)->w1, _t); } } while (0)
#define KT_END(r, tid) do { if ((r) && (tid) == 0) atomicMax(&(r)->t1, kt_now()); } while (0)
#else
#define KT_START(r, tid) ((void)0)
#define KT_WAITED(r, tid) ((void)0)
#define KT_END(r, tid) ((void)0)
#endif

#endif
