/*
 * racecheck_nvjet_pattern_probe.cu: the hand-off that racecheck reports inside cuBLAS's nvjet bf16
 * kernels, rebuilt in a few lines of our own, to say whether the report is about the pattern or
 * about cuBLAS. What ncu's SASS of nvjet_sm90_tss_64x8_64x16_1x4_h_bz_NNT shows (bench/sanitize.md,
 * session 46; nvjet_sm90_tss_64x288_64x4_2x1_v_bz_NTT has the same code at its reported offsets):
 *   - the producer thread (thread 256) waits on a stage's "empty" mbarrier, issues its TMA loads,
 *     stores one 32-bit word of its own next to the stage's "full" mbarrier (`STS [full + 8]`,
 *     the reported write) and arrives on "full" with the expected bytes;
 *   - every consumer thread waits on "full", reads that word (`LDS [full + 8]`, the reported
 *     read), passes `BAR.SYNC 0, 128` (a named barrier of its warpgroup), runs its wgmma and then
 *     releases the stage with an mbarrier arrival from a few selected lanes only (`@P1
 *     SYNCS.ARRIVE ... [R7 + UR14]`, onto the cluster peers' "empty" barriers).
 * So the consumers' reads are ordered before the producer's next store only through a thread
 * count barrier and an arrival made by other threads, two orders racecheck does not follow
 * (kernels/mbarrier.cuh; bench/racecheck_named_probe.cu, bench/racecheck_async_probe.cu).
 * Here one CTA of 384 threads (two consumer warpgroups, one producer warp) runs a ring of 4
 * stages for 64 rounds; the producer stores each stage's word (the same value every round, as in
 * every report, "Current Value" = "Incoming Value") and the consumers add what they read. Modes,
 * the consumers' release of a stage:
 *   0: every consumer thread arrives on "empty" (256 arrivals a phase);
 *   1: nvjet's form: bar.sync (warpgroup id + 1, 128), then thread 0 of the warpgroup arrives (2);
 *   2: bar.sync (warpgroup id + 1, 128), then every thread arrives (256);
 *   3: __syncwarp, then lane 0 of each warp arrives (8).
 * Every mode gives the same sums (checked); under racecheck, mode 0 and 2 should be silent if the
 * explanation holds, modes 1 and 3 report a WAR hazard between the read and the producer's store.
 * Build and run: nvcc -arch=sm_90 -O2 -lineinfo bench/racecheck_nvjet_pattern_probe.cu -o probe &&
 *   for m in 0 1 2 3; do compute-sanitizer --tool racecheck ./probe $m; done
 */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include "../kernels/mbarrier.cuh"   /* mb_init, mb_arrive, mb_wait: the library's */
#include "../kernels/ptx.cuh"        /* bar_sync_named */

enum { STAGES = 4, ROUNDS = 64, CONSUMERS = 256 };

__global__ void k(int mode, int *out) {
  __shared__ uint64_t full[STAGES], empty[STAGES];
  __shared__ int word[STAGES];
  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {
    const int releases = mode == 1 ? 2 : mode == 3 ? CONSUMERS / 32 : CONSUMERS;
    for (int s = 0; s < STAGES; s++) {
      mb_init(&full[s], 1);
      mb_init(&empty[s], releases);
    }
    mb_init_fence_cluster();
  }
  __syncthreads();
  if (wg == 2) {   /* the producer: thread 256 only, as nvjet's */
    if (tid != 256) return;
    for (int r = 0; r < ROUNDS; r++) {
      const int s = r % STAGES;
      if (r >= STAGES) mb_wait(&empty[s], (r / STAGES - 1) & 1);
      word[s] = 39 + s;   /* the same value every time round the ring */
      mb_arrive(&full[s]);
    }
    return;
  }
  int acc = 0;
  for (int r = 0; r < ROUNDS; r++) {
    const int s = r % STAGES;
    mb_wait(&full[s], (r / STAGES) & 1);
    acc += word[s];
    if (mode == 0) {
      mb_arrive(&empty[s]);
    } else if (mode == 1 || mode == 2) {
      bar_sync_named(wg + 1, 128);
      if (mode == 2 || (tid & 127) == 0) mb_arrive(&empty[s]);
    } else {
      __syncwarp();
      if ((tid & 31) == 0) mb_arrive(&empty[s]);
    }
  }
  out[tid] = acc;
}

int main(int argc, char **argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  if (argc != 2 || mode < 0 || mode > 3) {
    fprintf(stderr, "usage: %s MODE (0..3: the consumers' release; see the top of the file)\n", argv[0]);
    return 2;
  }
  int *out, ho[CONSUMERS];
  if (cudaMalloc(&out, sizeof ho) != cudaSuccess) { printf("cudaMalloc failed\n"); return 1; }
  k<<<1, 384>>>(mode, out);
  cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(ho, out, sizeof ho, cudaMemcpyDeviceToHost);
  int want = 0, bad = 0;
  for (int r = 0; r < ROUNDS; r++) want += 39 + r % STAGES;
  for (int c = 0; c < CONSUMERS; c++) bad += ho[c] != want;
  printf("mode %d: %s, %d wrong sums of %d\n", mode, cudaGetErrorString(e), bad, CONSUMERS);
  return e != cudaSuccess || bad != 0;
}
