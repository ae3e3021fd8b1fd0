#!/usr/bin/env python3
"""Random PEFT LoRA adapters at a Falcon model's real shapes, for load and fairness benchmarks
(numpy; the text they make is noise). Default shapes: falcon-7b (what `--preset falcon-7b`
serves).

    python3 bench/make_adapters.py --out /tmp/adapters --count 32 --rank 8 \
        --modules query_key_value,dense
"""
import argparse
import json
import os
import struct

import numpy as np


def bf16_bytes(a):
    """float32 array -> bfloat16 bytes (round to nearest even)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--modules", default="query_key_value,dense")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4544)
    ap.add_argument("--qkv-out", type=int, default=4672, help="(heads + 2 * kv_heads) * head_dim")
    ap.add_argument("--ffn", type=int, default=18176)
    ap.add_argument("--prefix", default="a")
    a = ap.parse_args()
    shapes = {  # module -> (path inside the layer, in, out)
        "query_key_value": ("self_attention.query_key_value", a.hidden, a.qkv_out),
        "dense": ("self_attention.dense", a.hidden, a.hidden),
        "dense_h_to_4h": ("mlp.dense_h_to_4h", a.hidden, a.ffn),
        "dense_4h_to_h": ("mlp.dense_4h_to_h", a.ffn, a.hidden),
    }
    modules = a.modules.split(",")
    rng = np.random.default_rng(0)
    for i in range(a.count):
        folder = os.path.join(a.out, f"{a.prefix}{i:02d}")
        os.makedirs(folder, exist_ok=True)
        tensors = {}
        for layer in range(a.layers):
            for m in modules:
                path, n_in, n_out = shapes[m]
                key = f"base_model.model.transformer.h.{layer}.{path}"
                la = rng.standard_normal((a.rank, n_in), dtype=np.float32) / np.sqrt(n_in)
                lb = rng.standard_normal((n_out, a.rank), dtype=np.float32) * 0.02
                tensors[key + ".lora_A.weight"] = ((a.rank, n_in), bf16_bytes(la))
                tensors[key + ".lora_B.weight"] = ((n_out, a.rank), bf16_bytes(lb))
        write_safetensors(os.path.join(folder, "adapter_model.safetensors"), tensors)
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": a.rank, "lora_alpha": 2 * a.rank,
                       "target_modules": modules, "lora_dropout": 0.0, "bias": "none",
                       "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
                       "base_model_name_or_path": "falcon-7b (random)"}, f, indent=1)
    print(f"{a.count} adapters of rank {a.rank} on {modules} in {a.out}")


if __name__ == "__main__":
    main()
