#!/usr/bin/env bash
# How long a program that trains with the CPU trainer and DiLoCo takes to compile
# (bench/compile_time/diloco_program.cpp, -c, Release flags as a user builds: -O2 -fopenmp),
# including the whole library (decentrain.hpp), only the headers it uses (-DDECENTRAIN_LIGHT), or
# those headers with the CPU instantiations taken from the compiled library
# (-DDECENTRAIN_COMPILED_LIB: what linking decentrain::compiled does; the library's own compile,
# src/compiled_cpu.cpp, happens once and is reported on its own row); best of N runs per
# compiler, on an otherwise idle machine. Prints a table, writes JSON.
#   bench/compile_time.sh [RUNS=3] [OUT=bench/results/compile_time.json]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
out=${2:-$root/bench/results/compile_time.json}
src=$root/bench/compile_time/diloco_program.cpp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best() {  # best wall seconds of $runs compiles: best SOURCE CXX FLAGS...
  local b= file=$1
  shift
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" -c "$file" -o "$tmp/p.o"
    t1=$(date +%s.%N)
    b=$(python3 -c "import sys; t=$t1-$t0; b='$b'; print(min(t, float(b)) if b else t)")
  done
  printf '%.2f' "$b"
}
flags=(-std=c++20 -O2 -fopenmp -DDECENTRAIN_HAS_CBLAS=1 -I"$root/include")
rows=()
printf '%-10s %-48s %8s\n' compiler what seconds
for cxx in g++ clang++; do
  command -v "$cxx" > /dev/null || continue
  for variant in whole whole-compiled light compiled library; do
    file=$src
    case $variant in
      whole) extra=(); name="program, decentrain.hpp" ;;
      whole-compiled) extra=(-DDECENTRAIN_COMPILED_LIB); name="program, decentrain.hpp + decentrain::compiled" ;;
      light) extra=(-DDECENTRAIN_LIGHT); name="program, the headers it uses" ;;
      compiled) extra=(-DDECENTRAIN_LIGHT -DDECENTRAIN_COMPILED_LIB); name="program, those headers + decentrain::compiled" ;;
      library) extra=(-DDECENTRAIN_COMPILED_LIB); file=$root/src/compiled_cpu.cpp; name="decentrain::compiled itself (once)" ;;
    esac
    s=$(best "$file" "$cxx" "${flags[@]}" "${extra[@]}")
    printf '%-10s %-48s %8s\n' "$cxx" "$name" "$s"
    rows+=("{\"compiler\": \"$cxx\", \"variant\": \"$variant\", \"seconds\": $s}")
  done
done
mkdir -p "$(dirname "$out")"
(IFS=,; echo "{\"runs\": $runs, \"flags\": \"${flags[*]:0:4}\", \"rows\": [${rows[*]}]}") > "$out"
echo "rows written to $out"
