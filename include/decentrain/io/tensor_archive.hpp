// cereal glue for tensors and rng streams. A tensor is stored as dtype code, sizes and raw
// little-endian bytes; loading checks every field, so a damaged archive fails with a message
// instead of allocating absurd sizes or reading out of bounds.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <cstdint>
#include <vector>

#include "decentrain/core/rng.hpp"
#include "decentrain/core/tensor.hpp"

namespace decentrain {

namespace detail {
inline constexpr std::size_t archive_max_rank = 8;
inline constexpr std::int64_t archive_max_elements = std::int64_t{1} << 40;
}  // namespace detail

template <class Archive>
void save(Archive& ar, const tensor<cpu>& t) {
  decentrain::detail::check(t.defined(), "cannot serialize an undefined tensor");
  const auto c = t.contiguous();
  ar(static_cast<std::uint8_t>(c.dtype()), c.shape().sizes());
  // As bytes: cereal's portable archive takes the element size from the pointer's type, and a
  // void pointer's (a GCC extension) does not compile with clang.
  ar(cereal::binary_data(static_cast<const unsigned char*>(c.raw_data()), c.nbytes()));
}

// Loads a stored tensor into `reuse`'s memory when that has the stored dtype and shape and is
// contiguous (a state decoded over the one it replaces: no fresh allocation, which a large state
// pays for page by page), else into new storage.
template <class Archive>
void load_tensor(Archive& ar, tensor<cpu>& t, const tensor<cpu>* reuse) {
  std::uint8_t code = 0;
  std::vector<std::int64_t> sizes;
  ar(code, sizes);
  decentrain::detail::check(code <= static_cast<std::uint8_t>(dtype::i32), "archive: unknown tensor dtype code ", int(code));
  decentrain::detail::check(sizes.size() <= detail::archive_max_rank, "archive: tensor rank ", sizes.size(), " exceeds ",
                detail::archive_max_rank);
  std::int64_t numel = 1;
  for (auto s : sizes) {
    decentrain::detail::check(s >= 0 && (s == 0 || numel <= detail::archive_max_elements / s),
                  "archive: implausible tensor size ", s);
    numel *= s;
  }
  const auto type = static_cast<dtype>(code);
  // An archive that knows how much is left (detail::bounded_input_archive) refuses a size it
  // cannot hold before allocating for it.
  if constexpr (requires { ar.remaining(); })
    decentrain::detail::check(static_cast<std::uint64_t>(numel) * dtype_size(type) <= ar.remaining(),
                              "archive: a tensor of ", numel, " elements, with only ", ar.remaining(), " bytes left");
  const shape stored(sizes);
  bool fits = reuse && reuse->defined() && reuse->dtype() == type && reuse->shape() == stored && reuse->is_contiguous();
  if constexpr (requires { ar.sources_may_alias(); })
    if (fits && ar.sources_may_alias()) fits = ar.next_bytes(reuse->nbytes()) == reuse->raw_data();
  if (fits)
    t = *reuse;
  else
    t = tensor<cpu>::empty(stored, type);
  ar(cereal::binary_data(static_cast<unsigned char*>(t.raw_data()), t.nbytes()));
}

template <class Archive>
void load(Archive& ar, tensor<cpu>& t) {
  load_tensor(ar, t, nullptr);
}

// rng streams: name and the 256-bit state.
template <class Archive>
void save(Archive& ar, const rng& r) {
  ar(r.name(), r.state());
}
template <class Archive>
void load(Archive& ar, rng& r) {
  std::string name;
  rng::state_type state{};
  ar(name, state);
  r = rng(0, name);
  r.set_state(state);
}

}  // namespace decentrain
