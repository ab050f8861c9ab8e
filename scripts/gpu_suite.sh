#!/usr/bin/env bash
# The GPU suite, for a machine with a CUDA GPU (offline is fine: run scripts/offline_deps.sh
# where there is a network and bring .deps along).
#
#   scripts/gpu_suite.sh OUTDIR [PHASE ...]
#
# Phases (default: all, in this order), each able to run alone once `build` has run. On an H200 the
# longest take about 8 minutes (bench of stages 02-04, whose FP32 kernels are slow) and 4 (bench of
# 05-07, of 08-11, memory); FA_STAGES="..." restricts the GPU phases to some stages, so that a
# machine lent ten minutes at a time runs the suite in pieces (then `archive` and merge at home):
#   build     Release build for the local GPU
#   test      the whole ctest suite with FA_REQUIRE_GPU=1 (a skipped test is a failure)
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck, initcheck on every GPU stage
#   bench     the seed shapes (also causal), the N sweeps, and grouped-query / multi-query
#             attention for the stages that take it           -> OUTDIR/data/results.csv
#   memory    one run per N = 2^10 .. 2^20 per GPU stage (2^18 for 02-04) -> OUTDIR/data/memory.csv
#   torch     PyTorch's SDPA backends beside our stages        -> OUTDIR/data/torch.csv
#             (a decoding stage's calls also replayed from a CUDA graph -> OUTDIR/data/torch_graph.csv)
#   ceilings  SGEMM, FP16 tensor-core matmul, copy bandwidth, the mma.sync and read ceilings
#             (FA_CEILINGS="read_bandwidth ..." measures just those)  -> OUTDIR/data/ceilings.csv
#   traffic   ncu DRAM and L2 bytes per stage                  -> OUTDIR/data/traffic.csv
#   exercises every stage's untouched student copy must fail its tests (scripts/check_exercises.sh)
#   archive   OUTDIR's data, logs and summary as one .tgz (in $FA_ARCHIVE_DIR, default OUTDIR), to
#             carry off a machine whose files do not outlive the call and merge at home
#   merge     OUTDIR/data into the repository's data set of this GPU, plots/data/<GPU name, spaces
#             as _>/ ($FA_DATA_DIR to choose another folder): per kind, the run's rows replace the
#             rows with the same key, the others stay (python3 -m fa_course.bench.data merge), env.txt is
#             replaced, and this call's summary is appended to its gpu_suite_log.txt (a run of some
#             stages replaces the peers other stages were compared with: merge by hand with --keep-peers)
# Each data phase writes its files fresh, so a partial run (say `bench merge`) replaces just its rows;
# rows that an earlier call wrote into the same OUTDIR stay beside them (a new row replaces the
# earlier one of the same key): calls with other FA_STAGES can share one OUTDIR and one archive. A
# phase cut short (a call stopped at its time limit) keeps its rows and the earlier ones: the next
# call merges them first (scripts/lib/earlier_rows.sh).
# Logs go to OUTDIR/logs, the machine and source hashes to OUTDIR/data/env.txt, and a short
# summary (OUTDIR/summary.txt) is printed last. Python: the standard library only.
# FA_COMMIT names the commit env.txt records: a copy of the working tree sent to a lent machine
# carries the .git of an earlier commit, so the sender says which one it is
# (FA_COMMIT=$(git rev-parse HEAD) on the sending side, written into the command).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: gpu_suite.sh OUTDIR [PHASE ...]}
shift
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(build test sanitize bench memory torch ceilings traffic exercises merge)
mkdir -p "$out/logs" "$out/data"
out=$(cd "$out" && pwd)
build="$repo/build-gpu"
bin="$build/bin"
summary="$out/summary.txt"
: >>"$summary"
summary_start=$(($(wc -l <"$summary") + 1))  # this call's lines of the summary, for the merge phase
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"  # python3 -m fa_course.bench.data

