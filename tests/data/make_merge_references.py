"""Makes tests/data/merge-falcon7b/: random peft LoRA adapters on the falcon7b-mqa-parallel base and
what peft's `PeftModel.add_weighted_adapter` makes of them, the reference for kestrel's merge of
LoRAX's `merged_adapters` (src/lora/merge.h, tests/lora/merge_test.cpp).

    /tmp/torchenv/bin/python tests/data/make_merge_references.py

Writes, under tests/data/merge-falcon7b/:
- adapters/NAME/ (adapter_config.json, adapter_model.safetensors, F32), four adapters:
  m1-r4-all (r 4, alpha 8, all four modules), m2-r4-attn-fc1-rslora (r 4, alpha 4, use_rslora,
  query_key_value + dense + dense_h_to_4h), m3-r4-mlp-layer1 (r 4, alpha 16, dense_h_to_4h +
  dense_4h_to_h, layers_to_transform [1]) and m4-r2-qkv (r 2, alpha 4, query_key_value).
- expected_<merge>.safetensors for every merge of MERGES: `transformer.h.N.<module path>.lora_A`
  ([r, in]) and `.lora_B` ([out, r]), F32, for every module of the merged adapter, exactly as peft
  leaves them (the merged adapter's scale, one for every module, is in fixture.json).
- expected_logits_<merge>.safetensors (`logits`, F32 [T, vocab]) for LOGIT_MERGES: the base model
  (float32) plus the merged adapter on fixture.json's `prompt_ids`.
- fixture.json: every merge's inputs (adapters, weights, strategy, density, sign method, seed), the
  strategy peft ran, the merged rank and scale, the merged modules, the refusals, and the fraction
  of non-zero entries of a DARE merge drawn with torch's own RNG.

DARE draws a Bernoulli mask per entry. kestrel cannot reproduce torch's generator, so for the
exact references peft's `merge_utils.random_pruning` is replaced here by one that draws from the
stream kestrel uses (src/lora/merge.h: per module a std::mt19937_64 seeded with
splitmix64(splitmix64(seed) ^ (layer * 4 + module)); an entry is kept when
(next() >> 11) * 2^-53 < density; the A's of the adapters that target the module in order, then
their B's, each row-major). Everything else is peft's own code. The `*_torchrng` numbers are the
unpatched peft, for the statistical check.
"""
import json
import shutil
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import merge_utils
from safetensors.torch import save_file
from transformers import FalconForCausalLM

DATA = Path(__file__).resolve().parent
BASE = DATA / "falcon7b-mqa-parallel"
OUT = DATA / "merge-falcon7b"
MODULES = ["self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
           "mlp.dense_4h_to_h"]
ALL = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]

ADAPTERS = {
    "m1-r4-all": dict(r=4, lora_alpha=8, target_modules=ALL),
    "m2-r4-attn-fc1-rslora": dict(r=4, lora_alpha=4, use_rslora=True,
                                  target_modules=["query_key_value", "dense", "dense_h_to_4h"]),
    "m3-r4-mlp-layer1": dict(r=4, lora_alpha=16, target_modules=["dense_h_to_4h", "dense_4h_to_h"],
                             layers_to_transform=[1]),
    "m4-r2-qkv": dict(r=2, lora_alpha=4, target_modules=["query_key_value"]),
}
M1, M2, M3, M4 = ADAPTERS

