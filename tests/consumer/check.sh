#!/usr/bin/env bash
# Builds and runs tests/consumer against ferry installed with `cmake --install` (find_package,
# its headers precompiled), and configures and compiles it against the source tree (add_subdirectory).
# Usage: tests/consumer/check.sh <ferry source dir> <ferry build dir> <scratch dir>
set -euo pipefail
source_dir=$1 build_dir=$2 scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
# Only the layers' include/ folders are installed: public headers and ferry/detail/, never
# a layer's internal/ or src/ headers.
unexpected=$(cd "$scratch/prefix/include" && find ferry -name '*.hpp' ! -path 'ferry/detail/*' -printf '%P\n' |
  grep -vxF -f <(cd "$source_dir" && for layer in runtime serialization channels; do
    (cd "$layer/include/ferry" && find . -name '*.hpp' ! -path './detail/*' -printf '%P\n'); done) || true)
if [[ -n $unexpected ]]; then
  echo "check.sh: installed headers that are neither public nor ferry/detail/: $unexpected" >&2
  exit 1
fi
if [[ -e $scratch/prefix/include/ferry/ring_transport.hpp || -e $scratch/prefix/include/ring ]]; then
  echo "check.sh: a private header was installed" >&2
  exit 1
fi
# Every installed header is one a public header reaches: nothing is installed that a user's
# program could not have needed.
"$source_dir/tests/consumer/check_installed_headers.sh" "$scratch/prefix/include" >/dev/null
# The `ferry` tool (FERRY_BUILD_TOOLS) is installed into bin/ and runs from there.
if grep -q '^FERRY_BUILD_TOOLS:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  if ! "$scratch/prefix/bin/ferry" --help | grep -q 'ferry ps\|  ps '; then
    echo "check.sh: bin/ferry was not installed, or its --help does not list ps" >&2
    exit 1
  fi
fi
cmake -S "$source_dir/tests/consumer" -B "$scratch/installed" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DFERRY_CONSUMER_PRECOMPILED=ON >/dev/null
cmake --build "$scratch/installed" >/dev/null
# The installed headers were precompiled and the program compiled with them.
if ! compgen -G "$scratch/installed/CMakeFiles/consumer.dir/cmake_pch.hxx.[gp]ch" >/dev/null; then
  echo "check.sh: the consumer's precompiled header of ferry's installed headers was not made" >&2
  exit 1
fi
"$scratch/installed/consumer"
# A program that does not link ferry::ucx never loads UCX.
if ldd "$scratch/installed/consumer" | grep -q 'libucp'; then
  echo "check.sh: the consumer without ucx:// links UCX" >&2
  exit 1
fi
# A ferry built with UCX exports ferry::ucx, and a ucx:// program built against it works.
if grep -q 'set(FERRY_BUILT_WITH_UCX ON)' "$scratch/prefix"/lib*/cmake/ferry/ferryConfig.cmake; then
  if [[ ! -x $scratch/installed/consumer_ucx ]]; then
    echo "check.sh: ferry was built with UCX, but its package gave no ferry::ucx" >&2
    exit 1
  fi
  UCX_TLS=${UCX_TLS:-tcp} "$scratch/installed/consumer_ucx"
fi

# The same consumer where the CUDA toolkit is out of its view (not on PATH, its prefixes
# ignored, CUDAToolkit_ROOT pointing nowhere): it must build and run against this ferry
# also when ferry was built with CUDA, since it does not use CUDA itself.
cuda_dirs=$(ls -d /usr/local/cuda /usr/local/cuda-* /opt/cuda 2>/dev/null | tr '\n' ';' || true)
ignored_paths=$(for d in ${cuda_dirs//;/ }; do printf '%s;' "$d/bin" "$d/lib" "$d/lib64" "$d/include" "$d/targets/x86_64-linux/lib" "$d/targets/x86_64-linux/include"; done)
path_without_cuda=$(tr ':' '\n' <<<"$PATH" | grep -v cuda | paste -sd: -)
grep -q 'set(FERRY_BUILT_WITH_CUDA ON)' "$scratch/prefix"/lib*/cmake/ferry/ferryConfig.cmake &&
  echo "check.sh: the consumer without a CUDA toolkit builds against a ferry built with CUDA" >&2
env -u CUDA_PATH -u CUDA_HOME PATH="$path_without_cuda" \
  cmake -S "$source_dir/tests/consumer" -B "$scratch/without_cuda" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DFERRY_CONSUMER_WITHOUT_CUDA=ON -DCUDAToolkit_ROOT=/nonexistent "-DCMAKE_IGNORE_PREFIX_PATH=$cuda_dirs" \
  "-DCMAKE_IGNORE_PATH=$ignored_paths" >/dev/null
env PATH="$path_without_cuda" cmake --build "$scratch/without_cuda" --target consumer >/dev/null
"$scratch/without_cuda/consumer"

# From ferry's source tree (add_subdirectory): configured as a consumer does by default, and
# the consumer's sources compiled against the in-tree targets (their include paths, options
# and definitions). The library itself is not built again here: every other build of the
# suite builds the same targets, and linking is the installed consumer's check above.
cmake -S "$source_dir/tests/consumer" -B "$scratch/subdirectory" -G Ninja -DFERRY_SOURCE_DIR="$source_dir" \
  >"$scratch/subdirectory.log"
objects=(CMakeFiles/consumer.dir/main.cpp.o)
if grep -q 'ferry::ucx found' "$scratch/subdirectory.log"; then objects+=(CMakeFiles/consumer_ucx.dir/ucx_main.cpp.o); fi
if grep -q 'set(FERRY_BUILT_WITH_UCX ON)' "$scratch/prefix"/lib*/cmake/ferry/ferryConfig.cmake &&
  [[ ${#objects[@]} -ne 2 ]]; then
  echo "check.sh: ferry's source tree gave a consumer no ferry::ucx, though this ferry was built with UCX" >&2
  exit 1
fi
cmake --build "$scratch/subdirectory" --target "${objects[@]}" >/dev/null
