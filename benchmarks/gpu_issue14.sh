# (Superseded by benchmarks/gpu_issue14_15.sh, which runs these rows five seeds at once and then issue 15's.)
# Issue 14's GPU rows in one call (≤ 8 min on an H200): image-mode OpenClipart-LT with configs/openclipart.yaml,
# ncdlr against UNO, seed by seed (as many pairs as fit in 420 s), 10 epochs, 64 + 64 images a step on one GPU
# worker: the cached cells' budget, so the rows can be set beside the cached regime on the same prepared data.
#
# Here first, once (CPU; what travels must stay ≤ 64 MiB: the checkout ≈ 2.4 MB + .gpu 46 MB + .gpu-data 17 MB):
#   ../shared/tools/gpu-bundle --with-lite0                    # Ray + the efficientnet_lite0 weights → .gpu/
#   .venv/bin/ncdlr prepare openclipart --max-side 160 --format jpeg --jpeg-quality 70 --out .gpu-data/oc160
# (.gpu/ and .gpu-data/ are in .gitignore, so they travel only when carried.)
# The call (device tool): command "bash benchmarks/gpu_issue14.sh", carry [".gpu", ".gpu-data"], timeout_s 540.
# What comes back under $OUT: card.txt, gpu_quality.jsonl (one line per run), gpu_quality.txt (the lines and the
# table), gpu_quality.err (the runs' progress and warnings, last 300 lines).
# The cached regime on the same data, on CPU (measured in session 40: docs/results.md "Session 40"; since then the
# cache rebuilds to the bit with the same threads on the same kind of CPU; both sets of rows: docs/activation-cache.md,
# last section):
#   .venv/bin/ncdlr embed --data .gpu-data/oc160 --encoder efficientnet_lite0 --image-size 160 --trainable-blocks 1 \
#       --views 8 --actors 2 --threads 1 --batch-size 32 --out /work/cache/oc160-lite0-160-b1-v8
#   .venv/bin/python benchmarks/quality.py --datasets openclipart-cached \
#       --table openclipart-cached=/work/cache/oc160-lite0-160-b1-v8 --variants ncdlr-uniform-relax-task-cb uno \
#       --seeds 3 --holdout-view --results /work/cache/quality-oc160
source .gpu/setup.sh || exit 1
export AWS_EC2_METADATA_DISABLED=true RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/card.txt"
[ -f .gpu-data/oc160/manifest.json ] || { echo "no .gpu-data/oc160: prepare it here and carry .gpu-data"; exit 2; }
timeout 480 python3 benchmarks/gpu_quality.py --data .gpu-data/oc160 --seeds 5 --budget-s 420 --out "$OUT" \
  2> >(tail -n 300 > "$OUT/gpu_quality.err") | tee "$OUT/gpu_quality.txt"
