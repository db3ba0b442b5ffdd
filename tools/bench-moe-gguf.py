#!/usr/bin/env python3
"""Converts a Qwen3 or Qwen3-MoE checkpoint written by tools/make-checkpoint.ts to GGUF for
bench:moe's llama.cpp comparison, with llama.cpp's own gguf-py (GGUF_PY: the gguf-py folder of a
llama.cpp checkout) and numpy alone.

llama.cpp's convert_hf_to_gguf.py is the converter to use where it runs; it needs torch (it
imports it unconditionally, and holds tensors as torch tensors), which this machine lacks and
cannot install (no PyPI). This script writes what that converter writes for these two
architectures (conversion/qwen.py and base.py at llama.cpp's d32676d): the same metadata keys,
tensor names and layouts (experts stacked into one [n_expert, n_ff, n_embd] tensor per
projection, [n_expert, n_embd, n_ff] for down), bf16 weights kept bit for bit, norms and the
router in F32 as the converter forces them. The vocabulary is the checkpoint's byte-level
tokens padded with [PADi] entries to the model's vocab size, as the converter pads; a merge list
of one entry stands in where the checkpoint has none (llama.cpp requires the key; the benchmark
never tokenizes).

  GGUF_PY=/path/to/llama.cpp/gguf-py python3 tools/bench-moe-gguf.py MODEL_DIR OUT.gguf
"""
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("GGUF_PY", "gguf-py"))
import gguf  # noqa: E402

DTYPES = {"BF16": (np.uint16, gguf.GGMLQuantizationType.BF16), "F32": (np.float32, None), "F16": (np.float16, None)}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
    data_start = 8 + header_len
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]][0]
        tensors[name] = mapped[data_start + begin:data_start + end].view(dtype).reshape(info["shape"])
    return tensors


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def main() -> None:
    model_dir, out_file = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((model_dir / "config.json").read_text())
    arch_name = config["architectures"][0]
    moe = arch_name == "Qwen3MoeForCausalLM"
    if arch_name not in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        raise SystemExit(f"{arch_name}: only Qwen3 and Qwen3-MoE")
    arch = gguf.MODEL_ARCH.QWEN3MOE if moe else gguf.MODEL_ARCH.QWEN3
    tensors = read_safetensors(model_dir / "model.safetensors")
    n_layers = config["num_hidden_layers"]

    writer = gguf.GGUFWriter(out_file, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(model_dir.name)
    writer.add_block_count(n_layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if moe:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}}
    special_ids = {t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    by_id = {i: token for token, i in vocab.items()}
    tokens, types = [], []
    for i in range(config["vocab_size"]):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"].get("merges", [])] or ["\u0120 \u0120"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)

    # (GGUF name, producer of the numpy array, force F32)
    plan: list[tuple[str, object, bool]] = []

    def plain(gguf_name: str, hf_name: str, f32: bool = False) -> None:
        plan.append((gguf_name, lambda: tensors[hf_name], f32))

    plain("token_embd.weight", "model.embed_tokens.weight")
    plain("output_norm.weight", "model.norm.weight", True)
    if "lm_head.weight" in tensors:
        plain("output.weight", "lm_head.weight")
    for i in range(n_layers):
        hf = f"model.layers.{i}"
        blk = f"blk.{i}"
        plain(f"{blk}.attn_norm.weight", f"{hf}.input_layernorm.weight", True)
        for proj, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")):
            plain(f"{blk}.{name}.weight", f"{hf}.self_attn.{proj}_proj.weight")
        plain(f"{blk}.attn_q_norm.weight", f"{hf}.self_attn.q_norm.weight", True)
        plain(f"{blk}.attn_k_norm.weight", f"{hf}.self_attn.k_norm.weight", True)
        plain(f"{blk}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", True)
        if f"{hf}.mlp.gate.weight" in tensors:
            plain(f"{blk}.ffn_gate_inp.weight", f"{hf}.mlp.gate.weight", True)
            for proj, name in (("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"), ("down", "ffn_down_exps")):
                stacked = lambda hf=hf, proj=proj: np.stack(
                    [tensors[f"{hf}.mlp.experts.{e}.{proj}_proj.weight"] for e in range(config["num_experts"])])
                plan.append((f"{blk}.{name}.weight", stacked, False))
        else:
            for proj, name in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
                plain(f"{blk}.{name}.weight", f"{hf}.mlp.{proj}_proj.weight")

    def converted(array: np.ndarray, f32: bool) -> np.ndarray:
        if f32 and array.dtype == np.uint16:
            return bf16_to_f32(np.asarray(array))
        return np.asarray(array)

    # Shapes and sizes first (the header), then each tensor's data in turn: one expert stack in memory at a time.
    for name, produce, f32 in plan:
        sample = produce() if "exps" not in name else None
        if sample is None:
            first = tensors[f"model.layers.{name.split('.')[1]}.mlp.experts.0.{name.split('.')[2].split('_')[1]}_proj.weight"]
            shape, dtype = (config["num_experts"], *first.shape), first.dtype
        else:
            shape, dtype = sample.shape, sample.dtype
        if f32 and dtype == np.uint16:
            dtype = np.dtype(np.float32)
        raw = gguf.GGMLQuantizationType.BF16 if dtype == np.uint16 else None
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, produce, f32 in plan:
        writer.write_tensor_data(np.ascontiguousarray(converted(produce(), f32)))
    writer.close()
    print(f"wrote {out_file} ({out_file.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
