#!/usr/bin/env bash
# Builds and runs tests/consumer against ferry installed with `cmake --install`
# (find_package) and against the source tree (add_subdirectory).
# Usage: tests/consumer/check.sh <ferry source dir> <ferry build dir> <scratch dir>
set -euo pipefail
source_dir=$1 build_dir=$2 scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source_dir/tests/consumer" -B "$scratch/installed" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/installed" >/dev/null
"$scratch/installed/consumer"

# A unity build (FERRY_UNITY_BUILD): half the compile time of ferry's sources one by one, and
# a check that the option works for consumers who set it.
cmake -S "$source_dir/tests/consumer" -B "$scratch/subdirectory" -G Ninja -DFERRY_SOURCE_DIR="$source_dir" \
  -DFERRY_UNITY_BUILD=ON >/dev/null
cmake --build "$scratch/subdirectory" >/dev/null
"$scratch/subdirectory/consumer"
