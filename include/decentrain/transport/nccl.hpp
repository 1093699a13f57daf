// GPU peers' collectives through NCCL, on device buffers with no host copy: all-reduce,
// broadcast, all-gather and reduce-scatter queued on a CUDA stream. Compiled only when the build
// defines DECENTRAIN_HAS_NCCL (the decentrain::nccl CMake target does, and links NCCL and the
// CUDA runtime); host code, so any C++ compiler builds it against the toolkit's headers.
//
// Communicators are non-blocking (NCCL's config.blocking = 0, as torchft and PyTorch's watchdog
// use them), so no call waits past a deadline: a rank that never comes, to the communicator's
// forming or to a collective, ends the wait with a peer_error instead of a hang. A peer the fault
// slot has found gone is then left out with ncclCommShrink (NCCL >= 2.27), which ends the
// collectives still in flight and needs no new bootstrap; or the communicator is aborted and the
// survivors make a new one (`over` with the next generation), torchft's way.
//
// NCCL's own connections (its bootstrap and its transfers) are neither authenticated nor
// encrypted, whatever the endpoint that carried the communicator's id: this is a transport for
// the machines of one cluster on a network their operator trusts, not for peers on the internet.
#pragma once

#include "decentrain/config.hpp"

#ifndef DECENTRAIN_HAS_NCCL
#define DECENTRAIN_HAS_NCCL 0
#endif

#if DECENTRAIN_HAS_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/core/dtype.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"
#include "decentrain/transport/tag.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "transport/nccl.hpp needs NCCL 2.27 or later (ncclCommShrink)"
#endif

namespace decentrain::transport {

enum class nccl_op { sum, avg, min, max, product };

struct nccl_options {
  // The longest wait for the communicator to form, for the work queued on a stream to finish
  // (`synchronize`) and for a shrink.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // The longest wait for a communicator that is dropped to finish what it was given before it
  // is freed; past it, it is aborted (a peer that died can hold a finalize forever).
  std::chrono::milliseconds close_timeout = std::chrono::seconds(10);
  // Where a collective misses its deadline: abort the communicator at once (the stream is free,
  // the object is spent and the survivors make a new one with `over`), or keep it for a
  // `shrink` without the peers the fault slot finds gone (which ends what is in flight).
  bool abort_on_timeout = false;
  // This rank's GPU; -1 takes the calling thread's current device.
  int device = -1;
  // How often a wait looks at the stream and at the communicator's state.
  std::chrono::microseconds poll = std::chrono::microseconds(50);
};

namespace nccl_detail {

// The tag channel of the communicator's id on the bootstrap endpoint: "nccl".
inline constexpr std::uint32_t id_channel = 0x6e63636cu;

template <class T>
constexpr ncclDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, bf16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else static_assert(sizeof(T) == 0, "transport::nccl carries float, double, bf16 and std::int32_t elements");
}

inline ncclRedOp_t reduction(nccl_op op) {
  switch (op) {
    case nccl_op::sum: return ncclSum;
    case nccl_op::avg: return ncclAvg;
    case nccl_op::min: return ncclMin;
    case nccl_op::max: return ncclMax;
    case nccl_op::product: return ncclProd;
  }
  decentrain::detail::fail("transport::nccl: unknown reduction ", static_cast<int>(op));
}

// NCCL's code in words, and its own account of the last error where it has one.
inline std::string describe(ncclResult_t result, ncclComm_t comm) {
  std::string out = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last && *last) out += std::string(" (") + last + ")";
  return out;
}

// The positions in `current` (the original ranks of a communicator's members, in its order) of
// those not in `view` (the members, by original rank, of the group's view the fault slot agreed
// on): what a shrink leaves out. A member of the view the communicator has not is a joiner,
// which no shrink takes in.
inline std::vector<int> left_out(std::span<const int> current, std::span<const int> view) {
  for (const int r : view)
    decentrain::detail::check(std::find(current.begin(), current.end(), r) != current.end(), "transport::nccl: peer ", r,
                              " of the view is not in the communicator: a joiner needs a new one (nccl::over, next generation)");
  std::vector<int> out;
  for (std::size_t i = 0; i < current.size(); ++i)
    if (std::find(view.begin(), view.end(), current[i]) == view.end()) out.push_back(static_cast<int>(i));
  return out;
}

