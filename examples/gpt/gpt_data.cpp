#include "gpt_data.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace gpt_example {
namespace {

// splitmix64: small, fast and the same everywhere (std:: distributions are not portable).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }  // n small: bias negligible
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

constexpr int kLexicon = 2048;

std::vector<std::string> make_lexicon(SplitMix64& rng) {
  static const char* kOnsets[] = {"",   "b",  "c",  "d",  "f",  "g",  "h",  "l",  "m",
                                  "n",  "p",  "r",  "s",  "t",  "v",  "w",  "br", "ch",
                                  "cl", "dr", "gr", "pl", "pr", "sh", "st", "th", "tr"};
  static const char* kNuclei[] = {"a", "e", "i", "o", "u", "ai", "ea", "ee", "ou", "oo", "y"};
  static const char* kCodas[] = {"", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"};
  std::vector<std::string> words;
  words.reserve(kLexicon);
  while (static_cast<int>(words.size()) < kLexicon) {
    // Short words are the frequent ones (low ranks), as in natural text.
    const int rank = static_cast<int>(words.size());
    const int syllables = 1 + (rank > 64) + (rank > 512 && rng.below(2) == 0);
    std::string w;
    for (int s = 0; s < syllables; ++s) {
      w += kOnsets[rng.below(std::size(kOnsets))];
      w += kNuclei[rng.below(std::size(kNuclei))];
      if (s + 1 == syllables || rng.below(3) == 0) w += kCodas[rng.below(std::size(kCodas))];
    }
    if (std::find(words.begin(), words.end(), w) == words.end()) words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

std::vector<uint8_t> load_text_corpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open text file '" + path + "'");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read text file '" + path + "'");
  return bytes;
}

std::vector<uint8_t> generate_corpus(size_t bytes, uint64_t seed) {
  SplitMix64 rng{seed * 0xD1B54A32D192ED03ULL + 1};
  const std::vector<std::string> words = make_lexicon(rng);
  // Zipf-like sampling: cumulative weights 1/(rank+1).
  std::vector<double> cumulative(kLexicon);
  double sum = 0;
  for (int i = 0; i < kLexicon; ++i) cumulative[i] = (sum += 1.0 / (i + 1));
  // Each word's successor: a fixed, mostly frequent word.
  std::vector<int> successor(kLexicon);
  for (int i = 0; i < kLexicon; ++i) successor[i] = static_cast<int>(rng.below(256));

  std::vector<uint8_t> out;
  out.reserve(bytes + 256);
  auto draw = [&] {
    const double u = rng.unit() * sum;
    return static_cast<int>(std::upper_bound(cumulative.begin(), cumulative.end(), u) -
                            cumulative.begin()) %
           kLexicon;
  };
  int previous = draw();
  int sentences_left = 3 + static_cast<int>(rng.below(6));
  while (out.size() < bytes) {
    const int length = 4 + static_cast<int>(rng.below(15));
    for (int i = 0; i < length; ++i) {
      const int w = rng.below(2) == 0 ? successor[previous] : draw();
      previous = w;
      const std::string& word = words[w];
      for (size_t c = 0; c < word.size(); ++c) {
        const char ch = (i == 0 && c == 0) ? static_cast<char>(word[c] - 'a' + 'A') : word[c];
        out.push_back(static_cast<uint8_t>(ch));
      }
      if (i + 1 < length) {
        if (rng.below(9) == 0) out.push_back(',');
        out.push_back(' ');
      }
    }
    const uint64_t end = rng.below(10);
    out.push_back(end < 7 ? '.' : end < 9 ? '?' : '!');
    if (--sentences_left == 0) {
      out.push_back('\n');
      out.push_back('\n');
      sentences_left = 3 + static_cast<int>(rng.below(6));
    } else {
      out.push_back(' ');
    }
  }
  out.resize(bytes);
  return out;
}

}  // namespace gpt_example
