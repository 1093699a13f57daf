// The parser for a codec chosen at run time (a command line's --codec): "NAME[:SETTING,...]" to
// a codec held in `Any`, a type any codec converts to (collective::any_codec, which carries each
// codec's collective). An unknown name, setting or value is an error naming it.
//
//   identity | fp16 | bf16 | int8[:block=N,stochastic,seed=S] | int4[:...] | fp4[:block=N]
//   | sign[:block=N] | topk:F (a fraction) | topk:count=K, with int4 or int2 values and
//   block=N, chunk=N (top-k within each chunk of N values) ; any of them with ",ef" for error
//   feedback (",ef=0.95": what is kept decays by that factor each round) and ",adaptive" to send
//   f32 instead where that measures faster (for example "int4:block=64", "topk:0.02,ef",
//   "topk:0.02,int2,ef", "topk:0.02,chunk=4096,int2,ef=0.95", "sign:block=256,ef", "int8:adaptive");
//   topk and dct with error feedback may add ",significance=T": Gaia's filter in front of the codec,
//   inside the error feedback ("topk:0.03,chunk=4096,int2,ef=0.95,significance=0.01")
//   | dct:F with chunk=N and top-k's settings (DeMo's DCT top-k; "dct:0.02,chunk=64,int2,ef")
//   | powersgd:rank=R,noef,seed=S,factors=identity|fp16|bf16|int8|int4|fp4 (error feedback built
//   in; "powersgd:rank=4,factors=int8")
#pragma once

#include <cmath>
#include <cctype>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/compress/adaptive.hpp"
#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/dct_top_k.hpp"
#include "decentrain/compress/error_feedback.hpp"
#include "decentrain/compress/fp4.hpp"
#include "decentrain/compress/half.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/compress/powersgd.hpp"
#include "decentrain/compress/sign.hpp"
#include "decentrain/compress/significance.hpp"
#include "decentrain/compress/top_k.hpp"
#include "decentrain/detail/spec.hpp"

