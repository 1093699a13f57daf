#!/bin/sh
# A compiler launcher (CMake's <LANG>_COMPILER_LAUNCHER): runs the compile command it is given
# with -fsyntax-only, which checks the file (templates instantiated, errors and warnings as in a
# full compile) without generating code, then leaves an empty object file where the command
# would have written one, for the build tool. bench/CMakeLists.txt and decentrain_add_gpu_program
# in CMakeLists.txt say where it is used; nvcc takes -fsyntax-only for its host compiler because
# CMake's CUDA command lines carry -forward-unknown-to-host-compiler.
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out="$arg"
  prev="$arg"
done
"$@" -fsyntax-only || exit
[ -z "$out" ] || : >"$out"
