#!/usr/bin/env bash
# Times every stage of two source trees on the same shapes, in one run on one GPU, interleaved
# (before, after, before, after) so drift of the clocks falls on both alike:
#
#   scripts/compare_trees.sh BEFORE_TREE OUTDIR
#
# BEFORE_TREE is another checkout (e.g. `git worktree add --detach ../before <commit>`); this
# repository is "after". Both are built for the local GPU (build-gpu inside each tree, reused when
# present). Each stage runs with --csv; the table (OUTDIR/compare.txt) lists the median of the
# rounds' medians per tree and after/before. Shapes: (4, 16, 4096, 128) plain and causal; the
# first descriptor of each stage (FP16 for 07 and later).
#
# To A/B one stage (say a backward kernel on a branch) rather than the course:
#   FA_COMPARE_STAGES="13_wgmma_backward" FA_COMPARE_PASS=bwd \
#   FA_COMPARE_SHAPES="4 16 4096 128;1 16 16384 128 --causal" FA_COMPARE_ROUNDS=3 \
#   FA_CMAKE_ARGS="-DFA_ONLY_STAGES=08_mma_registers;10_overlap;11_backward;13_wgmma_backward" \
#   scripts/compare_trees.sh ../before /tmp/ab
# FA_COMPARE_SHAPES: "B H N D [options]" separated by ";"; FA_CMAKE_ARGS go to both trees' configure
# (the stages a stage links must be in FA_ONLY_STAGES too).
set -uo pipefail
after=$(cd "$(dirname "$0")/.." && pwd)
before=$(cd "${1:?usage: compare_trees.sh BEFORE_TREE OUTDIR}" && pwd)
out=${2:?usage: compare_trees.sh BEFORE_TREE OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)

build() {
  local tree=$1 prefix=()
  [ -d "$after/.deps/root/usr" ] && prefix=(-DCMAKE_PREFIX_PATH="$after/.deps/root/usr")
  local log="$out/build-$(basename "$tree").log"
  # A build folder that exists (the GPU suite's) is reused as it is configured.
  if [ ! -f "$tree/build-gpu/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086 # FA_CMAKE_ARGS is a list of arguments
    cmake -S "$tree" -B "$tree/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA_BUILD_TESTS=OFF "${prefix[@]}" \
      ${FA_CMAKE_ARGS:-} >"$log" 2>&1 || return 1
  fi
  cmake --build "$tree/build-gpu" -j "$(nproc)" >>"$log" 2>&1
}
build "$before" || { echo "compare_trees: the before tree did not build (see $out)"; exit 1; }
build "$after" || { echo "compare_trees: the after tree did not build (see $out)"; exit 1; }

shapes=("4 16 4096 128" "4 16 4096 128 --causal")
[ -n "${FA_COMPARE_SHAPES:-}" ] && IFS=';' read -r -a shapes <<<"$FA_COMPARE_SHAPES"
pass=(--pass "${FA_COMPARE_PASS:-fwd}")
rm -f "$out"/before_*.csv "$out"/after_*.csv
# (stage 15 runs on several GPUs with its own command line: scripts/ring_gpus.sh)
for stage in $(ls "$after/stages" | grep -E '^(0[2-9]|[1-9][0-9])_' | grep -v '^15_ring$'); do
  [ -x "$before/build-gpu/bin/$stage" ] && [ -x "$after/build-gpu/bin/$stage" ] || continue
  [ -z "${FA_COMPARE_STAGES:-}" ] || [[ " $FA_COMPARE_STAGES " == *" $stage "* ]] || continue
  rounds=${FA_COMPARE_ROUNDS:-2} reps=10 warmup=3
  case $stage in 02_* | 03_* | 04_*) rounds=1 reps=3 warmup=1 ;; esac
  for shape in "${shapes[@]}"; do
    set -- $shape
    for round in $(seq "$rounds"); do
      for side in before after; do
        tree=$([ $side = before ] && echo "$before" || echo "$after")
        "$tree/build-gpu/bin/$stage" --batch "$1" --heads "$2" --seq "$3" --dim "$4" "${@:5}" "${pass[@]}" \
          --warmup $warmup --reps $reps --check-rows 16 --csv "$out/${side}_$round.csv" >>"$out/runs.log" 2>&1 ||
          echo "compare_trees: $side $stage $shape round $round failed" | tee -a "$out/runs.log"
      done
    done
  done
done

python3 - "$after/python" "$out" <<'PY' | tee "$out/compare.txt"
import glob, statistics, sys
sys.path.insert(0, sys.argv[1])
from fa_course.bench import results  # reads the before tree's older CSV header too

out = sys.argv[2]
times = {}
for side in ("before", "after"):
    for path in sorted(glob.glob(f"{out}/{side}_*.csv")):  # one file per round: a key once in each
        for row in results.read_results(path):
            if row["status"] == "ok":
                key = (row["stage"], row["dtype"], row["B"], row["Hq"], row["Nq"], row["D"], row["causal"], row["pass"])
                times.setdefault(key, {}).setdefault(side, []).append(row["ms_median"])
print(f"{'stage':20} {'dtype':5} {'B,H,N,D':16} {'causal':6} {'pass':7} {'before ms':>10} {'after ms':>10} "
      f"{'after/before':>12}")
for key in sorted(times):
    sides = times[key]
    if "before" not in sides or "after" not in sides:
        print(f"{key[0]:20} {key[1]:5} missing a side: {sorted(sides)}")
        continue
    b, a = statistics.median(sides["before"]), statistics.median(sides["after"])
    spread = max(sides["before"]) / min(sides["before"])
    shape = ",".join(str(value) for value in key[2:6])
    print(f"{key[0]:20} {key[1]:5} {shape:16} {key[6]:6} {key[7]:7} {b:10.3f} {a:10.3f} {a / b:12.3f}"
          f"   (before's own spread {spread:.3f})")
PY
