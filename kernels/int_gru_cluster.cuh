/*
 * int_gru_cluster.cuh: the integer GRU forward's persistent recurrence in thread-block clusters
 * (persistent_kernel: one launch for all T steps, R's planes in shared memory, h exchanged through
 * distributed shared memory; int_gru.cu's header describes it) and the host code that picks its
 * configuration (CS CTAs a cluster x NB batch rows: pk_layout, pk_choose, memoized per device and
 * shape) and its launch attributes (pk_config).
 * Included once by kernels/int_gru.cu, after rec_common and its helpers.
 */

/* ---- persistent: one launch for all steps (int_gru.cu's header) ---- */
struct pk_params {
  rec_common c;
  int CS, U, NB, Kp, Mp, PR, PH, ksplit;
  int need_sh;                    /* some row of R has a zero-point term roff != 0: per-step row sums of h */
  int64_t baseH, c0H;             /* output.h planes */
  const int8_t *Rp;               /* [PR][3H][Kp] */
  const int64_t *rconst, *roff;   /* [3H] */
  /* the 32-bit mode (A32): the per-tensor part of the 32-bit cell (P, H and the tables set per
   * thread), W's exponents and input.x's (the general cell's requantization of W x), and the
   * flag a unit outside the 32-bit bounds sets (zeroed before the launch) */
  qg_cell32 c32;
  const int32_t *eW;
  int eX;
  int32_t *c32_flag;
  /* shared memory layout (bytes) */
  int64_t off_H, off_acc, off_part, off_slice, off_contrib, off_items, off_P, off_mb, off_lut, smem;
  int lut_smem;
};