namespace decentrain::compress {

inline const char* codec_names = "identity, fp16, bf16, int8, int4, fp4, sign, topk, dct (each may add ',ef'), powersgd";

// "int4:block=64,ef" -> the codec, held in Any.
template <class Any>
Any parse_codec_as(std::string_view spec) {
  using decentrain::detail::check;
  using decentrain::detail::fail;
  const decentrain::detail::spec parsed("codec", spec);
  const std::string& name = parsed.name;
  bool ef = false, adapt = false;
  double decay = 1.0;
  std::optional<double> gaia;  // significance=T
  bool veto = false;           // significance's veto
  std::vector<std::pair<std::string, std::string>> settings;
  for (const auto& [key, value] : parsed.settings) {
    if ((key == "ef" || key == "adaptive") && value.empty()) {
      (key == "ef" ? ef : adapt) = true;
      continue;
    }
    if (key == "ef") {
      ef = true;
      decay = parsed.number(key, value);
      check(decay > 0 && decay <= 1, "codec '", spec, "': ef=D takes a decay in (0, 1], got ", value);
      continue;
    }
    if (key == "veto" && value.empty()) {
      veto = true;
      continue;
    }
    if (key == "significance") {
      gaia = parsed.number(key, value);
      check(std::isfinite(*gaia) && *gaia >= 0, "codec '", spec, "': significance=T takes a threshold >= 0, got ", value);
      continue;
    }
    settings.emplace_back(key, value);
  }
  check(!veto || gaia, "codec '", spec, "': veto is significance's (significance=T,veto)");
  auto number = [&](const std::string& key, const std::string& text) { return parsed.number(key, text); };
  auto whole = [&](const std::string& key, const std::string& text, double lo, double hi) {
    return parsed.whole(key, text, lo, hi);
  };
  auto unknown = [&](const std::string& key, const char* allowed) {
    fail("codec '", spec, "': ", name, " has no setting '", key, "' (it takes: ", allowed, ")");
  };
  auto with_feedback = [&](auto c) -> Any {
    if (!ef) return c;
    error_feedback<decltype(c)> e;
    e.codec = c;
    e.decay = decay;
    return e;
  };
  auto wrap = [&](auto c) -> Any {
    Any chosen;
    if (gaia) {
      if constexpr (is_dense<decltype(c)>()) {
        fail("codec '", spec, "': significance=T needs a sparse codec (topk or dct): ", name,
             " would still send the zeros the filter leaves");
      } else {
        check(ef, "codec '", spec, "': significance=T needs ',ef' (or ',ef=D'), which keeps the updates the filter holds back");
        significance<decltype(c)> g;
        g.codec = c;
        g.threshold = *gaia;
        g.veto = veto;
        chosen = with_feedback(g);
      }
    } else {
      chosen = with_feedback(c);
    }
    if (!adapt) return chosen;
    adaptive<Any> a;
    a.codec = chosen;
    return a;
  };
  if (name == "identity" || name == "fp16" || name == "bf16") {
    if (!settings.empty()) unknown(settings.front().first, "nothing");
    if (name == "identity") {
      check(!ef && !adapt && !gaia, "codec '", spec,
            "': identity loses nothing and is plain f32 (no ',ef', ',adaptive' or ',significance')");
      return identity{};
    }
    return name == "fp16" ? wrap(fp16{}) : wrap(bf16{});
  }
  if (name == "int8" || name == "int4") {
    auto configure = [&](auto c) {
      for (const auto& [k, v] : settings) {
        if (k == "block") c.block = whole(k, v, 1, double(1 << 24));
        else if (k == "stochastic" && v.empty()) c.mode = rounding::stochastic;
        else if (k == "seed") c.seed = whole(k, v, 0, 9e15);
        else unknown(k, "block=N, stochastic, seed=S");
      }
      (void)c.max_encoded_bytes(0);  // checks the settings now
      return wrap(c);
    };
    return name == "int8" ? configure(int8_blockwise{}) : configure(int4_blockwise{});
  }
  if (name == "fp4") {
    fp4 c;
    for (const auto& [k, v] : settings) {
      if (k == "block") c.block = whole(k, v, 2, double(1 << 24));
      else unknown(k, "block=N (even)");
    }
    (void)c.max_encoded_bytes(0);
    return wrap(c);
  }
  if (name == "sign") {
    sign c;
    for (const auto& [k, v] : settings) {
      if (k == "block") c.block = whole(k, v, 8, double(1 << 24));
      else unknown(k, "block=N (a multiple of 8)");
    }
    (void)c.max_encoded_bytes(0);
    return wrap(c);
  }
  // top-k's settings, shared with dct (which picks coefficients the same way).
  auto topk_setting = [&](top_k& c, const std::string& k, const std::string& v) {
    const bool numeral = !k.empty() && (std::isdigit(static_cast<unsigned char>(k[0])) || k[0] == '.' || k[0] == '-' || k[0] == '+');
    if (v.empty() && (k == "int4" || k == "int2")) c.value_bits = k == "int4" ? 4 : 2;
    else if (v.empty() && numeral) c.fraction = number("fraction", k);  // topk:0.02
    else if (k == "fraction") c.fraction = number(k, v);
    else if (k == "count") c.count = static_cast<std::int64_t>(whole(k, v, 1, 9e15));
    else if (k == "block") c.block = whole(k, v, 1, double(1 << 24));
    else return false;
    return true;
  };
  if (name == "topk") {
    top_k c;
    for (const auto& [k, v] : settings) {
      if (k == "chunk") c.chunk = whole(k, v, 1, 4294967296.0);
      else if (!topk_setting(c, k, v))
        unknown(k, "a fraction (topk:0.02), fraction=F, count=K, int4 or int2 values, block=N (values per scale), "
                   "chunk=N (top-k within each chunk)");
    }
    (void)c.k_for(1);
    return wrap(c);
  }
  if (name == "dct") {
    dct_top_k c;
    for (const auto& [k, v] : settings) {
      if (k == "chunk") c.chunk = whole(k, v, 2, 4096);
      else if (!topk_setting(c.select, k, v))
        unknown(k, "chunk=N (values per transform), and top-k's: a fraction (dct:0.02), fraction=F, count=K, int4 or int2, block=N");
    }
    // (named here: the top-k inside would name itself)
    check(c.select.count > 0 || (c.select.fraction > 0 && c.select.fraction <= 1), "codec '", spec,
          "': dct's fraction must be in (0, 1], got ", c.select.fraction);
    (void)c.max_encoded_bytes(1);
    (void)c.select.k_for(1);
    return wrap(c);
  }
  if (name == "powersgd") {
    check(!ef, "codec '", spec, "': powersgd keeps its own error feedback (',noef' turns it off)");
    check(!adapt, "codec '", spec, "': powersgd cannot be adaptive (its residual would not go out in the f32 rounds)");
    check(!gaia, "codec '", spec, "': significance=T needs a sparse codec (topk or dct), not powersgd");
    powersgd<Any> c;
    for (const auto& [k, v] : settings) {
      if (k == "rank") c.rank = whole(k, v, 1, 4096);
      else if (k == "noef" && v.empty()) c.feedback = false;
      else if (k == "seed") c.seed = whole(k, v, 0, 9e15);
      else if (k == "factors" && (v == "identity" || v == "fp16" || v == "bf16" || v == "int8" || v == "int4" || v == "fp4"))
        c.factors = parse_codec_as<Any>(v);
      else if (k == "factors")
        fail("codec '", spec, "': factors must be one of identity, fp16, bf16, int8, int4, fp4 (dense codecs), got '", v, "'");
      else unknown(k, "rank=R, noef, seed=S, factors=identity|fp16|bf16|int8|int4|fp4");
    }
    (void)c.rank_of(matrix_piece{0, 2, 2});
    return c;
  }
  fail("codec '", spec, "': unknown codec '", name, "' (expected one of: ", codec_names, ")");
}

}  // namespace decentrain::compress
