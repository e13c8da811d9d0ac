#!/usr/bin/env bash
# The checks of docs/gpu.md in one pass on a GPU machine, each under its own time limit, each
# logged to OUT/<n>-<name>.log; a failing step is reported and the next one still runs.
#
#     bash benchmarks/gpu_checks.sh OUT [POOL.parquet]
#
# Runs from the repository root, with rlmlab installed or importable (PYTHONPATH=.). POOL is an
# expression pool for the short paper-preset training (default: built here, 20,000 at seed 42).
# docs/gpu.md ("On an H200") has what each step took on an H200 and what it found.
set -u
out=${1:?usage: gpu_checks.sh OUT [POOL.parquet]}
pool=${2:-}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS CMD...: run CMD under a limit, log it, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s)
    echo "=== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "=== $name: exit $rc after $(( $(date +%s) - t0 ))s"
}

step 0-machine 60 bash -c "nvidia-smi; $py -c 'import torch, sys; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name(0))'"
# 1. The fused FlexAttention kernel against the dense mask, then both learners at paper size,
#    compiled, bf16 (the benchmark stops before timing if the kernel differs).
step 1a-bench-cot 300 $py benchmarks/bench_gpu.py --learners cot --seconds 10
step 1b-bench-rm 300 $py benchmarks/bench_gpu.py --learners rm --seconds 10
# 2. bf16 decoding on CUDA against the committed fp32 CPU decoding of the released checkpoints:
#    10 expressions a bin, both learners; prints how many predictions and divergences agree.
step 2-decode 600 $py -m rlmlab reproduce results/length-595-paper-cpu \
    --checkpoints rlmlab/released/paper-cpu-length-595 --sample 10 --out "$out/reproduce"
# 3. A short paper-preset training, compiled, one micro-batch per step: start-up lines and tok/s.
if [ -z "$pool" ]; then
    pool=$out/pool20k.parquet
    step 3a-pool 120 $py -m rlmlab data pool --n 20000 --seed 42 --out "$pool"
fi
step 3-train-cot 300 $py -m rlmlab train --learner cot --model paper --data "$pool" --out "$out/cot-paper" \
    --max-steps 400 --quiet --train.compile=true --train.micro_batch_tokens=65536 \
    --train.eval_every=200 --train.log_every=50
# 4. The CPU guards and the model tests on this machine (test_model's block-diagonal test runs on CUDA here).
step 4-tests 600 $py -m pytest -q -x -p no:cacheprovider tests/test_gpu_path.py tests/test_model.py
