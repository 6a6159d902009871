/*
 * igemm_sm90.cu: the int8 GEMM of kernels/igemm.cuh (what it computes, its operands' rules) on
 * wgmma and TMA. Built for sm_90a only (CMakeLists.txt: wgmma is an sm_90a instruction); the rest
 * of the library is sm_90 and calls it through igemm.cuh.
 *
 * Why our own: session 35's mma.sync product (bench/attempts/own_step_product.patch) could be a
 * programmatic dependent of the strict backward's step kernel but ran at 40% of cuBLAS's wgmma
 * kernel's rate (bench/cuda_int_gru.md), and cuBLAS's kernels cannot be programmatic dependents.
 *
 * Kernel (igemm_tn_kernel<BN, STAGES>): a block tile of 128 rows of A x BN rows of B; three
 * warpgroups. The first's thread 0 issues the TMA copies of K tiles of 128 bytes into a
 * STAGES-deep ring (each stage's copies complete on its `full` mbarrier); the other two each
 * multiply 64 rows of A by the tile's BN rows of B with wgmma m64nBNk32 (four a K tile, one wgmma
 * group in flight) and release a stage on its `empty` mbarrier once the group that read it has
 * completed. Shared tiles are 128-byte rows in TMA's 128-byte swizzle, which the wgmma
 * descriptors name; a K step of 32 bytes moves the descriptors' start address by 32 bytes within
 * the swizzle atom (8 rows x 128 bytes, 1024-byte aligned).
 */
#include "igemm.cuh"
#include "mbarrier.cuh"
#include "ptx.cuh"
#include "ktrace.cuh"   /* QG_KTRACE builds only */

#include <cudaTypedefs.h>   /* PFN_cuTensorMapEncodeTiled */
#include <string.h>

enum { IG_BM = 128,        /* rows of A a block */
       IG_BK = 128,        /* bytes of K a stage: one 128-byte swizzle row */
       IG_THREADS = 384 }; /* the producer warpgroup and two consumer warpgroups */

template <int BN, int STAGES>
struct ig_layout {
  static constexpr int A_BYTES = IG_BM * IG_BK, B_BYTES = BN * IG_BK, STAGE = A_BYTES + B_BYTES;
  /* the tiles (1024-byte aligned: the swizzle atom), then the mbarriers; +1024 to align the base */
  static constexpr int SMEM = STAGES * STAGE + 2 * STAGES * 8 + 1024;
};

/* A wgmma shared-memory descriptor of a K-major tile of 128-byte rows in 128-byte swizzle: start
 * address >> 4 (bits 0-13), leading byte offset 1 (unused for swizzled K-major), stride byte offset
 * 1024 >> 4 (8 rows of 128 bytes: one swizzle atom; bits 32-45), swizzle mode 1 = 128 bytes (bits
 * 62-63). */
__device__ __forceinline__ uint64_t ig_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

/* The box of a tensor map at (c0 = K byte, c1 = row) into shared memory, completing on mbar. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t mbar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(mbar)
      : "memory");
}

/* d [64 x 64] += A [64 x 32] B [64 x 32]^T: A and B in shared memory as the descriptors say
 * (K-major, 128-byte swizzle); every thread of the warpgroup issues it (wgmma's .aligned) */
__device__ __forceinline__ void wgmma_s8_n64(int32_t (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(da), "l"(db), "n"(1)
      : "memory");
}

/* d [64 x 128] += A [64 x 32] B [128 x 32]^T: A and B in shared memory as the descriptors say
 * (K-major, 128-byte swizzle); every thread of the warpgroup issues it (wgmma's .aligned) */
__device__ __forceinline__ void wgmma_s8_n128(int32_t (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(da), "l"(db), "n"(1)
      : "memory");
}

