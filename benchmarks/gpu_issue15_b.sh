# Issue 15's second GPU call (≈ 4 min on an H100): the GPU tests, the ViT step with and without torch.compile
# plus the input designs' cost per step, and the host design with 14 instead of 12 CPUs for Ray Data.
source .gpu/setup.sh
export AWS_EC2_METADATA_DISABLED=true RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
echo "== GPU tests"
timeout 60 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
echo "== bench_gpu_step (ViT-B/16: eager vs torch.compile; input designs)"
timeout 150 python3 benchmarks/bench_gpu_step.py --encoders vit --out "$OUT" 2>&1 | grep -v Warning | tail -12
echo "== bench_gpu_train host design, worker reserves 2 CPUs (14 for Ray Data)"
timeout 120 python3 benchmarks/bench_gpu_train.py --decode-on host --cpus-per-worker 2 2>"$OUT/gpu_train.err" | tee "$OUT/gpu_train_b.jsonl"
