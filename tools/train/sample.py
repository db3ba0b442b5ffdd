"""Step 5: continues fixed prompts with the exported checkpoint under its own default
sampling settings (generation_config.json), for the model card."""

import argparse
import json
import os

import torch

import bpe
from checkpoint import load_checkpoint_fp32

PROMPTS = ["In the beginning", "And Jesus said unto them,", "The LORD is my shepherd;", "Blessed are the"]
SEED = 1611


def top_p_filter(probs, top_p):
    """Zeroes the tail outside the smallest set of tokens whose probability reaches top_p."""
    sorted_probs, order = probs.sort(descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    sorted_probs[outside] = 0
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


@torch.no_grad()
def continue_text(model, token_ids, defaults, generator):
    ids = list(token_ids)
    max_positions = model.config.max_position_embeddings
    for _ in range(defaults["max_new_tokens"]):
        if len(ids) >= max_positions:
            break
        logits = model(torch.tensor([ids]))[0, -1]
        probs = top_p_filter(torch.softmax(logits / defaults["temperature"], dim=-1), defaults["top_p"])
        next_id = torch.multinomial(probs, 1, generator=generator).item()
        if next_id == defaults["eos_token_id"]:
            break
        ids.append(next_id)
    return ids[len(token_ids) :]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--output", required=True, help="a Markdown file")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = load_checkpoint_fp32(args.model_dir)
    tokenizer = bpe.load_tokenizer_json(os.path.join(args.model_dir, "tokenizer.json"))
    with open(os.path.join(args.model_dir, "generation_config.json")) as f:
        defaults = json.load(f)
    generator = torch.Generator().manual_seed(SEED)
    with open(args.output, "w") as f:
        for prompt in PROMPTS:
            completion = tokenizer.decode(continue_text(model, tokenizer.encode(prompt), defaults, generator))
            f.write(f"**{prompt}**{completion}\n\n---\n\n")


if __name__ == "__main__":
    main()
