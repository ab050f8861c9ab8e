# shellcheck shell=bash
# Shared by scripts/course.sh, scripts/test.sh and scripts/check_exercises.sh: find or install what
# the build needs, then configure and build with visible progress. Sourced, not run.

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The oldest CMake the course takes: CMakeLists.txt's cmake_minimum_required and CMakePresets.json's
# cmakeMinimumRequired say the same (a test checks that the three agree).
fa_cmake_minimum=3.24

# Catch2 and CLI11 unpacked by scripts/offline_deps.sh, for a machine without a network: every
# configure looks there first when the folder exists.
fa_deps_prefix="$repo_root/.deps/root/usr"
fa_cmake_args=()
[ -d "$fa_deps_prefix/include" ] && fa_cmake_args+=("-DCMAKE_PREFIX_PATH=$fa_deps_prefix")

# Debian/Ubuntu packages the build needs: CLI11 (command line) and Catch2 (tests), both
# header-only. Found in .deps/ or the system; else installed with apt-get when running as root
# (its chatter goes to a log, shown only if it fails); otherwise the exact command.
ensure_build_packages() {
  local missing=() include
  local cli=0 catch=0
  for include in /usr/include /usr/local/include "$fa_deps_prefix/include"; do
    [ -f "$include/CLI/CLI.hpp" ] && cli=1
    { [ -f "$include/catch2/catch.hpp" ] || [ -f "$include/catch2/catch_test_macros.hpp" ]; } && catch=1
  done
  [ $cli -eq 1 ] || missing+=(libcli11-dev)
  [ $catch -eq 1 ] || missing+=(catch2)
  command -v cmake >/dev/null || missing+=(cmake)
  # ccache only speeds builds up (fa_cmake_launchers): installed along when root, never required,
  # so a machine without a network (a lent GPU with .deps/) goes on without it
  local root_apt=0
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null && root_apt=1
  if [ ${#missing[@]} -eq 0 ]; then
    if ! command -v ccache >/dev/null && [ $root_apt -eq 1 ] &&
      ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache; } >/dev/null 2>&1; then
      echo "ccache could not be installed (offline?): building without a compiler cache"
    fi
    return 0
  fi
  command -v ccache >/dev/null || missing+=(ccache)
  if [ $root_apt -eq 1 ]; then
    echo "Installing ${missing[*]} from the distribution's packages"
    local log
    log=$(mktemp)
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >"$log" 2>&1; then
      cat "$log" >&2
      echo "apt-get could not install ${missing[*]} (offline? scripts/offline_deps.sh brings them along)" >&2
      rm -f "$log"
      exit 1
    fi
    rm -f "$log"
  else
    echo "Missing: ${missing[*]}. Install them with:" >&2
    echo "  sudo apt-get install ${missing[*]}" >&2
    echo "(or, on a machine without a network, bring .deps/ along: scripts/offline_deps.sh)" >&2
    exit 1
  fi
}

ensure_cuda_toolkit() {
  if ! command -v nvcc >/dev/null; then
    if [ -x /usr/local/cuda/bin/nvcc ]; then
      export PATH=/usr/local/cuda/bin:$PATH
    else
      echo "The CUDA toolkit (nvcc) was not found: install CUDA 12 or 13 and put nvcc on PATH." >&2
      exit 1
    fi
  fi
}

# A CMake >= $fa_cmake_minimum from pip, into .venv, where the system's is older (DESIGN.md).
ensure_cmake_version() {
  local version
  version=$(cmake --version | head -n1 | grep -oE '[0-9]+\.[0-9]+' | head -n1)
  if [ "$(printf '%s\n%s\n' "$version" "$fa_cmake_minimum" | sort -V | head -n1)" != "$fa_cmake_minimum" ]; then
    echo "CMake $version is older than $fa_cmake_minimum: installing a newer one into .venv with pip"
    if [ ! -x "$repo_root/.venv/bin/python" ]; then
      python3 -m venv "$repo_root/.venv" || { echo "python3 -m venv failed: install python3-venv" >&2; exit 1; }
    fi
    "$repo_root/.venv/bin/pip" install -q "cmake==3.31.6"
    export PATH="$repo_root/.venv/bin:$PATH"
  fi
}

# The Python packages of requirements.txt, pinned, in .venv (PEP 668 systems refuse
# system-wide pip), and the checkout's python/ on its path (a .pth file), so that `import fa_course`
# sees the working tree without building the library a second time: tests and scripts name the
# checkout's build ($FA_CAPI_LIB). Reinstalled only when requirements.txt changes.
ensure_venv() {
  local venv="$repo_root/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || { echo "python3 -m venv failed: install python3-venv" >&2; exit 1; }
  fi
  local stamp
  stamp=$(cat "$repo_root/requirements.txt")
  if [ "$stamp" != "$(cat "$venv/.requirements.txt" 2>/dev/null)" ]; then
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" uninstall -q -y fa-course 2>/dev/null || true  # an editable install of an older checkout
    "$venv/bin/pip" install -q -r "$repo_root/requirements.txt"
    printf '%s' "$stamp" >"$venv/.requirements.txt"
  fi
  "$venv/bin/python" -c 'import sys, sysconfig; open(sysconfig.get_path("purelib") + "/fa_course_checkout.pth", "w").write(sys.argv[1] + "\n")' \
    "$repo_root/python"
}

# ccache in front of the compilers of a build folder configured afresh ($1; a folder keeps what it
# was configured with), when ccache is installed: the package's wheel built after the course
# (check_package_install) then compiles only what no build before it compiled with the same flags.
# Paths under the repository are hashed relative to it, so two build folders share the cache.
export CCACHE_BASEDIR="$repo_root"
fa_cmake_launchers() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ccache >/dev/null; then
    echo "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
  fi
}

