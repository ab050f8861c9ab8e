#!/usr/bin/env bash
# Stage 15 on a machine with two GPUs or more (about 6 minutes on two H200s):
#
#   scripts/ring_gpus.sh OUTDIR
#
# 1. builds stage 15 and what it runs (stages 01, 08, 10, 11, 12, the C ABI) in build-ring-gpu/,
#    with NCCL from the CUDA toolkit or the pip package nvidia-nccl-cu13;
# 2. runs its tests with FA_REQUIRE_GPU=1 and FA_REQUIRE_GPUS=2 (nothing may skip);
# 3. times bin/15_ring on 1 vs 2 GPUs, forward and forward + backward, causal and not, at
#    N = 32768, 65536 and 131072 (B = 1, H = 16, D = 128, BF16), and prints the table;
# 4. runs the PyTorch op's test under torchrun on 2 GPUs (NCCL), and times it against one GPU.
# Logs go to OUTDIR. NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in everything launched here.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: ring_gpus.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build="$repo/build-ring-gpu"
export NCCL_NVLS_ENABLE=0
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
status=0

gpus=$(nvidia-smi --list-gpus | wc -l)
echo "GPUs: $gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1))"
[ "$gpus" -ge 2 ] || { echo "ring_gpus: this machine has $gpus GPU(s); stage 15 needs 2 or more"; exit 1; }

# 1. Build.
nccl_root=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
prefix=()
[ -d "$repo/.deps/root/usr" ] && prefix=(-DCMAKE_PREFIX_PATH="$repo/.deps/root/usr")
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
start=$(date +%s)
if cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFA_ONLY_STAGES=15_ring \
  ${nccl_root:+-DFA_NCCL_ROOT="$nccl_root"} "${prefix[@]}" >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target 15_ring fa_test_stage15 fa_capi >>"$out/build.log" 2>&1; then
  echo "build: ok in $(($(date +%s) - start)) s ($(grep -m1 '15_ring: NCCL' "$out/build.log"))"
else
  tail -n 30 "$out/build.log"
  echo "build: FAILED (see $out/build.log)"
  exit 1
fi

# 2. The stage's tests, every one required to run.
(cd "$build" && FA_REQUIRE_GPU=1 FA_REQUIRE_GPUS=2 timeout 300 ctest -R '^stage15:' --output-on-failure) \
  >"$out/test.log" 2>&1 || status=1
echo "tests: $(grep -E 'tests passed' "$out/test.log" | tail -n1); skipped: $(grep -c '\*\*\*Skipped' "$out/test.log")"
grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|Skipped)\)' "$out/test.log"

# 3. The C++ ring against one GPU (the median of 3 timed runs after one warm-up).
printf '\n%-8s %-10s %-8s %12s %12s %11s\n' N mask pass "1 GPU ms" "2 GPUs ms" efficiency
for seq in 32768 65536 131072; do
  for mask in --causal ""; do
    log="$out/ring_${seq}${mask:+_causal}.log"
    timeout 150 "$build/bin/15_ring" --gpus 2 -B 1 -H 16 -N "$seq" -D 128 $mask --backward --warmup 1 --reps 3 \
      >"$log" 2>&1 || { status=1; echo "15_ring -N $seq $mask failed: $(tail -n 3 "$log" | tr '\n' ' ')"; }
    sed -n 's/.* \(causal\|non-causal\) \(fwd+bwd\|fwd\): one GPU \([0-9.]*\) ms; ring of 2 (NCCL) \([0-9.]*\) ms; efficiency \([0-9.]*\)/\1 \2 \3 \4 \5/p' "$log" |
      while read -r m p one two eff; do printf '%-8s %-10s %-8s %12s %12s %11s\n' "$seq" "$m" "$p" "$one" "$two" "$eff"; done
    grep -h '^model:' "$log" | sed "s/^/  N=$seq ${mask:-full}: /"
  done
done

# 4. The PyTorch op under torchrun: correctness on 2 GPUs, then its times against one GPU.
FA_CAPI_LIB="$build/lib/libfa_capi.so" timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
  "$repo/tests/torch/test_ring.py" --gpu --time 32768 131072 >"$out/torchrun.log" 2>&1 || status=1
grep -E '^(ok|torch op|FAILED|SKIPPED)|Error' "$out/torchrun.log" | head -n 20

echo "ring_gpus: $([ $status -eq 0 ] && echo ok || echo 'FAILED (see the logs in '"$out"')')"
exit $status
