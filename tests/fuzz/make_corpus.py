#!/usr/bin/env python3
"""make_corpus.py: writes the fuzz seed corpora (tests/fuzz/corpus/<target>/: small valid files of
each format, so the fuzzers start from the interesting paths) and the regression files for the
findings of issue 9 (tests/fuzz/regressions/<target>/issue9-*: each one was accepted, crashed or
misbehaved before the loaders were hardened). Python standard library only; deterministic output.
Crashes found by the fuzzers later are copied into tests/fuzz/regressions/<target>/ by hand (see
README, "Fuzzing and sanitizers"). Run from anywhere: python3 tests/fuzz/make_corpus.py"""
import gzip, json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(kind, target, name, data):
    d = os.path.join(HERE, kind, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, mtime=0)


def idx(code, dims, payload):
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def npy(dict_text, payload, version=1):
    n = len(dict_text)
    pre = 10 if version == 1 else 12
    pad = (64 - (pre + n + 1) % 64) % 64
    hl = n + pad + 1
    head = b"\x93NUMPY" + bytes([version, 0]) + (struct.pack("<H", hl) if version == 1 else struct.pack("<I", hl))
    return head + dict_text.encode() + b" " * pad + b"\n" + payload


def st(header, payload, raw=None):
    text = raw if raw is not None else json.dumps(header, separators=(",", ":"))
    text = text.encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + payload


# ---- seeds ----
put("corpus", "idx", "u8_2x3.idx", idx(0x08, [2, 3], bytes([0, 1, 2, 250, 255, 7])))
put("corpus", "idx", "i16_3.idx.gz", gz(idx(0x0B, [3], struct.pack(">hhh", 258, -2, 7))))
put("corpus", "idx", "f32_2.idx", idx(0x0D, [2], struct.pack(">ff", 1.5, -0.25)))
put("corpus", "idx", "f64_2x2.idx", idx(0x0E, [2, 2], struct.pack(">dddd", 1, 2, 3, 4)))
put("corpus", "idx", "u8_2x2x2.idx.gz", gz(idx(0x08, [2, 2, 2], bytes(range(8)))))
# first byte 0xC0..0xFF: the target gzips the rest itself (0xD0 | k also cuts k bytes off the end)
put("corpus", "idx", "harness-gzip-u8_2x3", b"\xc0" + idx(0x08, [2, 3], bytes([0, 1, 2, 250, 255, 7])))
put("corpus", "idx", "harness-gzip-f32_2-cut4", b"\xd4" + idx(0x0D, [2], struct.pack(">ff", 1.5, -0.25)))
put("corpus", "idx", "i32_1x1x1x2.idx", idx(0x0C, [1, 1, 1, 2], struct.pack(">ii", -1, 65536)))

put("corpus", "npy", "f4_2x3.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", struct.pack("<6f", *range(6))))
put("corpus", "npy", "f8_scalar.npy", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", struct.pack("<d", 3.5)))
put("corpus", "npy", "u1_4.npy", npy("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", bytes([1, 2, 3, 4])))
put("corpus", "npy", "i8_2x2_v2.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }", struct.pack("<4q", 1, -2, 3, -4), 2))
put("corpus", "npy", "b1_3.npy", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", bytes([1, 0, 1])))
put("corpus", "npy", "i2_0.npy", npy("{'descr': '<i2', 'fortran_order': False, 'shape': (0,), }", b""))

put("corpus", "safetensors", "two.safetensors", st({
    "__metadata__": {"format": "qgru", "step": "3"},
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "I64", "shape": [1, 1], "data_offsets": [8, 16]}}, struct.pack("<ffq", 1.0, -2.0, 5)))
put("corpus", "safetensors", "empty.safetensors", st({}, b""))
put("corpus", "safetensors", "mixed.safetensors", st({
    "x": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
    "y": {"dtype": "I16", "shape": [], "data_offsets": [3, 5]},
    "z": {"dtype": "F64", "shape": [0, 4], "data_offsets": [5, 5]},
    "w": {"dtype": "I32", "shape": [1], "data_offsets": [5, 9]}}, bytes(9)))

with open(os.path.join(HERE, "..", "..", "config", "seed_example2_minimal.json"), "rb") as f:
    put("corpus", "json", "config_minimal.json", f.read())
put("corpus", "json", "values.json", b'{"a": [1, -2.5e3, true, false, null], "b": {"c": "d\\u00e9\\n"}, "e": []}')
put("corpus", "json", "array.json", b'[{"layer": 0, "exp2_inv": [3, 4], "zero_point": [0, 0]}]\n')

# ---- regressions: the C findings of issue 9 ----
put("regressions", "npy", "issue9-claims-40GB.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (10000000000,), }", bytes(16)))
put("regressions", "npy", "issue9-fortran-order-0.npy", npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", bytes(8)))
put("regressions", "npy", "issue9-fortran-order-Falsey.npy", npy("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,), }", bytes(8)))
put("regressions", "npy", "issue9-shape-overflow.npy", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", bytes(8)))
put("regressions", "idx", "issue9-claims-3.6GB.idx", idx(0x08, [60000, 60000], bytes(6)))
put("regressions", "idx", "issue9-gzip-no-trailer.idx.gz", gz(idx(0x08, [2, 3], bytes(6)))[:-8])
put("regressions", "idx", "issue9-gzip-claims-2GB.idx.gz", gz(idx(0x08, [0x7fffffff], bytes(2))))
put("regressions", "safetensors", "issue9-duplicate-names.safetensors", st(None, bytes(16), raw=
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}'))
put("regressions", "safetensors", "issue9-trailing-bytes.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(12)))
put("regressions", "safetensors", "issue9-shape-2p32x2p32x16.safetensors", st(
    {"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}}, b""))
put("regressions", "json", "deep-nesting.json", b"[" * 5000 + b"]" * 5000)
put("regressions", "json", "unterminated-string.json", b'{"a": "abc')
