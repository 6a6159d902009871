-- deploy/c99.lua: the quantized GRU as a self-contained C99 module, bit-exact with qgru's integer
-- forward (QUANT_SPEC.md section 3; the reference is core/int_gru_cell.h, 64-bit variant).
--
--   local c99 = require("qgru.deploy.c99")
--   local files = c99.write(desc, dir, {name = "fmnist_gru"})   -- desc from deploy/model.lua
--   -> dir/fmnist_gru.h, dir/fmnist_gru.c (the module), dir/fmnist_gru_main.c (a .npy driver)
--
-- The module: weight codes (the smallest integer type holding each grid: int8_t for 8-bit
-- weights), per-channel exponents and zero points, activation tables, and one step function per
-- layer and direction, all integer: GEMMs accumulate in int32_t where the model's codes bound the
-- sum below 2^30, else int64_t; the alignment sums and products of the cell likewise (the bound
-- of each is computed here from the grids and the constant codes); requantization is the
-- rounding right shift (ties to even) or the saturating left shift of qg_requant64. Where an
-- operator would need more than 62 bits the export refuses and names it (qgru would run its
-- 128-bit cell there; plain C99 has no 128-bit integers). No malloc, no floats except the
-- optional helpers that quantize float inputs (from the IEEE-754 bits, in integers),
-- dequantize outputs and run the float head.
local M = {}

local D = require("qgru.deploy.model")

local function fail(fmt, ...) error("qgru: export c: " .. string.format(fmt, ...), 0) end

local TWO30, TWO62 = 2 ^ 30, 2 ^ 62

-- The smallest stdint type holding every integer in [lo, hi].
local function ctype(lo, hi)
  if lo >= -128 and hi <= 127 then return "int8_t" end
  if lo >= 0 and hi <= 255 then return "uint8_t" end
  if lo >= -32768 and hi <= 32767 then return "int16_t" end
  if lo >= 0 and hi <= 65535 then return "uint16_t" end
  if lo >= -2 ^ 31 and hi <= 2 ^ 31 - 1 then return "int32_t" end
  if lo >= 0 and hi <= 2 ^ 32 - 1 then return "uint32_t" end
  return "int64_t"
end
M.ctype = ctype

local BYTES = { int8_t = 1, uint8_t = 1, int16_t = 2, uint16_t = 2, int32_t = 4, uint32_t = 4, int64_t = 8 }

local function int(v) return string.format("%d", v) end

-- An integer literal of any magnitude below 2^63 for C99.
local function lit(v)
  if v >= -2 ^ 31 + 1 and v <= 2 ^ 31 - 1 then return int(v) end
  return "INT64_C(" .. string.format("%.0f", v) .. ")"
end

-- A power of two as a C99 hexadecimal float literal.
local function p2f(e) return string.format("0x1p%df", e) end

