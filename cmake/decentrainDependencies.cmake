# Finds what the decentrain target links, in the build tree and again in an installed
# package config, so both give the same targets:
#   OpenMP::OpenMP_CXX  when OpenMP is available (CPU kernels run multi-threaded)
#   decentrain::cblas   always; it carries a CBLAS and DECENTRAIN_HAS_CBLAS=1 when one is
#                       found, and is empty otherwise (the portable GEMM is used then)
include_guard(GLOBAL)

find_package(OpenMP QUIET COMPONENTS CXX)

if(NOT TARGET decentrain::cblas)
  add_library(decentrain::cblas INTERFACE IMPORTED)
  if(NOT DEFINED DECENTRAIN_USE_CBLAS OR DECENTRAIN_USE_CBLAS)
    find_path(DECENTRAIN_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
    find_library(DECENTRAIN_CBLAS_LIBRARY NAMES openblas cblas blis)
    if(DECENTRAIN_CBLAS_INCLUDE_DIR AND DECENTRAIN_CBLAS_LIBRARY)
      set_target_properties(decentrain::cblas PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${DECENTRAIN_CBLAS_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${DECENTRAIN_CBLAS_LIBRARY}"
        INTERFACE_COMPILE_DEFINITIONS "DECENTRAIN_HAS_CBLAS=1")
      set(DECENTRAIN_HAS_CBLAS TRUE)
    endif()
  endif()
endif()
