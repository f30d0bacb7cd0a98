#!/bin/sh
# Fails when a sample includes one of ferry's internal headers (ferry/detail/..., a layer's
# src/): a sample shows what a user may write, with the public API only.
# Usage: check_public_headers.sh SAMPLES_DIR
set -eu
dir=${1:?usage: check_public_headers.sh SAMPLES_DIR}
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](ferry/detail/|[a-z_]+/src/|src/)' "$dir" \
     --include='*.cpp' --include='*.hpp' --include='*.h'; then
  echo "the samples above include ferry internals: use public headers (ferry/*.hpp) only" >&2
  exit 1
fi
echo "every sample includes public headers only"
