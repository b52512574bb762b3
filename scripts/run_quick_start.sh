#!/usr/bin/env bash
# Quick start on the CIFAR-10 sample shipped in data/ (1,000 train + 200 test real images), CPU:
# install, train ResNet-18 for a few epochs, evaluate, export to MindIR, predict.
#   bash scripts/run_quick_start.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-output/quick_start}"
source scripts/setup_env.sh requirements.txt

CONFIG=(--config_path configs/quick_start.yaml --output_dir "$OUT")
# --overwrite true: a second quick start moves the first one's files into $OUT/previous_run_*/
python train.py "${CONFIG[@]}" --overwrite true
CKPT="$(ls -t "$OUT"/resnet18-*_*.ckpt | head -n 1)"
python eval.py "${CONFIG[@]}" --checkpoint_path "$CKPT" --data_path data/cifar10_sample/test
python export.py "${CONFIG[@]}" --checkpoint_path "$CKPT" --file_format MINDIR \
    --file_name "$OUT/resnet18_quick_start" --batch_size 1
python predict.py "${CONFIG[@]}" --checkpoint_path "$OUT/resnet18_quick_start.mindir" \
    --batch_size 1 --image_path data/cifar10_sample/test/ship \
    --class_names_path "$OUT/class_names.txt" --top_k 3
echo "quick start done: checkpoint $CKPT, metrics $OUT/metrics.jsonl, eval $OUT/eval_result.json, report $OUT/report.html"
