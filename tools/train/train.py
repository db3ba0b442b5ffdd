"""Step 2: trains the model on the prepared token stream with fixed seeds and writes the
fp32 weights and the loss log to the output directory."""

import argparse
import dataclasses
import json
import math
import os
import time

import torch

from checkpoint import load_checkpoint_fp32
from model import LlamaConfig, LlamaForCausalLM

SEED = 1611


# conduit-tiny, and its draft for speculative decoding: a quarter of the layers, half the width,
# the same head size (the draft's step costs ~1/6 of the target's, mostly its output layer).
PRESETS = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4),
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2),
}


def model_config(preset, vocab_size, context_tokens):
    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=context_tokens, **PRESETS[preset])


def distillation_loss(student_logits, teacher_logits):
    """KL(teacher || student) per token: the student learns the teacher's whole distribution,
    which is what a draft is accepted on, not just the corpus's next token."""
    vocab_size = student_logits.shape[-1]
    return torch.nn.functional.kl_div(
        torch.log_softmax(student_logits.reshape(-1, vocab_size), dim=-1),
        torch.log_softmax(teacher_logits.reshape(-1, vocab_size), dim=-1),
        log_target=True,
        reduction="batchmean",
    )


def learning_rate(step, num_steps, peak, num_warmup_steps, final_fraction=0.1):
    """Linear warmup, then cosine decay to final_fraction of the peak."""
    if step < num_warmup_steps:
        return peak * (step + 1) / num_warmup_steps
    progress = (step - num_warmup_steps) / max(1, num_steps - num_warmup_steps)
    return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def sample_windows(stream, num_windows, context_tokens, generator):
    """Random windows of context_tokens + 1 ids: inputs and next-token targets."""
    starts = torch.randint(0, len(stream) - context_tokens - 1, (num_windows,), generator=generator)
    windows = torch.stack([stream[s : s + context_tokens + 1] for s in starts.tolist()]).long()
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def validation_loss(model, stream, context_tokens, batch_size):
    """Mean next-token loss over the whole validation stream in consecutive windows."""
    model.eval()
    num_windows = (len(stream) - 1) // context_tokens
    total_loss = 0.0
    for first in range(0, num_windows, batch_size):
        starts = range(first * context_tokens, min(num_windows, first + batch_size) * context_tokens, context_tokens)
        windows = torch.stack([stream[s : s + context_tokens + 1] for s in starts]).long()
        logits = model(windows[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1), reduction="sum"
        )
        total_loss += loss.item()
    model.train()
    return total_loss / (num_windows * context_tokens)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-steps", type=int, default=700)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context-tokens", type=int, default=256)
    parser.add_argument("--peak-lr", type=float, default=2.5e-3)
    parser.add_argument("--num-warmup-steps", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--stop-after-steps", type=int, help="end here, the schedule still that of --num-steps (a time budget)")
    parser.add_argument("--teacher", help="a checkpoint directory to distil from (KL to its logits) instead of the corpus's next tokens")
    args = parser.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(args.num_threads)
    train_stream = torch.load(os.path.join(args.out, "train.pt"))
    val_stream = torch.load(os.path.join(args.out, "val.pt"))
    with open(os.path.join(args.out, "data.json")) as f:
        vocab_size = json.load(f)["vocabSize"]

    config = model_config(args.preset, vocab_size, args.context_tokens)
    model = LlamaForCausalLM(config)
    teacher = load_checkpoint_fp32(args.teacher) if args.teacher else None
    if teacher is not None and teacher.config.vocab_size != vocab_size:
        raise SystemExit(f"teacher vocab {teacher.config.vocab_size} != data vocab {vocab_size}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.peak_lr,
        betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(SEED)
    log_path = os.path.join(args.out, "loss.jsonl")
    log = open(log_path, "w")
    print(json.dumps({"numParameters": model.num_parameters(), "config": dataclasses.asdict(config)}), flush=True)

    start_s = time.time()
    num_steps_run = min(args.num_steps, args.stop_after_steps or args.num_steps)
    for step in range(num_steps_run):
        lr = learning_rate(step, args.num_steps, args.peak_lr, args.num_warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = sample_windows(train_stream, args.batch_size, args.context_tokens, generator)
        logits = model(inputs)
        if teacher is None:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))
        else:
            with torch.no_grad():
                teacher_logits = teacher(inputs)
            loss = distillation_loss(logits, teacher_logits)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

        record = {"step": step + 1, "trainLoss": loss.item(), "lr": lr, "elapsedS": time.time() - start_s}
        if (step + 1) % args.eval_every == 0 or step + 1 == num_steps_run:
            record["valLoss"] = validation_loss(model, val_stream, args.context_tokens, args.batch_size)
            torch.save(model.state_dict(), os.path.join(args.out, "model-fp32.pt"))
            print(json.dumps(record), flush=True)
        log.write(json.dumps(record) + "\n")
        log.flush()

    summary = {
        "numParameters": model.num_parameters(),
        "numSteps": num_steps_run,
        "numScheduledSteps": args.num_steps,
        "numTrainingTokensSeen": num_steps_run * args.batch_size * args.context_tokens,
        "trainingSeconds": time.time() - start_s,
        "finalValLoss": record["valLoss"],
        "numThreads": args.num_threads,
        "preset": args.preset,
        "teacher": os.path.basename(os.path.normpath(args.teacher)) if args.teacher else None,
        "config": dataclasses.asdict(config),
    }
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
