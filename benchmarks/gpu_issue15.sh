# Issue 15's GPU measurements in one run (≈ 7 min on an H100): the service's images/s with each input design
# against its in-memory ceiling, the step's speed settings one by one, and the GPU tests (device input path
# included). On the lent GPU machine, after `../shared/tools/gpu-bundle` here (carry .gpu):
#   bash benchmarks/gpu_issue15.sh        # writes gpu_train.jsonl, gpu_step.{json,md}, tests.txt to $OUT
source .gpu/setup.sh
export AWS_EC2_METADATA_DISABLED=true RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
nvidia-smi -L; nproc
echo "== bench_gpu_train: host vs device input design (ViT-B/16, 224 px crops of 448 px JPEGs, 128 + 128)"
timeout 300 python3 benchmarks/bench_gpu_train.py 2>"$OUT/gpu_train.err" | tee "$OUT/gpu_train.jsonl"
tail -5 "$OUT/gpu_train.err"
echo "== bench_gpu_step: compile / channels_last one by one, and the input designs' cost per step"
timeout 220 python3 benchmarks/bench_gpu_step.py --out "$OUT" 2>&1 | tail -22
echo "== GPU tests"
timeout 90 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
