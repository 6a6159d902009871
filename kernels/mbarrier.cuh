/*
 * mbarrier.cuh: shared-memory mbarriers (sm_90 PTX) for kernels whose warp roles hand shared
 * memory to each other: tc_grid_kernel (int_gru_grid.cuh). A kernel that puts its mbarriers in
 * static shared memory cannot take persist_prepare_kernel's opt-in to the device's whole shared
 * memory (cudaFuncSetAttribute rejects it): those kernels keep them in the dynamic part.
 *
 * Why mbarriers rather than named barriers: compute-sanitizer's racecheck follows an mbarrier's
 * arrive / wait pairs when every thread that accessed the memory arrives itself. It does not
 * follow named barriers with a thread count (bar.sync id, n), and it does not follow one arrival
 * per warp after __syncwarp, nor one per warpgroup after a bar.sync of the warpgroup, though both
 * are correct orders (bench/racecheck_named_probe.cu, bench/racecheck_async_probe.cu,
 * bench/racecheck_nvjet_pattern_probe.cu: the form that draws its reports in cuBLAS's nvjet kernels).
 * synccheck accepts a wait that different roles reach from different code, which bar.sync
 * (barrier.sync.aligned) does not allow.
 * Arrive is a release and wait an acquire, both at CTA scope. A phase's parity is its count mod 2.
 *
 * The cluster form (the persistent kernel's h exchange, int_gru_cluster.cuh): a CTA's mbarrier counts the
 * bytes its peers store into its shared memory with st.async (ptx.cuh); the owner arms a phase
 * with the bytes it expects (mb_arrive_expect_tx) and waits with mb_wait. The bytes are in the
 * owner's shared memory when their complete_tx counts, so the wait's acquire at CTA scope is
 * enough (as CUTLASS's cluster transaction barriers wait); one at cluster scope also invalidated
 * L1 at every step (CCTL.IVALL: 12.7% of seed-small's stall samples, session 24). No peer's other
 * memory operations are waited for, as a cluster barrier's release waits for all of them.
 */
#ifndef QGRU_MBARRIER_CUH
#define QGRU_MBARRIER_CUH

#include <stdint.h>

__device__ __forceinline__ void mb_init(uint64_t *m, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(m)), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t *m) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }\n" ::"r"((uint32_t)__cvta_generic_to_shared(m)) : "memory");
}
/* wait until the phase of the given parity has completed */
__device__ __forceinline__ void mb_wait(uint64_t *m, int parity) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(m);
  uint32_t done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(a), "r"(parity)
                 : "memory");
  } while (!done);
}
/* makes this thread's mbarrier.init visible to the cluster's complete_tx (before the cluster
 * barrier that precedes any peer's store) */
__device__ __forceinline__ void mb_init_fence_cluster() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* one arrival that also expects `bytes` more of complete_tx in the current phase */
__device__ __forceinline__ void mb_arrive_expect_tx(uint64_t *m, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(m)), "r"(bytes)
               : "memory");
}
/* an arrival on *m once every cp.async this thread has issued so far has landed (counted in the
 * mbarrier's expected arrivals: .noinc) */
__device__ __forceinline__ void cp_async_mb_arrive(uint64_t *m) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"((uint32_t)__cvta_generic_to_shared(m)) : "memory");
}

#endif
