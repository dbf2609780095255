# One prepared GPU check (issue 13): the GPU tests, a real Ray Train run with one GPU worker through the
# service's worker/method/console path, and bench_gpu's step + OT numbers. On the lent GPU machine, after
# `../shared/tools/gpu-bundle` here (carry .gpu):  bash benchmarks/gpu_check.sh   (~2 min on an H100)
source .gpu/setup.sh
export AWS_EC2_METADATA_DISABLED=true RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1
nvidia-smi -L
echo "== tests/test_gpu.py"
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_gpu.py tests/test_layers.py 2>&1 | tail -4
echo "== ncdlr train on a feature table, one GPU worker"
python3 -c "
from ncdlr.data.features import synthetic_features, write_feature_table
x, y, s = synthetic_features(num_known=50, num_novel=50, dim=256, n_max=400, ratio=20, test_per_class=10, seed=0)
write_feature_table('/tmp/f.parquet', x, y, s, num_known=50, num_novel=50)"
timeout 200 python3 -m ncdlr.cli train --features /tmp/f.parquet --output /tmp/run --use-gpu true --num-workers 1 \
  --cpus-per-worker 4 --epochs 3 --gamma 25 --batch-size 128 --buffer-size 2048 2>&1 | tail -25
cp /tmp/run/metrics.json /tmp/run/train.log $OUT/ 2>/dev/null
echo "== bench_gpu"
timeout 200 python3 benchmarks/bench_gpu.py --out $OUT 2>&1 | tail -40
echo "== bench_gpu_train (issue 15): the service's images/s against the in-memory step ceiling"
timeout 240 python3 benchmarks/bench_gpu_train.py 2>&1 | tail -3 | tee $OUT/gpu_train.json