note() { echo "$*" | tee -a "$summary"; }
# FA_STAGES="06_wmma 07_fp16_pipelined" restricts the GPU phases to those stages (and the bench
# phase runs 01_cpu only when FA_STAGES is empty or names it).
# Stage 15 is left out: it runs on several GPUs (--gpus P), and scripts/ring_gpus.sh runs it.
gpu_stages() {
  ls "$repo/stages" | grep -E '^(0[2-9]|[1-9][0-9])_' | grep -v '^15_ring$' | while read -r s; do
    [ -x "$bin/$s" ] && { [ -z "${FA_STAGES:-}" ] || [[ " $FA_STAGES " == *" $s "* ]]; } && echo "$s"
  done
}
# The GPU stages the C ABI library knows: all but stage 14, whose executable (bin/14_fp8, its own
# main) runs the bench, memory and sanitize phases while it is no stage of the registry, so the
# torch and traffic phases, which ask the library, leave it out.
abi_gpu_stages() { gpu_stages | grep -vx 14_fp8; }
# The bench phase's CPU stage (its points take minutes): left out when FA_STAGES names only GPU stages.
cpu_stage() {
  if [ -z "${FA_STAGES:-}" ] || [[ " $FA_STAGES " == *" 01_cpu "* ]]; then echo 01_cpu; fi
}

gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -n1; }

# What a reader of the data needs: when, which GPU, driver and CUDA, and the source hashes of the
# tree and the commit (scripts/source_hash.py; a row is current when its source_hash equals its
# stage's here or a restamp in restamps.csv leads to it; scripts/restamp builds the commit named here).
write_env() {
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "gpu: $(gpu_name)"
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
    echo "cuda: $(nvcc --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\1 (nvcc \2)/p')"
    echo "commit: ${FA_COMMIT:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD -- 2>/dev/null || echo ' (with local changes)')}"
    echo "tree source_hash: $(python3 "$repo/scripts/source_hash.py" --tree)"
    echo "method cpp: $(python3 "$repo/scripts/source_hash.py" --method cpp)"
    echo "method torch: $(python3 "$repo/scripts/source_hash.py" --method torch)"
    python3 "$repo/scripts/source_hash.py" --all | sed 's/^\([^ ]*\) /source_hash \1: /'
  } >"$out/data/env.txt"
}

phase_build() {
  local prefix=()
  [ -d "$repo/.deps/root/usr" ] && prefix=(-DCMAKE_PREFIX_PATH="$repo/.deps/root/usr")
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$out/logs/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >>"$out/logs/build.log" 2>&1
  local status=$?
  grep -E 'warning|spill' "$out/logs/build.log" | grep -v '0 bytes spill' >"$out/logs/build-warnings.log"
  note "build: $([ $status -eq 0 ] && echo ok || echo FAILED), $(wc -l <"$out/logs/build-warnings.log") warning lines"
  write_env
  return $status
}

phase_test() {
  (cd "$build" && FA_REQUIRE_GPU=1 ctest -j 8 --output-on-failure --timeout 300) >"$out/logs/test.log" 2>&1
  local status=$?
  note "test: $(grep -E 'tests passed' "$out/logs/test.log" | tail -n1); skipped: $(grep -c '\*\*\*Skipped' "$out/logs/test.log")"
  grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|Skipped)\)' "$out/logs/test.log" | sed 's/^/  /' | tee -a "$summary"
  return $status
}

