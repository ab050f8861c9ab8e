#!/usr/bin/env bash
# Brings the header-only build dependencies (Catch2, CLI11) to an offline GPU machine:
# downloads Debian's packages here into .deps/ (git-ignored) and unpacks them into .deps/root.
# Carry .deps along; scripts/gpu_suite.sh points CMake at .deps/root/usr when it exists.
set -euo pipefail
if [ $# -gt 0 ]; then
  [ "$1" = --help ] && { sed -n "2,4s/^# //p" "$0"; exit 0; }
  echo "offline_deps.sh: takes no arguments (it fetches Catch2 and CLI11 into .deps/), not '$*'" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
mkdir -p .deps/root
(cd .deps && apt-get download catch2 libcli11-dev)
for package in .deps/*.deb; do dpkg -x "$package" .deps/root; done
ls .deps/root/usr/include
