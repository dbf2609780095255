# Issue 15's third GPU call (≈ 3.5 min on an H100): the hybrid input design (host decode, device crops) against
# the host design in one run, each also timed alone without the training step (--feed), and the GPU tests of
# the device-side views.
source .gpu/setup.sh
export AWS_EC2_METADATA_DISABLED=true RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
timeout 45 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_gpu.py -k "views" 2>&1 | tail -3 | tee "$OUT/tests.txt"
timeout 230 python3 benchmarks/bench_gpu_train.py --decode-on host,hybrid --feed 2>"$OUT/gpu_train.err" | tee "$OUT/gpu_train_c.jsonl"
