#!/bin/sh
# A compiler launcher (CMake's <LANG>_COMPILER_LAUNCHER) for a target that is there only to build
# a precompiled header for others (tests/CMakeLists.txt, bench/CMakeLists.txt): it compiles the
# header, and for the target's own source, cmake/empty.cpp, leaves an empty object file without
# compiling it. Compiled, that empty file would take 10 s or more: the compiler instantiates the
# templates the header's inline functions use in every file that loads the header. Nothing links
# the object.
out=""
depfile=""
prev=""
empty=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out="$arg"
  [ "$prev" = "-MF" ] && depfile="$arg"
  case "$arg" in */cmake/empty.cpp) empty=1 ;; esac
  prev="$arg"
done
if [ -n "$empty" ] && [ -n "$out" ]; then
  : >"$out"
  [ -z "$depfile" ] || printf '%s:\n' "$out" >"$depfile"
  exit 0
fi
exec "$@"