phase_sanitize() {
  local failures=0 runs=0
  for stage in $(gpu_stages); do
    local pass=() shapes=("--batch 2 --heads 1 --seq 150 --dim 72" "--batch 1 --heads 2 --seq 70 --dim 128"
      "--batch 1 --heads 2 --seq 150 --dim 64 --causal")
    is_backward_stage "$stage" && pass=(--pass bwd)
    is_wide_stage "$stage" && shapes+=("--batch 1 --heads 2 --seq 150 --dim 256 --causal" "--batch 2 --heads 1 --seq 70 --dim 200")
    # Stage 13 splits the key tiles of its last wave: 16 parts a tile; under the causal mask, parts
    # that cross query heads and parts of light tiles with no step.
    [ "$stage" = 13_wgmma_backward ] && shapes+=("--heads 4 --kv-heads 1 --seq 1000 --seq-k 600 --dim 128"
      "--heads 8 --kv-heads 1 --seq 1000 --seq-k 1300 --dim 64 --causal")
    # A persistent stage: more pieces than SMs, under the mask from the queue; without it at D = 64
    # (288 pieces), on 132 SMs the last round's 24 pieces split in three parts each (stage 10).
    is_persistent_stage "$stage" && shapes+=("--batch 2 --heads 16 --seq 1024 --dim 128 --causal"
      "--batch 2 --heads 16 --seq 1500 --dim 64 --causal --lse" "--batch 3 --heads 16 --seq 1000 --dim 64")
    # A decoding stage: split keys and a merge (D = 128, 100 on the synchronous copies, 256), and
    # enough query rows to fill the GPU without a split (one block writes O itself). 64 and 24
    # packed rows at D = 128 and 64 run stage 12's wgmma kernel on an H100 or H200.
    is_decode_stage "$stage" && shapes=("--heads 32 --kv-heads 8 --seq 4 --seq-k 5000 --dim 128 --causal --lse"
      "--heads 32 --kv-heads 8 --seq 16 --seq-k 5000 --dim 128 --causal --lse"
      "--batch 2 --heads 8 --kv-heads 2 --seq 5 --seq-k 3001 --dim 100 --causal --lse"
      "--heads 16 --kv-heads 2 --seq 7 --seq-k 900 --dim 256 --lse" "--batch 64 --heads 8 --kv-heads 4 --seq 3 --seq-k 700 --dim 64"
      "--batch 64 --heads 8 --kv-heads 1 --seq 3 --seq-k 700 --dim 64")
    for tool in memcheck racecheck synccheck initcheck; do
      for shape in "${shapes[@]}"; do
        runs=$((runs + 1))
        # shellcheck disable=SC2086
        if ! compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin/$stage" $shape "${pass[@]}" --warmup 0 --reps 1 \
          >>"$out/logs/sanitize.log" 2>&1; then
          failures=$((failures + 1))
          note "  sanitize FAILED: $tool $stage $shape"
        fi
      done
    done
    runs=$((runs + 1))
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/$stage" --walkthrough >>"$out/logs/sanitize.log" 2>&1 ||
      { failures=$((failures + 1)); note "  sanitize FAILED: memcheck $stage --walkthrough"; }
  done
  note "sanitize: $runs runs, $failures failed"
  [ $failures -eq 0 ]
}

# The numbers, comma-separated, of the built library's CUDA stages for which the Python condition
# $1 on `s` (a fa_course.capi stage) holds.
capi_stage_numbers() {
  python3 -c 'import sys; from fa_course import capi
print(",".join(sorted({s.id[:2] for s in capi.Library(sys.argv[1]).stages() if s.is_cuda and eval(sys.argv[2])})))' \
    "$build/lib/libfa_capi.so" "$1" 2>>"$out/logs/stages.log"
}

# capi_stage_numbers "$2", asked of the library once: the first call sets the variable named $1.
cache_stage_numbers() { [ -n "${!1+set}" ] || printf -v "$1" '%s' "$(capi_stage_numbers "$2")"; }
# Whether stage $1 (its first two characters, the number) is one of the comma-separated numbers $2.
number_in() { [[ ",$2," == *",${1:0:2},"* ]]; }

# The stages whose idea is the backward pass (fa_stage_features "backward" in the built library:
# 11_backward), in $backward_numbers once backward_stages has run. Their rows are of the backward
# (--pass bwd); their forward pass is an earlier stage's kernel (stage 08's), measured under that
# stage's name.
backward_stages() { cache_stage_numbers backward_numbers 's.supports("backward")'; }
# shellcheck disable=SC2154  # cache_stage_numbers sets it (printf -v)
is_backward_stage() { backward_stages && number_in "$1" "$backward_numbers"; }

# The stages whose kernels take head dims up to 256 (fa_stage_max_dim; 14_fp8, which the library
# does not know, too): the sanitizer runs them at D = 256 too, where their widest tiles are.
# shellcheck disable=SC2154  # cache_stage_numbers sets it (printf -v)
is_wide_stage() {
  [ "$1" = 14_fp8 ] || { cache_stage_numbers wide_numbers 's.max_dim >= 256' && number_in "$1" "$wide_numbers"; }
}

