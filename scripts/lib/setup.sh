# Shared by scripts/course.sh and scripts/test.sh: find or install what the build needs, then
# configure and build. Sourced, not run.

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Debian/Ubuntu packages the build needs: CLI11 (command line) and Catch2 (tests), both
# header-only. Installed with apt-get when running as root; otherwise the exact command.
ensure_build_packages() {
  local missing=()
  [ -f /usr/include/CLI/CLI.hpp ] || [ -f /usr/local/include/CLI/CLI.hpp ] || missing+=(libcli11-dev)
  if ! [ -f /usr/include/catch2/catch.hpp ] && ! [ -f /usr/include/catch2/catch_test_macros.hpp ] &&
     ! [ -f /usr/local/include/catch2/catch_test_macros.hpp ]; then
    missing+=(catch2)
  fi
  command -v cmake >/dev/null || missing+=(cmake)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "Installing ${missing[*]} from the distribution's packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "Missing: ${missing[*]}. Install them with:" >&2
    echo "  sudo apt-get install ${missing[*]}" >&2
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

# A CMake >= 3.24 from pip into the venv where the system's is older (design.md).
ensure_cmake_version() {
  local version
  version=$(cmake --version | head -n1 | grep -oE '[0-9]+\.[0-9]+' | head -n1)
  if [ "$(printf '%s\n3.24\n' "$version" | sort -V | head -n1)" != "3.24" ]; then
    ensure_venv
    "$repo_root/.venv/bin/pip" install -q "cmake==3.31.6"
    export PATH="$repo_root/.venv/bin:$PATH"
  fi
}

# The Python packages of requirements.txt, pinned, in .venv (PEP 668 systems refuse
# system-wide pip). Reinstalled only when requirements.txt changes.
ensure_venv() {
  local venv="$repo_root/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || { echo "python3 -m venv failed: install python3-venv" >&2; exit 1; }
  fi
  if ! cmp -s "$repo_root/requirements.txt" "$venv/.requirements.txt"; then
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r "$repo_root/requirements.txt"
    cp "$repo_root/requirements.txt" "$venv/.requirements.txt"
  fi
}

# The "ci" preset (sm_75 and sm_90 only) without a GPU, else "default" (the GPU in this machine).
choose_preset() {
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then echo default; else echo ci; fi
}

configure_and_build() {
  local preset=$1
  cmake --preset "$preset" -S "$repo_root" >/dev/null
  cmake --build --preset "$preset" -j "$(nproc)"
}
