-- cuda_gru_spec.lua: the float GRU on the GPU (kernels/gru.cu, kernels/gru_persist.cu) against the
-- CPU backend (core/gru_cpu.c, itself checked against float64 references, finite differences and
-- PyTorch's golden file by gru_lengths_spec, gradcheck_spec and golden_spec). For every case:
--   * forward outputs y (with untouched columns outside [y_offset, y_offset + H)), hs and gates, and
--     the backward's dx, dW, dR, dbx, dbr (the accumulated increments) and dh0: relative error
--     ||gpu - cpu|| / ||cpu|| < 1e-5;
--   * odd sizes (N in {1, 3, 17}, H in {1, 7, 130}, C in {1, 5, 300}), both directions, h0,
--     variable lengths, with and without dy / dhn; each on the persistent and the fallback
--     recurrence (qgru.setKernelPath), and the persistent kernel forced to every cluster size and
--     rows per cluster, R in shared memory and in registers (qg_ctx_set_persist_shape);
--   * nn.GRU multi-layer and bidirectional (qg_gru_forward_bidir / qg_gru_backward_bidir) with h0
--     and lengths: output, h_n, gradInput and every parameter gradient;
--   * the statistics observer: min/max equal, counts identical for the input row, histograms equal
--     up to values that fall on the other side of a bin edge;
--   * the same run twice gives the same bits; a forced persistent path on a shape it cannot hold is
--     QG_ERR_UNSUPPORTED naming the limit.
-- Tests tagged #sanitize (memcheck) and #race (racecheck) are the small subsets run under
-- compute-sanitizer on the GPU machine (tests/gpu/device_check.sh).
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local Tensor = require("qgru.tensor")

local lib, ffi = clib.lib, clib.ffi
local nn = qgru.nn
local TOL = 1e-5
local BINS = lib.QG_STATS_BINS

describe("CUDA float GRU #gpu", function()
  if skip_without_cuda(pending) then return end

  local cpu, gpu = clib.context("cpu"), clib.context("cuda")
  local function check(ctx, st) clib.check(ctx, st, 2) end
  local function host(t) return t:device() == "cpu" and t or t:to("cpu") end
  local function rnd(shape, k) return Tensor.new(shape, "f32"):uniform(-k, k) end
  local function poison(shape) return Tensor.new(shape, "f32"):fill(7):to("cuda") end

  -- ||(got - base) - (want - base)|| / ||want - base|| (base: the value a gradient accumulated onto)
  local function relerr(got, want, base)
    local g, w, b = host(got), host(want), base and host(base) or nil
    assert(g:numel() == w:numel(), "sizes differ")
    local pg, pw, pb = g:ptr(), w:ptr(), b and b:ptr() or nil
    local num, den = 0, 0
    for i = 0, g:numel() - 1 do
      local a, c = pg[i], pw[i]
      if a ~= a or c ~= c then Tensor.keepAlive(g, w, b); return 0 / 0 end
      local o = pb and pb[i] or 0
      num = num + ((a - o) - (c - o)) ^ 2
      den = den + (c - o) ^ 2
    end
    Tensor.keepAlive(g, w, b)   -- the host copies stay alive while read through raw pointers
    if den == 0 then return num == 0 and 0 or math.huge end
    return math.sqrt(num / den)
  end
  local function close(got, want, what, base)
    local e = relerr(got, want, base)
    assert(e < TOL, string.format("%s: relative error %.3g (limit %g)", what, e, TOL))
  end
  local function identical(a, b, what)
    local ha, hb = host(a), host(b)   -- held (keepAlive below): a raw pointer does not keep a temporary copy alive
    local pa, pb, n = ha:ptr(), hb:ptr(), a:numel()
    for i = 0, n - 1 do
      if pa[i] ~= pb[i] then error(string.format("%s: element %d differs between two runs (%.9g vs %.9g)", what, i, pa[i], pb[i])) end
    end
    Tensor.keepAlive(ha, hb)
  end

  -- One layer and direction through the C API: the CPU result and the GPU result of the same inputs.
  local function one_case(cs)
    local T, N, C, H = cs.T, cs.N, cs.C, cs.H
    qgru.seed(cs.seed or (T * 7919 + N * 131 + C * 17 + H))
    local k = 1.2 / math.sqrt(H)
    local P = { W = rnd({ 3 * H, C }, k), R = rnd({ 3 * H, H }, k), bx = rnd({ 3 * H }, k), br = rnd({ 3 * H }, k) }
    local x = rnd({ T, N, C }, 1)
    local h0 = cs.h0 and rnd({ N, H }, 0.8) or nil
    local lens
    if cs.lengths then
      local L = {}
      for n = 1, N do L[n] = (n * 5 + 2) % T + 1 end
      L[math.min(2, N)] = T
      lens = Tensor.from(L, "i64")
    end
    local Hy, yoff = cs.yoff and H + 5 or H, cs.yoff and 3 or 0
    local rev = cs.reverse or 0
    local dy = not cs.nody and rnd({ T, N, Hy }, 1) or nil
    local dhn = cs.dhn and rnd({ N, H }, 1) or nil
    local base = { dx = rnd({ T, N, C }, 0.5), W = rnd({ 3 * H, C }, 0.5), R = rnd({ 3 * H, H }, 0.5),
                   bx = rnd({ 3 * H }, 0.5), br = rnd({ 3 * H }, 0.5) }

    -- reps > 1: the same buffers again (the fallback runs directly, then captures a graph, then
    -- replays it); every repetition's results are kept (poisoned outputs, reset accumulators)
    local function run(ctx, dev, reps)
      local function mv(t) return t and (dev == "cpu" and t or t:to(dev)) or nil end
      local out = {}
      local sevens = {}
      local function out_t(key, shape)
        sevens[key] = Tensor.new(shape, "f32"):fill(7)
        out[key] = dev == "cpu" and sevens[key]:clone() or sevens[key]:to("cuda")
      end
      out_t("y", { T, N, Hy }); out_t("hs", { T + 1, N, H }); out_t("gates", { T, N, 4 * H })
      out_t("yi", { T, N, Hy }); out_t("hsi", { T + 1, N, H }); out_t("dh0", { N, H })
      out.dx, out.dW, out.dR = base.dx:clone():to(dev), base.W:clone():to(dev), base.R:clone():to(dev)
      out.dbx, out.dbr = base.bx:clone():to(dev), base.br:clone():to(dev)
      local W, R, bx, br, xd, h0d, ld = mv(P.W), mv(P.R), mv(P.bx), mv(P.br), mv(x), mv(h0), mv(lens)
      local dyd, dhnd = mv(dy), mv(dhn)
      local snaps = {}
      for rep = 1, reps or 1 do
        if rep > 1 then
          for key, t in pairs(sevens) do out[key]:copy(t) end
          out.dx:copy(base.dx); out.dW:copy(base.W); out.dR:copy(base.R); out.dbx:copy(base.bx); out.dbr:copy(base.br)
        end
        check(ctx, lib.qg_gru_forward(ctx, out.y.t, yoff, out.hs.t, out.gates.t, nil, xd.t, W.t, R.t, bx.t, br.t,
                                      h0d and h0d.t or nil, ld and ld.t or nil, rev))
        check(ctx, lib.qg_gru_forward(ctx, out.yi.t, yoff, out.hsi.t, nil, nil, xd.t, W.t, R.t, bx.t, br.t,   -- inference
                                      h0d and h0d.t or nil, ld and ld.t or nil, rev))
        check(ctx, lib.qg_gru_backward(ctx, out.dx.t, out.dW.t, out.dR.t, out.dbx.t, out.dbr.t, out.dh0.t,
                                       dyd and dyd.t or nil, yoff, dhnd and dhnd.t or nil, xd.t, W.t, R.t, out.hs.t,
                                       out.gates.t, ld and ld.t or nil, rev))
        if (reps or 1) > 1 then
          local snap = {}
          for key, t in pairs(out) do snap[key] = t:to("cpu"):clone() end
          snaps[rep] = snap
        end
      end
      return out, snaps
    end
    local g, snaps = run(gpu, "cuda", cs.reps)
    return run(cpu, "cpu"), g, base, snaps
  end

  local function compare(c, g, base, what)
    close(g.y, c.y, what .. " y")
    close(g.hs, c.hs, what .. " hs")
    close(g.gates, c.gates, what .. " gates")
    close(g.dx, c.dx, what .. " dx", base.dx)
    close(g.dW, c.dW, what .. " dW", base.W)
    close(g.dR, c.dR, what .. " dR", base.R)
    close(g.dbx, c.dbx, what .. " dbx", base.bx)
    close(g.dbr, c.dbr, what .. " dbr", base.br)
    close(g.dh0, c.dh0, what .. " dh0")
    identical(g.yi, g.y, what .. " inference y vs training y")
    identical(g.hsi, g.hs, what .. " inference hs vs training hs")
  end

  local function describe_case(cs)
    local f = {}
    for _, key in ipairs({ "reverse", "h0", "lengths", "yoff", "dhn", "nody" }) do
      if cs[key] and cs[key] ~= 0 then f[#f + 1] = key end
    end
    return string.format("T%d N%d C%d H%d %s", cs.T, cs.N, cs.C, cs.H, table.concat(f, " "))
  end

  local cases = {
    { T = 5, N = 1, C = 1, H = 1 },
    { T = 6, N = 3, C = 5, H = 7, reverse = 1, h0 = true, lengths = true, dhn = true },
    { T = 4, N = 17, C = 300, H = 130, h0 = true, lengths = true },
    { T = 7, N = 17, C = 5, H = 7, reverse = 1, lengths = true, yoff = true, dhn = true },
    { T = 5, N = 3, C = 300, H = 1, reverse = 1, h0 = true, nody = true, dhn = true },
    { T = 6, N = 1, C = 5, H = 130, reverse = 1, lengths = true },
    { T = 8, N = 17, C = 1, H = 130, h0 = true, yoff = true },
    { T = 6, N = 5, C = 16, H = 256, h0 = true, lengths = true },          -- clusters of 16
    { T = 5, N = 9, C = 12, H = 300, reverse = 1, lengths = true, dhn = true },
    { T = 30, N = 16, C = 40, H = 64, lengths = true },                    -- long-kws-like
    { T = 10, N = 32, C = 64, H = 128, h0 = true, reverse = 1 },           -- seed-qat-like
    { T = 4, N = 4, C = 8, H = 520, lengths = true },                      -- the largest R a cluster holds
  }

  after_each(function()
    qgru.setKernelPath("auto")
    check(gpu, lib.qg_ctx_set_persist_shape(gpu, 0, 0, 0, 0))
  end)

  for _, path in ipairs({ "persistent", "fallback" }) do
    for i, cs in ipairs(cases) do
      local tag = (i == 2 or i == 4) and " #sanitize" or ""
      it(string.format("%s: forward and backward == CPU (%s)%s", path, describe_case(cs), tag), function()
        qgru.setKernelPath(path)
        local c, g, base = one_case(cs)
        compare(c, g, base, path .. " " .. describe_case(cs))
      end)
    end
  end

  -- every cluster size and rows-per-cluster template of the persistent kernels
  -- {K, NB, S, storage}: storage 1 = R in shared memory, 2 = R in registers (S lanes per unit)
  local forced = { { 1, 1 }, { 1, 2 }, { 1, 4 }, { 2, 8 }, { 4, 2 }, { 8, 4 }, { 16, 1 }, { 16, 8 }, { 2, 1, 3 }, { 1, 1, 1 },
                   { 4, 4, 5 }, { 1, 1, 8, 2 }, { 2, 4, 16, 2 }, { 4, 2, 4, 2 }, { 16, 8, 8, 2 }, { 8, 1, 16, 2 }, { 1, 4, 4, 2 },
                   -- the large register shares: two lanes per unit (forward 32, backward 96 entries of R per
                   -- lane), one or two rows; one lane per unit (H <= 32: the backward's 3H in one lane)
                   { 1, 1, 2, 2 }, { 1, 2, 2, 2 }, { 1, 1, 1, 2, H = 30 } }
  for i, kn in ipairs(forced) do
    local cs = { T = 7, N = 11, C = 9, H = kn.H or 61, h0 = true, lengths = true, reverse = i % 2, dhn = i % 3 == 0, yoff = i % 2 == 0 }
    local tag = ((i == 4 or i == 13) and " #sanitize #race" or "") .. (i == 2 and " #race" or "")
    it(string.format("persistent forced to %d blocks x %d rows, %d splits, R in %s == CPU (%s)%s", kn[1], kn[2], kn[3] or 0,
                     kn[4] == 2 and "registers" or "shared memory", describe_case(cs), tag), function()
      qgru.setKernelPath("persistent")
      check(gpu, lib.qg_ctx_set_persist_shape(gpu, kn[1], kn[2], kn[3] or 0, kn[4] or 1))
      local c, g, base = one_case(cs)
      compare(c, g, base, string.format("K%d NB%d S%d storage %d", kn[1], kn[2], kn[3] or 0, kn[4] or 1))
    end)
  end

  for _, path in ipairs({ "fallback", "persistent" }) do
    it(path .. ": three calls with the same buffers (direct, captured graph, replayed graph) == CPU, same bits", function()
      qgru.setKernelPath(path)
      for _, cs in ipairs({ { T = 9, N = 5, C = 6, H = 17, h0 = true, lengths = true, dhn = true, reps = 3 },
                            { T = 12, N = 3, C = 4, H = 40, reverse = 1, yoff = true, reps = 3 } }) do
        local c, _, base, snaps = one_case(cs)
        assert.are.equal(3, #snaps)
        for rep = 1, 3 do compare(c, snaps[rep], base, string.format("%s rep %d", path, rep)) end
        for _, key in ipairs({ "y", "hs", "gates", "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
          identical(snaps[3][key], snaps[1][key], path .. " rep 3 vs rep 1 " .. key)
        end
      end
    end)
  end

  it("the same run twice gives the same bits (both paths) #sanitize", function()
    for _, path in ipairs({ "persistent", "fallback" }) do
      qgru.setKernelPath(path)
      local cs = { T = 9, N = 6, C = 7, H = 33, h0 = true, lengths = true, reverse = 1, dhn = true }
      local _, g1 = one_case(cs)
      local _, g2 = one_case(cs)
      for _, key in ipairs({ "y", "hs", "gates", "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
        identical(g1[key], g2[key], path .. " " .. key)
      end
    end
  end)

  it("a forced persistent path on a shape it cannot hold is QG_ERR_UNSUPPORTED naming the limit", function()
    qgru.setKernelPath("persistent")
    local H = 1024
    local x, W = Tensor.new({ 1, 1, 1 }, "f32", "cuda"), Tensor.new({ 3 * H, 1 }, "f32", "cuda")
    local R, b = Tensor.new({ 3 * H, H }, "f32", "cuda"), Tensor.new({ 3 * H }, "f32", "cuda")
    local y, hs = Tensor.new({ 1, 1, H }, "f32", "cuda"), Tensor.new({ 2, 1, H }, "f32", "cuda")
    local st = lib.qg_gru_forward(gpu, y.t, 0, hs.t, nil, nil, x.t, W.t, R.t, b.t, b.t, nil, nil, 0)
    assert.are.equal(lib.QG_ERR_UNSUPPORTED, st)
    local msg = ffi.string(lib.qg_last_error(gpu))
    assert.is_truthy(msg:find("cannot hold H = 1024", 1, true), msg)
    qgru.setKernelPath("auto")   -- the fallback takes it
    check(gpu, lib.qg_gru_forward(gpu, y.t, 0, hs.t, nil, nil, x.t, W.t, R.t, b.t, b.t, nil, nil, 0))
    check(gpu, lib.qg_ctx_set_persist_shape(gpu, 16, 8, 0, 0))   -- a forced shape that cannot hold a small H either
    qgru.setKernelPath("persistent")
    local H2 = 8
    local R2, b2 = Tensor.new({ 3 * H2, H2 }, "f32", "cuda"), Tensor.new({ 3 * H2 }, "f32", "cuda")
    local W2, y2, hs2 = Tensor.new({ 3 * H2, 1 }, "f32", "cuda"), Tensor.new({ 1, 1, H2 }, "f32", "cuda"),
                        Tensor.new({ 2, 1, H2 }, "f32", "cuda")
    assert.are.equal(lib.QG_ERR_UNSUPPORTED, lib.qg_gru_forward(gpu, y2.t, 0, hs2.t, nil, nil, x.t, W2.t, R2.t, b2.t, b2.t,
                                                                nil, nil, 0))
    assert.is_truthy(ffi.string(lib.qg_last_error(gpu)):find("forced shape", 1, true))
  end)

  -- nn.GRU: multi-layer, bidirectional, h0, lengths, on the GPU vs the same model on the CPU
  local nn_cases = {
    { C = 5, H = 7, layers = 2, bi = true, h0 = true, lengths = true, T = 6, N = 3 },
    { C = 1, H = 130, layers = 1, bi = true, lengths = true, T = 5, N = 17 },
    { C = 300, H = 1, layers = 3, bi = false, h0 = true, T = 4, N = 1 },
    { C = 12, H = 64, layers = 2, bi = true, T = 12, N = 9 },
    { C = 9, H = 256, layers = 2, bi = true, h0 = true, lengths = true, T = 5, N = 4 },
  }
  for _, path in ipairs({ "auto", "persistent", "fallback" }) do
    for i, cs in ipairs(nn_cases) do
      local name = string.format("nn.GRU(%d, %d, layers %d%s)%s%s T%d N%d", cs.C, cs.H, cs.layers, cs.bi and ", bidirectional" or "",
                                 cs.h0 and " h0" or "", cs.lengths and " lengths" or "", cs.T, cs.N)
      local tag = (i == 1 and path ~= "auto") and " #sanitize" or ""
      it(string.format("%s: %s == CPU: output, h_n, gradInput, gradients%s", path, name, tag), function()
        qgru.setKernelPath(path)
        local D = cs.bi and 2 or 1
        local opts = { layers = cs.layers, bidirectional = cs.bi }
        qgru.seed(40 + i); local mc = nn.GRU(cs.C, cs.H, opts)
        qgru.seed(40 + i); local mg = nn.GRU(cs.C, cs.H, { layers = cs.layers, bidirectional = cs.bi, device = "cuda" })
        qgru.seed(90 + i)
        local x = rnd({ cs.T, cs.N, cs.C }, 1)
        local h0 = cs.h0 and rnd({ cs.layers * D, cs.N, cs.H }, 0.8) or nil
        local L
        if cs.lengths then
          L = {}
          for n = 1, cs.N do L[n] = (n * 3) % cs.T + 1 end
          L[1] = cs.T
        end
        local function input(dev)
          local xd = x:to(dev)
          if h0 or L then return { xd, h0 and h0:to(dev) or nil, lengths = L } end
          return xd
        end
        local gout = rnd({ cs.T, cs.N, D * cs.H }, 1)
        local outs = {}
        for _, m in ipairs({ { mc, "cpu" }, { mg, "cuda" } }) do
          local model, dev = m[1], m[2]
          model:training()
          local inp = input(dev)
          local out, gi
          -- on the GPU three times with the same buffers: direct, captured, replayed (fallback)
          for _ = 1, dev == "cuda" and 3 or 1 do
            model:zeroGrad()
            out = model:forward(inp)
            gi = model:backward(inp, gout:to(dev))
          end
          local grads = {}
          for _, e in ipairs(model:namedParameters()) do grads[#grads + 1] = { name = e.name, g = e.grad:to("cpu") } end
          outs[dev] = { out = out:to("cpu"), hn = model.h_n:to("cpu"), dx = (h0 and gi[1] or gi):to("cpu"),
                        dh0 = h0 and gi[2]:to("cpu") or nil, grads = grads }
        end
        local c, g = outs.cpu, outs.cuda
        close(g.out, c.out, "output")
        close(g.hn, c.hn, "h_n")
        close(g.dx, c.dx, "gradInput dx")
        if h0 then close(g.dh0, c.dh0, "gradInput dh0") end
        for k, e in ipairs(c.grads) do close(g.grads[k].g, e.g, "grad " .. e.name) end
      end)
    end
  end

  -- the statistics observer: the same rows as the CPU's
  for _, path in ipairs({ "persistent", "fallback" }) do
    it(string.format("%s: statistics observer == CPU (min/max, counts)", path), function()
      qgru.setKernelPath(path)
      local T, N, C, H = 7, 5, 6, 19
      qgru.seed(77)
      local k = 1.2 / math.sqrt(H)
      local P = { W = rnd({ 3 * H, C }, k), R = rnd({ 3 * H, H }, k), bx = rnd({ 3 * H }, k), br = rnd({ 3 * H }, k) }
      local x, h0 = rnd({ T, N, C }, 1.2), rnd({ N, H }, 0.8)
      local lens = Tensor.from({ 7, 3, 1, 6, 5 }, "i64")
      local rows = {}
      for _, dev in ipairs({ "cpu", "cuda" }) do
        local ctx = clib.context(dev)
        local range = Tensor.new({ lib.QG_Q_NUM_ACT, 4 }, "f64")
        local p = range:ptr()
        for r = 0, lib.QG_Q_NUM_ACT - 1 do
          p[r * 4], p[r * 4 + 1], p[r * 4 + 2], p[r * 4 + 3] = math.huge, -math.huge, -1.5, 1.5
        end
        range = range:to(dev)
        local counts = Tensor.new({ lib.QG_Q_NUM_ACT, BINS }, "i64", dev)
        local stats = ffi.new("qg_stats")
        stats.range, stats.counts = range.t, counts.t
        local y, hs = Tensor.new({ T, N, H }, "f32", dev), Tensor.new({ T + 1, N, H }, "f32", dev)
        local function mv(t) return t:to(dev) end
        check(ctx, lib.qg_gru_forward(ctx, y.t, 0, hs.t, nil, stats, mv(x).t, mv(P.W).t, mv(P.R).t, mv(P.bx).t, mv(P.br).t,
                                      mv(h0).t, mv(lens).t, 1))
        rows[dev] = { range = range:to("cpu"):totable(), counts = counts:to("cpu"):totable() }
      end
      local c, g = rows.cpu, rows.cuda
      for r = 1, lib.QG_Q_NUM_ACT do
        for m = 1, 2 do
          local a, b = g.range[r][m], c.range[r][m]
          assert(math.abs(a - b) <= 1e-5 * math.max(1, math.abs(b)), string.format("row %d %s: %.9g vs CPU %.9g", r - 1,
                                                                                    m == 1 and "min" or "max", a, b))
        end
        local tg, tc, diff = 0, 0, 0
        for b = 1, BINS do
          tg, tc = tg + g.counts[r][b], tc + c.counts[r][b]
          diff = diff + math.abs(g.counts[r][b] - c.counts[r][b])
        end
        assert(tc > 0, "row " .. (r - 1) .. " observed nothing on the CPU")
        assert.are.equal(tc, tg, "row " .. (r - 1) .. ": number of observed values")
        if r - 1 == lib.QG_Q_INPUT_X then
          assert.are.equal(0, diff, "input row: identical values must give identical counts")
        else
          assert(diff <= math.max(4, tc / 500), string.format("row %d: histograms differ by %d of %d", r - 1, diff, tc))
        end
      end
    end)
  end
end)
