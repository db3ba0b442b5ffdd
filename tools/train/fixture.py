"""Step 4: the runtime's reference. Loads the exported bf16 checkpoint, widens the weights
to fp32, and records this PyTorch model's fp32 logits at every position of fixed prompts:
fixtures/reference-logits.bin (float32 little-endian, [position][vocab] per prompt, prompts
in order) and fixtures/reference-logits.json (prompts, token ids, checkpoint hash)."""

import argparse
import hashlib
import json
import os

import torch

import bpe
from checkpoint import load_checkpoint_fp32

PROMPTS = [
    "In the beginning God created the heaven and the earth.",
    "And it came to pass, when the king heard the words of the law, that he rent his clothes."
    " And the king commanded Hilkiah the priest, saying,",
]
FIXTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--fixture-dir", default=FIXTURE_DIR)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = load_checkpoint_fp32(args.model_dir)
    tokenizer = bpe.load_tokenizer_json(os.path.join(args.model_dir, "tokenizer.json"))
    os.makedirs(args.fixture_dir, exist_ok=True)

    prompts = []
    num_positions = 0
    with open(os.path.join(args.fixture_dir, "reference-logits.bin"), "wb") as f, torch.no_grad():
        for text in PROMPTS:
            token_ids = tokenizer.encode(text)
            logits = model(torch.tensor([token_ids]))[0].to(torch.float32).contiguous()
            f.write(logits.numpy().astype("<f4").tobytes())
            prompts.append({"text": text, "tokenIds": token_ids, "firstPosition": num_positions})
            num_positions += len(token_ids)
    fixture = {
        "about": "fp32 logits of tools/train/model.py on the bf16 checkpoint widened to fp32",
        "checkpointSha256": sha256_of(os.path.join(args.model_dir, "model.safetensors")),
        "vocabSize": model.config.vocab_size,
        "numPositions": num_positions,
        "prompts": prompts,
    }
    with open(os.path.join(args.fixture_dir, "reference-logits.json"), "w") as f:
        json.dump(fixture, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
