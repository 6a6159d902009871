#!/usr/bin/env python3
"""tools/onnx_export.py: ONNX models of a qgru integer GRU, built with the onnx library from the
folder that lua/qgru/deploy/onnx_data.lua writes (model.json + .npy codes, exponents, zero points,
activation tables, float head). recipes/export.lua --format onnx runs it; it also runs alone:

  python3 tools/onnx_export.py DATA_DIR [--out model.onnx] [--qdq model_qdq.onnx] [--unroll T]
                               [--dot graph.dot] [--qdq_only]

The integer model (--out) is bit-exact with qgru's integer forward (QUANT_SPEC.md section 3):
  - x -> QuantizeLinear(2^-e, z) -> input.x codes; h0 likewise with output.h
  - W x for all steps: MatMulInteger (8-bit operands; int32 MatMul of centered codes for 9..16
    bits), requantized by QuantizeLinear with per-channel power-of-two scales
  - the recurrence as Scan (one per layer and direction; the backward one with reversed scan
    directions), or unrolled for a fixed T (--unroll T); per step: R h (MatMulInteger), the
    aligned sums in int32 (per-channel powers of two), one QuantizeLinear per operator, Gather on
    the constant sigmoid / tanh tables, the products, and Where for variable lengths
  - every requantization: Cast(int32 -> float) then QuantizeLinear: exact because onnx_data.lua
    checked that every integer stays within 2^24 (float32's exact integers); ties round to even
    as QUANT_SPEC.md; a Clip to the grid follows where the grid is narrower than int8/int16
  Inputs: x f32 [T, N, C] (time-major), h0 f32 [layers * dirs, N, H] (zeros for none), lengths
  i64 [N] (each in 1..T). Outputs: y f32 [T, N, dirs * H] (0 at padded steps), hn f32
  [layers * dirs, N, H], logits f32 [N, K] when the model has a head (nn.Last + nn.Linear, float).

The QDQ model (--qdq) is the conventional form for runtimes that take only float GRU nodes
(AIMET's): one ONNX GRU node per layer (linear_before_reset = 1, gate order z, r, h as qgru) with
QuantizeLinear/DequantizeLinear on its input, initial state, outputs and weights (biases are
fake-quantized constants). The gates inside run in float: an approximation of qgru's integer GRU.
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:  # pragma: no cover
    sys.exit("qgru: export onnx: the Python packages onnx and numpy are needed (pip install onnx numpy): %s" % e)

F32 = TensorProto.FLOAT
I32 = TensorProto.INT32
I64 = TensorProto.INT64
GATES = ("z", "r", "g")


def fail(msg):
    raise SystemExit("qgru: export onnx: " + msg)


class Q:
    """A resolved quantizer from model.json."""

    def __init__(self, d):
        self.bits, self.uns = int(d["bits"]), bool(d["unsigned"])
        self.e, self.z = int(d["exp2_inv"]), int(d["zero_point"])
        self.qmin, self.qmax = int(d["qmin"]), int(d["qmax"])

    def storage(self):
        """(ONNX type, numpy type, lo, hi) of the QuantizeLinear output holding this grid."""
        if self.bits <= 8:
            return (TensorProto.UINT8, np.uint8, 0, 255) if self.uns else (TensorProto.INT8, np.int8, -128, 127)
        if self.bits <= 16:
            return (TensorProto.UINT16, np.uint16, 0, 65535) if self.uns else (TensorProto.INT16, np.int16, -32768, 32767)
        fail("a %d-bit grid has no QuantizeLinear type" % self.bits)


def load(data_dir):
    with open(os.path.join(data_dir, "model.json")) as f:
        doc = json.load(f)
    if doc.get("format") != "qgru-onnx-data" or doc.get("version") != 1:
        fail("%s/model.json is not a qgru-onnx-data v1 document" % data_dir)
    for L in doc["layers_params"]:
        L["q"] = {op: Q(v) for op, v in L["act"].items()}
        for key, w in L["weights"].items():
            w["codes"] = np.load(os.path.join(data_dir, w["codes"])).astype(np.int64)
            w["e"] = np.load(os.path.join(data_dir, w["exp2_inv"])).astype(np.int64)
            w["z"] = np.load(os.path.join(data_dir, w["zero_point"])).astype(np.int64)
        L["lut"] = {g: np.load(os.path.join(data_dir, L["tables"][g])).astype(np.int32) for g in GATES}
    if doc.get("head"):
        doc["head"]["W"] = np.load(os.path.join(data_dir, doc["head"]["weight"])).astype(np.float32)
        doc["head"]["b"] = np.load(os.path.join(data_dir, doc["head"]["bias"])).astype(np.float32)
    return doc


class Builder:
    """Nodes go to the current list (the main graph or a Scan body); constants are initializers
    of the main graph, deduplicated, and visible from the bodies as outer-scope names."""

    def __init__(self):
        self.inits, self.consts, self.count = [], {}, 0
        self.nodes = []

    def fresh(self, base):
        self.count += 1
        return "%s_%d" % (base, self.count)

    def const(self, arr, base="c"):
        arr = np.array(arr, order="C")   # (ascontiguousarray would make scalars 1-D)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self.consts:
            name = self.fresh(base)
            self.inits.append(numpy_helper.from_array(arr, name))
            self.consts[key] = name
        return self.consts[key]

    def op(self, kind, inputs, base=None, outputs=1, doc=None, **attrs):
        outs = [self.fresh(base or kind.lower()) for _ in range(outputs)]
        node = helper.make_node(kind, inputs, outs, name=self.fresh("n_" + kind), **attrs)
        if doc:
            node.doc_string = doc
        self.nodes.append(node)
        return outs[0] if outputs == 1 else outs

    def i32(self, v, base="k"):
        return self.const(np.array(v, dtype=np.int32), base)

    def i64(self, v, base="k"):
        return self.const(np.array(v, dtype=np.int64), base)

    def f32(self, v, base="k"):
        return self.const(np.array(v, dtype=np.float32), base)


def pow2(k):
    k = np.asarray(k, dtype=np.int64)
    if np.any(np.abs(k) > 126):
        fail("a power-of-two scale 2^%d is beyond float32" % int(np.max(np.abs(k))))
    return np.ldexp(np.float32(1), k).astype(np.float32)


F32_EXACT = 2 ** 24   # float32 holds every integer up to here exactly
I32_MAX = 2 ** 31 - 1


def maxc(q):
    """Largest |code - z| of a grid."""
    return max(q.qmax - q.z, q.z - q.qmin)


def exact_or_fail(bound, sexp, q, what):
    """The integer v (|v| <= bound) goes through Cast(int32 -> float) and QuantizeLinear(scale
    2^sexp): exact when |v| <= 2^24, or when every |v| > 2^24 saturates q's grid anyway (the
    float rounding of v then changes nothing). sexp may be per channel."""
    bound = np.asarray(bound, dtype=object)
    sexp = np.broadcast_to(np.asarray(sexp, dtype=np.int64), bound.shape)
    if np.any(bound > I32_MAX):
        i = int(np.argmax(bound > I32_MAX))
        fail("%s reaches 2^%.1f, beyond int32 (channel %d)" % (what, np.log2(float(bound.flat[i])), i))
    for i, (bv, se) in enumerate(zip(bound.flat, sexp.flat)):
        if bv > F32_EXACT and 2.0 ** (24 - int(se)) <= maxc(q) + 1:
            fail("%s reaches 2^%.1f > 2^24 (channel %d), beyond float32's exact integers, before a requantization by 2^%d that "
                 "does not saturate there: the Cast before QuantizeLinear would round it (use --format c)" % (
                     what, np.log2(float(bv)), i, int(se)))


def as_i32(vals, what):
    vals = np.asarray(vals, dtype=object)
    if vals.size and max(abs(int(v)) for v in vals.flat) > I32_MAX:
        fail("%s: a constant beyond int32" % what)
    return np.asarray([int(v) for v in vals.flat], dtype=np.int64).reshape(vals.shape).astype(np.int32)


def requant(b, v, k, q, axis=None, label=None):
    """Integer tensor v (int32) at scale 2^-s requantized to q, k = s - e (scalar or per channel
    along axis): Cast to float and QuantizeLinear(scale 2^k, zero point z), then Clip to the grid
    where it is narrower than the QuantizeLinear type. The caller has checked exact_or_fail."""
    onnx_t, np_t, lo, hi = q.storage()
    f = b.op("Cast", [v], "f", to=F32)
    k = np.asarray(k, dtype=np.int64)
    if k.ndim == 0:
        ql = b.op("QuantizeLinear", [f, b.f32(pow2(k), "scale"), b.const(np.array(q.z, np_t), "zp")], "q", doc=label)
    else:
        ql = b.op("QuantizeLinear", [f, b.const(pow2(k), "scale"), b.const(np.full(k.shape, q.z, np_t), "zp")], "q", axis=axis,
                  doc=label)
    c = b.op("Cast", [ql], "code", to=I32)
    if q.qmin != lo or q.qmax != hi:
        c = b.op("Clip", [c, b.i32(q.qmin), b.i32(q.qmax)], "code")
    return c


def quantize_float(b, x, q, label=None):
    """clamp(rne(x 2^e) + z) of a float tensor, as int32 codes."""
    onnx_t, np_t, lo, hi = q.storage()
    ql = b.op("QuantizeLinear", [x, b.f32(pow2(-q.e), "scale"), b.const(np.array(q.z, np_t), "zp")], "q", doc=label)
    c = b.op("Cast", [ql], "code", to=I32)
    if q.qmin != lo or q.qmax != hi:
        c = b.op("Clip", [c, b.i32(q.qmin), b.i32(q.qmax)], "code")
    return c


def centered(b, v, z):
    return v if z == 0 else b.op("Sub", [v, b.i32(z)], "c")


def mul(b, v, k):
    k = np.asarray(k, dtype=object)
    if k.ndim == 0:
        return v if int(k) == 1 else b.op("Mul", [v, b.i32(int(k))], "m")
    if all(int(x) == int(k.flat[0]) for x in k.flat):
        return mul(b, v, int(k.flat[0]))
    return b.op("Mul", [v, b.const(as_i32(k, "multiplier"))], "m")


def dequantize(b, codes, q):
    """(q - z) 2^-e as float (exact for codes of at most 16 bits)."""
    f = b.op("Cast", [centered(b, codes, q.z)], "f", to=F32)
    return b.op("Mul", [f, b.f32(pow2(-q.e))], "deq")


def gemm(b, L, codes, wkey, qin, qout, axis):
    """Requantized codes of (W - z_W)(x - z_x) over the last axis of codes (int32 [..., K])."""
    w = L["weights"][wkey]
    wq = Q({"bits": w["bits"], "unsigned": w["unsigned"], "exp2_inv": 0, "zero_point": 0, "qmin": w["qmin"], "qmax": w["qmax"]})
    k = w["e"] + qin.e - qout.e
    exact_or_fail(np.abs(w["codes"] - w["z"][:, None]).sum(axis=1) * maxc(qin), k, qout,
                  "%s.%s: the accumulator of %s times %s" % (L["name"], "matmul.Wx" if wkey == "W" else "matmul.Rh",
                                                            "weight.W" if wkey == "W" else "weight.R", "input.x" if wkey == "W" else "output.h"))
    if qin.bits <= 8 and wq.bits <= 8:
        _, xt, _, _ = qin.storage()
        _, wt, _, _ = wq.storage()
        a = b.op("Cast", [codes], "a8", to=qin.storage()[0])
        acc = b.op("MatMulInteger", [a, b.const(w["codes"].T.astype(wt), wkey + "T"), b.const(np.array(qin.z, xt), "az"),
                                     b.const(w["z"].astype(wt), wkey + "_zp")], "acc", doc="W x" if wkey == "W" else "R h")
    else:
        wc = (w["codes"] - w["z"][:, None]).T
        acc = b.op("MatMul", [centered(b, codes, qin.z), b.const(as_i32(wc, wkey), wkey + "Tc")], "acc", doc="W x" if wkey == "W" else "R h")
    return requant(b, acc, k, qout, axis=axis, label="matmul.Wx" if wkey == "W" else "matmul.Rh")


def reduce_sum(ev, code, eb, e):
    """(A, C, sexp) with rne(S / 2^k) == rne((A V + C) / 2^sexp) for every integer V, where
    S = V 2^(em - ev) + code 2^(em - eb) is the sum aligned to em = max(ev, eb) and k = em - e
    (see aligned_sum)."""
    em = max(ev, eb)
    g, k = em - ev, em - e
    B = code * 2 ** (em - eb)
    if k <= 0:
        return 2 ** g, B, k
    if k <= g + 1:
        return 2 ** (g - k + 2), 2 * (B >> (k - 1)) + (1 if B % 2 ** (k - 1) else 0), 2
    return 2, 2 * (B >> g) + (1 if B % 2 ** g else 0), k - g + 1


def rne_div(v, k):
    """Exact rne(v / 2^k) of integers (k may be <= 0)."""
    if k <= 0:
        return v * 2 ** -k
    q, r = v >> k, v % 2 ** k
    half = 2 ** (k - 1)
    return q + (1 if r > half or (r == half and q % 2) else 0)


def aligned_sum(b, name, terms, bias, q):
    """Requantization to q of the exact sum of variable terms (centered int32 tensors [N, H],
    with their exponents and bounds: (tensor, e, bound)) and a constant per-channel bias (a list
    of (centered code, exponent) per channel, or None), aligned to the finest scale of each
    channel (QUANT_SPEC.md section 3, step 3).
    The bias exponents can make that scale much finer than the variable terms' (a small bias
    calibrated with a fine exponent), and the aligned sum beyond float32's exact integers. So the
    sum is not formed at that scale: with ev the finest variable exponent, V the exact sum of the
    variable terms at ev, S = 2^g V + B (g = em - ev, B the aligned bias constant) and k = em - e
    the requantization shift, rne(S / 2^k) is computed exactly from a smaller integer S2 = A V + C:
      k <= 0:      S2 = S, scale 2^k (no rounding)
      k <= g + 1:  guard and sticky bits: S2 = 2 floor(S / 2^(k-1)) + [S mod 2^(k-1) != 0], scale 4
                   (2^g V is a multiple of 2^(k-1), so A = 2^(g-k+2), C = 2 floor(B / 2^(k-1)) + sticky)
      k > g + 1:   S = 2^g (V + floor(B / 2^g)) + (B mod 2^g): the remainder only acts as a sticky
                   bit below V's scale: S2 = 2 (V + floor(B / 2^g)) + [B mod 2^g != 0], scale 2^(k-g+1)
    (rne(x / 2^m) with a guard bit and a sticky bit below x is the classic exact reduction.)"""
    label = name.split(".", 2)[2].split(" ")[0] if name.count(".") >= 2 else name
    ev = max(e for _, e, _ in terms)
    v, vb = None, 0
    for t, e, m in terms:
        part = mul(b, t, 2 ** (ev - e))
        vb += m * 2 ** (ev - e)
        v = part if v is None else b.op("Add", [v, part], "v")
    if bias is None:
        exact_or_fail(vb, ev - q.e, q, name)
        return requant(b, v, ev - q.e, q, label=label)
    A, C, sexp, bound = [], [], [], []
    for code, eb in bias:
        a, c, se = reduce_sum(ev, int(code), eb, q.e)
        A.append(a)
        C.append(c)
        sexp.append(se)
        bound.append(a * vb + abs(c))
    exact_or_fail(bound, sexp, q, name + ": the aligned sum")
    s2 = b.op("Add", [mul(b, v, A), b.const(as_i32(C, name + " bias"), "bias")], "s2")
    return requant(b, s2, np.asarray(sexp, dtype=np.int64), q, axis=1, label=label + (" (Rh_g + br_g)" if "Rh_g" in name else ""))


def step(b, L, h, wx, valid):
    """One step of the cell for every row: h int32 [N, H] codes, wx int32 [N, 3H] matmul.Wx codes,
    valid bool [N, 1] or None. Returns the new h codes (int32 [N, H])."""
    q, H, nm = L["q"], L["hidden_size"], L["name"]
    QWX, QRH, QH = q["matmul.Wx"], q["matmul.Rh"], q["output.h"]
    QZ, QR, QG = q["gate.z_out"], q["gate.r_out"], q["gate.g_out"]
    QRRH, QOLD, QNEW = q["op.rRh"], q["op.old_contrib"], q["op.new_contrib"]
    bx, br = L["weights"]["bx"], L["weights"]["br"]
    hc = centered(b, h, QH.z)
    rh = gemm(b, L, h, "R", QH, QRH, axis=1)
    split = b.i64([H, H, H])
    wz, wr, wg = b.op("Split", [wx, split], "wx", outputs=3, axis=1)
    rz, rr, rg = b.op("Split", [rh, split], "rh", outputs=3, axis=1)
    wz, wr, wg = (centered(b, v, QWX.z) for v in (wz, wr, wg))
    rz, rr, rg = (centered(b, v, QRH.z) for v in (rz, rr, rg))
    bxc, brc = bx["codes"] - bx["z"], br["codes"] - br["z"]

    def bias(w, c, k, extra=None):
        """Per channel of gate k: the bias terms as one (code, exponent) (two biases summed exactly)."""
        out = []
        for i in range(H):
            j = k * H + i
            if extra is None:
                out.append((int(c[j]), int(w["e"][j])))
            else:
                w2, c2 = extra
                e = max(int(w["e"][j]), int(w2["e"][j]))
                out.append((int(c[j]) * 2 ** (e - int(w["e"][j])) + int(c2[j]) * 2 ** (e - int(w2["e"][j])), e))
        return out

    acts = {}
    for k, (g, wv, rv) in enumerate((("z", wz, rz), ("r", wr, rr))):
        P = q["gate.%s_pre" % g]
        qpre = aligned_sum(b, "%s.gate.%s_pre" % (nm, g), [(wv, QWX.e, maxc(QWX)), (rv, QRH.e, maxc(QRH))],
                           bias(bx, bxc, k, (br, brc)), P)
        acts[g] = b.op("Gather", [b.const(L["lut"][g], "table_" + g), centered(b, qpre, P.qmin)], "q" + g, axis=0,
                       doc="gate.%s_out: sigmoid table" % g)
    # Rh_g + br_g with matmul.Rh's quantizer
    rhb = aligned_sum(b, "%s.matmul.Rh (Rh_g + br_g)" % nm, [(rg, QRH.e, maxc(QRH))], bias(br, brc, 2), QRH)
    exact_or_fail(maxc(QR) * maxc(QRH), QR.e + QRH.e - QRRH.e, QRRH, "%s.op.rRh: the product r (Rh_g + br_g)" % nm)
    rrh = requant(b, b.op("Mul", [centered(b, acts["r"], QR.z), centered(b, rhb, QRH.z)], "p"), QR.e + QRH.e - QRRH.e, QRRH,
                  label="op.rRh")
    P = q["gate.g_pre"]
    qgpre = aligned_sum(b, "%s.gate.g_pre" % nm, [(wg, QWX.e, maxc(QWX)), (centered(b, rrh, QRRH.z), QRRH.e, maxc(QRRH))],
                        bias(bx, bxc, 2), P)
    qg = b.op("Gather", [b.const(L["lut"]["g"], "table_g"), centered(b, qgpre, P.qmin)], "qg", axis=0, doc="gate.g_out: tanh table")
    zc = centered(b, acts["z"], QZ.z)
    exact_or_fail(maxc(QZ) * maxc(QH), QZ.e + QH.e - QOLD.e, QOLD, "%s.op.old_contrib: the product z h" % nm)
    old = requant(b, b.op("Mul", [zc, hc], "p"), QZ.e + QH.e - QOLD.e, QOLD, label="op.old_contrib")
    one = 2 ** QZ.e
    exact_or_fail(max(abs(one - (QZ.qmin - QZ.z)), abs(one - (QZ.qmax - QZ.z))) * maxc(QG), QZ.e + QG.e - QNEW.e, QNEW,
                  "%s.op.new_contrib: the product (1 - z) g" % nm)
    one_minus_z = b.op("Sub", [b.i32(one), zc], "omz")
    new = requant(b, b.op("Mul", [one_minus_z, centered(b, qg, QG.z)], "p"), QZ.e + QG.e - QNEW.e, QNEW, label="op.new_contrib")
    hn = aligned_sum(b, "%s.output.h" % nm, [(centered(b, old, QOLD.z), QOLD.e, maxc(QOLD)), (centered(b, new, QNEW.z), QNEW.e, maxc(QNEW))],
                     None, QH)
    if valid is not None:
        hn = b.op("Where", [valid, hn, h], "h")
    return hn


REQUANTIZED = ("input.x", "matmul.Wx", "matmul.Rh", "gate.z_pre", "gate.r_pre", "gate.g_pre", "op.rRh", "op.old_contrib",
               "op.new_contrib", "output.h")


def integer_opset(doc):
    """13 when every requantized operator has at most 8 bits (int8/uint8 QuantizeLinear), 21 when
    some have 9..16 (int16/uint16); wider ones have no QuantizeLinear type."""
    opset = 13
    for L in doc["layers_params"]:
        for op in REQUANTIZED:
            bits = L["q"][op].bits
            if bits > 16:
                fail("%s.%s has %d bits: QuantizeLinear gives 8- or 16-bit codes, so this requantization has no exact ONNX form "
                     "(use --format c)" % (L["name"], op, bits))
            if bits > 8:
                opset = 21
    return opset


def build_integer(doc, unroll=None):
    """The integer model (see the top of this file)."""
    integer_opset(doc)   # refuses > 16-bit requantized operators first
    b = Builder()
    Lc, Dn, H, C0 = doc["layers"], doc["directions"], doc["hidden_size"], doc["input_size"]
    T = unroll if unroll else "T"
    inputs = [helper.make_tensor_value_info("x", F32, [T, "N", C0]),
              helper.make_tensor_value_info("h0", F32, [Lc * Dn, "N", H]),
              helper.make_tensor_value_info("lengths", I64, ["N"])]
    # time indices and the valid-step mask [T, N, 1]
    if unroll:
        trange = b.i64(np.arange(unroll))
    else:
        tlen = b.op("Gather", [b.op("Shape", ["x"], "shape"), b.i64(0)], "T", axis=0)
        trange = b.op("Range", [b.i64(0), tlen, b.i64(1)], "t")
    valid_tn = b.op("Less", [b.op("Unsqueeze", [trange, b.i64([1])], "t1"), b.op("Unsqueeze", ["lengths", b.i64([0])], "l1")], "valid")
    mask = b.op("Unsqueeze", [valid_tn, b.i64([2])], "mask")
    layers = {(L["layer"], L["direction"]): L for L in doc["layers_params"]}
    prev_y = None   # previous layer's outputs (float, masked) [T, N, Dn*H]
    hn_parts, y_codes = [], []
    for l in range(Lc):
        y_codes = []
        for d in range(Dn):
            L = layers[(l, "fwd" if d == 0 else "bwd")]
            q = L["q"]
            xin = quantize_float(b, "x" if l == 0 else prev_y, q["input.x"], label="input.x")
            wx_all = gemm(b, L, xin, "W", q["input.x"], q["matmul.Wx"], axis=2)
            h0 = b.op("Gather", ["h0", b.i64(l * Dn + d)], "h0_%d" % (l * Dn + d), axis=0)
            hinit = quantize_float(b, h0, q["output.h"], label="output.h (h0)")
            if unroll:
                h, outs = hinit, [None] * unroll
                order = range(unroll) if d == 0 else range(unroll - 1, -1, -1)
                for t in order:
                    wx_t = b.op("Gather", [wx_all, b.i64(t)], "wx_t", axis=0)
                    valid = b.op("Unsqueeze", [b.op("Less", [b.i64(t), "lengths"], "v"), b.i64([1])], "valid")
                    h = step(b, L, h, wx_t, valid)
                    outs[t] = b.op("Unsqueeze", [h, b.i64([0])], "y_t")
                hfinal = h
                ycodes = b.op("Concat", outs, "ycodes", axis=0)
            else:
                outer = b.nodes
                b.nodes = []
                tag = "%s" % L["name"].replace(".", "_")
                hin, wxin, tin = tag + "_h_in", tag + "_wx_in", tag + "_t_in"
                valid = b.op("Unsqueeze", [b.op("Less", [tin, "lengths"], "v"), b.i64([1])], "valid")
                hout = step(b, L, hin, wxin, valid)
                yout = b.op("Identity", [hout], "y_out")
                body = helper.make_graph(
                    b.nodes, tag + "_step",
                    [helper.make_tensor_value_info(hin, I32, ["N", H]), helper.make_tensor_value_info(wxin, I32, ["N", 3 * H]),
                     helper.make_tensor_value_info(tin, I64, [])],
                    [helper.make_tensor_value_info(hout, I32, ["N", H]), helper.make_tensor_value_info(yout, I32, ["N", H])])
                b.nodes = outer
                hfinal, ycodes = b.op("Scan", [hinit, wx_all, trange], "scan_" + tag, outputs=2, body=body, num_scan_inputs=2,
                                      scan_input_directions=[d, d], scan_output_directions=[d], doc="%s: the recurrence" % L["name"])
            y_codes.append((ycodes, q["output.h"]))
            hn_parts.append(b.op("Unsqueeze", [dequantize(b, hfinal, q["output.h"]), b.i64([0])], "hn_part"))
        yf = [dequantize(b, c, qh) for c, qh in y_codes]
        ycat = yf[0] if Dn == 1 else b.op("Concat", yf, "ycat", axis=2)
        prev_y = b.op("Where", [mask, ycat, b.f32(0.0)], "y")
    b.nodes.append(helper.make_node("Identity", [prev_y], ["y"], name="out_y"))
    hn = hn_parts[0] if len(hn_parts) == 1 else b.op("Concat", hn_parts, "hncat", axis=0)
    b.nodes.append(helper.make_node("Identity", [hn], ["hn"], name="out_hn"))
    outputs = [helper.make_tensor_value_info("y", F32, [T, "N", Dn * H]), helper.make_tensor_value_info("hn", F32, [Lc * Dn, "N", H])]
    if doc.get("head"):
        add_head(b, doc["head"], prev_y)
        outputs.append(helper.make_tensor_value_info("logits", F32, ["N", doc["head"]["outputs"]]))
    return finish(b, inputs, outputs, doc, "qgru_integer_gru", integer_opset(doc))


def add_head(b, head, y):
    last = b.op("Gather", [y, b.i64(-1)], "last", axis=0)
    mm = b.op("MatMul", [last, b.const(np.ascontiguousarray(head["W"].T), "head_WT")], "mm")
    b.nodes.append(helper.make_node("Add", [mm, b.const(head["b"], "head_b")], ["logits"], name="out_logits"))


def finish(b, inputs, outputs, doc, name, opset):
    graph = helper.make_graph(b.nodes, name, inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="qgru",
                              doc_string="qgru integer GRU: " + doc.get("source", ""))
    model.ir_version = 10 if opset >= 21 else 8
    onnx.checker.check_model(model, full_check=True)
    return model


def qdq(b, x, q):
    _, np_t, _, _ = q.storage()
    s, z = b.f32(pow2(-q.e), "scale"), b.const(np.array(q.z, np_t), "zp")
    return b.op("DequantizeLinear", [b.op("QuantizeLinear", [x, s, z], "q"), s, z], "dq")


def build_qdq(doc):
    """The conventional QDQ form (see the top of this file)."""
    b = Builder()
    Lc, Dn, H, C0 = doc["layers"], doc["directions"], doc["hidden_size"], doc["input_size"]
    inputs = [helper.make_tensor_value_info("x", F32, ["T", "N", C0]),
              helper.make_tensor_value_info("h0", F32, [Lc * Dn, "N", H]),
              helper.make_tensor_value_info("lengths", I64, ["N"])]
    layers = {(L["layer"], L["direction"]): L for L in doc["layers_params"]}
    seq = b.op("Cast", ["lengths"], "seq_lens", to=I32)
    opset = 13
    for L in doc["layers_params"]:
        for op in ("input.x", "output.h"):
            if L["q"][op].bits > 8:
                opset = 21
        for key in ("W", "R"):
            if L["weights"][key]["bits"] > 8:
                opset = 21
    y, hn_parts = "x", []
    for l in range(Lc):
        Ls = [layers[(l, "fwd" if d == 0 else "bwd")] for d in range(Dn)]
        xq = qdq(b, y, Ls[0]["q"]["input.x"])
        mats = {}
        for key in ("W", "R"):
            parts = []
            for L in Ls:
                w = L["weights"][key]
                wq = Q({"bits": w["bits"], "unsigned": w["unsigned"], "exp2_inv": 0, "zero_point": 0, "qmin": w["qmin"], "qmax": w["qmax"]})
                _, np_t, _, _ = wq.storage()
                dq = b.op("DequantizeLinear", [b.const(w["codes"].astype(np_t), key), b.const(pow2(-w["e"]), "scale"),
                                               b.const(w["z"].astype(np_t), "zp")], "dq", axis=0)
                parts.append(b.op("Unsqueeze", [dq, b.i64([0])], key))
            mats[key] = parts[0] if Dn == 1 else b.op("Concat", parts, key, axis=0)
        bias = []
        for L in Ls:
            bx, br = L["weights"]["bx"], L["weights"]["br"]
            bias.append(np.concatenate([np.ldexp((bx["codes"] - bx["z"]).astype(np.float64), -bx["e"]),
                                        np.ldexp((br["codes"] - br["z"]).astype(np.float64), -br["e"])]).astype(np.float32))
        B = b.const(np.stack(bias), "B")
        h0s = []
        for d, L in enumerate(Ls):
            h0 = b.op("Gather", ["h0", b.i64([l * Dn + d])], "h0", axis=0)
            h0s.append(qdq(b, h0, L["q"]["output.h"]))
        h0 = h0s[0] if Dn == 1 else b.op("Concat", h0s, "h0", axis=0)
        Y, Yh = b.op("GRU", [xq, mats["W"], mats["R"], B, seq, h0], "gru", outputs=2, hidden_size=H,
                     direction="forward" if Dn == 1 else "bidirectional", linear_before_reset=1)
        ys = []
        for d, L in enumerate(Ls):
            yd = b.op("Gather", [Y, b.i64(d)], "y_d", axis=1)      # [T, N, H]
            ys.append(qdq(b, yd, L["q"]["output.h"]))
            hd = b.op("Gather", [Yh, b.i64([d])], "h_d", axis=0)  # [1, N, H]
            hn_parts.append(qdq(b, hd, L["q"]["output.h"]))
        y = ys[0] if Dn == 1 else b.op("Concat", ys, "y", axis=2)
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="out_y"))
    hn = hn_parts[0] if len(hn_parts) == 1 else b.op("Concat", hn_parts, "hn", axis=0)
    b.nodes.append(helper.make_node("Identity", [hn], ["hn"], name="out_hn"))
    outputs = [helper.make_tensor_value_info("y", F32, ["T", "N", Dn * H]), helper.make_tensor_value_info("hn", F32, [Lc * Dn, "N", H])]
    if doc.get("head"):
        add_head(b, doc["head"], y)
        outputs.append(helper.make_tensor_value_info("logits", F32, ["N", doc["head"]["outputs"]]))
    return finish(b, inputs, outputs, doc, "qgru_qdq_gru", opset)


def to_dot(model, path):
    """A Graphviz picture of the graph (the Scan bodies as clusters): `dot -Tsvg path`."""
    lines = ["digraph qgru {", '  rankdir=TB; node [fontname="Helvetica", fontsize=10]; edge [fontsize=8, color="#666666"];']
    consts = {i.name for i in model.graph.initializer}
    counter = [0]

    def graph_body(g, indent, scope):
        producers = {}
        for n in g.node:
            counter[0] += 1
            nid = "n%d" % counter[0]
            color = {"MatMulInteger": "#9ecae1", "QuantizeLinear": "#fdae6b", "Gather": "#a1d99b", "Scan": "#bcbddc",
                     "MatMul": "#9ecae1", "GRU": "#bcbddc", "DequantizeLinear": "#fdd0a2"}.get(n.op_type, "#f0f0f0")
            label = n.op_type
            if n.doc_string:
                label += "\\n" + n.doc_string
            lines.append('%s%s [label="%s", shape=box, style="rounded,filled", fillcolor="%s"];' % (indent, nid, label, color))
            for o in n.output:
                producers[o] = nid
            for i in n.input:
                if i in producers:
                    lines.append("%s%s -> %s;" % (indent, producers[i], nid))
                elif i and i not in consts and i in scope:
                    lines.append("%s%s -> %s;" % (indent, scope[i], nid))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    lines.append('%ssubgraph cluster_%s {' % (indent, nid))
                    lines.append('%s  label="Scan body: one time step of %s"; style=dashed;' % (indent, a.g.name.replace("_step", "")))
                    inner = dict(scope)
                    for inp in a.g.input:
                        counter[0] += 1
                        iid = "n%d" % counter[0]
                        kind = inp.name.split("_")[-2]
                        lines.append('%s  %s [label="%s", shape=ellipse];' % (
                            indent, iid, {"h": "h codes (t-1)", "wx": "W x codes (t)", "t": "t"}.get(kind, kind)))
                        inner[inp.name] = iid
                    graph_body(a.g, indent + "  ", inner)
                    lines.append("%s}" % indent)
        return producers

    scope = {}
    for inp in model.graph.input:
        counter[0] += 1
        iid = "n%d" % counter[0]
        lines.append('  %s [label="%s", shape=ellipse];' % (iid, inp.name))
        scope[inp.name] = iid
    prod = graph_body(model.graph, "  ", scope)
    for o in model.graph.output:
        counter[0] += 1
        lines.append('  n%d [label="%s", shape=ellipse];' % (counter[0], o.name))
        if o.name in prod:
            lines.append("  %s -> n%d;" % (prod[o.name], counter[0]))
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--out", help="the integer model (default DATA_DIR/model.onnx)")
    ap.add_argument("--qdq", help="also the QDQ approximation (GRU node with Q/DQ)")
    ap.add_argument("--unroll", type=int, help="unroll the recurrence for this fixed T instead of Scan")
    ap.add_argument("--dot", help="also a Graphviz picture of the integer model")
    ap.add_argument("--qdq_only", action="store_true", help="only the QDQ approximation (no integer model)")
    a = ap.parse_args(argv)
    doc = load(a.data_dir)
    out = a.out or os.path.join(a.data_dir, "model.onnx")
    if a.unroll is not None and a.unroll < 1:
        fail("--unroll must be >= 1")
    if not a.qdq_only:
        m = build_integer(doc, a.unroll)
        onnx.save(m, out)
        print("wrote %s (opset %d, %d nodes in the main graph)" % (out, m.opset_import[0].version, len(m.graph.node)))
        if a.dot:
            to_dot(m, a.dot)
    if a.qdq:
        mq = build_qdq(doc)
        onnx.save(mq, a.qdq)
        print("wrote %s (QDQ approximation, opset %d)" % (a.qdq, mq.opset_import[0].version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
