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
//
// Beside the time: `per_byte` (the time per byte of text), `tokens` per text and `allocs`, heap
// allocations per text (operator new, counted here).
// Run: build/qvi-bench-tokenizer [--benchmark_min_time=0.3]; results and the command that made them are in
// docs/performance.md ("The cost of serving itself").
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "client/load_texts.h"
#include "server/core/text/tokenizer.h"
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

BENCHMARK(Ascii)->Arg(20)->Arg(100);
BENCHMARK(Unicode)->Arg(20)->Arg(100);
BENCHMARK(Validate)->Arg(20)->Arg(100);

}  // namespace
}  // namespace qvi

BENCHMARK_MAIN();
