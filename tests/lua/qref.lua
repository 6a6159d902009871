-- qref.lua: an independent reference of the quantized GRU, written in plain Lua from
-- ../shared/QUANT_SPEC.md (sections 1, 3 and 4) for the specs. It shares no code with the C
-- library: integers are Lua doubles (exact below 2^53; every value is checked to stay there),
-- rounding half to even is done by hand, sums are aligned by multiplying with powers of two.
--
-- Quantizers are tables {bits=, uns=, e=, z=}; weights are per channel: {bits=, uns=, e={..}, z={..}}.
local ffi = require("ffi")

local R = {}

local LIMIT = 2 ^ 52
local function exact(v)
  assert(math.abs(v) < LIMIT, "qref: integer magnitude beyond 2^52: " .. tostring(v))
  return v
end

-- round half to even
function R.rne(v)
  local f = math.floor(v)
  local d = v - f
  if d > 0.5 then return f + 1 end
  if d < 0.5 then return f end
  return (f % 2 == 0) and f or f + 1
end

function R.grid(bits, uns)
  if uns then return 0, 2 ^ bits - 1 end
  return -2 ^ (bits - 1), 2 ^ (bits - 1) - 1
end

local function clamp(r, q)
  local lo, hi = R.grid(q.bits, q.uns)
  if r < lo then return lo, 0 end
  if r > hi then return hi, 0 end
  return r, 1
end

-- quant(x) = clamp(rne(x 2^e) + z); returns code, mask
function R.quant(x, q) return clamp(R.rne(x * 2 ^ q.e) + q.z, q) end
function R.deq(c, q) return (c - q.z) * 2 ^ -q.e end

-- integer v at scale 2^-s moved to q: k = s - e; rne(v / 2^k) or exact v 2^-k; + z; clamp
function R.requant(v, s, q)
  exact(v)
  local k = s - q.e
  local r
  if k > 0 then r = R.rne(v / 2 ^ k) else r = exact(v * 2 ^ -k) end
  return clamp(r + q.z, q)
end

-- terms {{centered code, exponent}, ...} aligned to the finest scale, summed, requantized
local function aligned(terms, q)
  local emax = -math.huge
  for _, t in ipairs(terms) do emax = math.max(emax, t[2]) end
  local sum = 0
  for _, t in ipairs(terms) do sum = sum + exact(t[1] * 2 ^ (emax - t[2])) end
  local code, m = R.requant(exact(sum), emax, q)
  return code, m, sum * 2 ^ -emax
end

local function f32(v) return tonumber(ffi.new("float", v)) end
local function sigmoid(v) return 1 / (1 + math.exp(-v)) end

-- activation table entry: quant_O(f(deq_P(q)))
local function act(qpre, P, O, f) return R.quant(f(R.deq(qpre, P)), O) end

