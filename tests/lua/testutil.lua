-- testutil.lua: independent float64 references for the specs, written from the equations in
-- core/qgru.h and PyTorch's documentation, sharing no code with the C library: a GRU forward on
-- nested Lua tables (multi-layer, bidirectional, h0), Linear, cross-entropy and MSE; central
-- finite differences; and error measures.
local M = {}

local function sigmoid(v) return 1 / (1 + math.exp(-v)) end
local function tanh(v) local e = math.exp(2 * v); return (e - 1) / (e + 1) end

-- P[l][d] = {W = [3H][in], R = [3H][H], bx = [3H], br = [3H]} (1-based, gate blocks z, r, g)
-- x [T][N][C]; h0 [L*D][N][H] or nil. Returns y [T][N][D*H], hn [L*D][N][H].
function M.gru(P, x, h0, L, D, H)
  local T, N = #x, #x[1]
  local inp = x
  local hn = {}
  for l = 0, L - 1 do
    local out = {}
    for t = 1, T do out[t] = {} for n = 1, N do out[t][n] = {} end end
    for d = 0, D - 1 do
      local p = P[l][d]
      local h = {}
      for n = 1, N do
        h[n] = {}
        for i = 1, H do h[n][i] = h0 and h0[l * D + d + 1][n][i] or 0 end
      end
      for s = 1, T do
        local t = d == 0 and s or (T + 1 - s)
        local xt = inp[t]
        local newh = {}
        for n = 1, N do
          newh[n] = {}
          for i = 1, H do
            local function dot(Wrow, v) local a = 0 for k = 1, #v do a = a + Wrow[k] * v[k] end return a end
            local zx, rx, gx = dot(p.W[i], xt[n]), dot(p.W[H + i], xt[n]), dot(p.W[2 * H + i], xt[n])
            local zh, rh, gh = dot(p.R[i], h[n]), dot(p.R[H + i], h[n]), dot(p.R[2 * H + i], h[n])
            local z = sigmoid(zx + p.bx[i] + zh + p.br[i])
            local r = sigmoid(rx + p.bx[H + i] + rh + p.br[H + i])
            local g = tanh(gx + p.bx[2 * H + i] + r * (gh + p.br[2 * H + i]))
            newh[n][i] = z * h[n][i] + (1 - z) * g
          end
        end
        h = newh
        for n = 1, N do for i = 1, H do out[t][n][d * H + i] = h[n][i] end end
      end
      hn[l * D + d + 1] = h
    end
    inp = out
  end
  return inp, hn
end

-- Flattens nested tables into a 1-based list (row-major).
function M.flatten(t, out)
  out = out or {}
  if type(t) == "number" then out[#out + 1] = t; return out end
  for i = 1, #t do M.flatten(t[i], out) end
  return out
end

-- Writes the values of flat list v back into nested table t (same structure).
function M.unflatten_into(t, v, pos)
  pos = pos or 1
  for i = 1, #t do
    if type(t[i]) == "number" then t[i] = v[pos]; pos = pos + 1 else pos = M.unflatten_into(t[i], v, pos) end
  end
  return pos
end

-- Central differences of f() with respect to every number in nested table t (float64).
function M.numgrad(f, t, eps)
  eps = eps or 1e-6
  local vals = M.flatten(t)
  local g = {}
  for k = 1, #vals do
    local v0 = vals[k]
    vals[k] = v0 + eps; M.unflatten_into(t, vals); local fp = f()
    vals[k] = v0 - eps; M.unflatten_into(t, vals); local fm = f()
    vals[k] = v0; M.unflatten_into(t, vals)
    g[k] = (fp - fm) / (2 * eps)
  end
  return g
end

-- max|a - b| / max|b| over two flat lists.
function M.rel_err(a, b)
  assert(#a == #b, "rel_err: lengths differ " .. #a .. " vs " .. #b)
  local num, den = 0, 0
  for i = 1, #a do
    num = math.max(num, math.abs(a[i] - b[i]))
    den = math.max(den, math.abs(b[i]))
  end
  return num / math.max(den, 1e-300), num
end

function M.max_abs_diff(a, b)
  assert(#a == #b, "max_abs_diff: lengths differ " .. #a .. " vs " .. #b)
  local m = 0
  for i = 1, #a do m = math.max(m, math.abs(a[i] - b[i])) end
  return m
end

function M.dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end

function M.cross_entropy(logits, target)   -- logits [N][K], target 0-based class list; mean loss
  local total = 0
  for n = 1, #logits do
    local mx = -math.huge
    for _, v in ipairs(logits[n]) do mx = math.max(mx, v) end
    local se = 0
    for _, v in ipairs(logits[n]) do se = se + math.exp(v - mx) end
    total = total + (mx + math.log(se)) - logits[n][target[n] + 1]
  end
  return total / #logits
end

function M.mse(pred, target)               -- flat lists
  local s = 0
  for i = 1, #pred do s = s + (pred[i] - target[i]) ^ 2 end
  return s / #pred
end

-- A temporary file path under the system temp folder.
function M.tmpname(suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. (suffix or "")
end

function M.write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

function M.read_bytes(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The quantizers of a prepared, calibrated layer (lq: quant's LayerQuant) in the form of the
-- independent reference (tests/lua/qref.lua): activations A[op] and weights Wq[W|R|bx|br], each
-- { bits, uns, e, z } (per-channel e, z for the weights).
function M.qref_quantizers(lq)
  local A, Wq = {}, {}
  for op, q in pairs(lq:quantizers()) do
    local e, z = q:get()
    if q.per_channel then
      Wq[({ ["weight.W"] = "W", ["weight.R"] = "R", ["weight.bw"] = "bx", ["weight.br"] = "br" })[op]] =
        { bits = q.bitwidth, uns = q.is_unsigned, e = e, z = z }
    else
      A[op] = { bits = q.bitwidth, uns = q.is_unsigned, e = e, z = z }
    end
  end
  return A, Wq
end

return M
