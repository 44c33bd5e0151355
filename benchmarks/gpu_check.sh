#!/usr/bin/env bash
# GPU check for the fused kernels (docs/KERNELS.md), for a machine with CUDA and Triton.
# Usage: bash benchmarks/gpu_check.sh OUTDIR      (run from anywhere; at most 9.2 minutes: 130 + 80 + 90 + 90 + 40 + 50 + 70 s)
#   1. the Triton tests for real on CUDA (no interpreter): kernel primitives, Newton-Schulz, the normalisation
#      and lean recompute (in parallel workers where pytest-xdist is installed: compiling dominates);
#   2. the kernels benchmark (laplacianformer.bench.kernels) on CUDA and CPU (correctness-gated speedups, first-call compile times);
#   3. attention_scaling on CUDA against SDPA (N = 1k ... 64k);
#   4. model_throughput (Tiny, batch 8, 224² and 512²: the model-zoo target) and
#      stage_attention (one attention layer per stage at 512²) on CUDA;
#   5. roofline --measure: each Triton kernel at the Tiny model's shapes (224² and 1024²),
#      measured vs the H100 roofline estimate (the table of benchmarks/results/roofline_h100.md, docs/KERNELS.md);
#   6. detection_scaling on CUDA: RetinaNet with the Laplacian and SR-softmax Tiny backbones at
#      1024 and 1536 px (inference and a training step; where the classification crossover lay on the H200).
# Every step writes its log and results under OUTDIR; the script exits non-zero when a step fails,
# after running the others.
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
py="${LF_PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
cd "$root"
unset TRITON_INTERPRET
export PYTHONPATH="$root/src:$root${PYTHONPATH:+:$PYTHONPATH}"
status=0

step() {
  local name="$1" limit="$2"
  shift 2
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s, log: $out/$name.log"
  tail -n 5 "$out/$name.log"
  [ "$rc" = 0 ] || status=1
}

"$py" - >"$out/machine.json" <<'PY'
import json, sys
from laplacianformer.bench.machine import machine_info
info = machine_info()
print(json.dumps(info, indent=2))
if not info["cuda_available"]:
    sys.exit("gpu_check: no CUDA device visible")
PY
[ $? = 0 ] || { cat "$out/machine.json"; echo "gpu_check: no CUDA device, stopping" >&2; exit 1; }

xdist=()
"$py" -c "import xdist" 2>/dev/null && xdist=(-n 8)
step triton_tests 130 "$py" -m pytest -q -p no:cacheprovider -m triton "${xdist[@]}" \
  tests/ops/test_kernel_triton.py tests/ops/test_newton_schulz_triton.py tests/ops/test_normalization_native.py \
  tests/ops/test_lean_recompute.py tests/models/test_cuda_graph.py
step kernels_bench 80 "$py" -m laplacianformer.bench.kernels --devices cuda --sizes 1024 4096 16384 65536 --naive-max-n 4096 \
  --check-max-n 16384 --repeats 10 --out "$out/kernels_cuda"
step attention_scaling 90 "$py" -m laplacianformer.bench.attention_scaling --device cuda --repeats 5 \
  --out "$out/attention_scaling_cuda"
step model_throughput 90 "$py" -m laplacianformer.bench.model_throughput --device cuda --batch 8 --sizes 224 512 --repeats 10 \
  --max-seconds 8 --out "$out/model_throughput_cuda"
step stage_attention 40 "$py" -m laplacianformer.bench.stage_attention --device cuda --batch 8 --repeats 20 \
  --out "$out/stage_attention_cuda"
step roofline 50 "$py" -m laplacianformer.bench.roofline --measure --repeats 20 --out "$out/roofline_measured.json"
step detection_scaling 70 "$py" -m laplacianformer.bench.detection_scaling --device cuda --sizes 1024 1536 \
  --variants laplacian sr-softmax --repeats 5 --max-seconds 10 --memory rss --no-progress \
  --out "$out/detection_scaling_cuda"
cat "$out/roofline.log"
echo "gpu_check: results in $out (status $status)"
exit "$status"
