#!/usr/bin/env bash
# Builds and runs tests/consumer against ferry installed with `cmake --install`
# (find_package) and against the source tree (add_subdirectory).
# Usage: tests/consumer/check.sh <ferry source dir> <ferry build dir> <scratch dir>
set -euo pipefail
source_dir=$1 build_dir=$2 scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
# Only the layers' include/ folders are installed: public headers and ferry/detail/, never
# a layer's private src/ headers.
unexpected=$(cd "$scratch/prefix/include" && find ferry -name '*.hpp' ! -path 'ferry/detail/*' -printf '%P\n' |
  grep -vxF -f <(cd "$source_dir" && ls runtime/include/ferry serialization/include/ferry channels/include/ferry | grep '\.hpp$') || true)
if [[ -n $unexpected ]]; then
  echo "check.sh: installed headers that are neither public nor ferry/detail/: $unexpected" >&2
  exit 1
fi
if [[ -e $scratch/prefix/include/ferry/ring_transport.hpp || -e $scratch/prefix/include/ring ]]; then
  echo "check.sh: a private header was installed" >&2
  exit 1
fi
cmake -S "$source_dir/tests/consumer" -B "$scratch/installed" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/installed" >/dev/null
"$scratch/installed/consumer"

# A unity build (FERRY_UNITY_BUILD): half the compile time of ferry's sources one by one, and
# a check that the option works for consumers who set it.
cmake -S "$source_dir/tests/consumer" -B "$scratch/subdirectory" -G Ninja -DFERRY_SOURCE_DIR="$source_dir" \
  -DFERRY_UNITY_BUILD=ON >/dev/null
cmake --build "$scratch/subdirectory" >/dev/null
"$scratch/subdirectory/consumer"
