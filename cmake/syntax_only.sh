#!/bin/sh
# A compiler launcher (CMake's <LANG>_COMPILER_LAUNCHER): runs the compile command it is given
# with -fsyntax-only, which checks the file (templates instantiated, errors and warnings as in a
# full compile) without generating code, then leaves an empty object file where the command
# would have written one, for the build tool. bench/CMakeLists.txt says where it is used.
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out="$arg"
  prev="$arg"
done
"$@" -fsyntax-only || exit
[ -z "$out" ] || : >"$out"
