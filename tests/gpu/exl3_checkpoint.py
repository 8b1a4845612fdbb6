"""Make a real EXL3 checkpoint from nothing: a small random Llama, quantized by exllamav3 itself.

Why: pp4 needs an EXL3 model to check its kernels against, and the GPU machine has no network. This
script writes a seeded random HF Llama (LlamaForCausalLM, fp16 safetensors, untied embeddings, a
byte-level BPE tokenizer with exactly vocab_size entries) and then runs exllamav3's own converter
(exllamav3/conversion/convert_model.py, in this process) on it, so the result is a genuine EXL3
checkpoint: trellis/suh/svh per linear plus the codebook marker, as any released EXL3 model has.

    OUTDIR/hf     the random HF model: config.json, generation_config.json, model.safetensors,
                  tokenizer.json, tokenizer_config.json, special_tokens_map.json
    OUTDIR/work   exllamav3's conversion working directory (removed and remade on each run)
    OUTDIR/exl3   the EXL3 checkpoint; its tensors and quantization fields are printed at the end

The compiled exllamav3_ext is pp4's: `load_target("exl3", --exl3-build)` registers it as
sys.modules["exllamav3_ext"] before exllamav3 is imported, and exllamav3/ext.py then takes it as a
precompiled extension (importlib.util.find_spec finds it in sys.modules with an origin ending in .so)
instead of JIT-compiling its sources.

Every dim is checked to stay a multiple of 128 after halving for a TP2 split.

GPU machine:
    python3 tests/gpu/exl3_checkpoint.py --out /tmp/exl3tiny --exl3-build build
CPU (HF model only, no exllamav3 needed):
    python tests/gpu/exl3_checkpoint.py --out /tmp/exl3tiny --hf-only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: Llama's unk/bos/eos
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


def main() -> None:
    args = parse_args()
    out = Path(args.out).absolute()
    check_geometry(args)

    hf_dir = out / "hf"
    write_hf_model(args, hf_dir)
    if args.hf_only:
        print(f"HF model written to {hf_dir} (--hf-only: no conversion)")
        return

    load_ext(args.exl3_build)
    exl3_dir = out / "exl3"
    convert(args, hf_dir, out / "work", exl3_dir)
    print_checkpoint(exl3_dir)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (hf/, work/, exl3/ are made in it)")
    ap.add_argument("--exl3-build", default="build", help="pp4 build dir holding the exl3 target")
    ap.add_argument("--hf-only", action="store_true", help="write the HF model only, no conversion")
    ap.add_argument("--seed", type=int, default=0)
    g = ap.add_argument_group("geometry")
    g.add_argument("--hidden", type=int, default=1024)
    g.add_argument("--heads", type=int, default=16)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--intermediate", type=int, default=2816)
    g.add_argument("--vocab", type=int, default=4096)
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--rope-theta", type=float, default=500000.0)
    g.add_argument("--rms-norm-eps", type=float, default=1e-5)
    g.add_argument("--max-pos", type=int, default=4096)
    q = ap.add_argument_group("conversion")
    q.add_argument("--bits", type=float, default=4, help="decoder bits per weight (-b)")
    q.add_argument("--head-bits", type=float, default=6, help="lm_head bits per weight (-hb)")
    q.add_argument("--codebook", choices=["mul1", "mcg", "3inst"], default="mul1", help="(-cb)")
    q.add_argument("--cal-rows", type=int, default=16,
                   help="calibration rows (-cr; upstream default 250; 7 is the least its corpus mix gives)")
    q.add_argument("--cal-cols", type=int, default=512, help="calibration columns (-cc; upstream default 2048)")
    q.add_argument("--devices", default="0", help="(-d) CUDA devices for the quantizer")
    return ap.parse_args()


def check_geometry(a: argparse.Namespace) -> None:
    """Every dim a TP2 split cuts must stay a multiple of 128 per rank (EXL3 tiles and Hadamards)."""
    dims = {
        "hidden": a.hidden,
        "heads/2*head_dim": a.heads // 2 * a.head_dim,
        "kv_heads/2*head_dim": a.kv_heads // 2 * a.head_dim,
        "intermediate/2": a.intermediate // 2,
        "vocab/2": a.vocab // 2,
    }
    bad = {k: v for k, v in dims.items() if v <= 0 or v % 128}
    if a.heads % 2 or a.kv_heads % 2 or a.intermediate % 2 or a.vocab % 2 or a.heads % a.kv_heads:
        bad["parity"] = "heads, kv_heads, intermediate and vocab must be even, heads a multiple of kv_heads"
    if bad:
        sys.exit(f"geometry not TP2-splittable in multiples of 128: {bad}")


# --------------------------------------------------------------------------------------------------
# The HF model

def write_hf_model(a: argparse.Namespace, hf_dir: Path) -> None:
    hf_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "num_hidden_layers": a.layers,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.max_pos,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "torch_dtype": "float16",
        "use_cache": True,
    }
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (hf_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False}, indent=2) + "\n")

    write_tokenizer(a.vocab, hf_dir, a.max_pos)

    from safetensors.torch import save_file
    tensors = random_weights(a)
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    n = sum(t.numel() for t in tensors.values())
    print(f"HF model: {len(tensors)} tensors, {n / 1e6:.1f} M parameters, fp16, seed {a.seed}")


def random_weights(a: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Seeded Gaussian weights at init scale (std 0.02), norms near 1: non-degenerate logits.

    Tensors are made in fp32 on the CPU with one torch.Generator, in a fixed order, then cast to
    fp16, so the same seed gives the same bytes on every machine."""
    gen = torch.Generator().manual_seed(a.seed)

    def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).half().contiguous()

    def norm(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=gen)).half().contiguous()

    h, q, kv, i = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.intermediate
    t = {"model.embed_tokens.weight": normal(a.vocab, h, std=1.0)}
    for l in range(a.layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = normal(q, h)
        t[p + "self_attn.k_proj.weight"] = normal(kv, h)
        t[p + "self_attn.v_proj.weight"] = normal(kv, h)
        t[p + "self_attn.o_proj.weight"] = normal(h, q)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "mlp.gate_proj.weight"] = normal(i, h)
        t[p + "mlp.up_proj.weight"] = normal(i, h)
        t[p + "mlp.down_proj.weight"] = normal(h, i)
    t["model.norm.weight"] = norm(h)
    t["lm_head.weight"] = normal(a.vocab, h, std=0.05)
    return t


