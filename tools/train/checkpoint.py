"""Reads an exported checkpoint back into the PyTorch model."""

import json
import os

import torch

from model import LlamaConfig, LlamaForCausalLM
from safetensors_writer import read_safetensors


def load_checkpoint_fp32(model_dir):
    """The checkpoint as tools/train/model.py's model, its stored weights widened exactly to fp32."""
    with open(os.path.join(model_dir, "config.json")) as f:
        hf_config = json.load(f)
    config = LlamaConfig(
        vocab_size=hf_config["vocab_size"],
        hidden_size=hf_config["hidden_size"],
        intermediate_size=hf_config["intermediate_size"],
        num_hidden_layers=hf_config["num_hidden_layers"],
        num_attention_heads=hf_config["num_attention_heads"],
        num_key_value_heads=hf_config["num_key_value_heads"],
        max_position_embeddings=hf_config["max_position_embeddings"],
        rms_norm_eps=hf_config["rms_norm_eps"],
        rope_theta=hf_config["rope_theta"],
        tie_word_embeddings=hf_config["tie_word_embeddings"],
    )
    model = LlamaForCausalLM(config)
    weights = {name: t.to(torch.float32) for name, t in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    if config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()