template <int BN>
__device__ __forceinline__ void ig_wgmma(int32_t (&d)[BN / 2], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void ig_wgmma<64>(int32_t (&d)[32], uint64_t da, uint64_t db) { wgmma_s8_n64(d, da, db); }
template <>
__device__ __forceinline__ void ig_wgmma<128>(int32_t (&d)[64], uint64_t da, uint64_t db) { wgmma_s8_n128(d, da, db); }

/* grid (ceil(N / BN), ceil(M / 128), slices); k_tiles: the K tiles (of IG_BK bytes) of one slice.
 * b_first: B's first stages are issued before griddepcontrol.wait (B must not be written by the
 * grid this one depends on). */
template <int BN, int STAGES>
__global__ void __launch_bounds__(IG_THREADS, 1)
    igemm_tn_kernel(int32_t *__restrict__ C, int64_t ldc, int64_t slice_stride, const __grid_constant__ CUtensorMap ta,
                    const __grid_constant__ CUtensorMap tb, int M, int N, int K, int k_tiles, int b_first, kt_rec *kt) {
  using L = ig_layout<BN, STAGES>;
  extern __shared__ uint8_t ig_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)ig_raw + 1023) & ~(uintptr_t)1023);
  uint64_t *full = (uint64_t *)(sm + STAGES * L::STAGE), *empty = full + STAGES;
  const int wg = threadIdx.x >> 7;
  const int m0 = blockIdx.y * IG_BM, n0 = blockIdx.x * BN;
  const int kt_all = (K + IG_BK - 1) / IG_BK;
  const int kt0 = blockIdx.z * k_tiles, nk = min(kt0 + k_tiles, kt_all) - kt0;

  (void)kt;
  KT_START(kt, threadIdx.x);
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++) {
      mb_init(&full[s], 1);
      mb_init(&empty[s], 2 * 128);   /* every consumer thread arrives */
    }
    mb_init_fence_cluster();   /* the inits visible to the async proxy (TMA) */
  }
  __syncthreads();

  if (wg == 0) {
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&ta) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tb) : "memory");
      const int pre = b_first ? min(nk, STAGES) : 0;
      for (int i = 0; i < pre; i++) {
        mb_arrive_expect_tx(&full[i], L::STAGE);
        tma_load_2d(smem_addr(sm + i * L::STAGE + L::A_BYTES), &tb, (kt0 + i) * IG_BK, n0, smem_addr(&full[i]));
      }
      griddep_wait();   /* A (and the rest of B) from the grid before are visible from here on */
      KT_WAITED(kt, threadIdx.x);
      for (int i = 0; i < nk; i++) {
        const int s = i % STAGES;
        if (i >= STAGES) mb_wait(&empty[s], ((i / STAGES) - 1) & 1);
        uint8_t *st = sm + s * L::STAGE;
        if (i >= pre) {
          mb_arrive_expect_tx(&full[s], L::STAGE);
          tma_load_2d(smem_addr(st + L::A_BYTES), &tb, (kt0 + i) * IG_BK, n0, smem_addr(&full[s]));
        }
        tma_load_2d(smem_addr(st), &ta, (kt0 + i) * IG_BK, m0, smem_addr(&full[s]));
      }
    }
    return;
  }

  /* consumers: warpgroup c = wg - 1 multiplies the tile's rows 64 c .. 64 c + 63 */
  const int c = wg - 1;
  int32_t acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0;
  griddep_wait();   /* C may be read by the grid before: stores only after its completion */
  for (int i = 0; i < nk; i++) {
    const int s = i % STAGES;
    mb_wait(&full[s], (i / STAGES) & 1);
    const uint32_t a = smem_addr(sm + s * L::STAGE + c * 64 * IG_BK), b = smem_addr(sm + s * L::STAGE + L::A_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < IG_BK; kk += 32) ig_wgmma<BN>(acc, ig_desc(a + kk), ig_desc(b + kk));
    wgmma_commit();
    wgmma_wait<1>();   /* the group of stage i - 1 has completed: its stage is free */
    if (i > 0) mb_arrive(&empty[(i - 1) % STAGES]);
  }
  wgmma_wait<0>();
  griddep_launch();

  /* accumulator register 4 j + 2 h + e of thread (warp w of the warpgroup, lane l): row
   * 16 w + l / 4 + 8 h, column 8 j + 2 (l % 4) + e */
  const int w = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  int32_t *Cs = C + (int64_t)blockIdx.z * slice_stride;
  const bool pairs = (ldc & 1) == 0 && ((uintptr_t)Cs & 7) == 0;   /* 8-byte stores of column pairs */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int m = m0 + c * 64 + 16 * w + (l >> 2) + 8 * h;
    if (m >= M) continue;
    int32_t *row = Cs + (int64_t)m * ldc;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
      const int n = n0 + 8 * j + 2 * (l & 3);
      if (pairs && n + 1 < N) *(int2 *)(row + n) = make_int2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      else {
        if (n < N) row[n] = acc[4 * j + 2 * h];
        if (n + 1 < N) row[n + 1] = acc[4 * j + 2 * h + 1];
      }
    }
  }
  KT_END(kt, threadIdx.x - 128);   /* the first consumer thread */
}