# The package as a user installs it: `pip wheel python/` builds the library with the course's CMake
# (scikit-build-core) and packs it inside; the wheel goes into a fresh venv outside the repository,
# and fa_course is imported from /tmp. The wheel is built with the preset folder's CUDA
# architectures, warning flags and C++ compiler in build-wheel/ (beside the preset's folder: the same
# relative paths), so with ccache it reuses the preset's compiles.
check_package_install() {
  local preset=$1 dir work start=$SECONDS architectures werror compiler log deps=()
  dir=$(preset_binary_dir "$preset")
  architectures=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$dir/CMakeCache.txt")
  werror=$(sed -n 's/^FA_WERROR:[A-Z]*=//p' "$dir/CMakeCache.txt")
  compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$dir/CMakeCache.txt")
  work=$(mktemp -d)
  log="$repo_root/build-wheel/package.log"
  mkdir -p "$repo_root/build-wheel"
  # Catch2 and CLI11 from .deps/ where the preset's build took them from there (an offline machine).
  [ -d "$fa_deps_prefix/include" ] && deps=(-C "cmake.define.CMAKE_PREFIX_PATH=$fa_deps_prefix")
  echo "Checking the package a user installs: pip wheel python/ (CUDA architectures $architectures; log: build-wheel/package.log)"
  # shellcheck disable=SC2046
  if ! { CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$repo_root/.venv/bin/pip" wheel --no-build-isolation --no-deps \
           -w "$work/wheel" "$repo_root/python" -C build-dir="$repo_root/build-wheel" \
           -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$architectures" -C cmake.define.FA_WERROR="${werror:-OFF}" \
           -C cmake.define.CMAKE_CXX_COMPILER="$compiler" "${deps[@]}" \
           $(fa_cmake_launchers "$repo_root/build-wheel" | sed 's/-D/-C cmake.define./g') &&
         python3 -m venv "$work/venv" &&
         "$work/venv/bin/pip" install -q --no-index "$work"/wheel/*.whl &&
         (cd /tmp && "$work/venv/bin/python" -c "import fa_course; print(fa_course.attention, fa_course.__all__)
lib = fa_course.Library()
assert lib.path.startswith('$work/venv/'), lib.path
print(len(lib.stages()), 'stages in', lib.path)"); } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "The package did not build, install or import (the whole log: build-wheel/package.log)" >&2
    rm -rf "$work"
    return 1
  fi
  tail -n 3 "$log"
  echo "Package built, installed in a fresh venv and imported from /tmp in $((SECONDS - start)) s"
  rm -rf "$work"
}

# The "ci" preset (sm_75 and sm_90 only) without a GPU, else "default" (the GPU in this machine).
choose_preset() {
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then echo default; else echo ci; fi
}

# The build folder of a preset (CMakePresets.json): build/ or build-ci/.
preset_binary_dir() {
  if [ "$1" = ci ]; then echo "$repo_root/build-ci"; else echo "$repo_root/build"; fi
}

# Ninja for a new build folder when it is installed (its progress is one line); a folder keeps
# the generator it was configured with.
generator_args() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja >/dev/null; then echo "-G Ninja"; fi
}

# The build's progress lines ("[12/140] Building CUDA object ..."): on a terminal one line that
# updates in place, elsewhere (CI logs) every tenth step.
show_progress() {
  local line count=0
  while IFS= read -r line; do
    case $line in
      \[*/*\]* | \[*%\]*) ;;
      *) continue ;;
    esac
    count=$((count + 1))
    if [ -t 1 ]; then
      printf '\r\033[K%s' "${line:0:$(($(tput cols 2>/dev/null || echo 100) - 1))}"
    elif [ $((count % 10)) -eq 1 ]; then
      echo "$line"
    fi
  done
  [ -t 1 ] && [ $count -gt 0 ] && printf '\r\033[K'
  return 0
}