/* Sum over the warp (every lane gets it). */
template <typename S>
__device__ __forceinline__ S warp_sum(S v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* A32: W x arrives as int32 accumulators (wx_gemm_kernel with acc_out) and every R h sum is
 * taken in uint32 arithmetic: the host checked that every accumulator is below 2^29 in
 * magnitude, so its value mod 2^32 (what wrap-around sums of the plane products, the zero-point
 * constants and the row sums give) is exact. Each thread computes its unit's rows of the 32-bit
 * cell (qg_cell32_unit, into registers) once, and runs qg_cell32_forward at every step; a unit
 * outside the 32-bit bounds (its bias terms) runs the general cell on the same accumulators and
 * raises c32_flag. Both give the same codes, so the choice is per unit. */
template <int WIDE, int OBS, int A32, int PSM>
__global__ void __launch_bounds__(A32 && !PSM ? 256 : 512, 1) persistent_kernel(const __grid_constant__ pk_params p) {
  typedef typename std::conditional<A32, uint32_t, int64_t>::type sum_t;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  const rec_common &c = p.c;
  const int rank = (int)cluster.block_rank();
  const int CS = p.CS, U = p.U, NB = p.NB, Kp = p.Kp, Mp = p.Mp, PR = p.PR, PH = p.PH;
  const int RS = Kp + 16, HS = Kp + 16;
  const int64_t H = c.H, H3 = 3 * H, N = c.N, T = c.T;
  const int64_t n0 = (int64_t)(blockIdx.x / CS) * NB, i0 = (int64_t)rank * U;
  const int Ureal = (int)(H - i0 < 0 ? 0 : (H - i0 < U ? H - i0 : U));
  int8_t *Rs = (int8_t *)smem;
  int8_t *Hs = (int8_t *)(smem + p.off_H);             /* [2][PH][NB][HS] */
  sum_t *accp = (sum_t *)(smem + p.off_acc);           /* [ksplit][NB][Mp + 4]: R h partial sums */
  sum_t *part = (sum_t *)(smem + p.off_part);          /* [2][CS][NB] row sums of h by source rank */
  int8_t *slice = (int8_t *)(smem + p.off_slice);      /* [PH][NB][U] this CTA's new h planes (need_sh) */
  int32_t *contrib = (int32_t *)(smem + p.off_contrib);   /* [NB][U] r - c0 of the new h (need_sh) */
  int4 *items = (int4 *)(smem + p.off_items);          /* the R h work items: m row, n row, k steps, k part */
  const int tid = threadIdx.x, nthr = blockDim.x;
  const int warp = tid >> 5, nwarps = nthr >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int64_t hbuf = (int64_t)PH * NB * HS;

  /* R's rows of this CTA's units (local row g U + u), zero rows and columns beyond */
  const int kv = Kp / 16;
  for (int e = tid; e < PR * Mp * kv; e += nthr) {
    const int pl = e / (Mp * kv), rem = e % (Mp * kv), lr = rem / kv, cv = rem % kv;
    int4 v = make_int4(0, 0, 0, 0);
    if (lr < 3 * U) {
      const int gt = lr / U, u = lr % U;
      if (u < Ureal) v = ((const int4 *)(p.Rp + ((int64_t)pl * H3 + gt * H + i0 + u) * Kp))[cv];
    }
    *(int4 *)(Rs + ((int64_t)pl * Mp + lr) * RS + cv * 16) = v;
  }
  /* activation tables */
  qg_cell_q q = c.cell;
  if (p.lut_smem) cell_luts_to_smem(&q, (int32_t *)(smem + p.off_lut), tid, nthr);
  for (int64_t e = tid; e < 2 * hbuf / 16; e += nthr) ((int4 *)Hs)[e] = make_int4(0, 0, 0, 0);
  for (int e = tid; e < 2 * CS * NB; e += nthr) part[e] = 0;
  /* CS > 1: hb[b] counts the bytes the cluster stores into h buffer b (and its row sums): each
   * phase is one step's exchange, armed by thread 0 with the bytes of all CS CTAs (below, before
   * the cluster barrier that precedes every push); hb[1] first takes h_1, hb[0] h_2 (h_0 is
   * written locally) */
  uint64_t *hb = (uint64_t *)(smem + p.off_mb);
  const uint32_t tx_bytes = (uint32_t)(CS * PH * NB * U + (p.need_sh ? CS * NB * (int)sizeof(sum_t) : 0));
  if (CS > 1 && tid == 0) {
    mb_init(&hb[0], 1);
    mb_init(&hb[1], 1);
    mb_init_fence_cluster();
  }
  const int Mt = Mp / 16, Nt = NB / 8, Ks = Kp / 32, nitems = Mt * Nt * p.ksplit, Mps = Mp + 4;
  for (int it = tid; it < nitems; it += nthr) {
    const int mt = it % Mt, rest = it / Mt, nt = rest % Nt, ks = rest / Nt;
    items[it] = make_int4(mt * 16, nt * 8, (ks * Ks / p.ksplit) | (((ks + 1) * Ks / p.ksplit) << 16), ks);
  }
  __syncthreads();
  /* h0 planes of every unit (buffer 0) and their row sums (as if all came from rank 0), a warp per row */
  const int32_t *hq0 = h_at(c, 0);
  for (int nl = warp; nl < NB; nl += nwarps) {
    const int64_t n = n0 + nl;
    if (n >= N) continue;
    sum_t sum = 0;
    for (int64_t k = lane; k < H; k += 32) {
      const int64_t code = hq0[n * H + k];
      int8_t p0, p1;
      split_planes(code, p.baseH, PH, &p0, &p1);
      Hs[(int64_t)nl * HS + k] = p0;
      if (PH == 2) Hs[(int64_t)(NB + nl) * HS + k] = p1;
      sum += (sum_t)(code - p.baseH - p.c0H);
    }
    sum = warp_sum(sum);
    if (lane == 0) part[nl] = sum;
  }
  /* this thread's cell: unit u of the slice, row nl of the tile */
  const int u = tid % U, nl = tid / U;
  const int64_t i = i0 + u, n = n0 + nl;
  const bool mine = tid < U * NB;   /* owns a slot of the slice (maybe a padding one) */
  const bool active = mine && u < Ureal && n < N;
  const qg_qp QH = q.a[QG_Q_OUTPUT_H], QRH = q.a[QG_Q_MATMUL_RH];
  qg_cell_in base_in;
  sum_t rconst[3] = {0, 0, 0}, roff[3] = {0, 0, 0};
  int srh[3] = {0, 0, 0};
  int64_t hprev = 0, Ln = 0;
  base_in.mask = 0;
  base_in.hprev = 0;
  for (int k = 0; k < 3; k++) base_in.wx[k] = base_in.rh[k] = base_in.bx[k] = base_in.br[k] = base_in.ebx[k] = base_in.ebr[k] = 0;
  if (active) {
    if (!A32) fill_bias(c, i, &base_in);
    for (int k = 0; k < 3; k++) {
      const int64_t j = k * H + i;
      rconst[k] = (sum_t)p.rconst[j];
      roff[k] = (sum_t)p.roff[j];
      srh[k] = c.eR[j] + QH.e;
    }
    hprev = hq0[n * H + i];
    Ln = length_at(c.L, n, T);
  }
  /* A32: the rows of the 32-bit cell of this CTA's units, computed by the threads of row 0 into
   * shared memory; then each thread's unit's rows in its registers for all steps (51 of them:
   * CTAs of at most 256 threads), or, with PSM, read from shared memory by the cells (CTAs of
   * up to 512 threads, at most 128 registers each) */
  int32_t *Ps = (int32_t *)(smem + p.off_P);   /* [QG_C32_ROWS][U] */
  int use32 = 1, fast_unit = 1;
  if (A32 && active && nl == 0) {
    use32 = cell32_unit_rows(Ps, U, u, &q, H, i, p.eW, c.eR, c.bxc, c.bxz, c.bxe, c.brc, c.brz, c.bre);
    if (!use32) *p.c32_flag = 1;
    fast_unit = use32 && qg_cell32_unit_fast(Ps, U, u);
  }
  /* one loop per CTA: the 32-bit one where every unit of the CTA is within the bounds */
  use32 = __syncthreads_and(use32);
  /* the cell without the requantizations' clamps where every unit allows it (qg_rs32) */
  const bool fast = A32 && __syncthreads_and(p.c32.fast && fast_unit);
  constexpr int NP = PSM ? 1 : QG_C32_ROWS;   /* the rows' copy in registers (none with PSM) */
  int32_t P[NP];
#pragma unroll
  for (int r = 0; r < NP; r++) P[r] = !PSM && A32 && use32 && active ? Ps[r * U + u] : 0;
  qg_cell32 c32 = p.c32;
  c32.P = PSM ? Ps : P;
  c32.H = PSM ? U : 1;
  const int64_t iP = PSM ? u : 0;   /* the unit's column of c32.P */
#pragma unroll
  for (int k = 0; k < 3; k++) c32.lut[k] = q.lut[k];
  const double yscale = ldexp(1.0, -QH.e);
  if (mine && p.need_sh) {   /* padding slots push zeros */
    for (int pl = 0; pl < PH; pl++) slice[((int64_t)pl * NB + nl) * U + u] = 0;
    contrib[tid] = 0;
  }
  /* need_sh: this thread's 4-byte word of the new slice (plane, row, word), pushed to every CTA */
  const int words = U / 4, has_word = tid < PH * NB * words;
  const int64_t word_src = has_word ? (int64_t)(tid / words) * U + 4 * (tid % words) : 0;
  const int64_t word_dst = has_word ? (int64_t)(tid / words) * HS + i0 + 4 * (tid % words) : 0;
  /* only the phases some step waits for (synccheck reports an armed phase left unwaited) */
  if (CS > 1 && tid == 0) {
    if (T > 1) mb_arrive_expect_tx(&hb[1], tx_bytes);
    if (T > 2) mb_arrive_expect_tx(&hb[0], tx_bytes);
  }
  cluster.sync();

  /* the steps; C32 (a compile-time bool): the 32-bit cell. The same exchange in either loop, so
   * CTAs of a cluster may run different ones. */
  auto steps = [&](auto c32_tag) {
  constexpr bool C32 = decltype(c32_tag)::value;
  for (int64_t s = 0; s < T; s++) {
    const int cur = (int)(s & 1), nxt = cur ^ 1;
    /* CS > 1: h_s (s >= 1) has arrived when hb[cur] completes the phase of that step: phase
     * (s - 1) / 2 of the barrier (h_1, h_3, ... on hb[1]; h_2, h_4, ... on hb[0]). Every thread
     * of the CTA has pushed h_s, so has read accp, part[nxt] and buffer nxt of step s - 1: the
     * wait orders this step's writes after those reads, as the block barrier it replaces did.
     * Then thread 0 arms the barrier's next phase (h_{s+2}, where a step waits for it) before
     * its own push of h_{s+1}, which every peer needs before it can push h_{s+2}. The block
     * barrier after it orders nothing more, but racecheck does not follow the order through the
     * pushes and reports the accp reads and writes of consecutive steps without it (two buffers
     * of accp by step parity instead were slower: medium 0.516-0.522 ms against 0.501-0.509) */
    if (CS > 1 && s > 0) {
      mb_wait(&hb[cur], (int)(((s - 1) >> 1) & 1));
      if (tid == 0 && s + 2 < T) mb_arrive_expect_tx(&hb[cur], tx_bytes);
      __syncthreads();
    }
    /* this step's W x codes (A32: accumulators), fetched before the products to hide their latency */
    const bool valid = active && s < Ln;
    const int64_t t = valid ? (c.reverse ? Ln - 1 - s : s) : 0;
    int32_t wxc[3] = {0, 0, 0};
    uint32_t wxm = 0;
    if (valid) {
      const int64_t row = (t * N + n) * H3;
      for (int k = 0; k < 3; k++) {
        wxc[k] = c.qwx[row + k * H + i];
        if (!A32) wxm |= (uint32_t)c.mwx[row + k * H + i] << (QG_MB_WX_Z + k);
      }
    }
    /* R h: items (m tile, n tile, k part) over the warps */
    const int8_t *Hc = Hs + cur * hbuf;
    for (int it = warp; it < nitems; it += nwarps) {
      const int4 d4 = items[it];
      const int m16 = d4.x, n8 = d4.y, kb = d4.z & 0xffff, ke = d4.z >> 16, ks = d4.w;
      sum_t a64[4] = {0, 0, 0, 0};
      for (int pa = 0; pa < PR; pa++)
        for (int pb = 0; pb < PH; pb++) {
          /* fragments by ldmatrix (the mma layouts, rh_k32's matrices), two k32 steps a round on two
           * accumulators (independent mma chains): A (rows 0-7 | 8-15) x (bytes 0-15 | 16-31) per
           * step, B rows 0-7 x bytes 0-15, 16-31, 32-47, 48-63 for both steps (the last round of an
           * odd count only its first two) */
          int32_t d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
          const uint32_t A = smem_addr(Rs) + (uint32_t)(((pa * Mp + m16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS) + (lane >> 4) * 16);
          const uint32_t B = smem_addr(Hc) + (uint32_t)((pb * NB + n8 + (lane & 7)) * HS + (lane >> 3) * 16);
          for (int kst = kb; kst < ke; kst += 2) {
            const uint32_t kk = (uint32_t)kst * 32;
            uint32_t a0[4], a1[4], bb[4];
            if (kst + 1 < ke) ldsm_x4(bb[0], bb[1], bb[2], bb[3], B + kk);
            else ldsm_x2(bb[0], bb[1], B + kk);
            ldsm_x4(a0[0], a0[1], a0[2], a0[3], A + kk);
            mma_s8(d[0], a0, bb);
            if (kst + 1 < ke) {
              ldsm_x4(a1[0], a1[1], a1[2], a1[3], A + kk + 32);
              mma_s8(d[1], a1, bb + 2);
            }
          }
          const sum_t sc = (sum_t)(plane_scale(PR, pa) * plane_scale(PH, pb));
          for (int e = 0; e < 4; e++) a64[e] += sc * (sum_t)(int32_t)((uint32_t)d[0][e] + (uint32_t)d[1][e]);   /* below 2^31: exact */
        }
      for (int e = 0; e < 4; e++) {
        const int row = m16 + g + (e >= 2 ? 8 : 0), col = n8 + 2 * tq + (e & 1);
        accp[((int64_t)ks * NB + col) * Mps + row] = a64[e];
      }
    }
    __syncthreads();
    /* the cells */
    int64_t hnew = hprev;
    if (active) {
      if (!valid) {   /* padded step (t = s): the state stays, y = 0 */
        pad_cell(c, s, n, i, N);
      } else {
        sum_t sh = 0;
        if (p.need_sh)
          for (int r = 0; r < CS; r++) sh += part[(cur * CS + r) * NB + nl];
        sum_t a[3];
        for (int k = 0; k < 3; k++) {
          const int lr = k * U + u;
          a[k] = rconst[k] + roff[k] * sh;
          for (int ks = 0; ks < p.ksplit; ks++) a[k] += accp[((int64_t)ks * NB + nl) * Mps + lr];
        }
        if (C32) {
          qg_cell32_out o;
          if (fast)
            qg_cell32_forward(&c32, iP, wxc[0], wxc[1], wxc[2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hprev, &o, 1);
          else
            qg_cell32_forward(&c32, iP, wxc[0], wxc[1], wxc[2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hprev, &o, 0);
          hnew = o.h;
          c.y[(t * N + n) * c.Hy + c.y_offset + i] = (float)((double)(o.h - QH.z) * yscale);
          if (c.cell_out) {   /* narrow (A32 implies it): three aligned words */
            uint32_t w[3];
            qg_cell_narrow_words(&q, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, w);
            uint32_t *d = (uint32_t *)(c.cell_out + ((s * N + n) * H + i) * 12);
            d[0] = w[0]; d[1] = w[1]; d[2] = w[2];
          }
        } else {
          qg_cell_in in;
          if (A32) {   /* a unit outside the 32-bit bounds: W x requantized here, as wx_gemm_kernel does */
            fill_bias(c, i, &in);
            in.mask = 0;
            for (int k = 0; k < 3; k++) {
              int m;
              in.wx[k] = qg_requant64(wxc[k], p.eW[k * H + i] + p.eX, q.a[QG_Q_MATMUL_WX], &m);
              in.mask |= (uint32_t)m << (QG_MB_WX_Z + k);
            }
          } else {
            in = base_in;
            in.mask = wxm;
            for (int k = 0; k < 3; k++) in.wx[k] = wxc[k];
          }
          cell_rh<A32, OBS>(c, a, srh, QRH, in);
          in.hprev = hprev;
          hnew = run_cell<WIDE, OBS>(&q, c, s, t, n, i, &in);
        }
      }
      if (c.hq) c.hq[((s + 1) * N + n) * H + i] = (int32_t)hnew;
      else if (s == T - 1) h_at(c, T)[n * H + i] = (int32_t)hnew;
      if (s == T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(hnew, QH);
      hprev = hnew;
    }
    /* the new output.h planes to every CTA of the cluster (none after the last step): plain
     * shared stores when CS = 1 (the block barrier below orders them), else st.async into each
     * peer's buffer nxt, counted on its hb[nxt] */
    if (s + 1 < T) {
    const uint32_t mb_nxt = smem_addr(&hb[nxt]);
    if (p.need_sh) {   /* through the slice, with the row sums of r - c0 (warp reductions) */
      if (active) {
        int8_t p0, p1;
        split_planes(hnew, p.baseH, PH, &p0, &p1);
        slice[(int64_t)nl * U + u] = p0;
        if (PH == 2) slice[(int64_t)(NB + nl) * U + u] = p1;
        contrib[tid] = (int32_t)(hnew - p.baseH - p.c0H);
      }
      __syncthreads();
      if (has_word) {
        const uint32_t v = *(const uint32_t *)(slice + word_src);
        if (CS == 1) *(uint32_t *)(Hs + nxt * hbuf + word_dst) = v;
        else {
          const uint32_t d = smem_addr(Hs + nxt * hbuf + word_dst);
          for (int r = 0; r < CS; r++) st_async_b32(mapa_shared(d, r), v, mapa_shared(mb_nxt, r));
        }
      }
      for (int rl = warp; rl < NB; rl += nwarps) {
        sum_t sum = 0;
        for (int uu = lane; uu < U; uu += 32) sum += (sum_t)contrib[rl * U + uu];
        sum = warp_sum(sum);
        if (CS == 1) { if (lane == 0) part[nxt * NB + rl] = sum; }
        else {
          const uint32_t d = smem_addr(&part[(nxt * CS + rank) * NB + rl]);
          for (int r = lane; r < CS; r += 32) {
            if (sizeof(sum_t) == 4) st_async_b32(mapa_shared(d, r), (uint32_t)sum, mapa_shared(mb_nxt, r));
            else st_async_b64(mapa_shared(d, r), (uint64_t)sum, mapa_shared(mb_nxt, r));
          }
        }
      }
    } else {   /* straight from the cells: no row sums, no slice, no barrier before the push */
      int8_t p0 = 0, p1 = 0;
      if (active) split_planes(hnew, p.baseH, PH, &p0, &p1);
      int8_t *dst = Hs + nxt * hbuf + (int64_t)nl * HS + i0 + u;
      if (CS == 1) {
        if (mine) {
          dst[0] = p0;
          if (PH == 2) dst[(int64_t)NB * HS] = p1;
        }
      } else {   /* lanes 4a..4a+3 hold units 4a..4a+3 of one row (U % 4 == 0): one word, stores spread over them */
        const int sh8 = 8 * (tid & 3);
        uint32_t w0 = (uint32_t)(uint8_t)p0 << sh8, w1 = (uint32_t)(uint8_t)p1 << sh8;
        w0 |= __shfl_xor_sync(0xffffffffu, w0, 1);
        w0 |= __shfl_xor_sync(0xffffffffu, w0, 2);
        if (PH == 2) {
          w1 |= __shfl_xor_sync(0xffffffffu, w1, 1);
          w1 |= __shfl_xor_sync(0xffffffffu, w1, 2);
        }
        if (mine) {
          const uint32_t d0 = smem_addr(dst - (tid & 3));
          for (int r = tid & 3; r < CS; r += 4) {
            const uint32_t mb = mapa_shared(mb_nxt, r);
            st_async_b32(mapa_shared(d0, r), w0, mb);
            if (PH == 2) st_async_b32(mapa_shared(d0 + (uint32_t)(NB * HS), r), w1, mb);
          }
        }
      }
    }
    }
    if (CS == 1) __syncthreads();
  }
  /* no CTA leaves while a peer may still store into it */
  if (CS > 1) cluster.sync();
  };
  if (A32 && use32) steps(std::true_type());
  else steps(std::false_type());
}

/* One configuration of the persistent kernel. */
struct pk_plan {
  int CS, U, NB, Kp, Mp, ksplit, threads, lut_smem, psm;
  int64_t off_H, off_acc, off_part, off_slice, off_contrib, off_items, off_P, off_mb, off_lut, smem, clusters;
  double cost;
};

/* Sizes of configuration (CS, NB) for H units; 0 when it does not fit a block of max_threads. */
static int pk_layout(int CS, int NB, int64_t H, int PR, int PH, int64_t lut_bytes, int64_t smem_max, int max_threads, pk_plan *c) {
  const int64_t U = round_up((H + CS - 1) / CS, 4);
  if (U * NB > max_threads) return 0;
  c->CS = CS; c->NB = NB; c->U = (int)U; c->psm = 0;
  c->Kp = (int)round_up(CS * U, 32);
  c->Mp = (int)round_up(3 * U, 16);
  c->threads = (int)round_up(U * NB, 32);
  if (c->threads < 64) c->threads = 64;
  const int nwarps = c->threads / 32, Mt = c->Mp / 16, Nt = NB / 8, Ks = c->Kp / 32;
  int64_t best = -1;
  for (int ks = 1; ks <= Ks; ks++) {
    const int64_t rounds = ((int64_t)Mt * Nt * ks + nwarps - 1) / nwarps, per = (Ks + ks - 1) / ks, cost = rounds * per;
    if (best < 0 || cost < best) { best = cost; c->ksplit = ks; }
  }
  int64_t o = (int64_t)PR * c->Mp * (c->Kp + 16);
  c->off_H = round_up(o, 16); o = c->off_H + 2LL * PH * NB * (c->Kp + 16);
  c->off_acc = round_up(o, 16); o = c->off_acc + (int64_t)c->ksplit * (c->Mp + 4) * NB * 8;
  c->off_part = round_up(o, 16); o = c->off_part + 2LL * CS * NB * 8;
  c->off_slice = round_up(o, 16); o = c->off_slice + (int64_t)PH * NB * U;
  c->off_contrib = round_up(o, 16); o = c->off_contrib + (int64_t)NB * U * 4;
  c->off_items = round_up(o, 16); o = c->off_items + (int64_t)(c->Mp / 16) * (NB / 8) * c->ksplit * 16;
  c->off_P = round_up(o, 16); o = c->off_P + (int64_t)QG_C32_ROWS * U * 4;
  c->off_mb = round_up(o, 16); o = c->off_mb + 16;
  c->off_lut = round_up(o, 16);
  c->lut_smem = lut_bytes > 0 && lut_bytes <= 65536 && c->off_lut + lut_bytes <= smem_max;
  c->smem = c->lut_smem ? c->off_lut + lut_bytes : c->off_lut;
  return c->smem <= smem_max;
}

typedef void (*pk_kernel)(pk_params);

/* The kernel of a variant: 64- or 128-bit sums, observer, the 32-bit mode (whose per-unit rows
 * live in registers, CTAs of up to 256 threads, or with psm in shared memory, up to 512). */
static pk_kernel pk_kernel_of(int wide, int obs, int a32, int psm) {
  if (a32) {
    if (psm) return wide ? persistent_kernel<1, 0, 1, 1> : persistent_kernel<0, 0, 1, 1>;
    return wide ? persistent_kernel<1, 0, 1, 0> : persistent_kernel<0, 0, 1, 0>;
  }
  if (wide) return obs ? persistent_kernel<1, 1, 0, 0> : persistent_kernel<1, 0, 0, 0>;
  return obs ? persistent_kernel<0, 1, 0, 0> : persistent_kernel<0, 0, 0, 0>;
}

/* The launch configuration of plan c with `smem` bytes of dynamic shared memory (attr: storage for
 * its cluster dimension); the caller sets the stream. */
static cudaLaunchConfig_t pk_config(const pk_plan &c, int64_t smem, cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t cfg = {};
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = (unsigned)c.CS; attr->val.clusterDim.y = 1; attr->val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)(c.clusters * c.CS));
  cfg.blockDim = dim3((unsigned)c.threads);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/* The fastest configuration that launches, by a model of the per-step time (waves of clusters x
 * cells per CTA, then the smaller cluster); *found = 0 when none fits. The waves count the
 * clusters the device holds at once (cudaOccupancyMaxActiveClusters), not SMs / CS: an H200 holds
 * only 7 clusters of 16 CTAs, so 8 of them ran in two waves (medium, bench/cuda_int_gru.md session
 * 24). In the 32-bit mode a CTA of more than 256 cells reads its units' rows from shared memory
 * (psm), which lets it run 512 threads. */
static qg_status pk_choose_uncached(qg_ctx *ctx, const char *fn, int wide, int obs, int a32, int64_t N, int64_t H, int PR, int PH,
                                    int64_t lut_bytes, pk_plan *out, int *found) {
  *found = 0;
  int dev, sms, smem_max, smem_sm;
  QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  pk_plan cand[20];
  int nc = 0;
  const int nbs[4] = {8, 16, 32, 64}, css[5] = {1, 2, 4, 8, 16};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 5; b++) {
      pk_plan c;
      if (ctx->persist_cluster > 0 && (css[b] != ctx->persist_cluster || nbs[a] != 8 * ctx->persist_rows)) continue;   /* forced */
      if (!pk_layout(css[b], nbs[a], H, PR, PH, lut_bytes, smem_max, 512, &c)) continue;
      c.psm = a32 && c.U * c.NB > 256;
      c.clusters = (N + c.NB - 1) / c.NB;
      /* clusters resident at once, at the shared memory the launch asks for */
      const pk_kernel kern = pk_kernel_of(wide, obs, a32, c.psm);
      QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
      if (c.CS > 8) QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t cfg = pk_config(c, c.smem, &attr);
      int resident = 0;
      if (cudaOccupancyMaxActiveClusters(&resident, kern, &cfg) != cudaSuccess) { (void)cudaGetLastError(); resident = 0; }
      if (resident <= 0) continue;
      const int64_t waves = (c.clusters + resident - 1) / resident;
      /* 32-bit mode: the step time grows with the cells of a CTA and with the cluster (fitted on an
       * H100 over forced shapes: long-kws best at CS 4-8 x NB 8, seed-qat at CS 16 x NB 8) */
      if (a32) c.cost = (double)waves * (2.0 + (double)(c.U * c.NB) / 128.0) + 0.06 * c.CS + 0.001 * c.NB;
      else c.cost = (double)waves * (2.0 + (double)((c.U * c.NB + 255) / 256)) + 0.01 * c.CS + 0.001 * c.NB;
      cand[nc++] = c;
    }
  int bi = -1;
  for (int k = 0; k < nc; k++)
    if (bi < 0 || cand[k].cost < cand[bi].cost) bi = k;
  if (bi < 0) return QG_OK;
  pk_plan c = cand[bi];
  /* one CTA per multiprocessor where all of them fit at once: ask for more than half of a
   * multiprocessor's shared memory (two CTAs on one multiprocessor would slow their clusters) */
  const int64_t half = smem_sm / 2;
  if (c.clusters * c.CS <= sms && c.smem < half && half <= smem_max) {
    const pk_kernel kern = pk_kernel_of(wide, obs, a32, c.psm);
    int wide_active = 0;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = pk_config(c, half, &attr);
    QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)half));
    if (cudaOccupancyMaxActiveClusters(&wide_active, kern, &cfg) != cudaSuccess) { (void)cudaGetLastError(); wide_active = 0; }
    if (wide_active >= c.clusters) c.smem = half;
  }
  *out = c;
  *found = 1;
  return QG_OK;
}