# The stages whose blocks are persistent (one per SM, each looping over pieces; under the causal
# mask stage 10's take theirs from a queue): the sanitizer also runs them with more pieces than an
# H200 has SMs (132), where a block's later pieces and the queue's handover run.
is_persistent_stage() { [ "$1" = 10_overlap ] || [ "$1" = 14_fp8 ]; }

# The decoding stages (fa_course.selection.DECODE_STAGES: 12_split_kv), by number, comma-separated.
# They run their own kernel only for a few query rows against many keys and hand a square problem
# to an earlier stage's kernel, so they are benched, sanitized and compared on decode shapes, and
# left out of the square sweeps, the memory sweep and the forward traffic model.
decode_numbers=$(python3 -c 'from fa_course.selection import DECODE_STAGES
print(",".join(sorted(s[:2] for s in DECODE_STAGES)))')
is_decode_stage() { number_in "$1" "$decode_numbers"; }

# One stage at one shape, appended to a CSV; a big problem gets fewer repetitions. Arguments after
# the shape (--causal) go to the stage. A backward stage is checked on one (batch, K/V head) group
# up to N = 2048 (the double reference backward of a group costs 12·N²·D) and timed alone above.
run_point() {
  local csv=$1 stage=$2 b=$3 h=$4 n=$5 d=$6 reps=10 warmup=3 check=(--check-rows 64)
  shift 6
  if [ $((b * h * n * n / 1000000 * d)) -gt 500000 ]; then reps=3 warmup=1; fi
  if is_backward_stage "$stage"; then
    check=(--pass bwd --check-kv-heads 1)
    [ "$n" -gt 2048 ] && check=(--pass bwd --no-check)
  fi
  "$bin/$stage" --batch "$b" --heads "$h" --seq "$n" --dim "$d" --warmup $warmup --reps $reps "${check[@]}" \
    --csv "$csv" "$@" >>"$out/logs/bench.log" 2>&1
}

phase_bench() {
  local csv="$out/data/results.csv" failed=0
  rm -f "$csv"
  for stage in $(gpu_stages); do
    if is_decode_stage "$stage"; then
      # Decoding: Hq = 32, Hkv = 8, D = 128, Nq query rows per sequence against a cache of Nk keys.
      # From 65536 keys K and V outgrow L2 many times over (the stage's CLI does not flush L2; the
      # torch phase does, at every Nk, and runs B = 16 too: the CLI's random inputs of B = 16 take
      # the CPU about 20 s a shape).
      for b in 1 4; do
        for nk in 65536 262144; do
          for nq in 1 4 16; do
            run_point "$csv" "$stage" $b 32 $nq 128 --kv-heads 8 --seq-k $nk || failed=$((failed + 1))
          done
          run_point "$csv" "$stage" $b 32 16 128 --kv-heads 8 --seq-k $nk --causal || failed=$((failed + 1))
        done
      done
      continue
    fi
    for n in 512 1024 2048 4096 8192 16384; do
      run_point "$csv" "$stage" $((16384 / n)) 16 $n 128 || failed=$((failed + 1))
      run_point "$csv" "$stage" $((16384 / n)) 16 $n 128 --causal || failed=$((failed + 1))
    done
    run_point "$csv" "$stage" 1 64 1024 128 || failed=$((failed + 1))
    run_point "$csv" "$stage" 2 64 4096 128 || failed=$((failed + 1))
    run_point "$csv" "$stage" 4 64 8192 128 || failed=$((failed + 1))
    for d in 64 128; do
      for e in 10 11 12 13 14 15 16 17; do run_point "$csv" "$stage" 1 1 $((1 << e)) $d || failed=$((failed + 1)); done
    done
  done
  for stage in $(cpu_stage); do
    for d in 64 128; do
      for n in 256 512 1024; do
        run_point "$csv" "$stage" 1 1 $n $d || failed=$((failed + 1))
        run_point "$csv" "$stage" 1 1 $n $d --causal || failed=$((failed + 1))
      done
    done
  done
  # Grouped-query (Hkv = 8) and multi-query (Hkv = 1) attention beside plain multi-head (Hkv = Hq
  # = 32), B = 1, D = 128: N = 4096 for the GPU stages that take general shapes (08 and later), N =
  # 1024 for the CPU stage (its cost).
  for stage in $(cpu_stage) $(gpu_stages | awk '$1 >= "08"'); do
    is_decode_stage "$stage" && continue
    local n=4096
    [ "$stage" = 01_cpu ] && n=1024
    for kv_heads in 32 8 1; do
      run_point "$csv" "$stage" 1 32 $n 128 --kv-heads $kv_heads || failed=$((failed + 1))
    done
  done
  for stage in $(cpu_stage) $(gpu_stages); do "$bin/$stage" --walkthrough >"$out/data/walkthrough_${stage:0:2}.txt" 2>&1; done
  note "bench: $(($(wc -l <"$csv") - 1)) rows, $failed runs not ok (oom rows are expected for 02 at large N)"
  python3 "$repo/scripts/summarize_results.py" "$csv" | tee -a "$summary"
}

phase_memory() {
  local csv="$out/data/memory.csv"
  rm -f "$csv"
  for stage in $(gpu_stages); do
    is_decode_stage "$stage" && continue  # its memory: the inputs and its partials (torch rows' peak_bytes)
    # The CUDA-core stages 02-04 would take minutes per call past N = 2^18 (03: about 2 min at
    # 2^20) and show nothing new there: 02 is out of memory from 2^18, 03 and 04 stay linear.
    local top=20
    case $stage in 02_* | 03_* | 04_*) top=18 ;; esac
    # A backward stage runs its backward once, unchecked (the reference would take hours at 2^20).
    local run=(--reps 0 --check-rows 8)
    is_backward_stage "$stage" && run=(--pass bwd --reps 1 --no-check)
    for e in $(seq 10 $top); do
      "$bin/$stage" --batch 1 --heads 1 --seq $((1 << e)) --dim 128 --warmup 0 "${run[@]}" --csv "$csv" \
        >>"$out/logs/memory.log" 2>&1
    done
  done
  note "memory: $(grep -c ',ok,' "$csv") ok rows, $(grep -c ',oom,' "$csv") oom rows, $(grep -c ',error,' "$csv") error rows"
}

