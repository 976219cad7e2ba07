// Texts for load generation and benchmarks: read from a file (one per line) or generated with a
// length distribution, seeded, so that qvi-perf and qvi-bench-model see the same texts.
#ifndef QVI_CLIENT_LOAD_TEXTS_H_
#define QVI_CLIENT_LOAD_TEXTS_H_

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace qvi::client {

// `count` texts of about `mean_words` words (normal, `stddev_words`, at least 1), drawn from a
// small English vocabulary of review-like words.
inline std::vector<std::string> GenerateTexts(int count, double mean_words, double stddev_words, uint32_t seed) {
  static const char* kWords[] = {
      "the",  "a",      "film",  "movie",     "story",  "acting",   "plot",   "characters", "is",          "was",
      "and",  "but",    "not",   "very",      "good",   "bad",      "great",  "boring",     "funny",       "moving",
      "slow", "smart",  "dull",  "beautiful", "script", "director", "ending", "scenes",     "performance", "cast",
      "it",   "this",   "with",  "too",       "long",   "short",    "best",   "worst",      "of",          "in",
      "an",   "almost", "never", "always",    "every",  "minute",   "hour",   ",",          ".",           "!"};
  constexpr int kCount = sizeof(kWords) / sizeof(kWords[0]);
  std::mt19937 rng(seed);
  std::normal_distribution<double> length(mean_words, stddev_words);
  std::uniform_int_distribution<int> word(0, kCount - 1);
  std::vector<std::string> texts;
  texts.reserve(count);
  for (int i = 0; i < count; ++i) {
    const int n = std::max(1, static_cast<int>(std::lround(length(rng))));
    std::string t;
    for (int w = 0; w < n; ++w) t += (w ? " " : "") + std::string(kWords[word(rng)]);
    texts.push_back(std::move(t));
  }
  return texts;
}

// One text per non-empty line; an empty vector when the file cannot be read.
inline std::vector<std::string> ReadTexts(const std::string& path) {
  std::vector<std::string> texts;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) texts.push_back(line);
  }
  return texts;
}

}  // namespace qvi::client

#endif  // QVI_CLIENT_LOAD_TEXTS_H_
