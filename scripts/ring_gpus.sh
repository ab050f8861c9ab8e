#!/usr/bin/env bash
# Stage 15 on a machine with two GPUs or more (the default phases: under 8 minutes on two H200s;
# train and sanitize, asked for by name: 1 and 2-4 more):
#
#   scripts/ring_gpus.sh OUTDIR [PHASE ...]
#
# Phases (default: build test time torch, in this order; each can run alone once `build` has run):
#   build  stage 15 and what it runs (stages 01, 08, 10-13, the C ABI) in build-ring-gpu/, with NCCL
#          from the CUDA toolkit or the pip package nvidia-nccl-cu13
#   test   its tests with FA_REQUIRE_GPU=1 and FA_REQUIRE_GPUS=2 (nothing may skip)
#   time   bin/15_ring on 1 vs 2 GPUs, forward and forward + backward, causal and not, at
#          N = 32768, 65536 and 131072 (B = 1, H = 16, D = 128, BF16): the table (pass "fwd+bwd13":
#          stage 13's backward in place of stage 11's)
#   torch  the PyTorch op's test under torchrun on 2 GPUs (NCCL), and its times against one GPU
#   train  the training example with each sequence split across 2 GPUs, beside one GPU on whole ones
#   sanitize  compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on the loopback path:
#          3 virtual ranks on one GPU, causal, forward and backward, at a small shape
# Logs go to OUTDIR. NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in everything launched here.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: ring_gpus.sh OUTDIR [build test time torch train sanitize]}
shift
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(build test time torch)
mkdir -p "$out"
out=$(cd "$out" && pwd)
build="$repo/build-ring-gpu"
export NCCL_NVLS_ENABLE=0
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
export FA_CAPI_LIB="$build/lib/libfa_capi.so"

gpus=$(nvidia-smi --list-gpus | wc -l)
echo "GPUs: $gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1))"
[ "$gpus" -ge 2 ] || { echo "ring_gpus: this machine has $gpus GPU(s); stage 15 needs 2 or more"; exit 1; }

phase_build() {
  local nccl_root prefix=() generator=() start
  nccl_root=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  [ -d "$repo/.deps/root/usr" ] && prefix=(-DCMAKE_PREFIX_PATH="$repo/.deps/root/usr")
  command -v ninja >/dev/null && generator=(-G Ninja)
  start=$(date +%s)
  if cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFA_ONLY_STAGES=15_ring \
    ${nccl_root:+-DFA_NCCL_ROOT="$nccl_root"} "${prefix[@]}" >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" --target 15_ring fa_test_stage15 fa_capi >>"$out/build.log" 2>&1; then
    echo "build: ok in $(($(date +%s) - start)) s ($(grep -m1 '15_ring: NCCL' "$out/build.log"))"
  else
    tail -n 30 "$out/build.log"
    echo "build: FAILED (see $out/build.log)"
    return 1
  fi
}

phase_test() {
  local status=0
  (cd "$build" && FA_REQUIRE_GPU=1 FA_REQUIRE_GPUS=2 timeout 300 ctest -R '^stage15:' --output-on-failure) \
    >"$out/test.log" 2>&1 || status=1
  echo "test: $(grep -E 'tests passed' "$out/test.log" | tail -n1); skipped: $(grep -c '\*\*\*Skipped' "$out/test.log")"
  grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|Skipped)\)' "$out/test.log"
  return $status
}

# The C++ ring against one GPU (the median of 3 timed runs after one warm-up); the backward is stage
# 11's, and at N = 65536 stage 13's too.
phase_time() {
  local status=0 run seq backward mask log
  printf '%-8s %-10s %-10s %12s %12s %11s\n' N mask pass "1 GPU ms" "2 GPUs ms" efficiency
  for run in "32768 11" "65536 11" "131072 11" "65536 13"; do
    read -r seq backward <<<"$run"
    for mask in --causal ""; do
      log="$out/ring_${seq}${mask:+_causal}_bwd${backward}.log"
      timeout 150 "$build/bin/15_ring" --gpus 2 -B 1 -H 16 -N "$seq" -D 128 $mask --backward \
        --backward-stage "$backward" --warmup 1 --reps 3 >"$log" 2>&1 ||
        { status=1; echo "15_ring -N $seq $mask --backward-stage $backward failed: $(tail -n 3 "$log" | tr '\n' ' ')"; }
      sed -n 's/.* \(causal\|non-causal\) \(fwd+bwd\|fwd\): one GPU \([0-9.]*\) ms; ring of 2 (NCCL) \([0-9.]*\) ms; efficiency \([0-9.]*\)/\1 \2 \3 \4 \5/p' "$log" |
        while read -r m p one two eff; do
          [ "$backward" = 13 ] && [ "$p" = fwd ] && continue  # the forward is the same as with 11
          printf '%-8s %-10s %-10s %12s %12s %11s\n' "$seq" "$m" "$p${backward/11/}" "$one" "$two" "$eff"
        done
      grep -h '^model:' "$log" | sed "s/^/  N=$seq ${mask:-full}: /"
    done
  done
  return $status
}

phase_torch() {
  local status=0
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$repo/tests/torch/test_ring.py" \
    --gpu --time 32768 131072 >"$out/torchrun.log" 2>&1 || status=1
  grep -E '^(ok|torch op|FAILED|SKIPPED)|Error' "$out/torchrun.log" | head -n 20
  echo "torch: $([ $status -eq 0 ] && echo ok || echo "FAILED (see $out/torchrun.log)")"
  return $status
}

phase_train() {
  local status=0
  timeout 180 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$repo/python/examples/train_ring.py" \
    --steps 150 --seq 4096 --batch 8 --print-every 50 >"$out/train.log" 2>&1 || status=1
  grep -E '^ *[0-9]+ |ranks|final losses|Error' "$out/train.log" | tail -n 8
  echo "train: $([ $status -eq 0 ] && echo ok || echo "FAILED (see $out/train.log)")"
  return $status
}

phase_sanitize() {
  local status=0 tool
  for tool in memcheck racecheck synccheck initcheck; do
    if timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 1 "$build/bin/15_ring" --loopback 3 -B 1 -H 2 \
      -N 390 -D 64 --causal --backward --warmup 0 --reps 1 >"$out/sanitize_$tool.log" 2>&1; then
      echo "sanitize: $tool clean"
    else
      status=1
      echo "sanitize: $tool FAILED: $(grep -m3 -E 'ERROR|Error|error' "$out/sanitize_$tool.log" | tr '\n' ' ')"
    fi
  done
  return $status
}

status=0
for phase in "${phases[@]}"; do
  case $phase in
    build | test | time | torch | train | sanitize) "phase_$phase" || status=1 ;;
    *) echo "ring_gpus: unknown phase '$phase' (build test time torch train sanitize)"; exit 2 ;;
  esac
  [ "$phase" = build ] && [ $status -ne 0 ] && exit 1
done
echo "ring_gpus: $([ $status -eq 0 ] && echo ok || echo "FAILED (see the logs in $out)")"
exit $status