phase_torch() {
  rm -f "$out/data/torch.csv"  # compare_torch.py adds to --out: each call of the phase starts afresh
  : >"$out/logs/torch.log"
  # The backward stages' forward pass is an earlier stage's kernel, so the forward calls leave them
  # out and the backward calls at the end measure them.
  backward_stages
  # Those of FA_STAGES, by number.
  only_stages() { abi_gpu_stages | cut -c1-2 | awk -v keep=",$1," 'index(keep, "," $1 ",") > 0' | paste -sd, -; }
  local backward decode
  backward=$(only_stages "$backward_numbers")
  decode=$(only_stages "$decode_numbers")
  forward_stages() { abi_gpu_stages | cut -c1-2 | awk -v skip=",$backward,$decode_numbers," 'index(skip, "," $1 ",") == 0'; }
  local stages
  stages=$(forward_stages | paste -sd, -)
  local status=0
  if [ -n "$stages" ]; then
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" --shapes seed001 seed004 \
      --stages "$stages" --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 || status=1
  fi
  # The 16-bit stages (07 and later) beside PyTorch's fused backends at D = 64 and, on the
  # seed001 and seed004 shapes, with causal masking (is_causal=True).
  local fast
  fast=$(forward_stages | awk '$1 >= 7' | paste -sd, -)
  if [ -n "$fast" ]; then
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" --shapes seed001-d64 \
      --stages "$fast" --peers torch_flash,torch_cudnn --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 ||
      status=1
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" --shapes seed001 seed004 --causal on \
      --stages "$fast" --peers torch_flash,torch_cudnn --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 ||
      status=1
  fi
  # The bench phase's grouped-query and multi-query shapes (Hkv = 32, 8, 1 at Hq = 32), for the
  # stages that take general shapes (08 and later), beside PyTorch.
  local general
  general=$(forward_stages | awk '$1 >= 8' | paste -sd, -)
  if [ -n "$general" ]; then
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" \
      --shapes 1x32x32x4096x4096x128,1x32x8x4096x4096x128,1x32x1x4096x4096x128 \
      --stages "$general" --peers torch_flash,torch_cudnn --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 ||
      status=1
  fi
  # Grouped-query and multi-query attention at B = 4 (the stage READMEs' shapes), with and without the mask.
  if [ -n "$general" ]; then
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" \
      --shapes 4x32x32x4096x4096x128,4x32x8x4096x4096x128,4x32x1x4096x4096x128 --causal both \
      --stages "$general" --peers torch_flash,torch_cudnn --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 ||
      status=1
  fi
  # The standard sweep from N = 2048 at head dims 64, 96, 192 and 256 (stage 08's issue), and the
  # large-head shape at 256, with and without the mask, for the stages that take them (08 and later;
  # a stage that does not gets an unsupported row).
  if [ -n "$general" ]; then
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" \
      --shapes sweep-head-dims 4x16x8192x256 --causal both \
      --stages "$general" --peers torch_flash,torch_cudnn --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 ||
      status=1
  fi
  # The backward pass alone (pass = bwd) at issue 20's shapes, its lower bound N = 2048 and D = 256,
  # and grouped-query and multi-query heads (Hkv = 8, 1 at Hq = 32), FP16 and BF16, with and without
  # the mask, beside PyTorch's fused backward passes.
  if [ -n "$backward" ]; then
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" --pass bwd --causal both \
      --shapes 4x16x2048x64,4x16x2048x128,4x16x4096x64,4x16x4096x128,1x16x16384x128,4x16x4096x256 \
      1x32x8x4096x4096x128,1x32x1x4096x4096x128 \
      --stages "$backward" \
      --dtype fp16,bf16 --peers torch_flash,torch_cudnn,torch_efficient --out "$out/data/torch.csv" \
      >>"$out/logs/torch.log" 2>&1 || status=1
    # Forward and backward in one timed call, as a training step runs them (pass = fwd+bwd).
    python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" --pass fwd+bwd --causal both \
      --shapes 4x16x4096x64,4x16x4096x128 --stages "$backward" --dtype fp16,bf16 \
      --peers torch_flash,torch_cudnn --out "$out/data/torch.csv" >>"$out/logs/torch.log" 2>&1 || status=1
  fi
  # The decoding stages at the decode sweep (B in {1, 4, 16}, Nq in {1, 4, 16}, Nk = 4096 .. 262144),
  # FP16 and BF16, beside every backend: plain calls (torch.csv), then each call replayed from a CUDA
  # graph as serving engines run it (torch_graph.csv).
  if [ -n "$decode" ]; then
    rm -f "$out/data/torch_graph.csv"
    local timing file
    for timing in plain graph; do
      file=torch.csv
      [ $timing = graph ] && file=torch_graph.csv
      python3 "$repo/scripts/compare_torch.py" --lib "$build/lib/libfa_capi.so" --shapes decode-sweep --timing $timing \
        --stages "$decode" --dtype fp16,bf16 --peers torch_flash,torch_cudnn,torch_efficient,torch_default \
        --out "$out/data/$file" >>"$out/logs/torch.log" 2>&1 || status=1
    done
  fi
  note "torch: $([ $status -eq 0 ] && echo ok || echo FAILED) ($(data_rows torch.csv) rows, $(data_rows torch_graph.csv) graph-timed)"
  return $status
}