def write_tokenizer(vocab_size: int, hf_dir: Path, max_len: int) -> None:
    """Byte-level BPE (GPT-2/Llama-3 style) trained to exactly vocab_size tokens.

    Trained on exllamav3's bundled calibration text when that package is installed (so the
    converter's calibration corpus tokenizes into real merges), else on seeded synthetic text.
    Any byte string encodes, so no <unk> ever appears."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.Sequence([  # HF's encode adds BOS, as Llama's does; exllamav3 adds its own
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus, source = training_corpus()
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        sys.exit(f"tokenizer came out with {tok.get_vocab_size()} tokens, not {vocab_size}: "
                 f"corpus ({source}) too small for this vocab")
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.save(str(hf_dir / "tokenizer.json"))

    special = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for i, s in enumerate(SPECIAL_TOKENS)}
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "added_tokens_decoder": special,
    }
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (hf_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n")
    print(f"tokenizer: byte-level BPE, {vocab_size} tokens, trained on {source}")


def training_corpus() -> tuple[list[str], str]:
    """exllamav3's calibration texts if the package is on the path (found without importing it)."""
    spec = importlib.util.find_spec("exllamav3")
    if spec and spec.submodule_search_locations:
        d = Path(list(spec.submodule_search_locations)[0]) / "conversion" / "standard_cal_data"
        files = sorted(d.glob("*.utf8"))
        if files:
            lines = []
            for f in files:
                lines += f.read_text(encoding="utf8").splitlines()
            return lines, f"exllamav3 calibration text ({d})"
    import random
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    lines = [" ".join(rng.choice(words) for _ in range(20)) + rng.choice([".", ",", "!", "?", ";"])
             for _ in range(60000)]
    return lines, "seeded synthetic text"