-- One layer and direction. A = activation quantizers by op name; Wq = weight quantizers by
-- "W", "R", "bx", "br"; w = float weights {W = [3H][C], R = [3H][H], bx = [3H], br = [3H]};
-- x [T][N][C] (float values), h0 [N][H] or nil; reverse. Returns y [T][N][H] (float32 values of
-- deq(q_h)), hq [T+1][N][H] codes (processing order), and per step s the record used by the
-- backward: rec[s][n][i] = {masks and dequantized values}, plus xq/xm and weight fq/masks.
function R.layer(A, Wq, w, x, h0, reverse)
  local T, N, C, H = #x, #x[1], #x[1][1], #w.R[1]
  local QX, QH, QWX, QRH = A["input.x"], A["output.h"], A["matmul.Wx"], A["matmul.Rh"]
  local function wq(name, j) local q = Wq[name]; return { bits = q.bits, uns = q.uns, e = q.e[j], z = q.z[j] } end
  -- weight codes, fake-quantized values and masks
  local codes, fq, wmask = {}, {}, {}
  for _, name in ipairs({ "W", "R", "bx", "br" }) do
    codes[name], fq[name], wmask[name] = {}, {}, {}
    for j = 1, 3 * H do
      local q = wq(name, j)
      if type(w[name][j]) == "table" then
        codes[name][j], fq[name][j], wmask[name][j] = {}, {}, {}
        for k = 1, #w[name][j] do
          local c, m = R.quant(w[name][j][k], q)
          codes[name][j][k], fq[name][j][k], wmask[name][j][k] = c, R.deq(c, q), m
        end
      else
        local c, m = R.quant(w[name][j], q)
        codes[name][j], fq[name][j], wmask[name][j] = c, R.deq(c, q), m
      end
    end
  end
  -- input codes
  local xq, xm = {}, {}
  for t = 1, T do
    xq[t], xm[t] = {}, {}
    for n = 1, N do
      xq[t][n], xm[t][n] = {}, {}
      for k = 1, C do xq[t][n][k], xm[t][n][k] = R.quant(x[t][n][k], QX) end
    end
  end
  local hq, y, rec = { [0] = {} }, {}, {}
  for n = 1, N do
    hq[0][n] = {}
    for i = 1, H do hq[0][n][i] = (R.quant(h0 and h0[n][i] or 0, QH)) end
  end
  for t = 1, T do y[t] = {} for n = 1, N do y[t][n] = {} end end
  for s = 1, T do
    local t = reverse and (T + 1 - s) or s
    hq[s], rec[s] = {}, {}
    for n = 1, N do
      hq[s][n], rec[s][n] = {}, {}
      -- matmuls for this (t, n): acc over centered codes, requantized per output row j
      local qwx, mwx, qrh, mrh = {}, {}, {}, {}
      for j = 1, 3 * H do
        local qw, qr = wq("W", j), wq("R", j)
        local acc = 0
        for k = 1, C do acc = acc + exact((codes.W[j][k] - qw.z) * (xq[t][n][k] - QX.z)) end
        qwx[j], mwx[j] = R.requant(exact(acc), qw.e + QX.e, QWX)
        acc = 0
        for k = 1, H do acc = acc + exact((codes.R[j][k] - qr.z) * (hq[s - 1][n][k] - QH.z)) end
        qrh[j], mrh[j] = R.requant(exact(acc), qr.e + QH.e, QRH)
      end
      for i = 1, H do
        local jz, jr, jg = i, H + i, 2 * H + i
        local bxz, bxr, bxg, brz, brr, brg = wq("bx", jz), wq("bx", jr), wq("bx", jg), wq("br", jz), wq("br", jr), wq("br", jg)
        local m = {}
        local qzpre, qrpre, qrhb, qrrh, qgpre, qz, qr, qg, qold, qnew, qh
        qzpre, m.zpre = aligned({ { qwx[jz] - QWX.z, QWX.e }, { qrh[jz] - QRH.z, QRH.e }, { codes.bx[jz] - bxz.z, bxz.e }, { codes.br[jz] - brz.z, brz.e } }, A["gate.z_pre"])
        qrpre, m.rpre = aligned({ { qwx[jr] - QWX.z, QWX.e }, { qrh[jr] - QRH.z, QRH.e }, { codes.bx[jr] - bxr.z, bxr.e }, { codes.br[jr] - brr.z, brr.e } }, A["gate.r_pre"])
        qz, m.zout = act(qzpre, A["gate.z_pre"], A["gate.z_out"], sigmoid)
        qr, m.rout = act(qrpre, A["gate.r_pre"], A["gate.r_out"], sigmoid)
        qrhb, m.rhb = aligned({ { qrh[jg] - QRH.z, QRH.e }, { codes.br[jg] - brg.z, brg.e } }, QRH)
        local QR, QZ, QG = A["gate.r_out"], A["gate.z_out"], A["gate.g_out"]
        qrrh, m.rrh = R.requant(exact((qr - QR.z) * (qrhb - QRH.z)), QR.e + QRH.e, A["op.rRh"])
        qgpre, m.gpre = aligned({ { qwx[jg] - QWX.z, QWX.e }, { codes.bx[jg] - bxg.z, bxg.e }, { qrrh - A["op.rRh"].z, A["op.rRh"].e } }, A["gate.g_pre"])
        qg, m.gout = act(qgpre, A["gate.g_pre"], QG, math.tanh)
        local qhp = hq[s - 1][n][i]
        qold, m.old = R.requant(exact((qz - QZ.z) * (qhp - QH.z)), QZ.e + QH.e, A["op.old_contrib"])
        local one_minus_z = 2 ^ QZ.e - (qz - QZ.z)
        qnew, m.new = R.requant(exact(one_minus_z * (qg - QG.z)), QZ.e + QG.e, A["op.new_contrib"])
        qh, m.h = aligned({ { qold - A["op.old_contrib"].z, A["op.old_contrib"].e }, { qnew - A["op.new_contrib"].z, A["op.new_contrib"].e } }, QH)
        hq[s][n][i] = qh
        y[t][n][i] = f32(R.deq(qh, QH))
        m.wx = { mwx[jz], mwx[jr], mwx[jg] }
        m.rh = { mrh[jz], mrh[jr], mrh[jg] }
        rec[s][n][i] = {
          m = m, t = t,
          hprev = R.deq(qhp, QH), z = R.deq(qz, QZ), r = R.deq(qr, QR), g = R.deq(qg, QG), rhb = R.deq(qrhb, QRH),
          zpre = R.deq(qzpre, A["gate.z_pre"]), rpre = R.deq(qrpre, A["gate.r_pre"]), gpre = R.deq(qgpre, A["gate.g_pre"]),
        }
      end
    end
  end
  return { y = y, hq = hq, rec = rec, xq = xq, xm = xm, codes = codes, fq = fq, wmask = wmask, T = T, N = N, C = C, H = H,
           QX = QX, QH = QH, h0 = h0, reverse = reverse }