# The rows of OUTDIR/data/FILE below its header (0 when the phase wrote none).
data_rows() { if [ -f "$out/data/$1" ]; then echo $(($(wc -l <"$out/data/$1") - 1)); else echo 0; fi; }

phase_ceilings() {
  local tools=()
  [ -x "$bin/fa_mma_ceiling" ] && tools+=(--mma-ceiling "$bin/fa_mma_ceiling")
  [ -x "$bin/fa_read_ceiling" ] && tools+=(--read-ceiling "$bin/fa_read_ceiling")
  [ -n "${FA_CEILINGS:-}" ] && tools+=(--only "$(echo $FA_CEILINGS | tr ' ' ,)")
  python3 "$repo/scripts/ceilings.py" --out "$out/data/ceilings.csv" "${tools[@]}" >"$out/logs/ceilings.log" 2>&1
  local status=$?
  note "ceilings: $([ $status -eq 0 ] && echo ok || echo FAILED)"
  sed 's/^/  /' "$out/data/ceilings.csv" 2>/dev/null | tee -a "$summary"
  return $status
}

phase_exercises() {
  FA_CMAKE_ARGS="-G Ninja -DCMAKE_PREFIX_PATH=$repo/.deps/root/usr" FA_REQUIRE_GPU=1 "$repo/scripts/check_exercises.sh" "$repo/build-exercises" >"$out/logs/exercises.log" 2>&1
  local status=$?
  note "exercises: $([ $status -eq 0 ] && echo ok || echo FAILED)"
  sed 's/^/  /' "$out/logs/exercises.log" | tail -n 12 | tee -a "$summary"
  return $status
}