# Builds a configured folder with visible progress; the whole output goes to DIR/build.log and
# its tail is shown when the build fails.
build_with_progress() {
  local dir=$1
  shift
  local log="$dir/build.log" where=${dir#"$repo_root"/}
  if [ -f "$dir/.fa-built" ]; then
    echo "Building in $where/ (only what changed; log: $where/build.log)"
  else
    echo "Building in $where/: the first build takes several minutes, later ones only what changed" \
      "(log: $where/build.log)"
  fi
  local start=$SECONDS
  if ! cmake --build "$dir" -j "$(nproc)" "$@" 2>&1 | tee "$log" | show_progress; then
    echo "The build failed; the end of $where/build.log:" >&2
    grep -m 20 -nE 'error|Error' "$log" >&2 || true
    tail -n 25 "$log" >&2
    return 1
  fi
  touch "$dir/.fa-built"
  local warnings
  warnings=$(grep -ci 'warning' "$log" || true)
  if [ "${warnings:-0}" -gt 0 ]; then
    grep -m 10 -i 'warning' "$log"
    echo "Built in $((SECONDS - start)) s ($warnings warning lines: $where/build.log)"
  else
    echo "Built in $((SECONDS - start)) s"
  fi
}

# Configures (quietly: the log is DIR/configure.log) and builds the preset's folder.
configure_and_build() {
  local preset=$1 dir
  dir=$(preset_binary_dir "$preset")
  mkdir -p "$dir"
  [ -f "$dir/CMakeCache.txt" ] || echo "Configuring the $preset preset in ${dir#"$repo_root"/}/ (the first time takes a while: it looks for the compilers)"
  # shellcheck disable=SC2046
  if ! cmake --preset "$preset" -S "$repo_root" $(generator_args "$dir") $(fa_cmake_launchers "$dir") "${fa_cmake_args[@]}" \
    >"$dir/configure.log" 2>&1; then
    tail -n 30 "$dir/configure.log" >&2
    echo "Configuring the $preset preset failed (the whole log: ${dir#"$repo_root"/}/configure.log)" >&2
    return 1
  fi
  build_with_progress "$dir"
}

# The phases of a long command (scripts/test.sh): `phase "name"` prints a numbered title and ends
# the phase before it; `phase_summary` (run on exit) prints how long each took. FA_PHASES is the
# number of phases the command will announce.
fa_phase_names=()
fa_phase_seconds=()
fa_phase_started=
phase_end() {
  [ -n "$fa_phase_started" ] || return 0
  fa_phase_seconds+=($((SECONDS - fa_phase_started)))
  fa_phase_started=
}
phase() {
  phase_end
  fa_phase_names+=("$1")
  echo
  echo "==> [${#fa_phase_names[@]}/${FA_PHASES:-?}] $1"
  fa_phase_started=$SECONDS
}
phase_summary() {
  local status=$? i
  phase_end
  [ ${#fa_phase_names[@]} -gt 0 ] || return 0
  echo
  echo "==> Time per phase:"
  for i in "${!fa_phase_names[@]}"; do
    printf '    %-60s %4d min %02d s\n' "${fa_phase_names[$i]}" $((${fa_phase_seconds[$i]:-0} / 60)) \
      $((${fa_phase_seconds[$i]:-0} % 60))
  done
  printf '    %-60s %4d min %02d s\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
  [ "$status" -eq 0 ] || echo "==> Stopped in phase ${#fa_phase_names[@]} (exit status $status)"
  return "$status"
}
