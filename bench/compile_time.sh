#!/usr/bin/env bash
# How long a program that trains with the CPU trainer and DiLoCo takes to compile
# (bench/compile_time/diloco_program.cpp, -c, Release flags as a user builds: -O2 -fopenmp),
# including the whole library (decentrain.hpp) or only the headers it uses (-DDECENTRAIN_LIGHT);
# best of N runs per compiler, on an otherwise idle machine. Prints a table, writes JSON.
#   bench/compile_time.sh [RUNS=3] [OUT=bench/results/compile_time.json]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
out=${2:-$root/bench/results/compile_time.json}
src=$root/bench/compile_time/diloco_program.cpp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best() {  # best wall seconds of $runs compiles: best CXX FLAGS...
  local b=
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" -c "$src" -o "$tmp/p.o"
    t1=$(date +%s.%N)
    b=$(python3 -c "import sys; t=$t1-$t0; b='$b'; print(min(t, float(b)) if b else t)")
  done
  printf '%.2f' "$b"
}
flags=(-std=c++20 -O2 -fopenmp -DDECENTRAIN_HAS_CBLAS=1 -I"$root/include")
rows=()
printf '%-10s %-22s %8s\n' compiler includes seconds
for cxx in g++ clang++; do
  command -v "$cxx" > /dev/null || continue
  for variant in whole light; do
    extra=()
    [ "$variant" = light ] && extra=(-DDECENTRAIN_LIGHT)
    s=$(best "$cxx" "${flags[@]}" "${extra[@]}")
    name=$([ "$variant" = light ] && echo "the headers it uses" || echo "decentrain.hpp")
    printf '%-10s %-22s %8s\n' "$cxx" "$name" "$s"
    rows+=("{\"compiler\": \"$cxx\", \"includes\": \"$variant\", \"seconds\": $s}")
  done
done
mkdir -p "$(dirname "$out")"
(IFS=,; echo "{\"runs\": $runs, \"flags\": \"${flags[*]:0:4}\", \"rows\": [${rows[*]}]}") > "$out"
echo "rows written to $out"