# name: (adapters, weights, combination_type, density, majority_sign_method, seed)
MERGES = {
    "linear": ([M1, M2], [0.7, 0.5], "linear", None, "total", 0),
    "linear_three_neg": ([M1, M2, M3], [1.0, -0.6, 0.8], "linear", None, "total", 0),
    "linear_layers_first": ([M3, M1], [0.5, 0.5], "linear", None, "total", 0),
    "linear_rslora_first": ([M2, M1], [0.6, 0.4], "linear", None, "total", 0),
    "single_ties_is_linear": ([M2], [0.8], "ties", 0.5, "total", 0),
    "ties_total": ([M1, M2, M3], [0.7, 0.5, 0.9], "ties", 0.5, "total", 0),
    "ties_frequency": ([M1, M2, M3], [0.7, 0.5, 0.9], "ties", 0.5, "frequency", 0),
    "ties_neg_d03": ([M1, M2], [1.0, -0.6], "ties", 0.3, "total", 0),
    "dare_linear_d1": ([M1, M2, M3], [0.7, 0.5, 0.9], "dare_linear", 1.0, "total", 0),
    "dare_ties_total_d1": ([M1, M2, M3], [0.7, 0.5, 0.9], "dare_ties", 1.0, "total", 0),
    "dare_ties_frequency_d1": ([M1, M2, M3], [0.7, 0.5, 0.9], "dare_ties", 1.0, "frequency", 0),
    "dare_linear_d05": ([M1, M2, M3], [0.7, 0.5, 0.9], "dare_linear", 0.5, "total", 1234),
    "dare_ties_total_d05": ([M1, M2, M3], [0.7, 0.5, 0.9], "dare_ties", 0.5, "total", 1234),
    "dare_ties_frequency_d05": ([M1, M2], [0.7, -0.5], "dare_ties", 0.5, "frequency", 99),
    "cat": ([M1, M4], [0.7, -0.5], "cat", None, "total", 0),
    "cat_three": ([M2, M4, M1], [0.5, 1.5, -0.25], "cat", None, "total", 0),
}
LOGIT_MERGES = ["linear", "ties_total", "dare_ties_total_d05"]
REFUSED = {"linear_unequal_ranks": ([M1, M4], [0.5, 0.5], "linear"),
           "ties_unequal_ranks": ([M1, M4], [0.5, 0.5], "ties"),
           # The merged adapter targets the union of the target modules on the first adapter's
           # layers: dense_4h_to_h of layer 0, which neither adapter has (peft: IndexError / "No
           # matching LoRAs found").
           "linear_module_nobody_has": ([M2, M3], [0.5, 0.5], "linear"),
           "cat_module_nobody_has": ([M4, M2, M3], [0.5, 0.5, 0.5], "cat")}
TORCHRNG = ("dare_linear_d05_torchrng", [M1, M2, M3], [0.7, 0.5, 0.9], "dare_linear", 0.5)