// Makes `device` the calling thread's CUDA device for a scope, and puts the previous one back:
// NCCL's calls act on the current device.
class device_scope {
 public:
  explicit device_scope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    } else if (previous_ == device) {
      previous_ = -1;
      return;
    }
    if (cudaSetDevice(device) != cudaSuccess) {
      const auto e = cudaGetLastError();
      decentrain::detail::fail("transport::nccl: cannot make CUDA device ", device, " current: ", cudaGetErrorString(e));
    }
  }
  ~device_scope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace nccl_detail

// One rank's communicator. One thread at a time uses it (ranks that are threads of one process
// each hold their own, on their own GPU). NCCL's account of an error (ncclGetLastError) is the
// process's last, which with several ranks in one process may be another rank's.
class nccl {
 public:
  // A new communicator's id (ncclGetUniqueId: rank 0's bootstrap address; no GPU needed).
  static ncclUniqueId make_id() {
    ncclUniqueId id{};
    const ncclResult_t r = ncclGetUniqueId(&id);
    decentrain::detail::check(r == ncclSuccess, "transport::nccl: ncclGetUniqueId failed: ", nccl_detail::describe(r, nullptr));
    return id;
  }

  // Every rank of `bootstrap` calls it: rank 0 makes the id and sends it to the others, each of
  // which receives it (the endpoint's timeout bounds the wait). `generation` keeps the ids of
  // successive communicators over one endpoint apart.
  template <endpoint E>
  static ncclUniqueId share_id(E& bootstrap, std::uint32_t generation = 0) {
    const tag_type tag = (tag_type{nccl_detail::id_channel} << 32) | generation;
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) {
      id = make_id();
      const auto* p = reinterpret_cast<const std::byte*>(&id);
      for (int r = 1; r < bootstrap.world(); ++r) bootstrap.send(r, tag, std::span<const std::byte>(p, sizeof id));
      return id;
    }
    const bytes got = bootstrap.recv(0, tag);
    decentrain::detail::check(got.size() == sizeof id, "transport::nccl: rank 0 sent a communicator id of ", got.size(),
                              " bytes where NCCL's has ", sizeof id, " (another NCCL, or not this library's message)");
    std::memcpy(&id, got.data(), sizeof id);
    return id;
  }

  // A communicator of the bootstrap endpoint's ranks, each on its own GPU: the id travels over
  // the endpoint, everything after it over NCCL's own connections.
  template <endpoint E>
  static nccl over(E& bootstrap, nccl_options options = {}, std::uint32_t generation = 0) {
    const ncclUniqueId id = share_id(bootstrap, generation);
    return nccl(id, bootstrap.rank(), bootstrap.world(), options);
  }

  // Joins the communicator `id` names as `rank` of `world`; returns once all `world` ranks have
  // joined, or throws a peer_error when they have not within the timeout (the communicator is
  // then aborted).
  nccl(const ncclUniqueId& id, int rank, int world, nccl_options options = {}) : options_(options), rank_(rank), world_(world) {
    using decentrain::detail::check;
    check(world >= 1, "transport::nccl: a communicator needs at least 1 rank, got world ", world);
    check(rank >= 0 && rank < world, "transport::nccl: rank ", rank, " is outside a world of ", world);
    check(options.timeout.count() > 0, "transport::nccl: the timeout must be positive, got ", options.timeout.count(), " ms");
    check(options.close_timeout.count() > 0, "transport::nccl: the close timeout must be positive, got ",
          options.close_timeout.count(), " ms");
    check(options.poll.count() > 0, "transport::nccl: the poll interval must be positive, got ", options.poll.count(), " us");
    int version = 0;
    check(ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 27, 0),
          "transport::nccl: the NCCL library loaded is version ", version, "; this transport needs 2.27 or later (ncclCommShrink)");
    int devices = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
      (void)cudaGetLastError();  // the sticky "no device" status
      decentrain::detail::fail("transport::nccl: no CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(e),
                               "): NCCL's collectives run on GPUs");
    }
    check(devices > 0, "transport::nccl: no CUDA device on this machine: NCCL's collectives run on GPUs");
    if (options.device < 0) {
      check(cudaGetDevice(&device_) == cudaSuccess, "transport::nccl: cudaGetDevice failed");
    } else {
      check(options.device < devices, "transport::nccl: CUDA device ", options.device, " does not exist: this machine has ",
            devices, " CUDA device", devices == 1 ? "" : "s");
      device_ = options.device;
    }
    for (int r = 0; r < world; ++r) original_ranks_.push_back(r);
    const nccl_detail::device_scope on(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string why = nccl_detail::describe(r, comm_);
      abort();
      decentrain::detail::fail("transport::nccl: rank ", rank, " of ", world, " could not join the communicator on CUDA device ",
                               device_, ": ", why);
    }
    settle(comm_, "form the communicator", [&] {
      return concat_world("the communicator of ", world, " ranks did not form within ", options_.timeout.count(),
                          " ms: a rank did not join (not started, on another id, or gone)");
    });
  }

  nccl(nccl&& other) noexcept { *this = std::move(other); }
  nccl& operator=(nccl&& other) noexcept {
    if (this != &other) {
      release();
      options_ = other.options_;
      comm_ = std::exchange(other.comm_, nullptr);
      rank_ = other.rank_;
      world_ = other.world_;
      device_ = other.device_;
      stalled_ = other.stalled_;
      original_ranks_ = std::move(other.original_ranks_);
      stats_ = other.stats_;
    }
    return *this;
  }
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  ~nccl() { release(); }

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  // The rank each member had when the communicator was formed, in the current rank order (a
  // shrink removes the lost and closes the gaps, as ncclCommShrink numbers them).
  std::span<const int> original_ranks() const { return original_ranks_; }
  // False once aborted: every call but the destructor then throws.
  bool usable() const { return comm_ != nullptr; }
  ncclComm_t native() const { return comm_; }
  // messages_sent: collectives queued; bytes_sent: the elements they were given, in bytes (what
  // crosses the links depends on NCCL's algorithm, which it does not say).
  traffic_stats stats() const { return stats_; }

  // In place: every rank's `data` becomes the reduction of all of them. Each collective is
  // queued on `stream` and returns at once; `synchronize` waits for it.
  template <class T>
  void all_reduce(std::span<T> data, nccl_op op, cudaStream_t stream) {
    check_device_memory(data.data(), data.size_bytes(), "all_reduce");
    queue("all_reduce", data.size_bytes(), [&] {
      return ncclAllReduce(data.data(), data.data(), data.size(), nccl_detail::data_type<T>(), nccl_detail::reduction(op), comm_, stream);
    });
  }
  // In place: `root`'s data reaches every rank.
  template <class T>
  void broadcast(std::span<T> data, int root, cudaStream_t stream) {
    decentrain::detail::check(root >= 0 && root < world_, "transport::nccl: broadcast from rank ", root, ", outside a world of ", world_);
    check_device_memory(data.data(), data.size_bytes(), "broadcast");
    queue("broadcast", data.size_bytes(), [&] {
      return ncclBroadcast(data.data(), data.data(), data.size(), nccl_detail::data_type<T>(), root, comm_, stream);
    });
  }
  // `all` (world x mine.size() elements) gets every rank's `mine`, in rank order.
  template <class T>
  void all_gather(std::type_identity_t<std::span<const T>> mine, std::span<T> all, cudaStream_t stream) {
    check_parts("all_gather", mine.size(), all.size());
    check_device_memory(mine.data(), mine.size_bytes(), "all_gather");
    check_device_memory(all.data(), all.size_bytes(), "all_gather");
    queue("all_gather", mine.size_bytes(), [&] {
      return ncclAllGather(mine.data(), all.data(), mine.size(), nccl_detail::data_type<T>(), comm_, stream);
    });
  }
  // `mine` gets this rank's part (its rank's mine.size() elements) of the reduction of every
  // rank's `all`.
  template <class T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> all, std::span<T> mine, nccl_op op, cudaStream_t stream) {
    check_parts("reduce_scatter", mine.size(), all.size());
    check_device_memory(mine.data(), mine.size_bytes(), "reduce_scatter");
    check_device_memory(all.data(), all.size_bytes(), "reduce_scatter");
    queue("reduce_scatter", all.size_bytes(), [&] {
      return ncclReduceScatter(all.data(), mine.data(), mine.size(), nccl_detail::data_type<T>(), nccl_detail::reduction(op), comm_,
                               stream);
    });
  }

  // Waits for what is queued on `stream` (the collectives and whatever else the caller put
  // there). Past the timeout, or on an error NCCL reports (a peer's connection lost), throws a
  // peer_error; NCCL does not say which peer, so its peer() is -1 and the fault slot finds the
  // lost ones itself. After an error the communicator is aborted; after the timeout it is too
  // where options.abort_on_timeout says so, else kept for a `shrink`, which ends what is still
  // in flight.
  void synchronize(cudaStream_t stream) {
    check_sound("synchronize");
    const nccl_detail::device_scope on(device_);
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {  // the context is broken: nothing on it can be trusted
        (void)cudaGetLastError();
        abort();
        decentrain::detail::fail("transport::nccl: the stream failed while waiting for its collectives: ", cudaGetErrorString(q),
                                 "; the communicator is aborted");
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        // An error NCCL keeps (a peer's connection lost): a shrink would report it again, so the
        // survivors make a new communicator (over, next generation).
        const std::string why = nccl_detail::describe(r != ncclSuccess ? r : state, comm_);
        abort();
        fail_peer_because(failure_cause::other, -1, "synchronize", "transport::nccl: rank ", rank_, " of ", world_,
                          ": a collective failed: ", why, "; the communicator is aborted (make a new one with over())");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        stalled_ = true;
        if (options_.abort_on_timeout) abort();
        fail_peer_because(failure_cause::silent, -1, "synchronize", "transport::nccl: rank ", rank_, " of ", world_,
                          ": the collectives queued did not finish within ", options_.timeout.count(),
                          " ms: a rank did not take part (slow, stopped or gone); ",
                          options_.abort_on_timeout ? "the communicator is aborted" : "shrink() without it, or abort()");
      }
      std::this_thread::sleep_for(options_.poll);
    }
  }

  // The communicator without `lost` (ranks of this communicator, none of them this one), made
  // by ncclCommShrink: every survivor calls it with the same list (the view the fault slot
  // agreed on). What is still in flight on this communicator is ended first (NCCL_SHRINK_ABORT,
  // which shares no resources with the parent, so the parent is then aborted). This rank's
  // rank() and world() follow the new numbering. NCCL refuses a shrink that leaves none out:
  // with none lost this does nothing on a sound communicator, and refuses a stalled one (abort
  // it and make a new one with `over`).
  void shrink(std::span<const int> lost) {
    check_usable("shrink");
    std::vector<int> excluded(lost.begin(), lost.end());
    std::sort(excluded.begin(), excluded.end());
    using decentrain::detail::check;
    check(std::adjacent_find(excluded.begin(), excluded.end()) == excluded.end(), "transport::nccl: shrink lists a rank twice");
    for (const int r : excluded) {
      check(r >= 0 && r < world_, "transport::nccl: shrink leaves out rank ", r, ", outside a world of ", world_);
      check(r != rank_, "transport::nccl: rank ", rank_, " cannot leave itself out of the communicator (shrink)");
    }
    if (excluded.empty()) {
      check(!stalled_, "transport::nccl: a stalled communicator cannot shrink without leaving a rank out (NCCL refuses it): "
                       "abort() it and make a new one with over()");
      return;
    }
    const nccl_detail::device_scope on(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t next = nullptr;
    const ncclResult_t r = ncclCommShrink(comm_, excluded.data(), static_cast<int>(excluded.size()), &next, &config, NCCL_SHRINK_ABORT);
    if (r != ncclSuccess && r != ncclInProgress)
      decentrain::detail::fail("transport::nccl: ncclCommShrink failed: ", nccl_detail::describe(r, comm_));
    // A non-blocking shrink keeps its progress on the parent and writes the child's handle when
    // its job ends: wait on the parent, then for the handle. Giving up aborts the parent first,
    // which joins the job, so nothing writes to `next` after this frame is gone.
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    const auto give_up = [&](failure_cause cause, const std::string& why) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      if (next) (void)ncclCommAbort(next);
      fail_peer_because(cause, -1, "shrink", concat_world(why));
    };
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
        give_up(failure_cause::other, "the shrink failed: " + nccl_detail::describe(q != ncclSuccess ? q : state, comm_));
      if (state == ncclSuccess && std::atomic_ref<ncclComm_t>(next).load() != nullptr) break;
      if (std::chrono::steady_clock::now() > deadline)
        give_up(failure_cause::silent, decentrain::detail::concat("the shrunk communicator did not form within ", options_.timeout.count(),
                                                                  " ms: a survivor did not call shrink, or left out other ranks"));
      std::this_thread::sleep_for(options_.poll);
    }
    try {
      settle(next, "shrink", [&] {
        return concat_world("the shrunk communicator did not become ready within ", options_.timeout.count(), " ms");
      });
    } catch (...) {
      abort();  // its collectives were ended by the shrink: nothing is left to use it for
      throw;
    }
    int new_rank = 0, new_world = 0;
    (void)ncclCommUserRank(next, &new_rank);
    (void)ncclCommCount(next, &new_world);
    std::vector<int> kept;
    for (int i = 0; i < world_; ++i)
      if (!std::binary_search(excluded.begin(), excluded.end(), i)) kept.push_back(original_ranks_[static_cast<std::size_t>(i)]);
    (void)ncclCommAbort(comm_);  // the parent: it still counts the lost ranks
    comm_ = next;
    stalled_ = false;
    rank_ = new_rank;
    world_ = new_world;
    original_ranks_ = std::move(kept);
  }

  // Follows the fault slot: shrinks to the members of its new view (`ctx.set_view`'s members,
  // by the ranks they had when the communicator formed). Every survivor calls it with the same
  // view; a view with a member the communicator lacks (a joiner) is refused, named.
  void follow_view(std::span<const int> members) { shrink(nccl_detail::left_out(original_ranks_, members)); }

  // Ends the communicator now, and whatever it has in flight; the object is spent.
  void abort() noexcept {
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  template <class... Parts>
  std::string concat_world(Parts&&... parts) const {
    return decentrain::detail::concat("transport::nccl: rank ", rank_, " of ", world_, ": ", std::forward<Parts>(parts)...);
  }

  void check_usable(const char* what) const {
    decentrain::detail::check(comm_ != nullptr, "transport::nccl: ", what, " on a communicator that was aborted");
  }
  // Work queued behind a collective that never finished would wait with it.
  void check_sound(const char* what) const {
    check_usable(what);
    decentrain::detail::check(!stalled_, "transport::nccl: ", what, " on a communicator whose collectives did not finish: "
                              "shrink() it without the ranks lost, or abort() it, first");
  }

  void check_parts(const char* what, std::size_t mine, std::size_t all) const {
    decentrain::detail::check(all == mine * static_cast<std::size_t>(world_), "transport::nccl: ", what, " needs ", world_,
                              " x ", mine, " elements in its whole buffer, got ", all);
  }

  // A host buffer, or one on another GPU, would reach NCCL's kernels as a bad address (NCCL
  // does not check by default).
  void check_device_memory(const void* p, std::size_t n, const char* what) const {
    if (n == 0) return;
    cudaPointerAttributes attributes{};
    const cudaError_t e = cudaPointerGetAttributes(&attributes, p);
    if (e != cudaSuccess) (void)cudaGetLastError();
    decentrain::detail::check(e == cudaSuccess && (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged),
                              "transport::nccl: ", what, " was given a buffer that is not in GPU memory (collectives take "
                              "device or managed memory; copy a host buffer to the GPU first)");
    decentrain::detail::check(attributes.type == cudaMemoryTypeManaged || attributes.device == device_, "transport::nccl: ", what,
                              " was given a buffer on CUDA device ", attributes.device, " where this rank's GPU is device ",
                              device_);
  }

  template <class Call>
  void queue(const char* what, std::size_t size_bytes, Call&& call) {
    check_sound(what);
    if (size_bytes == 0) return;  // every rank passes the same count: none of them calls
    const nccl_detail::device_scope on(device_);
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress)
      decentrain::detail::fail("transport::nccl: ", what, " failed: ", nccl_detail::describe(r, comm_));
    if (r == ncclInProgress)
      settle(comm_, what, [&] {
        return concat_world(what, " was not queued within ", options_.timeout.count(), " ms");
      });
    ++stats_.messages_sent;
    stats_.bytes_sent += size_bytes;
  }

  // Waits for a non-blocking call on `comm` to finish (its state leaves ncclInProgress). On an
  // error or past the timeout `comm` is aborted and a peer_error thrown.
  template <class Message>
  void settle(ncclComm_t& comm, const char* what, Message&& timed_out) {
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r == ncclSuccess && state == ncclSuccess) return;
      if (r != ncclSuccess || state != ncclInProgress) {
        const std::string why = nccl_detail::describe(r != ncclSuccess ? r : state, comm);
        (void)ncclCommAbort(comm);
        comm = nullptr;
        fail_peer_because(failure_cause::other, -1, what, concat_world(what, " failed: ", why));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        (void)ncclCommAbort(comm);
        comm = nullptr;
        fail_peer_because(failure_cause::silent, -1, what, timed_out());
      }
      std::this_thread::sleep_for(options_.poll);
    }
  }

  // Frees the communicator: a stalled one is aborted; a sound one finalised (what it was given
  // finishes) within the close timeout, else aborted. (So a move assignment over a live
  // communicator can take up to close_timeout.)
  void release() noexcept {
    if (!comm_) return;
    if (stalled_) {
      abort();
      stalled_ = false;
      return;
    }
    const int previous = [] {
      int d = -1;
      return cudaGetDevice(&d) == cudaSuccess ? d : -1;
    }();
    if (previous != device_) (void)cudaSetDevice(device_);
    bool finished = false;
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclSuccess || r == ncclInProgress) {
      const auto deadline = std::chrono::steady_clock::now() + options_.close_timeout;
      for (;;) {
        ncclResult_t state = ncclInProgress;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) break;
        if (state == ncclSuccess) {
          finished = true;
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(options_.poll);
      }
    }
    if (finished) (void)ncclCommDestroy(comm_);
    else (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    if (previous >= 0 && previous != device_) (void)cudaSetDevice(previous);
  }

  nccl_options options_{};
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, world_ = 0, device_ = 0;
  bool stalled_ = false;  // work was queued that did not finish in time, or failed
  std::vector<int> original_ranks_;
  traffic_stats stats_{};
};

}  // namespace decentrain::transport

#endif  // DECENTRAIN_HAS_NCCL
