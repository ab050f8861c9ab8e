#!/usr/bin/env bash
# design.md's source_hash: `source_hash.sh 04_online_softmax` hashes stages/04_online_softmax and
# common/; `source_hash.sh --tree` hashes all of stages/ and common/ (what env.txt records).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --tree ]; then folders=(stages common); else folders=("stages/${1:?usage: source_hash.sh STAGE|--tree}" common); fi
find "${folders[@]}" -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \
  -o -name CMakeLists.txt \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
