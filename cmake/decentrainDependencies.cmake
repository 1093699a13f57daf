# Finds what the decentrain target links, in the build tree and again in an installed
# package config, so both give the same targets:
#   cereal::cereal      required: checkpoints and (later) network messages are cereal archives
#   xxhash.h            required (Debian: libxxhash-dev, used header-only): checkpoint and
#                       state checksums (XXH3)
#   OpenMP::OpenMP_CXX  when OpenMP is available (CPU kernels run multi-threaded)
#   Threads::Threads    in-process peers and the TCP transport's I/O thread
#   OpenSSL::SSL        when OpenSSL is found (Debian: libssl-dev): the TCP transport's run key
#                       (transport/auth.hpp, libcrypto) and TLS (transport/tls.hpp, libssl);
#                       without it a run key or TLS is refused with a message
#   decentrain::mpi     when MPI is found: link it to use transport::mpi
#   decentrain::cuda    when the CUDA toolkit is found: link it from CUDA sources that use
#                       dt::cuda (the CUDA runtime; cuBLAS is opened at the first GEMM)
#   decentrain::nccl    when NCCL (2.27 or later) is found beside the toolkit or on the system:
#                       link it to use transport::nccl (host code: any C++ compiler builds it)
#   decentrain::cblas   always; it carries a CBLAS and DECENTRAIN_HAS_CBLAS=1 when one is
#                       found, and is empty otherwise (the portable GEMM is used then)
# With OpenMP, OpenBLAS's OpenMP build (Debian: libopenblas-openmp-dev) is preferred: the
# pthreads build keeps its own spinning workers, which fight the OpenMP threads of the other
# kernels for cores each time a GEMM and an elementwise op follow each other (measured in
# bench/gemm: both sides slowed to about 0.6x on 2 cores).
include_guard(GLOBAL)

find_package(cereal REQUIRED)
find_path(DECENTRAIN_XXHASH_INCLUDE_DIR xxhash.h)
if(NOT DECENTRAIN_XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "decentrain needs xxHash's header xxhash.h (Debian: apt-get install libxxhash-dev)")
endif()
find_package(OpenMP QUIET COMPONENTS CXX)
find_package(Threads REQUIRED)
find_package(OpenSSL QUIET COMPONENTS Crypto SSL)

# Standalone asio (Debian: libasio-dev) is header-only; transport/tcp.hpp compiles only when
# <asio.hpp> is found. MPI is optional: decentrain::mpi carries it and DECENTRAIN_HAS_MPI=1.
find_path(DECENTRAIN_ASIO_INCLUDE_DIR asio.hpp)
find_package(MPI QUIET COMPONENTS CXX)
if(MPI_CXX_FOUND AND NOT TARGET decentrain::mpi)
  add_library(decentrain::mpi INTERFACE IMPORTED)
  set_target_properties(decentrain::mpi PROPERTIES
    INTERFACE_LINK_LIBRARIES MPI::MPI_CXX
    INTERFACE_COMPILE_DEFINITIONS "DECENTRAIN_HAS_MPI=1")
endif()

# The CUDA toolkit (at /usr/local/cuda or on the PATH) is optional as well. CPU-only users never
# link CUDA libraries: only decentrain::cuda carries them, the runtime alone (cuBLAS is opened at
# the first GEMM on a GPU: kernels/cuda/cublas_library.hpp says why).
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND AND NOT TARGET decentrain::cuda)
  add_library(decentrain::cuda INTERFACE IMPORTED)
  set_target_properties(decentrain::cuda PROPERTIES INTERFACE_LINK_LIBRARIES "CUDA::cudart;${CMAKE_DL_LIBS}")
endif()

# NCCL: the toolkit's copy (/usr/local/cuda ships one) or a system one (Debian: libnccl-dev).
# transport/nccl.hpp is host code, so decentrain::nccl carries the CUDA runtime's headers and
# library too, and a program compiled by g++ alone can use it.
if(CUDAToolkit_FOUND AND NOT TARGET decentrain::nccl)
  find_path(DECENTRAIN_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(DECENTRAIN_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(DECENTRAIN_NCCL_INCLUDE_DIR AND DECENTRAIN_NCCL_LIBRARY)
    file(STRINGS ${DECENTRAIN_NCCL_INCLUDE_DIR}/nccl.h _nccl_version REGEX "^#define NCCL_(MAJOR|MINOR) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" _nccl_major "${_nccl_version}")
    string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" _nccl_minor "${_nccl_version}")
    if(_nccl_major GREATER 2 OR (_nccl_major EQUAL 2 AND _nccl_minor GREATER_EQUAL 27))
      add_library(decentrain::nccl INTERFACE IMPORTED)
      set_target_properties(decentrain::nccl PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${DECENTRAIN_NCCL_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${DECENTRAIN_NCCL_LIBRARY};CUDA::cudart"
        INTERFACE_COMPILE_DEFINITIONS "DECENTRAIN_HAS_NCCL=1")
    endif()
  endif()
endif()

if(NOT TARGET decentrain::cblas)
  add_library(decentrain::cblas INTERFACE IMPORTED)
  if(NOT DEFINED DECENTRAIN_USE_CBLAS OR DECENTRAIN_USE_CBLAS)
    if(OpenMP_CXX_FOUND)
      find_path(DECENTRAIN_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-openmp NO_CMAKE_SYSTEM_PATH
                PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE} /usr/include)
      find_library(DECENTRAIN_CBLAS_LIBRARY NAMES openblas PATH_SUFFIXES openblas-openmp NO_CMAKE_SYSTEM_PATH
                   PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib)
      if(NOT DECENTRAIN_CBLAS_INCLUDE_DIR OR NOT DECENTRAIN_CBLAS_LIBRARY)
        unset(DECENTRAIN_CBLAS_INCLUDE_DIR CACHE)
        unset(DECENTRAIN_CBLAS_LIBRARY CACHE)
      endif()
    endif()
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