# --------------------------------------------------------------------------------------------------
# Conversion

def load_ext(build_dir: str):
    """pp4's compiled exllamav3_ext, registered in sys.modules before exllamav3 is imported."""
    sys.path.insert(0, str(Path(__file__).absolute().parents[2]))
    from pp4.certify.loader import load_target
    mod = load_target("exl3", build_dir)
    assert sys.modules.get("exllamav3_ext") is mod, "load_target did not register exllamav3_ext"
    assert "exllamav3" not in sys.modules, "exllamav3 was imported before its extension was registered"
    import exllamav3.ext
    assert exllamav3.ext.exllamav3_ext is mod, "exllamav3 did not take pp4's precompiled extension"
    print(f"exllamav3_ext: {mod.__file__}")
    return mod


def convert(a: argparse.Namespace, hf_dir: Path, work_dir: Path, exl3_dir: Path) -> None:
    """Run exllamav3.conversion.convert_model's own parser, prepare() and main() in this process."""
    import exllamav3.conversion.convert_model as cm

    for d in (work_dir, exl3_dir):  # a fresh job: no resume state, no stale shards
        if d.exists():
            shutil.rmtree(d)
    argv = [
        "-i", str(hf_dir), "-o", str(exl3_dir), "-w", str(work_dir),
        "-b", fmt_bits(a.bits), "-hb", fmt_bits(a.head_bits), "-cb", a.codebook,
        "-cr", str(a.cal_rows), "-cc", str(a.cal_cols), "-d", a.devices,
    ]
    print("convert_model " + " ".join(argv))
    in_args, job_state, ok, err = cm.prepare(cm.parser.parse_args(argv))
    if not ok:
        sys.exit(f"exllamav3 conversion refused: {err}")
    t0 = time.time()
    cm.main(in_args, job_state)
    print(f"conversion took {time.time() - t0:.1f} s")


def fmt_bits(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else str(b)


# --------------------------------------------------------------------------------------------------
# Report

def print_checkpoint(exl3_dir: Path) -> None:
    from safetensors import safe_open

    cfg = json.loads((exl3_dir / "config.json").read_text())
    print("\nconfig.json quantization_config:")
    print(json.dumps(cfg.get("quantization_config"), indent=2))
    qc = exl3_dir / "quantization_config.json"
    if qc.is_file():
        print(f"{qc.name}: {len(qc.read_text())} bytes")

    print("\nEXL3 tensors:")
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for f in sorted(exl3_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in sorted(st.keys()):
                t = st.get_tensor(k)
                extra = f" = {t.item():#x}" if t.numel() == 1 and not t.is_floating_point() else ""
                print(f"  {f.name}  {k:<48} {str(t.dtype):<14} {list(t.shape)}{extra}")
                mod, _, sub = k.rpartition(".")
                groups.setdefault(mod, {})[sub] = t

    print("\nper-linear summary (K = trellis.shape[-1] / 16):")
    for mod, g in groups.items():
        if "trellis" in g:
            marker = "mcg" if "mcg" in g else "mul1" if "mul1" in g else "3inst"
            print(f"  {mod:<40} K={g['trellis'].shape[-1] / 16:g} codebook={marker}")
    print("\nshared input rotations (linears quantized together against one Hessian):")
    layers = sorted({re.match(r"(.*\.layers\.\d+)\.", m).group(1) for m in groups if ".layers." in m})
    for l in layers:
        for a, b in (("self_attn.q_proj", "self_attn.k_proj"), ("self_attn.q_proj", "self_attn.v_proj"),
                     ("mlp.gate_proj", "mlp.up_proj")):
            ga, gb = groups.get(f"{l}.{a}", {}), groups.get(f"{l}.{b}", {})
            if "suh" in ga and "suh" in gb:
                print(f"  {l}: suh({a}) == suh({b}): {torch.equal(ga['suh'], gb['suh'])}")

if __name__ == "__main__":
    main()
