"""Step 1: reads the corpus, trains the tokenizer on the training split, and writes the
tokenizer and both splits as token ids to the output directory."""

import argparse
import json
import os
import shutil

import torch

import bpe
import corpus

END_OF_TEXT = "<|endoftext|>"
VOCAB_SIZE = 4096


def encode_documents(tokenizer, documents):
    """One stream: each document's ids followed by the end-of-text id."""
    end_of_text_id = tokenizer.special_tokens[END_OF_TEXT]
    ids = []
    for document in documents:
        ids.extend(tokenizer.encode(document))
        ids.append(end_of_text_id)
    return torch.tensor(ids, dtype=torch.int16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer", help="encode with this tokenizer.json instead of training one (a draft model must share its target's ids)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    training, validation = corpus.split_chapters(corpus.read_chapters())
    if args.tokenizer:
        tokenizer = bpe.load_tokenizer_json(args.tokenizer)
    else:
        num_byte_tokens = 256
        merges = bpe.train_merges(training, VOCAB_SIZE - num_byte_tokens - 1)
        tokenizer = bpe.ByteLevelBpe(merges, [END_OF_TEXT])
    assert tokenizer.vocab_size == VOCAB_SIZE, tokenizer.vocab_size
    if args.tokenizer:
        shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    else:
        bpe.save_tokenizer_json(tokenizer, os.path.join(args.out, "tokenizer.json"))

    splits = {"train": encode_documents(tokenizer, training), "val": encode_documents(tokenizer, validation)}
    for name, ids in splits.items():
        torch.save(ids, os.path.join(args.out, f"{name}.pt"))
    summary = {
        "numTrainingChapters": len(training),
        "numValidationChapters": len(validation),
        "numTrainingTokens": len(splits["train"]),
        "numValidationTokens": len(splits["val"]),
        "numTrainingBytes": sum(len(c.encode("utf-8")) for c in training),
        "vocabSize": tokenizer.vocab_size,
    }
    with open(os.path.join(args.out, "data.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
