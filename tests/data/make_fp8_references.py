"""Makes the FP8 references beside the base fixtures: what transformers computes for each fixture
when its linear weights (query_key_value, dense, dense_h_to_4h, dense_4h_to_h) are rounded as
kestrel's --quantize fp8 rounds them: one float32 scale per output row, amax / 448 (1 for a row of
zeros), w / scale clamped to +-448 and cast to torch.float8_e4m3fn (round to nearest even), then
used as float32(q) * scale. Everything else as for expected.safetensors (float32, TF32 off, each
prompt alone, 12 greedy steps with a KV cache, never stopping at EOS).

    python3 tests/data/make_fp8_references.py [--kv] OUT_DIR [FIXTURE ...]

writes OUT_DIR/<fixture>/expected_fp8.safetensors with `logits` (or `last_logits` for the
full-vocabulary model), `greedy_ids` and, where the fixture has them, `greedy_logits`. With --kv,
the weights stay as they are and instead every key and value is rounded to E4M3 (scale 1,
clamped to +-448) as it enters the KV cache, as --kv-cache-dtype fp8 stores them:
expected_fp8kv.safetensors.
Needs torch (with float8_e4m3fn), transformers and safetensors: run it on the GPU machine.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import FalconConfig, FalconForCausalLM
from transformers.cache_utils import DynamicLayer

DATA = Path(__file__).resolve().parent
FIXTURES = ["falcon7b-mqa-parallel", "legacy-rw-7b-config", "falcon40b-gqa",
            "legacy-rw-40b-config", "rw-mha-sequential-bias", "falcon180b-gqa-untied",
            "falcon2-11b-style", "falcon40b-hd64-gqa", "falcon7b-hd128-mqa",
            "e2e-falcon7b-fullvocab", "rw-alibi-mha"]
LINEARS = ("self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
           "mlp.dense_4h_to_h")
STEPS = 12


def fp8_round(w):
    """w (float32 [out, in]) as kestrel's FP8 weights hold it, back in float32."""
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (w / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.to(torch.float32) * scale


def e4m3(t):
    return t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(t.dtype)


def round_kv_cache():
    """Every DynamicLayer (the KV cache of a layer) stores and returns rounded keys and values."""
    update = DynamicLayer.update

    def rounded(self, key_states, value_states, *args, **kwargs):
        return update(self, e4m3(key_states), e4m3(value_states), *args, **kwargs)

    DynamicLayer.update = rounded


def run(name, out_dir, device, kv):
    folder = DATA / name
    exp = load_file(str(folder / "expected.safetensors"))
    # The config the fixture was built from (fixture.json): the legacy folders' config.json
    # (RefinedWeb / RefinedWebModel keys) is kestrel's to parse, not transformers'.
    config = FalconConfig(**json.loads((folder / "fixture.json").read_text())["config"])
    model = FalconForCausalLM.from_pretrained(str(folder), config=config,
                                              dtype=torch.float32).to(device)
    model.eval()
    n = 0
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            if not kv and isinstance(mod, torch.nn.Linear) and mod_name.endswith(LINEARS):
                mod.weight.copy_(fp8_round(mod.weight.float()))
                n += 1
    assert kv or n == 4 * model.config.num_hidden_layers, (name, n)
    ids, cu = exp["prompt_ids"], exp["cu_seqlens"]
    prompts = [ids[cu[p]:cu[p + 1]] for p in range(len(cu) - 1)]
    out = {}
    with torch.no_grad():
        logits = [model(p[None].to(device)).logits[0].float().cpu() for p in prompts]
        if "logits" in exp:
            out["logits"] = torch.cat(logits).contiguous()
        out["last_logits"] = torch.stack([l[-1] for l in logits]).contiguous()
        greedy_ids, greedy_logits = [], []
        for p in prompts:
            g = model.generate(p[None].to(device), max_new_tokens=STEPS, min_new_tokens=STEPS,
                               do_sample=False, eos_token_id=None, pad_token_id=0,
                               output_logits=True, return_dict_in_generate=True)
            greedy_ids.append(g.sequences[0, len(p):].cpu())
            greedy_logits.append(torch.stack([s[0].float().cpu() for s in g.logits]))
        out["greedy_ids"] = torch.stack(greedy_ids).to(torch.int64).contiguous()
        if "greedy_logits" in exp:
            out["greedy_logits"] = torch.stack(greedy_logits).contiguous()
    dst = Path(out_dir) / name
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / ("expected_fp8kv.safetensors" if kv else "expected_fp8.safetensors")),
              metadata={"made_by": "tests/data/make_fp8_references.py",
                        "torch": torch.__version__})
    base = exp["last_logits"]
    err = (out["last_logits"] - base).abs().max() / base.abs().max()
    same = (out["greedy_ids"] == exp["greedy_ids"]).float().mean()
    print(f"{name}: {'K/V' if kv else f'{n} linears'} rounded; last_logits vs fp32 {err:.3e}; greedy ids equal "
          f"{same:.2%}", flush=True)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = sys.argv[1:]
    kv = "--kv" in args
    args = [a for a in args if a != "--kv"]
    if kv:
        round_kv_cache()
    for name in args[1:] or FIXTURES:
        run(name, args[0], device, kv)


if __name__ == "__main__":
    main()
