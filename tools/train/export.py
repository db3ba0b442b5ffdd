"""Step 3: writes the trained weights as a Hugging Face checkpoint in bf16: config.json,
model.safetensors, tokenizer.json, tokenizer_config.json and generation_config.json."""

import argparse
import json
import os
import shutil

import torch

from prepare import END_OF_TEXT
from safetensors_writer import write_safetensors
from model import LlamaConfig

# A plain role-prefixed transcript; the model was never trained on it (see the model card).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# RoPE has no learned positions, so the checkpoint runs at any length; training saw windows of
# --context-tokens, and text quality falls past them (the model card says so). The served
# limit stays generous so long requests are served rather than refused.
SERVED_MAX_POSITION_EMBEDDINGS = 2048
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 128}


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def config_json(config, end_of_text_id):
    """config.json as transformers writes it for LlamaForCausalLM (without
    transformers_version: it did not write this one)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": end_of_text_id,
        "eos_token_id": end_of_text_id,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": config.initializer_range,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": SERVED_MAX_POSITION_EMBEDDINGS,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": config.vocab_size,
    }


def tokenizer_config_json(end_of_text_id, max_length_tokens):
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(end_of_text_id): {
                "content": END_OF_TEXT,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
        "bos_token": END_OF_TEXT,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": END_OF_TEXT,
        "model_max_length": max_length_tokens,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the training output directory")
    parser.add_argument("--model-dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.model_dir, exist_ok=True)

    with open(os.path.join(args.out, "train.json")) as f:
        config = LlamaConfig(**json.load(f)["config"])
    end_of_text_id = config.vocab_size - 1
    state = torch.load(os.path.join(args.out, "model-fp32.pt"))
    if config.tie_word_embeddings:
        del state["lm_head.weight"]  # transformers stores a tied head once, as the embedding
    write_safetensors(
        os.path.join(args.model_dir, "model.safetensors"),
        {name: tensor.to(torch.bfloat16) for name, tensor in state.items()},
    )
    write_json(os.path.join(args.model_dir, "config.json"), config_json(config, end_of_text_id))
    write_json(
        os.path.join(args.model_dir, "generation_config.json"),
        {"bos_token_id": end_of_text_id, "eos_token_id": end_of_text_id, **GENERATION_DEFAULTS},
    )
    write_json(
        os.path.join(args.model_dir, "tokenizer_config.json"),
        tokenizer_config_json(end_of_text_id, SERVED_MAX_POSITION_EMBEDDINGS),
    )
    shutil.copyfile(os.path.join(args.out, "tokenizer.json"), os.path.join(args.model_dir, "tokenizer.json"))


if __name__ == "__main__":
    main()
