#!/usr/bin/env bash
# All GPU checks and GPU benchmarks in one run, for a machine with a CUDA GPU whose
# Python already has torch (CUDA build). The project's pure-Python dependencies come
# from a folder prepared beforehand on a machine with network access:
#   python -m pip install --target .gpu-deps typer rich psutil PyYAML nvidia-ml-py \
#       pytest pytest-timeout hypothesis jsonschema
# and, for the FP8 test, a torchao release built for the GPU machine's torch (torchao's
# README lists which torch each release needs); without it that one test skips.
# Results go to ${OUT:-benchmarks/results/gpu} as JSON and text.
#
#   benchmarks/gpu_suite.sh [all|tests|gpt|resnet]
# `all` (the default) runs everything; the parts fit one short call each when a
# lease allows only a few minutes per command (torch.compile takes a while per model).
set -uo pipefail
part="${1:-all}"
case "$part" in all|tests|gpt|resnet) ;; *) echo "unknown part '$part': all, tests, gpt or resnet" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/gpu}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD/.gpu-deps${PYTHONPATH:+:$PYTHONPATH}"
gpu=$(python -c 'import torch; print(torch.cuda.get_device_name(0))' 2>&1)
echo "GPU: $gpu" | tee "$out/gpu.txt"
nvidia-smi >>"$out/gpu.txt" 2>&1 || true

if [[ "$part" == all || "$part" == tests ]]; then
    # only the files that hold GPU tests: collecting the rest would need every dev extra
    gpu_tests=$(grep -l "mark.gpu" tests/test_*.py)
    python -m pytest -m gpu -q -p no:cacheprovider --timeout 300 $gpu_tests 2>&1 \
        | tee "$out/pytest_gpu.txt"
    python -m cloudtrain.cli bench --json >"$out/bench.json" 2>"$out/bench.err"
    python -m cloudtrain.cli doctor --json >"$out/doctor.json" 2>&1
    python benchmarks/sampler_overhead.py --out "$out/sampler_overhead.json" \
        >"$out/sampler_overhead.log" 2>&1
fi
for model in gpt2_124m resnet50; do
    short="${model%%[0-9_]*}"  # gpt, resnet
    [[ "$part" == all || "$part" == "$short" ]] || continue
    extra=()  # FP8 (d) for the GPT when torchao is there
    [[ "$short" == gpt ]] && python -c 'import torchao' 2>/dev/null && extra=(--fp8)
    python benchmarks/train_throughput.py --skip-cpu --models "$model" "${extra[@]}" \
        --out "$out/train_throughput_$model.json" 2>&1 | tee "$out/train_throughput_$model.log"
done
ls -l "$out"
