#!/usr/bin/env bash
# The prepared GPU run (docs/KERNELS.md "The prepared GPU run"), for a machine with CUDA and Triton: the Triton tests
# on the hardware, then the measurements of issue 29's target table, then the table itself.
# Usage: bash benchmarks/gpu_check.sh OUTDIR        (run from anywhere; LF_PYTHON=python3 for the machine image's
#        python, as the first run did)
#        GPU_CHECK_DRY_RUN=1 bash benchmarks/gpu_check.sh OUTDIR   (print each step's name, limit and command; run none)
# Budget: at most 8 minutes. The step limits below sum to 475 s <= 480 s (tests/benchmarks/test_gpu_check_script.py
# holds the sum); each limit has its estimate beside it, from the first H200 run's logs and file times
# (benchmarks/results/gpu_check_h200: the whole first run took 255 s, its Triton tests 61 s of pytest for 55 tests).
#   1. machine               20 s (est.  5): machine.json; stops when no CUDA device is visible
#   2. triton_tests         120 s (est. 105): the Triton-marked tests for real on CUDA (no interpreter), 225 tests:
#                                            every kernel and pass, the streaming passes and the fused landmark solve,
#                                            each for every kernel family of the Triton profile (the Laplacian and
#                                            Gaussian matrices, a case per kernel for exponential, matern32 and
#                                            cauchy, the profile per id: 32 tests, about 80 more JIT compiles)
#                                            (8 xdist workers where pytest-xdist is installed)
#   3. census_tests          25 s (est. 20): tests/benchmarks/test_launch_census.py (launch counts on the hardware)
#   4. gpu_overhead          30 s (est. 15): Tiny 512², batch 8, fp32: eager, device kernels, CUDA-graph replay
#   5. gpu_overhead_bf16     30 s (est. 15): the same under bf16 autocast
#   6. model_throughput      45 s (est. 35): Tiny, batch 8, 224² 512² 768² 1024², inference and training step,
#                                            Laplacian and SR-softmax, fp32 (the first run: 65 s for five variants
#                                            at 224² and 512² with memory)
#   7. model_throughput_bf16 45 s (est. 35): the same under bf16 autocast
#   8. stage_attention       30 s (est. 20): one attention layer per stage at 512² (26 s with three attentions)
#   9. gpu_micro             25 s (est. 10): Newton–Schulz of 64 and 132 matrices 49×49 (time, float64 agreement at
#                                            condition <= 1e3), one kernel matrix at G·N = 131,072, d 64, m 49
#  10. attention_scaling     30 s (est. 15): the operator fwd+bwd against SOFT and SDPA, N = 1k, 4k, 16k, 64k
#                                            (the first run: 33 s for seven methods at seven sizes)
#  11. gpu_overhead_compiled 60 s (est. 50): step 4 again with torch.compile (its compiles took 28 + 11 s on the H200;
#                                            last, so that a compile past its limit costs only this row)
#  12. gpu_targets           15 s (est.  8): the target table, OUTDIR/gpu_targets.{md,json,png}, against the first run
# Every step writes its log (OUTDIR/NAME.log) and results under OUTDIR; a step that fails is reported and the others
# still run; the script exits non-zero at the end when any step failed.
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
dry="${GPU_CHECK_DRY_RUN:-0}"
cd "$root"
unset TRITON_INTERPRET
export PYTHONPATH="$root/src:$root${PYTHONPATH:+:$PYTHONPATH}"
status=0

step() {
  local name="$1" limit="$2"
  shift 2
  if [ "$dry" != 0 ]; then
    printf '%s %s' "$name" "$limit"
    printf ' %q' "$@"
    printf '\n'
    return
  fi
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s, log: $out/$name.log"
  tail -n 5 "$out/$name.log"
  [ "$rc" = 0 ] || status=1
}

existing() {  # the given test files that exist in this checkout
  local f
  for f in "$@"; do [ -e "$f" ] && printf '%s\n' "$f"; done
}