local function array(ctype_, name, vals, per_line)
  per_line = per_line or 20
  local out = { string.format("static const %s %s[%d] = {", ctype_, name, #vals) }
  for i = 1, #vals, per_line do
    local row = {}
    for k = i, math.min(#vals, i + per_line - 1) do row[#row + 1] = lit(vals[k]) end
    out[#out + 1] = "  " .. table.concat(row, ", ") .. (i + per_line <= #vals and "," or "")
  end
  out[#out + 1] = "};"
  return table.concat(out, "\n")
end

local function minmax(vals)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(vals) do lo = math.min(lo, v); hi = math.max(hi, v) end
  return lo, hi
end

local function all_zero(vals)
  for _, v in ipairs(vals) do if v ~= 0 then return false end end
  return true
end

-- Integer type of an arithmetic on values bounded by `bound` whose result is requantized to q
-- (int32 needs |v| < 2^30 and a grid of <= 16 bits; int64 |v| < 2^62). nil beyond.
local function arith(bound, q)
  if bound < TWO30 and q.bits <= 16 then return "32" end
  if bound < TWO62 then return "64" end
  return nil
end

local function centered_type(q) return q.bits <= 30 and "int32_t" or "int64_t" end
local function codetype(q) return q.qmax <= 2 ^ 31 - 1 and "int32_t" or "int64_t" end

-- ---- checks and plan ------------------------------------------------------------------------
-- For every layer and direction: the integer type of each GEMM and of each sum / product of the
-- cell, from the bounds; refuses where 64 bits are not enough.
local function plan(desc)
  for _, L in ipairs(desc.layer) do
    local A = L.act
    L.plan = {}
    for _, g in ipairs({ { "W", "input.x", "matmul.Wx" }, { "R", "output.h", "matmul.Rh" } }) do
      local b = D.gemmBound(L.w[g[1]], A[g[2]])
      local t = arith(b, A[g[3]])
      if not t then
        fail("%s.%s: the accumulator of %s times %s reaches 2^%.1f, beyond 62 bits", L.name, g[3], M.WEIGHT_OP[g[1]], g[2], D.log2(b))
      end
      L.plan[g[3]] = { bound = b, t = t }
    end
    -- sums: the largest bound over channels
    local sums = {}
    for i = 1, L.H do
      for k, s in ipairs(D.cellSums(L, i)) do
        if not sums[k] or s.bound > sums[k].bound then sums[k] = s end
      end
    end
    L.plan.sums = {}
    for k, s in ipairs(sums) do
      local t = arith(s.bound, s.out)
      if not t then
        local labels = {}
        for _, term in ipairs(s.terms) do labels[#labels + 1] = term.label end
        fail("%s.%s: the aligned sum of %s reaches 2^%.1f at the finest scale (exponents up to %d), beyond the 62 bits of the 64-bit cell; qgru runs it on 128 bits, which C99 does not have: narrow this operator's or its inputs' exponents or bitwidths",
             L.name, s.name, table.concat(labels, ", "), D.log2(s.bound), s.emax)
      end
      L.plan.sums[k] = t
    end
    L.plan.products = {}
    for k, p in ipairs(D.cellProducts(L)) do
      local b = p.a * p.b
      local t = arith(b, p.out)
      if not t then fail("%s.%s: the product %s reaches 2^%.1f, beyond 62 bits", L.name, p.name, p.what, D.log2(b)) end
      L.plan.products[k] = t
    end
  end
end
M.WEIGHT_OP = D.WEIGHT_OP

-- ---- code generation ------------------------------------------------------------------------
local HELPERS = [[
/* ---- integer requantization (QUANT_SPEC.md section 1; core/int_gru_cell.h, qg_requant64) ----
 * v at scale 2^-s to a grid of exponent e: k = s - e; k > 0: rne(v / 2^k), a rounding right
 * shift with ties to even; k <= 0: v * 2^-k, saturating beyond every grid. Then + z, clamp.
 * Shifts of negative values are written on their complement (no implementation-defined shifts). */
static inline int32_t @P@_shr32(int32_t v, int k)   /* rne(v / 2^k), 1 <= k, |v| < 2^30 */
{
  int32_t fl, rem, half;
  if (k >= 31) return 0;
  fl = v >= 0 ? (int32_t)((uint32_t)v >> k) : (int32_t)~((uint32_t)~v >> k);   /* floor */
  rem = v - fl * ((int32_t)1 << k);
  half = (int32_t)1 << (k - 1);
  if (rem > half || (rem == half && (fl & 1))) fl += 1;
  return fl;
}

static inline int32_t @P@_rq32(int32_t v, int k, int32_t z, int32_t lo, int32_t hi)   /* |v| < 2^30, grid <= 16 bits */
{
  int32_t r;
  if (k > 0) r = @P@_shr32(v, k);
  else if (v == 0) r = 0;
  else if (-k >= 30 || (v > 0 ? v : -v) >= ((int32_t)1 << (30 + k))) r = v > 0 ? ((int32_t)1 << 30) : -((int32_t)1 << 30);
  else r = v * ((int32_t)1 << -k);
  r += z;
  return r < lo ? lo : (r > hi ? hi : r);
}

static inline int64_t @P@_shr64(int64_t v, int k)   /* rne(v / 2^k), 1 <= k, |v| < 2^62 */
{
  int64_t fl, rem, half;
  if (k >= 63) return 0;
  fl = v >= 0 ? (int64_t)((uint64_t)v >> k) : (int64_t)~((uint64_t)~v >> k);
  rem = v - fl * ((int64_t)1 << k);
  half = (int64_t)1 << (k - 1);
  if (rem > half || (rem == half && (fl & 1))) fl += 1;
  return fl;
}

static inline int64_t @P@_rq64(int64_t v, int k, int64_t z, int64_t lo, int64_t hi)   /* |v| < 2^62 */
{
  int64_t r;
  if (k > 0) r = @P@_shr64(v, k);
  else if (v == 0) r = 0;
  else if (-k >= 62 || (v > 0 ? v : -v) >= ((int64_t)1 << (62 + k))) r = v > 0 ? ((int64_t)1 << 62) : -((int64_t)1 << 62);
  else r = v * ((int64_t)1 << -k);
  r += z;
  return r < lo ? lo : (r > hi ? hi : r);
}

static inline int @P@_max(int a, int b) { return a > b ? a : b; }

/* quant(x) = clamp(rne(x 2^e) + z) of an IEEE-754 binary32 value, in integers: x = m 2^(b - 150)
 * with m the 24-bit significand and b the biased exponent, so quant(x) requantizes m from scale
 * 2^(b - 150). NaN gives the code of zero (as qgru), +-inf the ends of the grid. */
static inline int64_t @P@_quant_f32(float x, int e, int64_t z, int64_t lo, int64_t hi)
{
  union { float f; uint32_t u; } bits;
  uint32_t b;
  int64_t m;
  bits.f = x;
  b = (bits.u >> 23) & 0xffu;
  m = (int64_t)(bits.u & 0x7fffffu);
  if (b == 0xffu) return m ? z : ((bits.u >> 31) ? lo : hi);
  if (b == 0) b = 1; else m += (int64_t)1 << 23;
  if (bits.u >> 31) m = -m;
  return @P@_rq64(m, 150 - (int)b - e, z, lo, hi);
}
]]

-- Emits the requantization of expression v (arith "32"/"64") with shift expression k to quantizer q.
local function rq(P, t, v, k, q)
  if t == "32" then
    return string.format("%s_rq32(%s, %s, %d, %s, %s)", P, v, k, q.z, int(q.qmin), int(q.qmax))
  end
  return string.format("%s_rq64(%s, %s, %s, %s, %s)", P, v, k, lit(q.z), lit(q.qmin), lit(q.qmax))
end

local function ity(t) return t == "32" and "int32_t" or "int64_t" end

-- Text of one layer-and-direction step function (and its constants) for the source file.
local function layer_code(P, desc, L, K, types, tables)
  local A, H, C, H3 = L.act, L.H, L.C, 3 * L.H
  local pfx = string.format("%s_l%d%s", P, L.l, L.d == 0 and "f" or "b")
  local QX, QH, QWX, QRH = A["input.x"], A["output.h"], A["matmul.Wx"], A["matmul.Rh"]
  local out = {}
  local function add(s) out[#out + 1] = s end
  add(string.format("/* ---- layer %d, %s direction (%s): C = %d inputs, H = %d units ---- */", L.l,
                    L.d == 0 and "forward" or "backward", L.name, C, H))
  local wz = {}
  for _, key in ipairs({ "W", "R", "bx", "br" }) do
    local w = L.w[key]
    local op = M.WEIGHT_OP[key]
    add(string.format("/* %s: %s%d%s, rows in gate order z, r, g; per-channel exponents (scale 2^-e) and zero points */",
                      op, w.uns and "u" or "i", w.bits, all_zero(w.z) and " symmetric" or ""))
    add(array(ctype(w.qmin, w.qmax), pfx .. "_" .. key, w.codes, key == "W" and math.min(C, 28) or (key == "R" and math.min(H, 32) or 24)))
    add(array("int8_t", pfx .. "_" .. key .. "_e", w.e, 32))
    if all_zero(w.z) then wz[key] = nil
    else
      local lo, hi = minmax(w.z)
      add(array(ctype(lo, hi), pfx .. "_" .. key .. "_z", w.z, 24))
      wz[key] = pfx .. "_" .. key .. "_z"
    end
  end
  -- activation tables (shared when equal)
  local lut = {}
  for _, g in ipairs({ { "z", "gate.z_pre", "gate.z_out", "sigmoid" }, { "r", "gate.r_pre", "gate.r_out", "sigmoid" },
                       { "g", "gate.g_pre", "gate.g_out", "tanh" } }) do
    local vals = L.lut[g[1]]
    local Q = A[g[3]]
    local key = Q.qmin .. ":" .. Q.qmax .. ":" .. table.concat(vals, ",")
    if not tables[key] then
      local name = pfx .. "_lut_" .. g[1]
      tables[key] = name
      add(string.format("/* %s table: %s codes of %s(deq(q)) for every %s code q, indexed by q - (%d) */", g[1], g[3], g[4], g[2], A[g[2]].qmin))
      add(array(ctype(Q.qmin, Q.qmax), name, vals, 24))
    end
    lut[g[1]] = tables[key]
  end
  local pl = L.plan
  local xin_t = L.l == 0 and (P .. "_x_t") or types.xin
  add("")
  add(string.format("/* One step of %s: x = input.x codes [%d], h = output.h codes [%d] (read h_{t-1}, write h_t). */", L.name, C, H))
  add(string.format("static void %s_step(const %s *x, %s_h_t *h, %s_scratch *s)", pfx, xin_t, P, P))
  add("{")
  add("  int32_t i, j, k;")
  add(string.format("  for (k = 0; k < %d; k++) s->xc[k] = (%s)((int32_t)x[k] - %d);   /* input.x - z */", C, types.xc, QX.z))
  add(string.format("  for (k = 0; k < %d; k++) s->hc[k] = (%s)((int32_t)h[k] - %d);   /* output.h - z */", H, types.hc, QH.z))
  for _, g in ipairs({ { "W", "xc", C, "wx", QWX, QX, "matmul.Wx" }, { "R", "hc", H, "rh", QRH, QH, "matmul.Rh" } }) do
    local key, src, n, dst, Q, Qin, op = g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    local t = pl[op].t
    local acc = ity(t)
    add(string.format("  /* %s: per row j, sum_k (%s[j][k] - z_j)(%s_k), exact in %s (|acc| <= 2^%.1f), requantized from", op, key,
                      src == "xc" and "x" or "h", acc, D.log2(pl[op].bound)))
    add(string.format("   * scale 2^-(e_j + %d) to %s (e = %d, z = %d) */", Qin.e, op, Q.e, Q.z))
    add(string.format("  for (j = 0; j < %d; j++) {", H3))
    add(string.format("    const %s *w = %s_%s + j * %d;", ctype(L.w[key].qmin, L.w[key].qmax), pfx, key, n))
    add(string.format("    %s acc = 0;", acc))
    if wz[key] then
      add(string.format("    const int32_t zw = %s[j];", wz[key]))
      add(string.format("    for (k = 0; k < %d; k++) acc += (%s)((int32_t)w[k] - zw) * s->%s[k];", n, acc, src))
    else
      add(string.format("    for (k = 0; k < %d; k++) acc += (%s)w[k] * s->%s[k];", n, acc, src))
    end
    add(string.format("    s->%s[j] = (%s)%s;", dst, dst == "wx" and types.wx or types.rh,
                      rq(P, t, "acc", string.format("%s_%s_e[j] + %d", pfx, key, Qin.e - Q.e), Q)))
    add("  }")
  end
  -- the cell
  local Z, R, G = A["gate.z_out"], A["gate.r_out"], A["gate.g_out"]
  local RRH, OLD, NEW = A["op.rRh"], A["op.old_contrib"], A["op.new_contrib"]
  local ZP, RP, GP = A["gate.z_pre"], A["gate.r_pre"], A["gate.g_pre"]
  local S, Pr = pl.sums, pl.products
  local function bias(key, jexpr, st)
    local c = string.format("(%s)%s_%s[%s]", st, pfx, key, jexpr)
    if wz[key] then c = string.format("(%s - %s[%s])", c, wz[key], jexpr) end
    return c
  end
  local function sh(st, e) return string.format("((%s)1 << (em - %s))", st, e) end
  add("  /* the cell (QUANT_SPEC.md section 3, steps 3-8) for every unit; sums are aligned to the finest")
  add("   * scale of their terms (per channel: the bias exponents differ) and requantized once */")
  add(string.format("  for (i = 0; i < %d; i++) {", H))
  add(string.format("    const %s wz = (%s)s->wx[i] - %d, wr = (%s)s->wx[%d + i] - %d, wg = (%s)s->wx[%d + i] - %d;",
                    centered_type(QWX), centered_type(QWX), QWX.z, centered_type(QWX), H, QWX.z, centered_type(QWX), 2 * H, QWX.z))
  add(string.format("    const %s rz = (%s)s->rh[i] - %d, rr = (%s)s->rh[%d + i] - %d, rg = (%s)s->rh[%d + i] - %d;",
                    centered_type(QRH), centered_type(QRH), QRH.z, centered_type(QRH), H, QRH.z, centered_type(QRH), 2 * H, QRH.z))
  add("    int em;")
  add("    int32_t qzpre, qrpre, qgpre, qz, qr, qg;")
  add(string.format("    %s qrhb;", codetype(QRH)))
  add(string.format("    %s qrrh;", codetype(RRH)))
  add(string.format("    %s qold;", codetype(OLD)))
  add(string.format("    %s qnew;", codetype(NEW)))
  for k, g in ipairs({ { "z", "wz", "rz", "i", ZP, "qzpre" }, { "r", "wr", "rr", string.format("%d + i", H), RP, "qrpre" } }) do
    local st = ity(S[k])
    add(string.format("    /* %s_pre = matmul.Wx + matmul.Rh + weight.bw + weight.br (%s) */", g[1], st))
    add(string.format("    em = %s_max(%s_max(%d, %d), %s_max(%s_bx_e[%s], %s_br_e[%s]));", P, P, QWX.e, QRH.e, P, pfx, g[4], pfx, g[4]))
    add(string.format("    %s = (int32_t)%s;", g[6], rq(P, S[k], string.format("(%s)%s * %s + (%s)%s * %s + %s * %s + %s * %s", st, g[2], sh(st, QWX.e), st, g[3],
                      sh(st, QRH.e), bias("bx", g[4], st), sh(st, string.format("%s_bx_e[%s]", pfx, g[4])), bias("br", g[4], st),
                      sh(st, string.format("%s_br_e[%s]", pfx, g[4]))), "em - " .. g[5].e, g[5])))
  end
  add(string.format("    qz = %s[qzpre - (%d)];   /* gate.z_out */", lut.z, ZP.qmin))
  add(string.format("    qr = %s[qrpre - (%d)];   /* gate.r_out */", lut.r, RP.qmin))
  local jg = string.format("%d + i", 2 * H)
  do
    local st = ity(S[3])
    add(string.format("    /* Rh_g + br_g with matmul.Rh's quantizer (%s) */", st))
    add(string.format("    em = %s_max(%d, %s_br_e[%s]);", P, QRH.e, pfx, jg))
    add(string.format("    qrhb = %s;", rq(P, S[3], string.format("(%s)rg * %s + %s * %s", st, sh(st, QRH.e), bias("br", jg, st),
                      sh(st, string.format("%s_br_e[%s]", pfx, jg))), "em - " .. QRH.e, QRH)))
  end
  do
    local st = ity(Pr[1])
    add(string.format("    /* op.rRh = r * (Rh_g + br_g) (%s) */", st))
    add(string.format("    qrrh = %s;", rq(P, Pr[1], string.format("((%s)qr - %d) * ((%s)qrhb - %s)", st, R.z, st, lit(QRH.z)), int(R.e + QRH.e - RRH.e), RRH)))
  end
  do
    local st = ity(S[4])
    add(string.format("    /* g_pre = matmul.Wx + weight.bw + op.rRh (%s) */", st))
    add(string.format("    em = %s_max(%s_max(%d, %d), %s_bx_e[%s]);", P, P, QWX.e, RRH.e, pfx, jg))
    add(string.format("    qgpre = (int32_t)%s;", rq(P, S[4], string.format("(%s)wg * %s + %s * %s + ((%s)qrrh - %s) * %s", st, sh(st, QWX.e),
                      bias("bx", jg, st), sh(st, string.format("%s_bx_e[%s]", pfx, jg)), st, lit(RRH.z), sh(st, RRH.e)), "em - " .. GP.e, GP)))
  end
  add(string.format("    qg = %s[qgpre - (%d)];   /* gate.g_out */", lut.g, GP.qmin))
  do
    local st = ity(Pr[2])
    add(string.format("    /* op.old_contrib = z * h_{t-1} (%s) */", st))
    add(string.format("    qold = %s;", rq(P, Pr[2], string.format("((%s)qz - %d) * (%s)s->hc[i]", st, Z.z, st), int(Z.e + QH.e - OLD.e), OLD)))
    st = ity(Pr[3])
    add(string.format("    /* op.new_contrib = (1 - z) * g, 1 = 2^%d in gate.z_out's scale (%s) */", Z.e, st))
    add(string.format("    qnew = %s;", rq(P, Pr[3], string.format("((%s)%s - ((%s)qz - %d)) * ((%s)qg - %d)", st, lit(2 ^ Z.e), st, Z.z, st, G.z),
                      int(Z.e + G.e - NEW.e), NEW)))
  end
  do
    local st = ity(S[5])
    local em = math.max(OLD.e, NEW.e)
    add(string.format("    /* h = old + new aligned to 2^-%d (%s) */", em, st))
    add(string.format("    h[i] = (%s_h_t)%s;", P, rq(P, S[5], string.format("((%s)qold - %s) * %s + ((%s)qnew - %s) * %s", st, lit(OLD.z),
                      lit(2 ^ (em - OLD.e)), st, lit(NEW.z), lit(2 ^ (em - NEW.e))), int(em - QH.e), QH)))
  end
  add("  }")
  add("}")
  -- tidy the arithmetic of zero points: "v - -3" -> "v + 3", "v - 0" -> "v"
  local text = table.concat(out, "\n"):gsub(" %- %-(%d)", " + %1"):gsub(" %- 0([%);,])", "%1")
  return text, pfx
end

-- Text of the function moving the previous layer's output.h codes (both directions) to layer
-- l's input.x codes: exactly qgru's quant_x(deq_h(q)) (requantization of q - z_h).
local function lift_code(P, desc, l, types)
  local L = desc.layer[l * desc.dirs + 1]
  local QX = L.act["input.x"]
  local out = { string.format("/* layer %d's input.x codes from layer %d's output.h codes [%d] (both directions): quant_x(deq_h(q)) */",
                              l, l - 1, desc.output_size) }
  out[#out + 1] = string.format("static void %s_lift%d(%s *x, const %s_h_t *y)", P, l, types.xin, P)
  out[#out + 1] = "{"
  out[#out + 1] = "  int32_t k;"
  for d = 0, desc.dirs - 1 do
    local QH = desc.layer[(l - 1) * desc.dirs + d + 1].act["output.h"]
    out[#out + 1] = string.format("  for (k = %d; k < %d; k++) x[k] = (%s)%s;", d * desc.hidden_size, (d + 1) * desc.hidden_size, types.xin,
                                  rq(P, "32", string.format("(int32_t)y[k] - %d", QH.z), int(QH.e - QX.e), QX))
  end
  out[#out + 1] = "}"
  return table.concat(out, "\n")
end

local function describe_q(q) return string.format("%s%d e=%d z=%d", q.uns and "u" or "i", q.bits, q.e, q.z) end

-- Generates {header, source, driver, info} for desc (deploy/model.lua). opts.name: C prefix.
function M.generate(desc, opts)
  opts = opts or {}
  local P = opts.name or "qgru_model"
  if type(P) ~= "string" or not P:match("^[%a_][%w_]*$") or #P > 40 then
    fail("the C name must be an identifier of at most 40 characters ([A-Za-z_][A-Za-z0-9_]*), got %s", tostring(P))
  end
  plan(desc)
  local Lc, Dn, H, C0 = desc.layers, desc.dirs, desc.hidden_size, desc.input_size
  local OUT, STATE = desc.output_size, Lc * Dn * H
  local first = desc.layer[1]
  -- types
  local function widest(field, fn)
    local lo, hi = math.huge, -math.huge
    for _, L in ipairs(desc.layer) do
      local a, b = fn(L)
      if a then lo = math.min(lo, a); hi = math.max(hi, b) end
    end
    return lo, hi
  end
  local types = {}
  types.x = ctype(first.act["input.x"].qmin, first.act["input.x"].qmax)
  types.h = ctype(widest("h", function(L) return L.act["output.h"].qmin, L.act["output.h"].qmax end))
  types.wx = ctype(widest("wx", function(L) return L.act["matmul.Wx"].qmin, L.act["matmul.Wx"].qmax end))
  types.rh = ctype(widest("rh", function(L) return L.act["matmul.Rh"].qmin, L.act["matmul.Rh"].qmax end))
  local xlo, xhi = widest("xc", function(L) local m = D.maxCentered(L.act["input.x"]); return -m, m end)
  types.xc = ctype(xlo, xhi)
  local hlo, hhi = widest("hc", function(L) local m = D.maxCentered(L.act["output.h"]); return -m, m end)
  types.hc = ctype(hlo, hhi)
  if Lc > 1 then
    types.xin = ctype(widest("xin", function(L) if L.l > 0 then return L.act["input.x"].qmin, L.act["input.x"].qmax end end))
  else
    types.xin = types.x
  end
  local CMAX = 0
  for _, L in ipairs(desc.layer) do CMAX = math.max(CMAX, L.C) end
  -- scratch layout (largest alignment first: no padding between members)
  local members = {
    { types.xc, "xc", CMAX, "centered input.x codes of the running layer" },
    { types.hc, "hc", H, "centered output.h codes h_{t-1}" },
    { types.wx, "wx", 3 * H, "matmul.Wx codes, rows z, r, g" },
    { types.rh, "rh", 3 * H, "matmul.Rh codes, rows z, r, g" },
    { P .. "_h_t", "h", H, "the running direction's state" },
  }
  local member_bytes = { [P .. "_h_t"] = BYTES[types.h] }
  if Lc > 1 then members[#members + 1] = { types.xin, "xin", CMAX, "input.x codes of layers >= 1" } end
  local function mb(m) return member_bytes[m[1]] or BYTES[m[1]] end
  table.sort(members, function(a, b) if mb(a) ~= mb(b) then return mb(a) > mb(b) end return a[2] < b[2] end)
  local scratch_bytes, align = 0, 1
  for _, m in ipairs(members) do scratch_bytes = scratch_bytes + mb(m) * m[3]; align = math.max(align, mb(m)) end
  scratch_bytes = math.ceil(scratch_bytes / align) * align
  local work_layers = math.min(Lc - 1, 2)

  local UP = P:upper()
  local src_info = opts.source_info or "a quantized qgru model"
  local hd = {}
  local function h(s) hd[#hd + 1] = s end
  h(string.format("/* %s.h: integer GRU exported by qgru from %s.", P, src_info))
  h(" *")
  h(string.format(" * Model: GRU %d -> %d, %d layer(s), %s%s.", C0, H, Lc, Dn == 2 and "bidirectional" or "unidirectional",
                  desc.head and string.format(", head Last + Linear %d -> %d (float)", desc.head.inputs, desc.head.outputs) or ""))
  h(" * Bit-exact with qgru's integer forward (QUANT_SPEC.md section 3): every output.h code equals")
  h(" * qgru's at every step. Plain C99, integer")
  h(" * only on the GRU path, no allocation: the caller owns the state, the scratch and the buffers.")
  h(" *")
  h(" * Codes: a quantizer maps a real v to clamp(rne(v 2^e) + z, qmin, qmax); the code q stands for")
  h(" * (q - z) 2^-e. Layer 0's input.x: " .. describe_q(first.act["input.x"]) .. "; output.h per layer and direction:")
  for _, L in ipairs(desc.layer) do h(string.format(" *   %s: %s", L.name, describe_q(L.act["output.h"]))) end
  h(" *")
  h(" * Entry points:")
  if Dn == 1 then
    h(string.format(" *   %s_step(state, x, scratch)      one time step of every layer (streaming): state holds", P))
    h(string.format(" *       the output.h codes of each layer [%s_LAYERS][%s_HIDDEN_SIZE] (set it with %s_reset or", UP, UP, P))
    h(string.format(" *       %s_quantize_state); afterwards the last layer's slice is the step's output.", P))
  end
  h(string.format(" *   %s_sequence(y, hn, x, T, h0, work, scratch)   a whole sequence of T steps: x [T][%s_INPUT_SIZE]", P, UP))
  h(string.format(" *       input.x codes; y [T][%s_OUTPUT_SIZE] the last layer's output.h codes (directions", UP))
  h(" *       concatenated, forward first); hn [layers * directions][H] final codes or NULL; h0 the same")
  h(string.format(" *       shape or NULL (zeros); work [%s_WORK_SIZE(T)] codes (NULL for one layer). Returns 0, or -1", UP))
  h(" *       for a bad argument. A batch of variable-length sequences is one call per sequence with")
  h(" *       its own length (qgru's lengths: the backward direction starts at the last valid step).")
  h(string.format(" *   %s_quantize_input / %s_quantize_state   float -> codes (integer arithmetic on the float bits)", P, P))
  h(string.format(" *   %s_dequantize_output / %s_dequantize_state   codes -> float (optional)", P, P))
  if desc.head then h(string.format(" *   %s_head(logits, features)   the float head (Linear) on dequantized features", P)) end
  h(" */")
  h(string.format("#ifndef %s_H", UP))
  h(string.format("#define %s_H", UP))
  h("")
  h("#include <stdint.h>")
  h("")
  h("#ifdef __cplusplus")
  h("extern \"C\" {")
  h("#endif")
  h("")
  h("enum {")
  h(string.format("  %s_INPUT_SIZE = %d,    /* C of layer 0 */", UP, C0))
  h(string.format("  %s_HIDDEN_SIZE = %d,   /* H */", UP, H))
  h(string.format("  %s_LAYERS = %d,", UP, Lc))
  h(string.format("  %s_DIRECTIONS = %d,", UP, Dn))
  h(string.format("  %s_OUTPUT_SIZE = %d,   /* directions * H */", UP, OUT))
  h(string.format("  %s_STATE_SIZE = %d,    /* layers * directions * H */", UP, STATE))
  h(string.format("  %s_HEAD_SIZE = %d,     /* outputs of the float head (0: none) */", UP, desc.head and desc.head.outputs or 0))
  h(string.format("  %s_SCRATCH_BYTES = %d  /* sizeof(%s_scratch) */", UP, scratch_bytes, P))
  h("};")
  if work_layers > 0 then
    h(string.format("/* codes of work that %s_sequence needs for T steps */", P))
    h(string.format("#define %s_WORK_SIZE(T) ((T) * %d)", UP, work_layers * OUT))
  else
    h(string.format("/* %s_sequence of a one-layer model needs no work (pass NULL); 1 keeps arrays legal */", P))
    h(string.format("#define %s_WORK_SIZE(T) 1", UP))
  end
  h("")
  h(string.format("typedef %s %s_x_t;   /* a code of layer 0's input.x */", types.x, P))
  h(string.format("typedef %s %s_h_t;   /* a code of output.h (any layer and direction) */", types.h, P))
  h("")
  h("/* Scratch of one call (its contents need not persist between calls). */")
  h("typedef struct {")
  for _, m in ipairs(members) do h(string.format("  %s %s[%d];   /* %s */", m[1], m[2], m[3], m[4])) end
  h(string.format("} %s_scratch;", P))
  h("")
  if Dn == 1 then
    h(string.format("void %s_reset(%s_h_t *state);", P, P))
    h(string.format("void %s_step(%s_h_t *state, const %s_x_t *x, %s_scratch *scratch);", P, P, P, P))
  end
  h(string.format("int %s_sequence(%s_h_t *y, %s_h_t *hn, const %s_x_t *x, int32_t T, const %s_h_t *h0, %s_h_t *work,", P, P, P, P, P, P))
  h(string.format("    %s_scratch *scratch);", P))
  h(string.format("void %s_quantize_input(%s_x_t *q, const float *x, int32_t n);", P, P))
  h(string.format("void %s_quantize_state(%s_h_t *q, const float *h);   /* [layers * directions][H] */", P, P))
  h(string.format("void %s_dequantize_output(float *y, const %s_h_t *q, int32_t T);   /* [T][%s_OUTPUT_SIZE] */", P, P, UP))
  h(string.format("void %s_dequantize_state(float *h, const %s_h_t *q);   /* [layers * directions][H] */", P, P))
  if desc.head then
    h(string.format("void %s_head(float *logits, const float *features);   /* [%d] from [%d] */", P, desc.head.outputs, desc.head.inputs))
  end
  h("")
  h("#ifdef __cplusplus")
  h("}")
  h("#endif")
  h("")
  h("#endif")

  local sc = {}
  local function s(x) sc[#sc + 1] = x end
  s(string.format("/* %s.c: the integer GRU of %s.h (generated by qgru's recipes/export.lua --format c; do not edit).", P, P))
  s(" * Weight codes, per-channel exponents and zero points, activation tables and the step code of")
  s(" * every layer and direction. Integer arithmetic follows QUANT_SPEC.md section 3 exactly: exact")
  s(" * GEMM accumulators, sums aligned to the finest scale, one rounding (half to even) per operator. */")
  s(string.format("#include \"%s.h\"", P))
  s("")
  s(string.format("/* compile-time check of %s_SCRATCH_BYTES */", UP))
  s(string.format("typedef char %s_scratch_bytes_check[(sizeof(%s_scratch) == %s_SCRATCH_BYTES) ? 1 : -1];", P, P, UP))
  s("")
  s((HELPERS:gsub("@P@", P)))
  local tables = {}
  local pfxs = {}
  for k, L in ipairs(desc.layer) do
    local code, pfx = layer_code(P, desc, L, k, types, tables)
    s(code)
    s("")
    pfxs[k] = pfx
  end
  for l = 1, Lc - 1 do s(lift_code(P, desc, l, types)); s("") end
  -- zero codes (quant(0) = z) per layer and direction
  local function zcode(L) return L.act["output.h"].z end
  if Dn == 1 then
    s(string.format("void %s_reset(%s_h_t *state)", P, P))
    s("{")
    s("  int32_t i;")
    for l = 0, Lc - 1 do
      s(string.format("  for (i = 0; i < %d; i++) state[%d + i] = %d;", H, l * H, zcode(desc.layer[l + 1])))
    end
    s("}")
    s("")
    s(string.format("void %s_step(%s_h_t *state, const %s_x_t *x, %s_scratch *scratch)", P, P, P, P))
    s("{")
    s(string.format("  %s_step(x, state, scratch);", pfxs[1]))
    for l = 1, Lc - 1 do
      s(string.format("  %s_lift%d(scratch->xin, state + %d);", P, l, (l - 1) * H))
      s(string.format("  %s_step(scratch->xin, state + %d, scratch);", pfxs[l + 1], l * H))
    end
    s("}")
    s("")
  end
  s(string.format("int %s_sequence(%s_h_t *y, %s_h_t *hn, const %s_x_t *x, int32_t T, const %s_h_t *h0, %s_h_t *work,", P, P, P, P, P, P))
  s(string.format("    %s_scratch *scratch)", P))
  s("{")
  s("  int32_t st, t, i;")
  s(string.format("  if (!y || !x || !scratch || T < 0%s) return -1;", Lc > 1 and " || (T > 0 && !work)" or ""))
  s("  (void)work;")
  for l = 0, Lc - 1 do
    local dst = l == Lc - 1 and "y" or (l % 2 == 0 and "work" or string.format("work + (int64_t)T * %d", OUT))
    s(string.format("  /* layer %d */", l))
    s("  {")
    s(string.format("    %s_h_t *out = %s;", P, dst))
    if l > 0 then s(string.format("    const %s_h_t *in = %s;", P, (l % 2 == 1) and "work" or string.format("work + (int64_t)T * %d", OUT))) end
    for d = 0, Dn - 1 do
      local k = l * Dn + d
      s(string.format("    for (i = 0; i < %d; i++) scratch->h[i] = h0 ? h0[%d + i] : %d;", H, k * H, zcode(desc.layer[k + 1])))
      s("    for (st = 0; st < T; st++) {")
      s(string.format("      t = %s;", d == 0 and "st" or "T - 1 - st"))
      if l == 0 then
        s(string.format("      %s_step(x + (int64_t)t * %d, scratch->h, scratch);", pfxs[k + 1], C0))
      else
        s(string.format("      %s_lift%d(scratch->xin, in + (int64_t)t * %d);", P, l, OUT))
        s(string.format("      %s_step(scratch->xin, scratch->h, scratch);", pfxs[k + 1]))
      end
      s(string.format("      for (i = 0; i < %d; i++) out[(int64_t)t * %d + %d + i] = scratch->h[i];", H, OUT, d * H))
      s("    }")
      s(string.format("    if (hn) for (i = 0; i < %d; i++) hn[%d + i] = scratch->h[i];", H, k * H))
    end
    s("  }")
  end
  s("  return 0;")
  s("}")
  s("")
  local QX = first.act["input.x"]
  s(string.format("void %s_quantize_input(%s_x_t *q, const float *x, int32_t n)", P, P))
  s("{")
  s("  int32_t i;")
  s(string.format("  for (i = 0; i < n; i++) q[i] = (%s_x_t)%s_quant_f32(x[i], %d, %s, %s, %s);", P, P, QX.e, lit(QX.z), lit(QX.qmin), lit(QX.qmax)))
  s("}")
  s("")
  s(string.format("void %s_quantize_state(%s_h_t *q, const float *h)", P, P))
  s("{")
  s("  int32_t i;")
  for k, L in ipairs(desc.layer) do
    local Q = L.act["output.h"]
    s(string.format("  for (i = %d; i < %d; i++) q[i] = (%s_h_t)%s_quant_f32(h[i], %d, %s, %s, %s);", (k - 1) * H, k * H, P, P, Q.e,
                    lit(Q.z), lit(Q.qmin), lit(Q.qmax)))
  end
  s("}")
  s("")
  s(string.format("void %s_dequantize_output(float *y, const %s_h_t *q, int32_t T)", P, P))
  s("{")
  s("  int32_t t, i;")
  s("  for (t = 0; t < T; t++) {")
  for d = 0, Dn - 1 do
    local Q = desc.layer[(Lc - 1) * Dn + d + 1].act["output.h"]
    s(string.format("    for (i = %d; i < %d; i++) y[(int64_t)t * %d + i] = (float)((int32_t)q[(int64_t)t * %d + i] - %d) * %s;", d * H, (d + 1) * H,
                    OUT, OUT, Q.z, p2f(-Q.e)))
  end
  s("  }")
  s("}")
  s("")
  s(string.format("void %s_dequantize_state(float *h, const %s_h_t *q)", P, P))
  s("{")
  s("  int32_t i;")
  for k, L in ipairs(desc.layer) do
    local Q = L.act["output.h"]
    s(string.format("  for (i = %d; i < %d; i++) h[i] = (float)((int32_t)q[i] - %d) * %s;", (k - 1) * H, k * H, Q.z, p2f(-Q.e)))
  end
  s("}")
  if desc.head then
    local hw = desc.head
    s("")
    s("/* The float head: nn.Linear (weights [outputs][inputs] as qgru holds them, float32). */")
    local wv, bv = {}, {}
    for i, v in ipairs(hw.weight) do wv[i] = string.format("%.9gf", v) end
    for i = 1, hw.outputs do bv[i] = string.format("%.9gf", hw.bias and hw.bias[i] or 0) end
    local function farray(name, vals, n)
      local o = { string.format("static const float %s[%d] = {", name, #vals) }
      for i = 1, #vals, n do
        local row = {}
        for k = i, math.min(#vals, i + n - 1) do row[#row + 1] = vals[k] end
        o[#o + 1] = "  " .. table.concat(row, ", ") .. (i + n <= #vals and "," or "")
      end
      o[#o + 1] = "};"
      return table.concat(o, "\n")
    end
    s(farray(P .. "_head_w", wv, 8))
    s(farray(P .. "_head_b", bv, 8))
    s(string.format("void %s_head(float *logits, const float *features)", P))
    s("{")
    s("  int32_t o, k;")
    s(string.format("  for (o = 0; o < %d; o++) {", hw.outputs))
    s(string.format("    float acc = %s_head_b[o];", P))
    s(string.format("    for (k = 0; k < %d; k++) acc += %s_head_w[o * %d + k] * features[k];", hw.inputs, P, hw.inputs))
    s("    logits[o] = acc;")
    s("  }")
    s("}")
  end
  local info = { name = P, scratch_bytes = scratch_bytes, state_codes = STATE, state_bytes = STATE * BYTES[types.h],
                 work_per_step_bytes = work_layers * OUT * BYTES[types.h], types = types, plan = {} }
  for _, L in ipairs(desc.layer) do
    info.plan[#info.plan + 1] = string.format("%s: W x %s-bit (2^%.1f), R h %s-bit (2^%.1f), sums %s, products %s", L.name,
      L.plan["matmul.Wx"].t, D.log2(L.plan["matmul.Wx"].bound), L.plan["matmul.Rh"].t, D.log2(L.plan["matmul.Rh"].bound),
      table.concat(L.plan.sums, "/"), table.concat(L.plan.products, "/"))
  end
  return { header = table.concat(hd, "\n") .. "\n", source = table.concat(sc, "\n") .. "\n",
           driver = M.driver(desc, P), info = info }
end

-- A command-line driver for tests: reads .npy inputs, runs every sequence, writes .npy outputs.
function M.driver(desc, P)
  local UP = P:upper()
  local text = [[
/* @P@_main.c: a command-line driver of @P@.h for tests (generated by qgru's export; uses stdio/malloc).
 *   @P@_main x.npy y.npy [--lengths L.npy] [--h0 h0.npy] [--hn hn.npy] [--codes codes.npy] [--logits logits.npy]
 * x f32 [T, N, C] (time-major, like qgru); lengths i64 or i32 [N] (each in 1..T; default T);
 * h0 f32 [layers * directions, N, H]. Writes y f32 [T, N, OUTPUT] (dequantized output.h of the last
 * layer, 0 at padded steps, as qgru), hn f32 [layers * directions, N, H], codes i32 [T, N, OUTPUT]
 * (0 at padded steps) and, with a head, logits f32 [N, HEAD] of the last time step (nn.Last). */
#include "@P@.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char descr[8];
  long shape[4];
  int ndim;
  void *data;
} npy;

static int fail(const char *what, const char *path)
{
  fprintf(stderr, "@P@_main: %s: %s\n", path, what);
  return 0;
}

/* Reads a little-endian, C-order .npy file of up to 4 dimensions. */
static int npy_read(const char *path, npy *a)
{
  FILE *f = fopen(path, "rb");
  unsigned char pre[10];
  char *hdr, *p;
  long hlen, n = 1, elem;
  int i;
  if (!f) return fail("cannot open", path);
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) { fclose(f); return fail("not a .npy file", path); }
  if (pre[6] == 1) hlen = pre[8] | (pre[9] << 8);
  else {
    unsigned char more[2];
    if (fread(more, 1, 2, f) != 2) { fclose(f); return fail("truncated header", path); }
    hlen = (long)pre[8] | ((long)pre[9] << 8) | ((long)more[0] << 16) | ((long)more[1] << 24);
  }
  hdr = (char *)malloc((size_t)hlen + 1);
  if (!hdr || fread(hdr, 1, (size_t)hlen, f) != (size_t)hlen) { free(hdr); fclose(f); return fail("truncated header", path); }
  hdr[hlen] = 0;
  p = strstr(hdr, "'descr':");
  if (!p || sscanf(p + 8, " '%7[^']'", a->descr) != 1) { free(hdr); fclose(f); return fail("no descr", path); }
  if (strstr(hdr, "'fortran_order': True")) { free(hdr); fclose(f); return fail("Fortran order is not supported", path); }
  p = strstr(hdr, "'shape':");
  if (!p || !(p = strchr(p, '('))) { free(hdr); fclose(f); return fail("no shape", path); }
  p++;
  a->ndim = 0;
  while (*p && *p != ')') {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) { p++; continue; }
    if (a->ndim == 4) { free(hdr); fclose(f); return fail("more than 4 dimensions", path); }
    a->shape[a->ndim++] = v;
    n *= v;
    p = end;
  }
  free(hdr);
  elem = (a->descr[1] == 'f' && a->descr[2] == '4') || (a->descr[1] == 'i' && a->descr[2] == '4') ? 4 : (a->descr[1] == 'i' && a->descr[2] == '8' ? 8 : 0);
  if (a->descr[0] != '<' || !elem) { fclose(f); return fail("expected <f4, <i4 or <i8", path); }
  a->data = malloc((size_t)(n * elem + 1));
  if (!a->data || fread(a->data, (size_t)elem, (size_t)n, f) != (size_t)n) { fclose(f); return fail("truncated data", path); }
  fclose(f);
  for (i = a->ndim; i < 4; i++) a->shape[i] = 1;
  return 1;
}

static int npy_write(const char *path, const char *descr, const long *shape, int ndim, const void *data, long elem)
{
  char hdr[256], dims[128] = "";
  long n = 1, len;
  int i;
  FILE *f;
  for (i = 0; i < ndim; i++) {
    char one[32];
    sprintf(one, "%ld,%s", shape[i], (ndim == 1 || i + 1 < ndim) ? " " : "");
    strcat(dims, one);
    n *= shape[i];
  }
  len = sprintf(hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
  while ((10 + len + 1) % 64) hdr[len++] = ' ';
  hdr[len++] = '\n';
  f = fopen(path, "wb");
  if (!f) return fail("cannot write", path);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  fputc((int)(len & 255), f);
  fputc((int)(len >> 8), f);
  fwrite(hdr, 1, (size_t)len, f);
  fwrite(data, (size_t)elem, (size_t)n, f);
  return fclose(f) == 0 ? 1 : fail("write error", path);
}

int main(int argc, char **argv)
{
  const char *xs = NULL, *ys = NULL, *ls = NULL, *h0s = NULL, *hns = NULL, *cs = NULL, *lgs = NULL;
  npy x, L, h0;
  long T, N, n, t, i, k, LD = (long)@UP@_LAYERS * @UP@_DIRECTIONS, H = @UP@_HIDDEN_SIZE, OUT = @UP@_OUTPUT_SIZE;
  float *y, *hn, *xrow, *frow;
  int32_t *codes;
  @P@_x_t *xq;
  @P@_h_t *yq, *hq, *h0q = NULL, *work;
  @P@_scratch scratch;
  int argi;
  for (argi = 1; argi < argc; argi++) {
    if (!strcmp(argv[argi], "--lengths") && argi + 1 < argc) ls = argv[++argi];
    else if (!strcmp(argv[argi], "--h0") && argi + 1 < argc) h0s = argv[++argi];
    else if (!strcmp(argv[argi], "--hn") && argi + 1 < argc) hns = argv[++argi];
    else if (!strcmp(argv[argi], "--codes") && argi + 1 < argc) cs = argv[++argi];
    else if (!strcmp(argv[argi], "--logits") && argi + 1 < argc) lgs = argv[++argi];
    else if (!xs) xs = argv[argi];
    else if (!ys) ys = argv[argi];
    else { fprintf(stderr, "@P@_main: unexpected argument %s\n", argv[argi]); return 2; }
  }
  if (!xs || !ys) {
    fprintf(stderr, "usage: @P@_main x.npy y.npy [--lengths L.npy] [--h0 h0.npy] [--hn hn.npy] [--codes codes.npy] [--logits logits.npy]\n");
    return 2;
  }
  if (!npy_read(xs, &x)) return 1;
  if (x.ndim != 3 || x.shape[2] != @UP@_INPUT_SIZE || strcmp(x.descr, "<f4")) { fail("expected f32 [T, N, input size]", xs); return 1; }
  T = x.shape[0]; N = x.shape[1];
  if (ls) {
    if (!npy_read(ls, &L)) return 1;
    if (L.ndim != 1 || L.shape[0] != N || L.descr[1] != 'i') { fail("expected i64 or i32 [N]", ls); return 1; }
  }
  if (h0s) {
    if (!npy_read(h0s, &h0)) return 1;
    if (h0.ndim != 3 || h0.shape[0] != LD || h0.shape[1] != N || h0.shape[2] != H || strcmp(h0.descr, "<f4")) {
      fail("expected f32 [layers * directions, N, H]", h0s); return 1;
    }
    h0q = (@P@_h_t *)malloc(sizeof(@P@_h_t) * (size_t)(LD * H));
  }
  y = (float *)calloc((size_t)(T * N * OUT), sizeof(float));
  codes = (int32_t *)calloc((size_t)(T * N * OUT), sizeof(int32_t));
  hn = (float *)malloc(sizeof(float) * (size_t)(LD * N * H));
  xrow = (float *)malloc(sizeof(float) * (size_t)(T * @UP@_INPUT_SIZE + 1));
  frow = (float *)malloc(sizeof(float) * (size_t)(T * OUT + LD * H + 1));
  xq = (@P@_x_t *)malloc(sizeof(@P@_x_t) * (size_t)(T * @UP@_INPUT_SIZE + 1));
  yq = (@P@_h_t *)malloc(sizeof(@P@_h_t) * (size_t)(T * OUT + 1));
  hq = (@P@_h_t *)malloc(sizeof(@P@_h_t) * (size_t)(LD * H));
  work = (@P@_h_t *)malloc(sizeof(@P@_h_t) * (size_t)(@UP@_WORK_SIZE(T) + 1));
  if (!y || !codes || !hn || !xrow || !frow || !xq || !yq || !hq || !work || (h0s && !h0q)) { fprintf(stderr, "@P@_main: out of memory\n"); return 1; }
  for (n = 0; n < N; n++) {
    long Tn = T;
    float *hrow = frow + T * OUT;
    if (ls) Tn = L.descr[2] == '8' ? (long)((const int64_t *)L.data)[n] : (long)((const int32_t *)L.data)[n];
    if (Tn < 1 || Tn > T) { fprintf(stderr, "@P@_main: lengths[%ld] = %ld is not in 1..%ld\n", n, Tn, T); return 1; }
    for (t = 0; t < Tn; t++)
      for (k = 0; k < @UP@_INPUT_SIZE; k++) xrow[t * @UP@_INPUT_SIZE + k] = ((const float *)x.data)[(t * N + n) * @UP@_INPUT_SIZE + k];
    @P@_quantize_input(xq, xrow, (int32_t)(Tn * @UP@_INPUT_SIZE));
    if (h0s) {
      for (i = 0; i < LD; i++)
        for (k = 0; k < H; k++) hrow[i * H + k] = ((const float *)h0.data)[(i * N + n) * H + k];
      @P@_quantize_state(h0q, hrow);
    }
    if (@P@_sequence(yq, hq, xq, (int32_t)Tn, h0q, work, &scratch) != 0) { fprintf(stderr, "@P@_main: @P@_sequence failed\n"); return 1; }
    @P@_dequantize_output(frow, yq, (int32_t)Tn);
    for (t = 0; t < Tn; t++)
      for (k = 0; k < OUT; k++) {
        y[(t * N + n) * OUT + k] = frow[t * OUT + k];
        codes[(t * N + n) * OUT + k] = (int32_t)yq[t * OUT + k];
      }
    @P@_dequantize_state(hrow, hq);
    for (i = 0; i < LD; i++)
      for (k = 0; k < H; k++) hn[(i * N + n) * H + k] = hrow[i * H + k];
  }
  {
    long ys_shape[3], hs_shape[3];
    ys_shape[0] = T; ys_shape[1] = N; ys_shape[2] = OUT;
    hs_shape[0] = LD; hs_shape[1] = N; hs_shape[2] = H;
    if (!npy_write(ys, "<f4", ys_shape, 3, y, 4)) return 1;
    if (hns && !npy_write(hns, "<f4", hs_shape, 3, hn, 4)) return 1;
    if (cs && !npy_write(cs, "<i4", ys_shape, 3, codes, 4)) return 1;
  }
  if (lgs) {
#if @HEAD@
    long lshape[2];
    float *logits = (float *)malloc(sizeof(float) * (size_t)(N * @UP@_HEAD_SIZE));
    if (!logits) return 1;
    for (n = 0; n < N; n++) @P@_head(logits + n * @UP@_HEAD_SIZE, y + ((T - 1) * N + n) * OUT);
    lshape[0] = N; lshape[1] = @UP@_HEAD_SIZE;
    if (!npy_write(lgs, "<f4", lshape, 2, logits, 4)) return 1;
#else
    fprintf(stderr, "@P@_main: the model has no head (--logits)\n");
    return 2;
#endif
  }
  return 0;
}
]]
  text = text:gsub("@HEAD@", desc.head and "1" or "0"):gsub("@UP@", UP):gsub("@P@", P)
  return text
end

-- Writes dir/<name>.h, dir/<name>.c and dir/<name>_main.c; returns the paths and the info.
function M.write(desc, dir, opts)
  local g = M.generate(desc, opts)
  local P = g.info.name
  local paths = { header = dir .. "/" .. P .. ".h", source = dir .. "/" .. P .. ".c", driver = dir .. "/" .. P .. "_main.c" }
  for k, path in pairs(paths) do
    local f, err = io.open(path, "w")
    if not f then error("qgru: export c: cannot write " .. path .. ": " .. tostring(err), 0) end
    f:write(g[k]); f:close()
  end
  return paths, g.info
end

return M
