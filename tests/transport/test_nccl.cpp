// transport::nccl. [host]: what runs without a GPU (the communicator's id over a bootstrap
// endpoint, options refused before NCCL is called). [no_gpu]: what a machine without a GPU is
// told. [gpu]: one GPU (one rank; a second rank that never joins). [multi_gpu]: a rank per GPU,
// at least two (NCCL puts no two ranks of one communicator on the same GPU). CTest runs each tag
// as an entry of its own, skipped (77) where the machine has not what it needs.
#include <catch2/catch.hpp>

#include <decentrain/transport/in_process.hpp>
#include <decentrain/transport/nccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dt = decentrain;
using dt::transport::in_process;
using dt::transport::nccl;
using dt::transport::nccl_op;
using dt::transport::nccl_options;

namespace {

std::vector<std::byte> id_bytes(const ncclUniqueId& id) {
  const auto* p = reinterpret_cast<const std::byte*>(&id);
  return {p, p + sizeof id};
}

// What a call threw, as text ("" when it did not).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A buffer in GPU memory of n elements.
template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t n) : n_(n) {
    if (cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) dt::detail::fail("cudaMalloc of ", n * sizeof(T), " bytes failed");
  }
  explicit device_buffer(const std::vector<T>& values) : device_buffer(values.size()) { upload(values); }
  ~device_buffer() { (void)cudaFree(p_); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  void upload(const std::vector<T>& values) {
    dt::detail::check(cudaMemcpy(p_, values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess, "upload failed");
  }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    dt::detail::check(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess, "download failed");
    return out;
  }
  std::span<T> span() { return {p_, n_}; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

nccl_options quick(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  nccl_options o;
  o.timeout = timeout;
  return o;
}

}  // namespace

TEST_CASE("nccl: the communicator's id goes from rank 0 to every rank over the bootstrap endpoint", "[host]") {
  in_process net(4);
  std::vector<std::vector<std::byte>> first(4), second(4);
  net.run([&](in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    if (ep.rank() == 0) {
      first[r] = id_bytes(nccl::share_id(ep, 1));
      second[r] = id_bytes(nccl::share_id(ep, 2));
    } else {  // the later generation taken first: the tags keep the two apart
      second[r] = id_bytes(nccl::share_id(ep, 2));
      first[r] = id_bytes(nccl::share_id(ep, 1));
    }
  });
  REQUIRE(first[0].size() == sizeof(ncclUniqueId));
  CHECK(first[0] != second[0]);  // two ids NCCL made, for two communicators
  CHECK(std::any_of(first[0].begin(), first[0].end(), [](std::byte b) { return b != std::byte{0}; }));
  for (std::size_t r = 1; r < 4; ++r) {
    CHECK(first[r] == first[0]);
    CHECK(second[r] == second[0]);
  }
}

TEST_CASE("nccl: an id of the wrong size from rank 0 is refused, named", "[host]") {
  in_process net(2);
  std::string error;
  net.run([&](in_process::endpoint& ep) {
    if (ep.rank() == 0) {
      const std::byte seven[7]{};
      ep.send(1, dt::transport::tag_type{dt::transport::nccl_detail::id_channel} << 32, seven);
    } else {
      error = thrown([&] { (void)nccl::share_id(ep); });
    }
  });
  CHECK(error.find("communicator id of 7 bytes") != std::string::npos);
  CHECK(error.find("NCCL's has 128") != std::string::npos);
}

TEST_CASE("nccl: bad settings are refused before NCCL is called, named", "[host]") {
  const ncclUniqueId id = nccl::make_id();
  CHECK(thrown([&] { nccl(id, 2, 2); }).find("rank 2 is outside a world of 2") != std::string::npos);
  CHECK(thrown([&] { nccl(id, -1, 2); }).find("rank -1 is outside a world of 2") != std::string::npos);
  CHECK(thrown([&] { nccl(id, 0, 0); }).find("at least 1 rank, got world 0") != std::string::npos);
  nccl_options o;
  o.timeout = std::chrono::milliseconds(0);
  CHECK(thrown([&] { nccl(id, 0, 1, o); }).find("timeout must be positive, got 0 ms") != std::string::npos);
  o = {};
  o.close_timeout = std::chrono::milliseconds(-5);
  CHECK(thrown([&] { nccl(id, 0, 1, o); }).find("close timeout must be positive, got -5 ms") != std::string::npos);
  o = {};
  o.poll = std::chrono::microseconds(0);
  CHECK(thrown([&] { nccl(id, 0, 1, o); }).find("poll interval must be positive") != std::string::npos);
}

TEST_CASE("nccl: without a GPU a communicator is refused, named", "[no_gpu]") {
  const std::string error = thrown([&] { nccl(nccl::make_id(), 0, 1); });
  CHECK(error.find("transport::nccl: no CUDA device") != std::string::npos);
  CHECK(error.find("NCCL's collectives run on GPUs") != std::string::npos);
}

TEST_CASE("nccl: one rank's collectives on device buffers", "[gpu]") {
  nccl comm(nccl::make_id(), 0, 1, quick());
  REQUIRE(comm.world() == 1);
  REQUIRE(comm.rank() == 0);
  std::vector<float> values(1000);
  std::iota(values.begin(), values.end(), -3.5f);
  device_buffer<float> a(values);
  comm.all_reduce(a.span(), nccl_op::sum, nullptr);
  comm.all_reduce(a.span(), nccl_op::avg, nullptr);
  comm.all_reduce(a.span(), nccl_op::max, nullptr);
  comm.broadcast(a.span(), 0, nullptr);
  device_buffer<float> all(values.size());
  comm.all_gather<float>(a.span(), all.span(), nullptr);
  device_buffer<float> mine(values.size());
  comm.reduce_scatter<float>(all.span(), mine.span(), nccl_op::sum, nullptr);
  std::vector<double> wide(257, 0.25);
  device_buffer<double> d(wide);
  comm.all_reduce(d.span(), nccl_op::sum, nullptr);
  std::vector<dt::bf16> half(64, dt::bf16(1.5f));
  device_buffer<dt::bf16> h(half);
  comm.all_reduce(h.span(), nccl_op::sum, nullptr);
  std::vector<std::int32_t> ints(33, 7);
  device_buffer<std::int32_t> i(ints);
  comm.all_reduce(i.span(), nccl_op::product, nullptr);
  comm.synchronize(nullptr);
  CHECK(a.download() == values);  // a world of one: every reduction is the identity
  CHECK(all.download() == values);
  CHECK(mine.download() == values);
  CHECK(d.download() == wide);
  CHECK(h.download() == half);
  CHECK(i.download() == ints);
  CHECK(comm.stats().messages_sent == 9);
  CHECK(comm.stats().bytes_sent == 6 * 4000 + 257 * 8 + 64 * 2 + 33 * 4);
}

TEST_CASE("nccl: what a collective is given is checked, named", "[gpu]") {
  nccl comm(nccl::make_id(), 0, 1, quick());
  std::vector<float> host(16, 1.0f);
  CHECK(thrown([&] { comm.all_reduce(std::span<float>(host), nccl_op::sum, nullptr); }).find("not in GPU memory") != std::string::npos);
  device_buffer<float> a(16), b(8);
  CHECK(thrown([&] { comm.all_gather<float>(a.span(), b.span(), nullptr); })
            .find("all_gather needs 1 x 16 elements in its whole buffer, got 8") != std::string::npos);
  CHECK(thrown([&] { comm.broadcast(a.span(), 1, nullptr); }).find("broadcast from rank 1, outside a world of 1") != std::string::npos);
  const int self[1] = {0}, outside[1] = {5};
  CHECK(thrown([&] { comm.shrink(self); }).find("cannot leave itself out") != std::string::npos);
  CHECK(thrown([&] { comm.shrink(outside); }).find("leaves out rank 5, outside a world of 1") != std::string::npos);
  nccl_options far;
  far.device = 99;
  CHECK(thrown([&] { nccl(nccl::make_id(), 0, 1, far); }).find("CUDA device 99 does not exist") != std::string::npos);
}

TEST_CASE("nccl: a shrink that leaves none out changes nothing, and an aborted communicator", "[gpu]") {
  nccl comm(nccl::make_id(), 0, 1, quick());
  comm.shrink({});  // NCCL refuses an empty list: a sound communicator is kept as it is
  const int self[1] = {0};
  comm.follow_view(self);
  CHECK(comm.world() == 1);
  CHECK(comm.original_ranks().size() == 1);
  device_buffer<float> a(std::vector<float>(8, 2.0f));
  comm.all_reduce(a.span(), nccl_op::sum, nullptr);
  comm.synchronize(nullptr);
  CHECK(a.download() == std::vector<float>(8, 2.0f));
  comm.abort();
  CHECK_FALSE(comm.usable());
  CHECK(thrown([&] { comm.all_reduce(a.span(), nccl_op::sum, nullptr); }).find("was aborted") != std::string::npos);
}

TEST_CASE("nccl: a rank that never joins ends the forming at the deadline", "[gpu]") {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<dt::transport::failure_cause> cause;
  std::string message;
  try {
    nccl comm(nccl::make_id(), 0, 2, quick(std::chrono::milliseconds(1500)));
  } catch (const dt::transport::peer_error& e) {
    cause = e.cause();
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(cause.has_value());
  CHECK(*cause == dt::transport::failure_cause::silent);
  CHECK(message.find("did not form within 1500 ms") != std::string::npos);
  CHECK(seconds >= 1.4);
  CHECK(seconds < 30.0);  // the abort returned: nothing waits on the rank that never came
}

namespace {
// A rank's thread on its own GPU, with a stream of its own (not the device's legacy default
// stream, which a synchronous copy would wait on behind a collective).
struct on_gpu {
  cudaStream_t stream = nullptr;
  explicit on_gpu(int device) {
    dt::detail::check(cudaSetDevice(device) == cudaSuccess, "cudaSetDevice(", device, ") failed");
    dt::detail::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreate failed");
  }
  ~on_gpu() { (void)cudaStreamDestroy(stream); }
  on_gpu(const on_gpu&) = delete;
  on_gpu& operator=(const on_gpu&) = delete;
};

int ranks_for_multi_gpu() {
  int devices = 0;
  (void)cudaGetDeviceCount(&devices);
  return std::min(devices, 4);
}
}  // namespace

TEST_CASE("nccl: a rank a GPU, collectives equal the exact results", "[multi_gpu]") {
  const int n = ranks_for_multi_gpu();
  REQUIRE(n >= 2);
  in_process net(n);
  constexpr std::size_t count = 1 << 16;
  std::vector<std::vector<float>> reduced(static_cast<std::size_t>(n)), gathered(static_cast<std::size_t>(n)),
      scattered(static_cast<std::size_t>(n)), broadcast(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::string other_device;
  net.run([&](in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    try {
      on_gpu gpu(ep.rank());  // the rank's buffers and stream on its own GPU
      nccl_options o = quick();
      o.device = ep.rank();
      nccl comm = nccl::over(ep, o);
      std::vector<float> mine(count);
      for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((ep.rank() + 1) * static_cast<int>(i % 97));
      device_buffer<float> a(mine), all(count * static_cast<std::size_t>(n)), part(count / static_cast<std::size_t>(n)),
          b(mine), whole(std::vector<float>(count, static_cast<float>(ep.rank())));
      if (ep.rank() == 0) {
        dt::detail::check(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1) failed");
        device_buffer<float> elsewhere(16);
        dt::detail::check(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0) failed");
        other_device = thrown([&] { comm.all_reduce(elsewhere.span(), nccl_op::sum, gpu.stream); });
      }
      comm.all_gather<float>(a.span(), all.span(), gpu.stream);
      comm.all_reduce(a.span(), nccl_op::sum, gpu.stream);
      comm.reduce_scatter<float>(whole.span().first(part.span().size() * static_cast<std::size_t>(n)), part.span(), nccl_op::sum,
                                 gpu.stream);
      comm.broadcast(b.span(), n - 1, gpu.stream);
      comm.synchronize(gpu.stream);
      reduced[r] = a.download();
      gathered[r] = all.download();
      scattered[r] = part.download();
      broadcast[r] = b.download();
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  CHECK(other_device.find("a buffer on CUDA device 1 where this rank's GPU is device 0") != std::string::npos);
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2), last = static_cast<float>(n);
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r].empty());
    for (std::size_t i = 0; i < count; i += 101) {
      CHECK(reduced[r][i] == ranks_sum * static_cast<float>(i % 97));
      CHECK(broadcast[r][i] == last * static_cast<float>(i % 97));
      for (int q = 0; q < n; ++q)
        CHECK(gathered[r][static_cast<std::size_t>(q) * count + i] == static_cast<float>((q + 1) * static_cast<int>(i % 97)));
    }
    CHECK(std::all_of(scattered[r].begin(), scattered[r].end(),
                      [&](float v) { return v == static_cast<float>(n * (n - 1) / 2); }));
  }
}

TEST_CASE("nccl: a rank that stops: the others' wait ends at the deadline, and they follow the view without it", "[multi_gpu]") {
  const int n = ranks_for_multi_gpu();
  REQUIRE(n >= 2);
  in_process net(n);
  struct outcome {
    std::string error;
    std::optional<dt::transport::failure_cause> cause;
    int world_after = -1;
    std::vector<int> original_ranks;
    std::vector<float> after;
    double waited_s = 0;
  };
  std::vector<outcome> out(static_cast<std::size_t>(n));
  net.run([&](in_process::endpoint& ep) {
    auto& mine = out[static_cast<std::size_t>(ep.rank())];
    try {
      on_gpu gpu(ep.rank());
      nccl_options o = quick(std::chrono::milliseconds(2000));
      o.device = ep.rank();
      nccl comm = nccl::over(ep, o);
      device_buffer<float> a(std::vector<float>(4096, 1.0f)), b(std::vector<float>(4096, static_cast<float>(ep.rank() + 1)));
      comm.all_reduce(a.span(), nccl_op::sum, gpu.stream);
      comm.synchronize(gpu.stream);
      if (ep.rank() == n - 1) {
        // Stops taking part; waits (on the bootstrap endpoint) until the others have shrunk
        // without it, then goes (its communicator aborted: a process that died).
        (void)ep.recv(0, 99);
        comm.abort();
        return;
      }
      comm.all_reduce(a.span(), nccl_op::sum, gpu.stream);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        comm.synchronize(gpu.stream);
      } catch (const dt::transport::peer_error& e) {
        mine.cause = e.cause();
      }
      mine.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<int> view(static_cast<std::size_t>(n - 1));  // the fault slot's next view: all but the last
      std::iota(view.begin(), view.end(), 0);
      comm.follow_view(view);
      mine.world_after = comm.world();
      mine.original_ranks.assign(comm.original_ranks().begin(), comm.original_ranks().end());
      comm.all_reduce(b.span(), nccl_op::sum, gpu.stream);
      comm.synchronize(gpu.stream);
      mine.after = b.download();
      if (ep.rank() == 0) ep.send(n - 1, 99, std::span<const std::byte>{});
    } catch (const std::exception& e) {
      mine.error = e.what();
      if (ep.rank() == 0) ep.send(n - 1, 99, std::span<const std::byte>{});
    }
  });
  const float survivors_sum = static_cast<float>((n - 1) * n / 2);
  std::vector<int> kept(static_cast<std::size_t>(n - 1));
  std::iota(kept.begin(), kept.end(), 0);
  for (std::size_t r = 0; r + 1 < static_cast<std::size_t>(n); ++r) {
    INFO("rank " << r << ": " << out[r].error);
    REQUIRE(out[r].error.empty());
    REQUIRE(out[r].cause.has_value());  // the wait ended with an error, not with the collective
    CHECK(*out[r].cause == dt::transport::failure_cause::silent);
    CHECK(out[r].waited_s >= 1.9);
    CHECK(out[r].waited_s < 30.0);
    CHECK(out[r].world_after == n - 1);
    CHECK(out[r].original_ranks == kept);
    CHECK(out[r].after == std::vector<float>(4096, survivors_sum));
  }
}

TEST_CASE("nccl: a view the fault slot agreed on names the ranks a shrink leaves out", "[host]") {
  using dt::transport::nccl_detail::left_out;
  const std::vector<int> formed{0, 1, 2, 3, 4}, shrunk{0, 2, 4};
  CHECK(left_out(formed, std::vector<int>{0, 1, 2, 3, 4}).empty());
  CHECK(left_out(formed, std::vector<int>{0, 2, 3}) == std::vector<int>{1, 4});
  CHECK(left_out(formed, std::vector<int>{3, 1, 0}) == std::vector<int>{2, 4});  // the view's order does not matter
  // After a shrink the communicator's positions are no longer the original ranks.
  CHECK(left_out(shrunk, std::vector<int>{0, 4}) == std::vector<int>{1});
  CHECK(thrown([&] { (void)left_out(shrunk, std::vector<int>{0, 1, 2, 4}); })
            .find("peer 1 of the view is not in the communicator: a joiner needs a new one") != std::string::npos);
}
