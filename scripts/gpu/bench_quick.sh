set -u
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
python3 -m pytest tests/test_gpu_triton.py -q -p no:cacheprovider -k "bf16_round" 2>&1 | tail -n 2
for cm in "one-256M/fp32 clip" "one-256M/fp32 adamw" "one-256M/bf16 adamw-bf16m-rne" "one-256M/bf16 adamw" "gpt2-124m/fp32 adamw"; do
  set -- $cm
  timeout 120 python3 benchmarks/bench_kernels.py --case $1 --mode $2 --out $OUT/kernels.csv 2>&1 | tail -n 12
done
timeout 300 python3 benchmarks/bench_step.py --out $OUT/bench.csv --cases one-256M/fp32,one-256M/bf16,gpt2-124m/fp32,gpt2-124m/bf16 --modes adamw,clip,adamw-bf16m-rne,adamw-rne --impls luminamoon-triton,torch-adamw-fused 2>&1 | tee $OUT/bench.log | tail -n 30