phase_traffic() {
  # By name: traffic.py would take every executable bin/NN_* (14_fp8, 14_fp8_accuracy too) for a stage.
  local stages
  stages=$(abi_gpu_stages | paste -sd, -)
  [ -n "$stages" ] || { note "traffic: no stage of the C ABI selected"; return 0; }
  python3 "$repo/scripts/traffic.py" --bin "$bin" --stages "$stages" --out "$out/data/traffic.csv" \
    >"$out/logs/traffic.log" 2>&1
  local status=$?
  note "traffic: $([ $status -eq 0 ] && echo ok || echo FAILED)"
  return $status
}

phase_merge() {
  local gpu dest status
  gpu=$(gpu_name)
  dest=${FA_DATA_DIR:-$repo/plots/data/${gpu// /_}}
  [ -f "$out/data/env.txt" ] || write_env
  python3 -m fa_course.bench.data merge "$out/data" "$dest" >"$out/logs/merge.log" 2>&1
  status=$?
  note "merge: $([ $status -eq 0 ] && echo ok || echo FAILED) into ${dest#"$repo"/}"
  sed 's/^/  /' "$out/logs/merge.log" | tee -a "$summary"
  if [ $status -eq 0 ]; then
    note "  $(python3 -m fa_course.bench.data stale --brief "$dest" 2>&1) (python3 -m fa_course.bench.data stale)"
    { echo; echo "## $(date -u +%FT%TZ): scripts/gpu_suite.sh ${phases[*]} (OUTDIR $(basename "$out"))"
      tail -n +"$summary_start" "$summary"; } >>"$dest/gpu_suite_log.txt"
  fi
  return $status
}

# The run's data, logs and summary as one archive, FA_ARCHIVE_DIR/<OUTDIR's name>.tgz (default: in
# OUTDIR), for a machine whose files do not outlive the call (a lent GPU): merge it at home with
# `tar -xzf X.tgz -C DIR && python3 -m fa_course.bench.data merge DIR/data plots/data/<gpu>`.
phase_archive() {
  local dir=${FA_ARCHIVE_DIR:-$out}
  tar -C "$out" -czf "$dir/$(basename "$out").tgz" data logs summary.txt
  note "archive: $dir/$(basename "$out").tgz"
}

# A phase or a stage that does not exist is refused before anything runs: a typo would otherwise show
# only after the phases before it (a build, minutes of a lent machine), or leave a phase nothing to run.
for phase in "${phases[@]}"; do
  declare -F "phase_$phase" >/dev/null || {
    echo "gpu_suite.sh: there is no phase '$phase'; the phases are: $(declare -F | sed -n 's/^declare -f phase_//p' | paste -sd ' ')" >&2
    exit 2
  }
done
for stage in ${FA_STAGES:-}; do
  [ -d "$repo/stages/$stage" ] || {
    echo "gpu_suite.sh: FA_STAGES names '$stage', which is no stage folder; the stages are: $(cd "$repo/stages" && echo [0-9][0-9]_*)" >&2
    exit 2
  }
done

# shellcheck source=lib/earlier_rows.sh
source "$repo/scripts/lib/earlier_rows.sh"
overall=0
finish_cut_phases || overall=1
for phase in "${phases[@]}"; do
  start=$(date +%s)
  set_aside_earlier_rows "$phase"
  "phase_$phase" || overall=1
  merge_earlier_rows "$phase" || overall=1
  note "  ($phase took $(($(date +%s) - start)) s)"
done
echo
echo "==== summary ($out/summary.txt) ===="
cat "$summary"
exit $overall
