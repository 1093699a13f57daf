// An empty translation unit, for the targets that only build a precompiled header
// (tests/CMakeLists.txt, bench/CMakeLists.txt): a target needs a source of its own.
