# Issues 14 and 15 in one GPU call (≤ 9.5 min on an H200; a session has 15 min of device time, start included).
#   1. the GPU tests (tests/test_gpu.py: labeler, buffer, step and device-side views on CUDA against CPU);
#   2. issue 14's GPU rows: image-mode OpenClipart-LT with configs/openclipart.yaml, ncdlr against UNO, 10 epochs,
#      64 + 64 images a step on one GPU worker, seeds 0..SEEDS-1 (default 5) at once: one process per seed, each
#      its own local Ray and its ncdlr-then-UNO pair (expected, not yet measured: a lite0 step at 160 px leaves the
#      H200 mostly idle, and a short run's wall time is mostly Ray's start-ups, which the concurrent runs overlap);
#   3. issue 15: bench_gpu_train (ViT-B/16, 224-px crops of 448-px JPEGs, 128 + 128) with the host and hybrid input
#      designs at data.epochs_per_execution 4 and then 1 (in that order; what the time limit cuts is the last).
# Here first, once (CPU; what travels must stay ≤ 64 MiB: the checkout ≈ 2.5 MB + .gpu 46 MB + .gpu-data 17 MB):
#   ../shared/tools/gpu-bundle --with-lite0
#   .venv/bin/ncdlr prepare openclipart --max-side 160 --format jpeg --jpeg-quality 70 --out .gpu-data/oc160
# The call (device tool): command "bash benchmarks/gpu_issue14_15.sh", carry [".gpu", ".gpu-data"], timeout_s 590.
# Back under $OUT (≤ 8 files): card.txt, tests.txt, gpu_quality.jsonl + gpu_quality.txt (rows, table),
# gpu_quality.err (each process's last lines), gpu_train.jsonl + gpu_train.err.
# A dry run on CPU at toy sizes (the wiring only): SMOKE=1 SEEDS=2 bash benchmarks/gpu_issue14_15.sh
set -u
export AWS_EC2_METADATA_DISABLED=true RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
SEEDS=${SEEDS:-5}
WORK=$(mktemp -d /tmp/gpu-issue14-15.XXXX)
if [ "${SMOKE:-0}" = 1 ]; then
  PY=${PY:-.venv/bin/python}; FLAG=--smoke; DATA=(); T_TESTS=60; T_QUALITY=600; T_TRAIN=600
  echo "smoke: $(nproc) CPUs" | tee "$OUT/card.txt"
else
  source .gpu/setup.sh || exit 1
  PY=python3; FLAG=; DATA=(--data .gpu-data/oc160); T_TESTS=60; T_QUALITY=300; T_TRAIN=215
  { nvidia-smi -L; nproc; } | tee "$OUT/card.txt"
  [ -f .gpu-data/oc160/manifest.json ] || { echo "no .gpu-data/oc160: prepare it here and carry .gpu-data"; exit 2; }
fi

echo "== 1. GPU tests"
timeout $T_TESTS $PY -m pytest -q -p no:cacheprovider --noconftest tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/tests.txt"

echo "== 2. issue 14: ncdlr and UNO, seeds 0..$((SEEDS - 1)) at once ($T_QUALITY s at most)"
pids=()
for ((s = 0; s < SEEDS; s++)); do
  timeout $T_QUALITY $PY benchmarks/gpu_quality.py $FLAG "${DATA[@]}" --seed-start $s --seeds 1 --cpus-per-worker 2 \
    --object-store-gb 4 --jsonl "$WORK/s$s.jsonl" >"$WORK/s$s.out" 2>"$WORK/s$s.err" &
  pids+=($!)
done
for i in "${!pids[@]}"; do wait "${pids[$i]}"; echo "seed $i: exit $?" | tee -a "$WORK/exits.txt"; done
for ((s = 0; s < SEEDS; s++)); do echo "== seed $s"; tail -n 40 "$WORK/s$s.err"; done > "$OUT/gpu_quality.err"
cat "$WORK/exits.txt" >> "$OUT/gpu_quality.err"
$PY benchmarks/gpu_quality.py --summarize "$WORK"/s*.jsonl --out "$OUT" | tee "$OUT/gpu_quality.txt"

echo "== 3. issue 15: bench_gpu_train, host and hybrid at epochs_per_execution 4 then 1 ($T_TRAIN s at most)"
timeout $T_TRAIN $PY benchmarks/bench_gpu_train.py $FLAG --decode-on host,hybrid --epochs-per-execution 4,1 \
  2> >(tail -n 200 > "$OUT/gpu_train.err") | tee "$OUT/gpu_train.jsonl"
rm -rf "$WORK"