MASK64 = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class MT19937_64:
    """std::mt19937_64."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & MASK64
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64
        self.i = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.i = 0

    def __call__(self):
        if self.i >= 312:
            self._twist()
        x = self.mt[self.i]
        self.i += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & MASK64


def module_seed(seed, layer, module):
    return splitmix64(splitmix64(seed) ^ (layer * 4 + module))


_stream = {"rng": None}


def kestrel_random_pruning(tensor, density, rescale):
    """peft's random_pruning with the mask drawn from kestrel's stream instead of torch.bernoulli."""
    rng = _stream["rng"]
    keep = [1.0 if (rng() >> 11) * 2.0**-53 < density else 0.0 for _ in range(tensor.numel())]
    mask = torch.tensor(keep, dtype=tensor.dtype).reshape(tensor.shape)
    pruned_tensor = tensor * mask
    if rescale:
        pruned_tensor = pruned_tensor / density
    return pruned_tensor


def module_index(name):
    """'base_model.model.transformer.h.1.mlp.dense_h_to_4h' -> (1, 2)."""
    rest = name.split("transformer.h.", 1)[1]
    layer, path = rest.split(".", 1)
    return int(layer), MODULES.index(path)


def make_adapters(base_dir):
    torch.manual_seed(20261206)
    shutil.rmtree(OUT / "adapters", ignore_errors=True)
    for name, kw in ADAPTERS.items():
        base = FalconForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(lora_dropout=0.0, **kw))
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn_like(p) * 0.15)
        model.save_pretrained(OUT / "adapters" / name)
        (OUT / "adapters" / name / "README.md").unlink()  # peft's model card template


def load_all(base_dir):
    base = FalconForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    names = list(ADAPTERS)
    model = PeftModel.from_pretrained(base, OUT / "adapters" / names[0], adapter_name=names[0])
    for n in names[1:]:
        model.load_adapter(OUT / "adapters" / n, adapter_name=n)
    model.eval()
    return model


def merged_tensors(model, name):
    out, scales = {}, set()
    for mname, mod in model.named_modules():
        if hasattr(mod, "lora_A") and name in mod.lora_A:
            layer, m = module_index(mname)
            key = f"transformer.h.{layer}.{MODULES[m]}"
            out[key + ".lora_A"] = mod.lora_A[name].weight.detach().clone().contiguous()
            out[key + ".lora_B"] = mod.lora_B[name].weight.detach().clone().contiguous()
            scales.add(mod.scaling[name])
    assert len(scales) == 1, scales
    return out, scales.pop()


def main():
    OUT.mkdir(exist_ok=True)
    make_adapters(BASE)
    model = load_all(BASE)
    lora_model = model.base_model
    names_of = {id(mod): mname for mname, mod in model.named_modules()}
    original_generalized = lora_model._generalized_task_arithmetic_weighted_adapter

    def generalized(combination_type, adapters, weights, target, *args):
        layer, m = module_index(names_of[id(target)])
        _stream["rng"] = MT19937_64(module_seed(_stream["seed"], layer, m))
        return original_generalized(combination_type, adapters, weights, target, *args)

    lora_model._generalized_task_arithmetic_weighted_adapter = generalized
    original_random_pruning = merge_utils.random_pruning
    merge_utils.random_pruning = kestrel_random_pruning

    prompt_ids = [99, 431, 646, 21, 177, 438, 711, 167, 728, 416, 1022, 265, 848, 397, 869, 821,
                  134]
    fixture = {"base": "../falcon7b-mqa-parallel", "prompt_ids": prompt_ids,
               "adapters": {n: {k: v for k, v in kw.items()} for n, kw in ADAPTERS.items()},
               "merges": {}, "refused": {}}
    for name, (adapters, weights, ctype, density, msm, seed) in MERGES.items():
        _stream["seed"] = seed
        model.add_weighted_adapter(adapters, weights, name, combination_type=ctype,
                                   density=density, majority_sign_method=msm)
        tensors, scale = merged_tensors(model, name)
        save_file(tensors, str(OUT / f"expected_{name}.safetensors"))
        cfg = model.peft_config[name]
        fixture["merges"][name] = {
            "adapters": adapters, "weights": weights, "strategy": ctype, "density": density,
            "majority_sign_method": msm, "seed": seed, "rank": cfg.r, "scale": scale,
            "use_rslora": cfg.use_rslora,
            "modules": sorted(k[: -len(".lora_A")] for k in tensors if k.endswith(".lora_A"))}
        print(name, "rank", cfg.r, "scale", scale, "modules", len(tensors) // 2)

    merge_utils.random_pruning = original_random_pruning
    lora_model._generalized_task_arithmetic_weighted_adapter = original_generalized

    # DARE with torch's RNG: the fraction of non-zero entries, per number of adapters targeting
    # the module (1 - (1 - density)^n expected).
    torch.manual_seed(7)
    tname, adapters, weights, ctype, density = TORCHRNG
    model.add_weighted_adapter(adapters, weights, tname, combination_type=ctype, density=density)
    tensors, _ = merged_tensors(model, tname)
    counts = {}
    for key, t in tensors.items():
        layer, m = module_index("transformer.h." + key.split("transformer.h.", 1)[1].rsplit(".", 1)[0])
        n = sum(1 for a in adapters if model.peft_config[a].layers_to_transform in (None, [layer])
                and ALL[m] in model.peft_config[a].target_modules)
        c = counts.setdefault(str(n), [0, 0])
        c[0] += int((t != 0).sum())
        c[1] += t.numel()
    fixture["dare_linear_d05_torchrng"] = {
        "adapters": adapters, "weights": weights, "density": density,
        "nonzero_fraction_by_adapter_count": {n: c[0] / c[1] for n, c in counts.items()},
        "entries_by_adapter_count": {n: c[1] for n, c in counts.items()}}

    for name, (adapters, weights, ctype) in REFUSED.items():
        try:
            model.add_weighted_adapter(adapters, weights, name, combination_type=ctype)
        except (ValueError, IndexError) as e:
            fixture["refused"][name] = {"adapters": adapters, "weights": weights,
                                        "strategy": ctype,
                                        "peft_error": f"{type(e).__name__}: {e}"}
        else:
            raise SystemExit(f"peft accepted {name}")

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        for name in LOGIT_MERGES:
            model.set_adapter(name)
            logits = model(input_ids=ids).logits[0].float().contiguous()
            save_file({"logits": logits}, str(OUT / f"expected_logits_{name}.safetensors"))
        with model.disable_adapter():
            base_logits = model(input_ids=ids).logits[0]
        fixture["max_logit_change_vs_base"] = {}
        for name in LOGIT_MERGES:
            model.set_adapter(name)
            fixture["max_logit_change_vs_base"][name] = float(
                (model(input_ids=ids).logits[0] - base_logits).abs().max())
    fixture["made_with"] = {"torch": torch.__version__,
                            "peft": __import__("peft").__version__,
                            "transformers": __import__("transformers").__version__}
    (OUT / "fixture.json").write_text(json.dumps(fixture, indent=1) + "\n")


if __name__ == "__main__":
    main()
