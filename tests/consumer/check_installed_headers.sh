#!/usr/bin/env bash
# Fails when an installed ferry header is reachable from no public header (one outside
# ferry/detail/), following #include "ferry/..." from the public ones, or when an installed
# header includes a ferry header that was not installed. Only what a public template needs
# is installed: a detail header nothing public includes belongs in a layer's internal/ or src/.
# Usage: check_installed_headers.sh <include dir of an installed ferry>
set -euo pipefail
include_dir=${1:?usage: check_installed_headers.sh <include dir of an installed ferry>}
cd "$include_dir"

mapfile -t installed < <(find ferry -name '*.hpp' | sort)
if ((${#installed[@]} == 0)); then
  echo "check_installed_headers.sh: no ferry headers under $include_dir" >&2
  exit 1
fi
declare -A reached=()
queue=()
for header in "${installed[@]}"; do
  [[ $header == ferry/detail/* ]] || queue+=("$header")
done
not_installed=()
while ((${#queue[@]} > 0)); do
  header=${queue[-1]}
  unset 'queue[-1]'
  [[ -n ${reached[$header]:-} ]] && continue
  reached[$header]=1
  if [[ ! -f $header ]]; then
    not_installed+=("$header")
    continue
  fi
  while read -r included; do
    queue+=("$included")
  done < <(sed -nE 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](ferry/[^">]+)[">].*|\1|p' "$header")
done

unreached=()
for header in "${installed[@]}"; do
  [[ -n ${reached[$header]:-} ]] || unreached+=("$header")
done
status=0
if ((${#unreached[@]} > 0)); then
  echo "installed headers that no public header includes (move them to the layer's internal/ or src/):" >&2
  printf '  %s\n' "${unreached[@]}" >&2
  status=1
fi
if ((${#not_installed[@]} > 0)); then
  echo "headers that installed headers include but that were not installed:" >&2
  printf '  %s\n' "${not_installed[@]}" >&2
  status=1
fi
((status == 0)) && echo "every installed ferry header (${#installed[@]}) is reachable from a public one"
exit $status
