#!/usr/bin/env python3
"""Generates tests/data/gru_golden.safetensors: a PyTorch nn.GRU forward to compare qgru against.

Random weights, T=5, N=3, C=4, H=6, 2 layers, bidirectional, with a random h0. Weights are drawn
in float32; the forward runs in float64 on those exact values, and its outputs are stored as
float64 so the comparison measures qgru's error alone. The file holds the PyTorch state dict
under its own names (weight_ih_l0, ..., *_reverse; gate order r, z, n) plus x, h0, y and h_n.
Run where PyTorch is installed:  python3 tests/gen_gru_golden.py [out_path]
Written with json + struct only, so the safetensors package is not needed.
"""
import json
import struct
import sys

import torch

T, N, C, H, L = 5, 3, 4, 6, 2


def save_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        dtype = {torch.float32: "F32", torch.float64: "F64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/gru_golden.safetensors"
    torch.manual_seed(20261121)
    gru = torch.nn.GRU(C, H, num_layers=L, bidirectional=True)          # float32 weights
    x = torch.randn(T, N, C)
    h0 = torch.randn(L * 2, N, H)
    gru64 = torch.nn.GRU(C, H, num_layers=L, bidirectional=True).double()
    gru64.load_state_dict({k: v.double() for k, v in gru.state_dict().items()})
    with torch.no_grad():
        y, hn = gru64(x.double(), h0.double())
    tensors = {k: v for k, v in gru.state_dict().items()}
    tensors.update({"x": x, "h0": h0, "y": y, "h_n": hn})
    save_safetensors(out, tensors, {"generator": "tests/gen_gru_golden.py", "torch": torch.__version__,
                                    "shape": f"T={T} N={N} C={C} H={H} layers={L} bidirectional"})
    print(f"wrote {out} with torch {torch.__version__}")


if __name__ == "__main__":
    main()
