#!/usr/bin/env bash
# Reproduces models/conduit-tiny from scratch: corpus -> tokenizer -> training -> bf16
# checkpoint -> reference logits fixture -> samples and loss curve. See README.md.
set -euo pipefail
cd "$(dirname "$0")"

# Debian's torch is installed for /usr/bin/python3, whatever python3 comes first on PATH.
PYTHON=/usr/bin/python3
OUT=out
MODEL_DIR=../../models/conduit-tiny
# Fixed thread count: the reduction order, and so the exact weights, depend on it.
export OMP_NUM_THREADS=2
# Threads that wait at a barrier sleep instead of spinning: on shared cores the spinning
# steals the time the other thread needs. It changes timing only, never results.
export OMP_WAIT_POLICY=PASSIVE

$PYTHON prepare.py --out "$OUT"
nice -n 19 $PYTHON train.py --out "$OUT" --num-threads "$OMP_NUM_THREADS" | tee "$OUT/train.log"
$PYTHON export.py --out "$OUT" --model-dir "$MODEL_DIR"
$PYTHON fixture.py --model-dir "$MODEL_DIR"
$PYTHON sample.py --model-dir "$MODEL_DIR" --output "$OUT/samples.md"
$PYTHON plot.py --loss-log "$OUT/loss.jsonl" --output "$MODEL_DIR/loss-curve.png"