/* ------------------------------------------------------------------------------------------ */
/* Host side: the tensor maps and the launch.                                                   */

#ifndef IG_STAGES_64
#define IG_STAGES_64 8
#endif
#ifndef IG_STAGES_128
#define IG_STAGES_128 6
#endif

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no link to libcuda); NULL where
 * the driver has none. */
static PFN_cuTensorMapEncodeTiled_v12000 ig_encode_fn(void) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
  if (!fn) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
  }
  return fn;
}

int ig_available(void) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return 0;
  return major == 9 && minor == 0 && ig_encode_fn() != NULL;
}

/* The map of an int8 matrix [rows][K] (row stride ld bytes) in boxes of box_rows x IG_BK bytes,
 * 128-byte swizzle. */
static int ig_map(CUtensorMap *map, const int8_t *base, int64_t rows, int64_t K, int64_t ld, int box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = ig_encode_fn();
  if (!enc || ld % 16 != 0 || ((uintptr_t)base & 15) != 0 || ld < K) return -1;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)ld};
  cuuint32_t box[2] = {IG_BK, (cuuint32_t)box_rows};
  cuuint32_t estr[2] = {1, 1};
  CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : -1;
}

int ig_plan_init(ig_plan *p, const int8_t *A, int64_t lda, const int8_t *B, int64_t ldb, int64_t M, int64_t N, int64_t K, int64_t ldc,
                 int slices, int64_t slice_stride, int bn) {
  if (M <= 0 || N <= 0 || K <= 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || ldc < N || slices < 1 || (bn != 64 && bn != 128))
    return -1;
  const int64_t kt_all = (K + IG_BK - 1) / IG_BK;
  ig_plan q;   /* filled here, copied to *p only when every check has passed */
  memset(&q, 0, sizeof q);
  q.M = M; q.N = N; q.K = K; q.ldc = ldc; q.slice_stride = slice_stride; q.bn = bn;
  q.k_tiles = (int)((kt_all + slices - 1) / slices);
  q.slices = (int)((kt_all + q.k_tiles - 1) / q.k_tiles);
  if (q.slices > 65535 || (M + IG_BM - 1) / IG_BM > 65535) return -1;
  if (ig_map(&q.ta, A, M, K, lda, IG_BM) || ig_map(&q.tb, B, N, K, ldb, bn)) return -1;
  *p = q;
  return 0;
}

#if QG_KTRACE
static kt_rec *ig_kt_next;   /* the next launch's trace record (ig_kt_set) */
void ig_kt_set(kt_rec *r) { ig_kt_next = r; }
#endif

template <int BN, int STAGES>
static cudaError_t ig_launch_t(const ig_plan *p, int32_t *C, cudaStream_t st, int pdl, int b_first) {
  static unsigned long long opted = 0;   /* device ordinals (< 64) whose shared-memory opt-in is done */
  const int smem = ig_layout<BN, STAGES>::SMEM;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
  if (!bit || !(__atomic_load_n(&opted, __ATOMIC_RELAXED) & bit)) {
    e = cudaFuncSetAttribute((const void *)igemm_tn_kernel<BN, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    __atomic_fetch_or(&opted, bit, __ATOMIC_RELAXED);
  }
  cudaLaunchConfig_t lc = {};
  cudaLaunchAttribute at[1];
  lc.gridDim = dim3((unsigned)((p->N + BN - 1) / BN), (unsigned)((p->M + IG_BM - 1) / IG_BM), (unsigned)p->slices);
  lc.blockDim = dim3(IG_THREADS);
  lc.dynamicSmemBytes = (size_t)smem;
  lc.stream = st;
  if (pdl) {
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&lc, igemm_tn_kernel<BN, STAGES>, C, (int64_t)p->ldc, (int64_t)p->slice_stride, p->ta, p->tb, (int)p->M,
                            (int)p->N, (int)p->K, p->k_tiles, b_first,
#if QG_KTRACE
                            ig_kt_next
#else
                            (kt_rec *)NULL
#endif
  );
}

cudaError_t ig_launch(const ig_plan *p, int32_t *C, cudaStream_t st, int pdl, int b_first) {
  return p->bn == 64 ? ig_launch_t<64, IG_STAGES_64>(p, C, st, pdl, b_first) : ig_launch_t<128, IG_STAGES_128>(p, C, st, pdl, b_first);
}
