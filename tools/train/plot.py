"""Step 6: draws the loss curve of a training run (loss.jsonl) as a PNG."""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

SMOOTHING_STEPS = 20


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loss-log", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    with open(args.loss_log) as f:
        records = [json.loads(line) for line in f]
    steps = [r["step"] for r in records]
    train_losses = [r["trainLoss"] for r in records]
    smoothed = [
        sum(train_losses[max(0, i - SMOOTHING_STEPS + 1) : i + 1]) / (i + 1 - max(0, i - SMOOTHING_STEPS + 1))
        for i in range(len(train_losses))
    ]
    val = [(r["step"], r["valLoss"]) for r in records if "valLoss" in r]

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, train_losses, color="#9ecae1", linewidth=0.8, label="training loss (per step)")
    ax.plot(steps, smoothed, color="#3182bd", linewidth=1.5, label=f"training loss ({SMOOTHING_STEPS}-step mean)")
    ax.plot([s for s, _ in val], [v for _, v in val], "o-", color="#e6550d", label="validation loss")
    ax.set_xlabel("step (4,096 tokens each)")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_ylim(bottom=min(train_losses + [v for _, v in val]) - 0.2, top=min(9, max(train_losses)) + 0.2)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("conduit-tiny on the King James Bible")
    fig.tight_layout()
    fig.savefig(args.output)


if __name__ == "__main__":
    main()
