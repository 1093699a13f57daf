// Differentiable embedding lookup: out[..., :] = table[ids[...], :].
#pragma once

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/kernels/embedding.hpp"

namespace decentrain {

// ids: integer tensor of any shape; table: (V, C). Result: ids.shape + (C,).
template <class Device>
var<Device> embedding(const tensor<Device>& ids, const var<Device>& table) {
  detail::check(ids.dtype() == dtype::i32, "embedding: ids must be i32, got ", dtype_name(ids.dtype()));
  detail::check(table.rank() == 2, "embedding: table must be 2-D (vocab, width), got shape ", table.shape());
  const std::int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  const auto cids = ids.contiguous();
  // Ids are checked on the host (on a GPU that costs one small copy): a bad id must be an
  // error naming it, not an out-of-bounds read in a kernel.
  const auto host_ids = to_device<cpu>(cids);
  const auto* p = host_ids.template data<std::int32_t>();
  for (std::int64_t i = 0; i < N; ++i)
    detail::check(p[i] >= 0 && p[i] < V, "embedding: id ", p[i], " at flat index ", i,
                  " is outside the table's ", V, " rows");
  auto out_sizes = ids.shape().sizes();
  out_sizes.push_back(C);
  const auto ct = detail::compute_tensor(table.value());
  auto out = tensor<Device>::empty(shape(out_sizes), ct.dtype());
  detail::with_float_type(table.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    kernels::embedding_forward(Device{}, out.template data<T>(), cids.template data<std::int32_t>(),
                               ct.template data<T>(), N, C);
  });
  return record<Device>("embedding", detail::stored_as(out, table.dtype()), {table},
                        [cids, N, C](const tensor<Device>& g, node<Device>& n) {
    const auto cg = detail::compute_tensor(g);
    auto dt = zeros<Device>(n.input(0).shape(), cg.dtype());
    detail::with_float_type(cg.dtype(), "embedding backward", [&](auto tag) {
      using T = decltype(tag);
      kernels::embedding_backward(Device{}, dt.template data<T>(), cids.template data<std::int32_t>(),
                                  cg.template data<T>(), N, C);
    });
    n.accumulate(0, std::move(dt));
  });
}

}  // namespace decentrain
