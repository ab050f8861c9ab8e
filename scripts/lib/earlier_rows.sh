# shellcheck shell=bash
# shellcheck disable=SC2154  # out and note are the sourcing script's
# Sourced by scripts/gpu_suite.sh: rows that an earlier call wrote into OUTDIR/data stay beside a data
# phase's. A data phase writes its files afresh; before it they are set aside in OUTDIR/earlier, and
# after it its rows are merged over them (python3 -m fa_course.bench.data merge: a new row replaces the
# earlier one of its key). A phase cut short (a call stopped at its time limit) leaves the rows before
# it in OUTDIR/earlier and its own in OUTDIR/data; the next call merges them first, as that phase's end
# would have. Needs $out (OUTDIR, with logs/) and note (a line for the summary).

# The files a data phase writes afresh.
phase_files() {
  case $1 in
    bench) echo results.csv ;;
    memory) echo memory.csv ;;
    torch) echo torch.csv torch_graph.csv ;;
    ceilings) echo ceilings.csv ;;
    traffic) echo traffic.csv ;;
  esac
}

set_aside_earlier_rows() {
  local file
  for file in $(phase_files "$1"); do
    if [ -f "$out/data/$file" ]; then mkdir -p "$out/earlier" && mv "$out/data/$file" "$out/earlier/$file"; fi
  done
}

# OUTDIR/data/FILE's rows over OUTDIR/earlier/FILE's, the result back in OUTDIR/data; where the merge
# fails both files stay, the earlier one in OUTDIR/earlier.
merge_earlier_files() {
  local file status=0
  for file in "$@"; do
    [ -f "$out/earlier/$file" ] || continue
    if [ -f "$out/data/$file" ]; then
      rm -rf "$out/new" && mkdir -p "$out/new" && cp "$out/data/$file" "$out/new/$file"
      if ! python3 -m fa_course.bench.data merge "$out/new" "$out/earlier" >>"$out/logs/merge.log" 2>&1; then
        note "  the earlier rows of $file could not be merged: they stay in $out/earlier (logs/merge.log)"
        status=1
        continue
      fi
      rm -rf "$out/new"
    fi
    mv "$out/earlier/$file" "$out/data/$file"
  done
  rmdir "$out/earlier" 2>/dev/null
  return $status
}

merge_earlier_rows() {
  # shellcheck disable=SC2046  # the file names have no spaces
  merge_earlier_files $(phase_files "$1")
}

# Run first: the files a phase cut short left in OUTDIR/earlier.
finish_cut_phases() {
  [ -d "$out/earlier" ] || return 0
  local files
  files=$(cd "$out/earlier" && ls)
  note "  rows left aside by a phase cut short, merged first: $(echo "$files" | paste -sd' ' -)"
  # shellcheck disable=SC2086
  merge_earlier_files $files
}
