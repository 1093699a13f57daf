// The built-in training text, generated so that the demo and tests need no files: a small
// procedural English with structure worth learning at several ranges (spelling, number
// agreement between subject and verb across adjectives and clauses, answers that repeat the
// question's subject, counting). Deterministic from its seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "decentrain/core/rng.hpp"

namespace decentrain::data {

inline std::string builtin_corpus(std::size_t chars = std::size_t{1} << 20, std::uint64_t seed = 1) {
  rng gen(seed, "builtin-corpus");
  struct noun { const char *one, *many; };
  struct verb { const char *one, *many; };
  static const noun nouns[] = {{"cat", "cats"},     {"fox", "foxes"},   {"child", "children"},
                               {"mouse", "mice"},   {"bird", "birds"},  {"farmer", "farmers"},
                               {"wolf", "wolves"},  {"sailor", "sailors"}};
  static const verb verbs[] = {{"sees", "see"},   {"follows", "follow"}, {"finds", "find"},
                               {"watches", "watch"}, {"likes", "like"},  {"carries", "carry"}};
  static const verb intransitive[] = {{"sleeps", "sleep"}, {"sings", "sing"}, {"waits", "wait"},
                                      {"runs", "run"}};
  static const char* adjectives[] = {"old", "quick", "small", "red", "quiet", "brave"};
  static const char* places[] = {"the garden", "the river", "the barn", "the forest", "the harbour"};
  static const char* things[] = {"a lamp", "the bread", "some apples", "a letter", "the rope"};
  static const char* numbers[] = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};
  const auto pick = [&](const auto& arr) -> const auto& {
    return arr[gen.below(sizeof(arr) / sizeof(arr[0]))];
  };

  // A noun phrase; `many` says whether it is plural.
  const auto subject = [&](bool many, const noun& n) {
    std::string s = many ? (gen.below(2) ? "the " : "some ") : (gen.below(2) ? "the " : "a ");
    if (gen.below(2)) s += std::string(pick(adjectives)) + " ";
    return s + (many ? n.many : n.one);
  };

  std::string text;
  while (text.size() < chars) {
    switch (gen.below(4)) {
      case 0:
      case 1: {  // statement, sometimes with a relative clause between subject and verb
        const bool many = gen.below(2);
        const noun& n = pick(nouns);
        std::string s = subject(many, n);
        if (gen.below(3) == 0) {
          const verb& r = pick(intransitive);
          s += std::string(" that ") + (many ? r.many : r.one);
        }
        const verb& v = pick(verbs);
        s += std::string(" ") + (many ? v.many : v.one) + " " + pick(things);
        if (gen.below(2)) s += std::string(" in ") + pick(places);
        text += s + ". ";
        break;
      }
      case 2: {  // question and an answer that names the same subject
        const bool many = gen.below(2);
        const noun& n = pick(nouns);
        const char* place = pick(places);
        text += std::string("where ") + (many ? "are the " : "is the ") + (many ? n.many : n.one) + "? ";
        text += std::string("the ") + (many ? n.many : n.one) + (many ? " are in " : " is in ") + place + ". ";
        break;
      }
      default: {  // counting from one
        const std::size_t upto = 3 + gen.below(7);
        for (std::size_t i = 0; i < upto; ++i) text += std::string(numbers[i]) + (i + 1 < upto ? ", " : ". ");
        break;
      }
    }
    if (gen.below(6) == 0) text += "\n";
  }
  text.resize(chars);
  return text;
}

}  // namespace decentrain::data