/* pk_choose_uncached memoized per device, variant, shape and forced settings (its occupancy
 * queries would otherwise cost every forward tens of microseconds of host time). The caller sets
 * the kernel's shared-memory attribute to the plan's before each launch. */
static qg_status pk_choose(qg_ctx *ctx, const char *fn, int wide, int obs, int a32, int64_t N, int64_t H, int PR, int PH,
                           int64_t lut_bytes, pk_plan *out, int *found) {
  enum { MEMO = 32 };
  struct memo_entry { int64_t key[12]; int found; pk_plan plan; };
  static memo_entry memo[MEMO];
  static int nmemo = 0, next = 0;
  static std::mutex lock;
  int dev;
  QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
  const int64_t key[12] = {dev, wide, obs, a32, N, H, PR, PH, lut_bytes, ctx->persist_cluster, ctx->persist_rows, ctx->persist_splits};
  {
    std::lock_guard<std::mutex> g(lock);
    for (int k = 0; k < nmemo; k++)
      if (memcmp(memo[k].key, key, sizeof key) == 0) {
        *found = memo[k].found;
        if (*found) *out = memo[k].plan;
        return QG_OK;
      }
  }
  QG_CHECK(pk_choose_uncached(ctx, fn, wide, obs, a32, N, H, PR, PH, lut_bytes, out, found));
  std::lock_guard<std::mutex> g(lock);
  const int slot = nmemo < MEMO ? nmemo++ : (next++ % MEMO);
  memcpy(memo[slot].key, key, sizeof key);
  memo[slot].found = *found;
  if (*found) memo[slot].plan = *out;
  return QG_OK;
}
