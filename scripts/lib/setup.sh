# Shared by scripts/test and scripts/demo: installs the Debian packages the build needs (only
# those missing; apt-get as root, or through sudo) and configures the build directory.
# Packages: g++/make (build-essential), cmake, catch2 (tests), libcereal-dev (checkpoints),
# libopenblas-openmp-dev (CBLAS GEMM sharing the OpenMP thread pool of the other kernels),
# python3 (single-header generator), libasio-dev (TCP transport), libssl-dev (the TCP transport's
# run key and TLS: OpenSSL's HMAC, ChaCha20-Poly1305 and TLS 1.3), openssl (scripts/tls_certs, which
# the TLS tests run), libopenmpi-dev + openmpi-bin
# (MPI transport and its tests). OpenMP ships with g++.

DECENTRAIN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DECENTRAIN_BUILD=${DECENTRAIN_BUILD:-$DECENTRAIN_ROOT/build}

decentrain_install_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root (or sudo) to install ${missing[*]}" >&2; return 1; }
    sudo=(sudo)
  fi
  # (once a run: the lists the first install fetched serve the next)
  if [ -z "${DECENTRAIN_APT_UPDATED:-}" ]; then
    "${sudo[@]}" apt-get update -qq
    DECENTRAIN_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Extra CMake arguments: the caller's DECENTRAIN_CMAKE_ARGS array (scripts/test builds the
# benchmarks only to check them; every other script builds them to measure).
decentrain_configure() {
  local args=(-DDECENTRAIN_BENCH_COMPILE_ONLY=OFF)
  [ -n "${DECENTRAIN_CMAKE_ARGS+set}" ] && args=("${DECENTRAIN_CMAKE_ARGS[@]}")
  decentrain_install_packages build-essential cmake catch2 libcereal-dev libopenblas-openmp-dev python3 \
    libasio-dev libssl-dev openssl libopenmpi-dev openmpi-bin pkg-config libcli11-dev libxxhash-dev "$@"
  cmake -S "$DECENTRAIN_ROOT" -B "$DECENTRAIN_BUILD" -DCMAKE_BUILD_TYPE=Release "${args[@]}"
}
