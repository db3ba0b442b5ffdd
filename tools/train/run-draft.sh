#!/usr/bin/env bash
# Reproduces models/conduit-tiny-draft, conduit-tiny's draft model for speculative decoding:
# conduit-tiny's tokenizer on the same corpus -> the `draft` preset distilled from conduit-tiny's
# logits -> bf16 checkpoint. See README.md.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=/usr/bin/python3
OUT=out-draft
TARGET_DIR=../../models/conduit-tiny
MODEL_DIR=../../models/conduit-tiny-draft
export OMP_NUM_THREADS=2
export OMP_WAIT_POLICY=PASSIVE

$PYTHON prepare.py --out "$OUT" --tokenizer "$TARGET_DIR/tokenizer.json"
nice -n 19 $PYTHON train.py --out "$OUT" --num-threads "$OMP_NUM_THREADS" --preset draft --teacher "$TARGET_DIR" \
  --num-steps 400 --stop-after-steps 200 --batch-size 8 --context-tokens 128 --peak-lr 3e-3 --num-warmup-steps 20 --eval-every 100 \
  | tee "$OUT/train.log"
$PYTHON export.py --out "$OUT" --model-dir "$MODEL_DIR"
