/*
 * ptx.cuh: the inline-PTX wrappers that the kernels share: mma.sync m16n8k32 s8, ldmatrix .x4 / .x2,
 * cp.async (16 bytes with and without zero fill, 4 bytes) with its commit and wait, the named
 * barrier (bar.sync id, n), the acquire load / release add of a global arrival counter, and the
 * distributed-shared-memory address map (mapa) and asynchronous stores (st.async) of a cluster.
 * One definition for every kernel (the integer forward, its small-H kernel and the W x GEMM, the
 * float persistent kernels and the integer STE backward) and for the bench programs that
 * prototype such kernels (bench/xs_grid_proto.cu); mbarrier.cuh holds the mbarrier operations.
 */
#ifndef QGRU_PTX_CUH
#define QGRU_PTX_CUH

#include <stdint.h>

/* The shared-state-space address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* D += A B on the int8 tensor cores: m16n8k32, A row-major (4 regs), B column-major (2 regs). */
__device__ __forceinline__ void mma_s8(int32_t *d, const uint32_t *a, const uint32_t *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ldmatrix .x4: four 8 x 16-byte matrices from shared memory, lane l giving the address of row
 * l % 8 of matrix l / 8; thread t receives the 4 bytes at row t / 4, bytes 4 (t % 4) of each, which
 * is the layout of an int8 mma.sync fragment register. */
__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(saddr));
}

/* ldmatrix .x2: the first two of .x4's matrices (lanes 0-15 give the addresses). */
__device__ __forceinline__ void ldsm_x2(uint32_t &r0, uint32_t &r1, uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(saddr));
}

/* Asynchronous copies global -> shared (sm_80+). The thread's copies since its last commit form a
 * group; cp_async_wait<N> returns once all but its newest N groups have landed (its own copies
 * only: other threads' copies need a barrier or an mbarrier besides). */
/* 16 bytes to a shared address (cvta'd once by the caller), bypassing L1 */
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src) { cp_async16_s(smem_addr(dst), src); }
/* 16 bytes of which the first `bytes` (0 or 16) are read and the rest are zeros */
__device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
/* 4 bytes, through L1 (the persistent kernels' per-thread prefetch rings); typed, so that the
 * callers' address arithmetic compiles as it did with their own typed copies */
template <typename T>
__device__ __forceinline__ void cp_async4(T *dst, const T *src) {
  static_assert(sizeof(T) == 4, "cp_async4 copies one 4-byte element");
  const unsigned sa = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
/* every copy of the thread, committed or not, has landed */
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* bar.sync id, n (barrier.sync.aligned): the n threads (a multiple of 32) that reach barrier id
 * wait for each other; every thread of a warp must reach it from the same instruction.
 * compute-sanitizer's racecheck does not follow these (bench/racecheck_named_probe.cu): where it
 * must, order shared memory with mbarriers (mbarrier.cuh). */
__device__ __forceinline__ void bar_sync_named(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
/* barrier.sync id, n (not .aligned): the same wait, for warps that reach it from different
 * instructions (warp roles each on a code path of its own), which the aligned form does not allow
 * and compute-sanitizer synccheck reports ("divergent thread(s) in block") */
__device__ __forceinline__ void bar_sync_named_unaligned(int id, int n) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* The shared::cluster address of the same offset in the shared memory of the cluster's CTA `rank`
 * (a = a shared::cta address of this CTA). */
__device__ __forceinline__ uint32_t mapa_shared(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
/* A store into a peer's shared memory (addr and mbar from mapa_shared) whose completion counts its
 * bytes on the peer's mbarrier (complete_tx, a release at cluster scope; mbarrier.cuh). */
__device__ __forceinline__ void st_async_b32(uint32_t addr, uint32_t v, uint32_t mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v), "r"(mbar) : "memory");
}
__device__ __forceinline__ void st_async_b64(uint32_t addr, uint64_t v, uint32_t mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(addr), "l"(v), "r"(mbar) : "memory");
}

/* The cluster barrier in halves (barrier.cluster; every thread of every CTA of the cluster takes
 * part, each warp from one instruction): arrive (release: this thread's writes, distributed
 * shared memory included, are visible to the peers after their wait; relaxed: no such order, for
 * a phase that only says "this CTA has started") and wait (acquire). */
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
/* Programmatic dependent launch (sm_90): wait until the grid this one depends on has completed and
 * its memory is visible. A no-op where the launch had no programmatic dependency. */
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
/* The grid that depends on this one programmatically may launch once every block has passed here or
 * exited; it still waits for this grid's completion in its griddep_wait. */
__device__ __forceinline__ void griddep_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* *addr = v in a peer's shared memory (addr from mapa_shared) */
__device__ __forceinline__ void st_cluster_f32(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void st_cluster_s64(uint32_t addr, long long v) {
  asm volatile("st.shared::cluster.s64 [%0], %1;\n" ::"r"(addr), "l"(v) : "memory");
}

__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t *p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* *p += v with release semantics at GPU scope (the writes this thread observed, the block's
 * stores ordered before it by a barrier included, are visible to an acquire that reads the sum) */
__device__ __forceinline__ void red_release_gpu(int32_t *p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

#endif
