// The server's tokenizer alone (server/core/text/tokenizer.h), in nanoseconds per byte of text, as issue
// 33 asks: what tokenising costs a request before anything else, on the texts qvi-perf sends (Google
// Benchmark).
//
//   Ascii/W     Tokenize on generated ~W-word texts (qvi-perf's --words W: English words, ASCII), one
//               text per iteration, the texts taking turns. ASCII characters are classified from a table
//               and decoded without utf8proc.
//   Unicode/W   the same words with accented Latin, Greek and Hangul mixed in (about a third of the words),
//               which take utf8proc's look-ups.
//   Validate/W  ValidateUtf8 alone on the ASCII texts: the part every text pays before tokenising.
//   Lookup/N    Vocabulary::Id (an absl::flat_hash_map), one token per iteration, over a vocabulary of N
//               made-up words (the demo models have 40,000-60,000), a tenth of the tokens unknown.
//   LookupUnorderedMap/N  the same look-ups in a std::unordered_map, the server's map before (the baseline).
//
// Beside the time: `per_byte` (the time per byte of text), `tokens` per text and `allocs`, heap
// allocations per text (operator new, counted here).
// Run: build/qvi-bench-tokenizer [--benchmark_min_time=0.3]; results and the command that made them are in
// docs/performance.md ("The cost of serving itself").
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "client/load_texts.h"
#include "server/core/text/tokenizer.h"
#include "server/core/text/vocabulary.h"
#include "tests/cpp/test_util/count_allocations.h"

namespace qvi {
namespace {

constexpr int kTexts = 256;

std::vector<std::string> AsciiTexts(int words) { return client::GenerateTexts(kTexts, words, words / 4.0, 7); }

// Every third word of the generated texts swapped for a non-ASCII one.
std::vector<std::string> UnicodeTexts(int words) {
  static const char* kOther[] = {"café", "naïve", "Zürich", "élan", "λόγος", "über", "서울", "한국어"};
  std::vector<std::string> out;
  int n = 0;
  for (const std::string& text : AsciiTexts(words)) {
    std::string t;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find(' ', start);
      if (end == std::string::npos) end = text.size();
      if (!t.empty()) t += ' ';
      t += (n % 3 == 2) ? std::string(kOther[(n / 3) % 8]) : text.substr(start, end - start);
      ++n;
      start = end + 1;
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Runs `body` on each text in turn and reports the counters.
template <typename Body>
void Measure(benchmark::State& state, const std::vector<std::string>& texts, Body&& body) {
  int64_t bytes = 0, tokens = 0, texts_done = 0;
  size_t next = 0;
  const int64_t before = testing::Allocations();
  for (auto _ : state) {
    const std::string& text = texts[next++ % texts.size()];
    tokens += body(text);
    bytes += static_cast<int64_t>(text.size());
    ++texts_done;
  }
  const int64_t allocs = testing::Allocations() - before;
  state.SetBytesProcessed(bytes);
  state.counters["per_byte"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = static_cast<double>(tokens) / static_cast<double>(texts_done);
  state.counters["allocs"] = static_cast<double>(allocs) / static_cast<double>(texts_done);
}

int64_t TokenizeOne(const Tokenizer& tokenizer, benchmark::State& state, const std::string& text) {
  absl::StatusOr<std::vector<TextToken>> tokens = tokenizer.Tokenize(text);
  if (!tokens.ok()) {
    state.SkipWithError("refused");
    return 0;
  }
  benchmark::DoNotOptimize(tokens->data());
  return static_cast<int64_t>(tokens->size());
}

void Ascii(benchmark::State& state) {
  const Tokenizer tokenizer(TokenizerOptions{});
  Measure(state, AsciiTexts(static_cast<int>(state.range(0))),
          [&](const std::string& text) { return TokenizeOne(tokenizer, state, text); });
}

void Unicode(benchmark::State& state) {
  const Tokenizer tokenizer(TokenizerOptions{});
  Measure(state, UnicodeTexts(static_cast<int>(state.range(0))),
          [&](const std::string& text) { return TokenizeOne(tokenizer, state, text); });
}

void Validate(benchmark::State& state) {
  Measure(state, AsciiTexts(static_cast<int>(state.range(0))), [&](const std::string& text) -> int64_t {
    if (!ValidateUtf8(text).ok()) state.SkipWithError("refused");
    return 0;
  });
}

// A vocabulary of `size` made-up words (2-10 lower-case letters, seeded) and texts of ~20 words drawn
// from it, a tenth of them unknown: what Prepare looks up per token, over a map as large as the demo
// models' (40,000-60,000 words), so that most look-ups miss the CPU's caches as they do in the server.
struct Lookups {
  std::vector<std::string> vocab;  // the made-up words, in id order from 2
  Vocabulary vocabulary;
  std::vector<std::string> words;  // the texts' tokens, normalized, in order
};

Lookups MakeLookups(int size) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> length(2, 10), letter('a', 'z');
  std::vector<std::string> vocab;
  std::string text = "[PAD]\n[UNK]\n";
  absl::flat_hash_set<std::string> seen;
  while (static_cast<int>(vocab.size()) < size) {
    std::string w(static_cast<size_t>(length(rng)), 'a');
    for (char& c : w) c = static_cast<char>(letter(rng));
    if (!seen.insert(w).second) continue;
    text += w + "\n";
    vocab.push_back(std::move(w));
  }
  absl::StatusOr<Vocabulary> parsed = Vocabulary::Parse(text);
  if (!parsed.ok()) std::abort();
  std::uniform_int_distribution<int> pick(0, size - 1), unknown(0, 9);
  std::vector<std::string> words;
  for (int i = 0; i < kTexts * 20; ++i) words.push_back(unknown(rng) == 0 ? "zzzzzzzzzzzz" : vocab[pick(rng)]);
  return Lookups{std::move(vocab), *std::move(parsed), std::move(words)};
}

// Looks up the texts' words in turn, one per iteration, with `id(word)`.
template <typename Id>
void TimeLookups(benchmark::State& state, const Lookups& l, Id&& id) {
  size_t next = 0;
  int64_t sum = 0;
  for (auto _ : state) sum += id(l.words[next++ % l.words.size()]);
  benchmark::DoNotOptimize(sum);
}

void Lookup(benchmark::State& state) {
  const Lookups l = MakeLookups(static_cast<int>(state.range(0)));
  TimeLookups(state, l, [&](const std::string& word) { return l.vocabulary.Id(word); });
}

// The same look-ups in a std::unordered_map built from the same words: the server's map before it
// became an absl::flat_hash_map, kept as the baseline.
void LookupUnorderedMap(benchmark::State& state) {
  const Lookups l = MakeLookups(static_cast<int>(state.range(0)));
  std::unordered_map<std::string, int64_t> index;
  index.reserve(l.vocab.size());
  for (const std::string& w : l.vocab) index.emplace(w, static_cast<int64_t>(index.size()) + 2);
  TimeLookups(state, l, [&](const std::string& word) {
    auto it = index.find(word);
    return it == index.end() ? Vocabulary::kUnkId : it->second;
  });
}

BENCHMARK(Ascii)->Arg(20)->Arg(100);
BENCHMARK(Unicode)->Arg(20)->Arg(100);
BENCHMARK(Validate)->Arg(20)->Arg(100);
BENCHMARK(Lookup)->Arg(50000);
BENCHMARK(LookupUnorderedMap)->Arg(50000);

}  // namespace
}  // namespace qvi

BENCHMARK_MAIN();