if [ "$dry" != 0 ]; then
  step machine 20 "$py" -
else
  timeout 20 "$py" - >"$out/machine.json" <<'PY'
import json, sys
from laplacianformer.bench.machine import machine_info
info = machine_info()
print(json.dumps(info, indent=2))
if not info["cuda_available"]:
    sys.exit("gpu_check: no CUDA device visible")
PY
  [ $? = 0 ] || { cat "$out/machine.json"; echo "gpu_check: no CUDA device, stopping" >&2; exit 1; }
fi

xdist=()
"$py" -c "import xdist" 2>/dev/null && xdist=(-n 8)
mapfile -t triton_files < <(existing tests/ops/test_kernel_triton.py tests/ops/test_newton_schulz_triton.py \
  tests/ops/test_normalization_native.py tests/ops/test_lean_recompute.py tests/models/test_cuda_graph.py \
  tests/ops/test_streaming.py tests/ops/test_landmark_solve.py tests/layers/test_fused_value_conv.py \
  tests/ops/test_backward_stats_triton.py tests/ops/test_backward_rows_triton.py \
  tests/ops/test_backward_landmarks_triton.py tests/ops/test_fused_training.py tests/ops/test_streaming_dtypes.py)
mapfile -t census_files < <(existing tests/benchmarks/test_launch_census.py)
tiny=(--batch 8)

step triton_tests 120 "$py" -m pytest -q -p no:cacheprovider -m triton "${xdist[@]}" "${triton_files[@]}"
if [ ${#census_files[@]} -gt 0 ]; then
  step census_tests 25 "$py" -m pytest -q -p no:cacheprovider "${census_files[@]}"
fi
step gpu_overhead 30 "$py" -m laplacianformer.bench.gpu_overhead --device cuda --size 512 "${tiny[@]}" --repeats 20 \
  --no-compile --out "$out/gpu_overhead_cuda"
step gpu_overhead_bf16 30 "$py" -m laplacianformer.bench.gpu_overhead --device cuda --size 512 "${tiny[@]}" --repeats 20 \
  --no-compile --autocast bf16 --out "$out/gpu_overhead_cuda_bf16"
for precision in fp32 bf16; do
  if [ "$precision" = fp32 ]; then amp=(); suffix=""; else amp=(--autocast bf16); suffix="_bf16"; fi
  step "model_throughput$suffix" 45 "$py" -m laplacianformer.bench.model_throughput --device cuda "${tiny[@]}" \
    --sizes 224 512 768 1024 --attn laplacian softmax --repeats 8 --max-seconds 4 --no-memory "${amp[@]}" \
    --out "$out/model_throughput_cuda$suffix"
done
step stage_attention 30 "$py" -m laplacianformer.bench.stage_attention --device cuda --size 512 "${tiny[@]}" \
  --attn laplacian softmax --repeats 20 --max-seconds 5 --out "$out/stage_attention_cuda"
step gpu_micro 25 "$py" -m benchmarks.gpu_micro --device cuda --ns-matrices 64 132 --repeats 50 \
  --out "$out/gpu_micro_cuda"
step attention_scaling 30 "$py" -m laplacianformer.bench.attention_scaling --device cuda --methods laplacian soft \
  softmax_sdpa --sizes 32 64 128 256 --repeats 5 --out "$out/attention_scaling_cuda"
step gpu_overhead_compiled 60 "$py" -m laplacianformer.bench.gpu_overhead --device cuda --size 512 "${tiny[@]}" \
  --repeats 10 --compile --out "$out/gpu_overhead_cuda_compiled"
step gpu_targets 15 "$py" -m benchmarks.gpu_targets --measured "$out" --out "$out/gpu_targets"
[ "$dry" != 0 ] && exit 0
cat "$out/gpu_targets.md" 2>/dev/null
echo "gpu_check: results in $out (status $status)"
exit "$status"