end

-- Straight-through backward of QUANT_SPEC.md section 4 in float64, from a forward record.
-- dy [T][N][H]. Returns dx [T][N][C], dW, dR, dbx, dbr (masked), dh0 [N][H].
function R.backward(F, dy)
  local T, N, C, H = F.T, F.N, F.C, F.H
  local function zeros2(a, b) local t = {} for i = 1, a do t[i] = {} for j = 1, b do t[i][j] = 0 end end return t end
  local dW, dR, dbx, dbr = zeros2(3 * H, C), zeros2(3 * H, H), {}, {}
  for j = 1, 3 * H do dbx[j], dbr[j] = 0, 0 end
  local dx = {}
  for t = 1, T do dx[t] = zeros2(N, C) end
  local dh = zeros2(N, H)
  for s = T, 1, -1 do
    local nextdh = zeros2(N, H)
    for n = 1, N do
      local dq = {}
      for i = 1, H do
        local r = F.rec[s][n][i]
        local m, t = r.m, r.t
        local d = (dh[n][i] + dy[t][n][i]) * m.h
        local dold, dnew = d * m.old, d * m.new
        local dz = dold * r.hprev - dnew * r.g
        nextdh[n][i] = nextdh[n][i] + dold * r.z
        local dg = dnew * (1 - r.z)
        local tg = math.tanh(r.gpre)
        local dgpre = dg * m.gout * (1 - tg * tg) * m.gpre
        local drrh = dgpre * m.rrh
        local dr = drrh * r.rhb
        local drhb = drrh * r.r * m.rhb
        local sz, sr = sigmoid(r.zpre), sigmoid(r.rpre)
        local dzpre = dz * m.zout * sz * (1 - sz) * m.zpre
        local drpre = dr * m.rout * sr * (1 - sr) * m.rpre
        local dwx = { dzpre * m.wx[1], drpre * m.wx[2], dgpre * m.wx[3] }
        local drh = { dzpre * m.rh[1], drpre * m.rh[2], drhb * m.rh[3] }
        dbx[i], dbx[H + i], dbx[2 * H + i] = dbx[i] + dzpre, dbx[H + i] + drpre, dbx[2 * H + i] + dgpre
        dbr[i], dbr[H + i], dbr[2 * H + i] = dbr[i] + dzpre, dbr[H + i] + drpre, dbr[2 * H + i] + drhb
        for gi = 0, 2 do
          local j = gi * H + i
          dq[j] = drh[gi + 1]
          -- dW~ += dacc_Wx x~^T ; dx~ = W~^T dacc_Wx
          for k = 1, C do
            local xv = R.deq(F.xq[t][n][k], F.QX)
            dW[j][k] = dW[j][k] + dwx[gi + 1] * xv
            dx[t][n][k] = dx[t][n][k] + F.fq.W[j][k] * dwx[gi + 1]
          end
        end
      end
      -- dR~ += dacc_Rh h~^T ; dh_{t-1} += R~^T dacc_Rh
      for j = 1, 3 * H do
        for k = 1, H do
          local hv = F.rec[s][n][k].hprev
          dR[j][k] = dR[j][k] + dq[j] * hv
          nextdh[n][k] = nextdh[n][k] + F.fq.R[j][k] * dq[j]
        end
      end
    end
    dh = nextdh
  end
  -- masks of the quantized inputs, weights and h0
  for t = 1, T do for n = 1, N do for k = 1, C do dx[t][n][k] = dx[t][n][k] * F.xm[t][n][k] end end end
  for j = 1, 3 * H do
    for k = 1, C do dW[j][k] = dW[j][k] * F.wmask.W[j][k] end
    for k = 1, H do dR[j][k] = dR[j][k] * F.wmask.R[j][k] end
    dbx[j] = dbx[j] * F.wmask.bx[j]
    dbr[j] = dbr[j] * F.wmask.br[j]
  end
  local dh0 = zeros2(N, H)
  for n = 1, N do
    for i = 1, H do
      local _, m = R.quant(F.h0 and F.h0[n][i] or 0, F.QH)
      dh0[n][i] = dh[n][i] * m
    end
  end
  return { dx = dx, dW = dW, dR = dR, dbx = dbx, dbr = dbr, dh0 = dh0 }
end

return R
