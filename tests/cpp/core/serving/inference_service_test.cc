// The core service against the real demo models (built by scripts/setup.sh): answers, and every
// INVALID_ARGUMENT / NOT_FOUND case of DESIGN.md's table that the core decides.
#include "server/core/serving/inference_service.h"
#include "server/core/serving/postprocess.h"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>

#include "server/core/base/sync.h"
#include "tests/cpp/test_util/run.h"
#include "tests/cpp/test_util/store.h"

namespace qvi {
namespace {

class InferenceServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    store_ = new testing::TempStore("core_test");
    store_->CopyDemo();
    store_->Write("sentiment/2/model.pt", "this is not a TorchScript archive");
    auto repo = testing::PolledCpuRepository(store_->str());
    ASSERT_TRUE(repo.ok()) << repo.status();
    repo_ = repo->release();
    executor_ = new Executor(1, 4);
  }
  static void TearDownTestSuite() {
    delete executor_;
    delete repo_;
    delete store_;
  }

  InferenceService Service(RequestLimits limits = {}) { return InferenceService(repo_, executor_, limits); }
  static absl::StatusOr<InferenceResponse> Run(InferenceService service, Method method, InferenceRequest request) {
    return testing::RunAndWait(service, method, std::move(request));
  }

  // The demo store served with model queues of `max_queued_tokens` tokens; null when it cannot load.
  static std::unique_ptr<ModelRepository> SmallQueue(int64_t max_queued_tokens) {
    ServingConfig small;
    small.device = "cpu";
    small.max_queued_tokens = max_queued_tokens;
    auto repo = ModelRepository::Create({store_->str(), small});
    if (!repo.ok()) return nullptr;
    (*repo)->Poll();
    return *std::move(repo);
  }

  static InferenceRequest Request(std::string model, std::vector<std::string> texts) {
    InferenceRequest r;
    r.model = std::move(model);
    r.texts = std::move(texts);
    return r;
  }

  static void ExpectError(const absl::StatusOr<InferenceResponse>& r, absl::StatusCode code, const std::string& part) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  }

  static testing::TempStore* store_;
  static ModelRepository* repo_;
  static Executor* executor_;
};

testing::TempStore* InferenceServiceTest::store_ = nullptr;
ModelRepository* InferenceServiceTest::repo_ = nullptr;
Executor* InferenceServiceTest::executor_ = nullptr;

TEST_F(InferenceServiceTest, ClassifiesWithExplanations) {
  InferenceRequest r = Request("sentiment", {"A moving, funny film.", "Dull and far too long."});
  r.options.top_k = 5;
  r.options.Ask(OutputSwitch::kAttention);
  r.options.Ask(OutputSwitch::kGates);
  auto out = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->version, 1);  // version 2 is corrupt, so 0 resolves to 1
  ASSERT_EQ(out->results.size(), 2u);
  for (const TextResult& res : out->results) {
    ASSERT_EQ(res.labels.size(), 2u);
    EXPECT_GE(res.labels[0].second, res.labels[1].second);
    float sum = 0;
    for (const TokenOutput& t : res.tokens) {
      ASSERT_TRUE(t.attention.has_value() && t.gate.has_value());
      sum += *t.attention;
      EXPECT_GT(*t.gate, 0.0f);
      EXPECT_LT(*t.gate, 1.0f);
    }
    EXPECT_NEAR(sum, 1.0f, 1e-5);
  }
  EXPECT_EQ(out->results[0].tokens.size(), 6u);
}

// What a response cache did.
struct CacheCounts final : ResponseCache::Events {
  void OnLookups(const std::string&, int h, int m) override {
    hits += h;
    misses += m;
  }
  void OnEvictions(const std::string&, int n) override { evictions += n; }
  void OnSize(int64_t b) override { bytes = b; }
  std::atomic<int> hits{0}, misses{0}, evictions{0};
  std::atomic<int64_t> bytes{0};
};

// The parts of two answers for a text that must agree to the bit: labels, scores, tokens and α, β.
void ExpectSameAnswer(const TextResult& a, const TextResult& b) {
  EXPECT_EQ(a.labels, b.labels);
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t t = 0; t < a.tokens.size(); ++t) {
    EXPECT_EQ(a.tokens[t].token.text, b.tokens[t].token.text);
    EXPECT_EQ(a.tokens[t].attention, b.tokens[t].attention);
    EXPECT_EQ(a.tokens[t].gate, b.tokens[t].gate);
  }
}

TEST_F(InferenceServiceTest, TheResponseCacheAnswersKnownTextsAndSendsOnlyTheOthersToTheModel) {
  CacheCounts counts;
  ResponseCache cache(int64_t{64} << 20, &counts);
  InferenceService cached(repo_, executor_, {}, &cache);
  auto explained = [](std::vector<std::string> texts) {
    InferenceRequest r = Request("sentiment", std::move(texts));
    r.options.Ask(OutputSwitch::kAttention);
    r.options.Ask(OutputSwitch::kGates);
    return r;
  };
  auto first = Run(cached, Method::kClassify, explained({"A moving, funny film.", "Dull and far too long."}));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(counts.hits, 0);
  EXPECT_EQ(counts.misses, 2);
  EXPECT_GT(counts.bytes, 0);

  // Three texts, two known: only the new one reaches the model (its tokens are all the answer ran).
  auto second =
      Run(cached, Method::kClassify, explained({"Dull and far too long.", "Something new.", "A moving, funny film."}));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(counts.hits, 2);
  EXPECT_EQ(counts.misses, 3);
  ASSERT_EQ(second->results.size(), 3u);
  EXPECT_EQ(second->tokens, second->results[1].num_tokens) << "only the text the cache lacked ran";
  ExpectSameAnswer(second->results[0], first->results[1]);
  ExpectSameAnswer(second->results[2], first->results[0]);
  auto uncached = Run(Service(), Method::kClassify, explained({"Something new."}));
  ASSERT_TRUE(uncached.ok());
  ExpectSameAnswer(second->results[1], uncached->results[0]);

  // Every text known: answered without the model, by the version that answered them.
  auto known = Run(cached, Method::kClassify, explained({"A moving, funny film."}));
  ASSERT_TRUE(known.ok());
  EXPECT_EQ(known->tokens, 0);
  EXPECT_EQ(known->version, 1);
  EXPECT_EQ(known->results[0].tokens.size(), 6u);

  // Other options are other answers.
  ASSERT_TRUE(Run(cached, Method::kClassify, Request("sentiment", {"A moving, funny film."})).ok());
  EXPECT_EQ(counts.misses, 4);

  // A refusal of the texts the cache lacked names them as the caller numbered them.
  auto refused = Run(cached, Method::kClassify, explained({"A moving, funny film.", "Dull and far too long.", ""}));
  ExpectError(refused, absl::StatusCode::kInvalidArgument, "texts[2]: has no tokens");
}

TEST(ResponseCacheTest, KeysTellModelsLoadsOptionsAndTextsApartAndTheBoundEvictsTheLeastRecentlyUsed) {
  const std::string classify = ResponseCache::OptionsKey(Method::kClassify, OutputOptions{});
  OutputOptions top2;
  top2.top_k = 2;
  const ResponseCache::Key key = ResponseCache::KeyOf("sentiment", 7, classify, "fine");
  EXPECT_TRUE(key == ResponseCache::KeyOf("sentiment", 7, classify, "fine"));
  EXPECT_FALSE(key == ResponseCache::KeyOf("topics", 7, classify, "fine"));
  EXPECT_FALSE(key == ResponseCache::KeyOf("sentiment", 8, classify, "fine")) << "another load of the version";
  EXPECT_FALSE(key == ResponseCache::KeyOf("sentiment", 7, ResponseCache::OptionsKey(Method::kClassify, top2), "fine"));
  EXPECT_FALSE(key == ResponseCache::KeyOf("sentiment", 7, ResponseCache::OptionsKey(Method::kTag, {}), "fine"));
  EXPECT_FALSE(key == ResponseCache::KeyOf("sentiment", 7, classify, "fine."));
  EXPECT_FALSE(ResponseCache::KeyOf("ab", 7, classify, "c") == ResponseCache::KeyOf("a", 7, classify, "bc"))
      << "the parts are delimited";

  TextResult result;
  result.labels = {{"positive", 0.9f}};
  const int64_t one = ResponseCache::Bytes(result);
  CacheCounts counts;
  ResponseCache cache(3 * one, &counts);
  auto k = [&](const char* text) { return ResponseCache::KeyOf("m", 1, classify, text); };
  cache.Insert("m", k("a"), result);
  cache.Insert("m", k("b"), result);
  cache.Insert("m", k("c"), result);
  EXPECT_TRUE(cache.Find("m", {k("a")})[0].has_value());  // a used now: b is the least recently used
  cache.Insert("m", k("d"), result);
  EXPECT_EQ(counts.evictions, 1);
  const auto found = cache.Find("m", {k("a"), k("b"), k("c"), k("d")});
  EXPECT_TRUE(found[0] && !found[1] && found[2] && found[3]);
  EXPECT_EQ(found[0]->labels, result.labels);
  EXPECT_EQ(cache.bytes(), 3 * one);
  TextResult huge;
  huge.margins.resize(static_cast<size_t>(one));
  cache.Insert("m", k("huge"), huge);
  EXPECT_EQ(cache.entries(), 3u) << "a result larger than the whole cache is not kept";
}

TEST_F(InferenceServiceTest, CheapAnswerHasNoTokens) {
  auto out = Run(Service(), Method::kClassify, Request("sentiment", {"fine"}));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->results[0].labels.size(), 1u);
  EXPECT_TRUE(out->results[0].tokens.empty());
}

TEST_F(InferenceServiceTest, TagsWithExactSubstrings) {
  const std::string text = "Barack Obama flew to Paris with Microsoft people 😀 .";
  auto out = Run(Service(), Method::kTag, Request("ner", {text, ""}));
  ASSERT_TRUE(out.ok()) << out.status();
  const TextResult& res = out->results[0];
  EXPECT_EQ(res.tokens.size(), 10u);
  for (const TokenOutput& t : res.tokens) EXPECT_FALSE(t.tag.empty());
  for (const SpanOutput& s : res.spans) EXPECT_EQ(text.substr(s.byte_start, s.byte_end - s.byte_start), s.text);
  EXPECT_TRUE(out->results[1].tokens.empty());
}

TEST_F(InferenceServiceTest, Truncation) {
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "word ";
  InferenceRequest r = Request("sentiment", {long_text});
  r.options.Ask(OutputSwitch::kTokens);
  auto out = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->results[0].truncated);
  EXPECT_EQ(out->results[0].num_tokens, 200u);
  EXPECT_EQ(out->results[0].tokens.size(), 128u);
  r.options.error_on_truncation = true;
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "texts[0]: 200 tokens exceed model 'sentiment' max_tokens of 128");
}

TEST_F(InferenceServiceTest, InvalidArguments) {
  auto svc = Service(RequestLimits{3, 20});
  ExpectError(Run(svc, Method::kClassify, Request("sentiment", {})), absl::StatusCode::kInvalidArgument,
              "texts: empty; send between 1 and 3 texts");
  ExpectError(Run(svc, Method::kClassify, Request("sentiment", {"a", "b", "c", "d"})),
              absl::StatusCode::kInvalidArgument, "texts: 4 texts exceed the limit of 3");
  ExpectError(Run(svc, Method::kClassify, Request("sentiment", {"ok", std::string(21, 'x')})),
              absl::StatusCode::kInvalidArgument, "texts[1]: 21 bytes exceed the limit of 20 bytes");
  ExpectError(Run(svc, Method::kClassify, Request("sentiment", {"ok\xff"})), absl::StatusCode::kInvalidArgument,
              "texts[0]: invalid UTF-8 at byte 2");
  ExpectError(Run(svc, Method::kClassify, Request("sentiment", {"  "})), absl::StatusCode::kInvalidArgument,
              "texts[0]: has no tokens");
  ExpectError(Run(svc, Method::kClassify, Request("", {"x"})), absl::StatusCode::kInvalidArgument, "model.name: empty");
  InferenceRequest r = Request("sentiment", {"x"});
  r.options.top_k = -1;
  ExpectError(Run(svc, Method::kClassify, r), absl::StatusCode::kInvalidArgument, "options.top_k: -1 is negative");
  r = Request("sentiment", {"x"});
  r.version = -3;
  ExpectError(Run(svc, Method::kClassify, r), absl::StatusCode::kInvalidArgument, "model.version: -3");
  ExpectError(Run(svc, Method::kTag, Request("sentiment", {"x"})), absl::StatusCode::kInvalidArgument,
              "model 'sentiment' is a classification model; call Classify, not Tag");
  r = Request("sentiment", {"x"});
  r.options.Ask(OutputSwitch::kLayerGates);
  r.options.layers.layers = {7};
  ExpectError(Run(svc, Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.layers.layers[0]: 7 is out of range [0, 2)");
}

TEST_F(InferenceServiceTest, RepeatedOrTooManyLayerAndHeadIndicesAreRefused) {
  // sentiment: 2 layers x 4 heads.
  InferenceRequest r = Request("sentiment", {"x"});
  r.options.Ask(OutputSwitch::kLayerAttention);
  r.options.layers.layers = {1, 0, 1};
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.layers.layers: 3 indices exceed the model's 2 layers");
  r.options.layers.layers = {1, 1};
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.layers.layers[1]: 1 repeats options.layers.layers[0]");
  r.options.layers.layers = {};
  r.options.layers.heads = {2, 0, 2};
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.layers.heads[2]: 2 repeats options.layers.heads[0]");
  r.options.layers.heads = std::vector<int>(200000, 0);  // refused by its length, before it is walked
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.layers.heads: 200000 indices exceed the model's 4 heads");
  r.options.layers.heads = {3, 0, 2, 1};  // every head once, in any order, is fine
  EXPECT_TRUE(Run(Service(), Method::kClassify, r).ok());
}

TEST_F(InferenceServiceTest, LongModelNamesAndRequestIdsAreRefusedWithoutEcho) {
  InferenceRequest r = Request(std::string(1 << 22, 'm'), {"x"});
  absl::StatusOr<InferenceResponse> out = Run(Service(), Method::kClassify, r);
  ExpectError(out, absl::StatusCode::kInvalidArgument, "model.name: 4194304 bytes exceed the limit of 256 bytes");
  EXPECT_LT(out.status().message().size(), 200u);
  r = Request("sentiment", {"x"});
  r.request_id = std::string(257, 'r');
  out = Run(Service(), Method::kClassify, r);
  ExpectError(out, absl::StatusCode::kInvalidArgument, "request_id: 257 bytes exceed the limit of 256 bytes");
  EXPECT_LT(out.status().message().size(), 200u);
  EXPECT_EQ(Capped(std::string(1000, 'a'), 4), "aaaa...(1000 bytes)");
  EXPECT_EQ(Capped("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9...(4 bytes)");  // never cuts inside a code point
}

TEST_F(InferenceServiceTest, AnAnswerOverTheSendLimitIsRefusedBeforeTheModelRuns) {
  std::vector<std::string> texts(64, "a long text of many words that the model reads and explains word by word");
  InferenceRequest r = Request("sentiment", texts);
  r.options.Ask(OutputSwitch::kAttention);
  r.options.Ask(OutputSwitch::kLayerGates);
  r.options.Ask(OutputSwitch::kLayerAttention);
  // The answer really is about as large as estimated: measure it without a limit.
  absl::StatusOr<InferenceResponse> full = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(full.ok()) << full.status();
  int64_t payload = 0;
  for (const TextResult& t : full->results) {
    for (const LayerMapOutput& m : t.layers) payload += 4 * static_cast<int64_t>(m.gates.size() + m.attention.size());
  }
  const int64_t estimate =
      EstimateResponseBytes(Method::kClassify, (*repo_->Resolve("sentiment", 0))->model->manifest(), r, *full);
  EXPECT_GE(estimate, payload);
  EXPECT_LE(estimate, 2 * payload);
  RequestLimits limits;
  limits.max_response_bytes = payload / 2;
  ExpectError(Run(Service(limits), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "the answer would be about");
  // Averaging the heads makes it fit.
  r.options.layers.reduction = LayerSelection::Reduction::kMeanHeads;
  EXPECT_TRUE(Run(Service(limits), Method::kClassify, r).ok());
}

TEST_F(InferenceServiceTest, ARequestThatCanNeverFitTheQueueIsInvalidNotExhausted) {
  RequestLimits limits;
  limits.max_texts = 4000;
  ExpectError(Run(Service(limits), Method::kClassify, Request("sentiment", std::vector<std::string>(1025, "x"))),
              absl::StatusCode::kInvalidArgument,
              "texts: 1025 texts can never fit model 'sentiment''s queue of 1024 texts (max_queued_texts)");
  // The same store served with queues of 16 tokens.
  std::unique_ptr<ModelRepository> repo = SmallQueue(16);
  ASSERT_NE(repo, nullptr);
  InferenceService service(repo.get(), executor_, RequestLimits{});
  ExpectError(Run(service, Method::kClassify,
                  Request("sentiment", {"one two three four five six seven eight nine",
                                        "ten eleven twelve thirteen fourteen fifteen sixteen seventeen"})),
              absl::StatusCode::kInvalidArgument,
              "texts: 17 tokens in all can never fit model 'sentiment''s queue of 16 tokens (max_queued_tokens)");
  EXPECT_TRUE(Run(service, Method::kClassify, Request("sentiment", {"one two three"})).ok());
}

// The text's tokens joined by spaces, leaving out token `skip` (-1: none): the demo tokenizers read
// it as the same ids less that one.
std::string Without(const TextResult& r, int skip) {
  std::string out;
  for (size_t t = 0; t < r.tokens.size(); ++t) {
    if (static_cast<int>(t) == skip) continue;
    if (!out.empty()) out += " ";
    out += r.tokens[t].token.text;
  }
  return out;
}

TEST_F(InferenceServiceTest, ClassifyOcclusionIsEachTokensDropInEachReturnedLabelsProbability) {
  InferenceRequest r = Request("sentiment", {"a moving , funny and far too long film", "dull", "great"});
  r.options.top_k = 2;
  r.options.Ask(OutputSwitch::kOcclusion);
  auto out = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(out.ok()) << out.status();
  const TextResult& text = out->results[0];
  ASSERT_EQ(text.tokens.size(), 9u);
  // Each variant asked alone, as a text of its own: its labels' probabilities.
  std::vector<std::string> variants;
  for (size_t i = 0; i < text.tokens.size(); ++i) variants.push_back(Without(text, static_cast<int>(i)));
  InferenceRequest alone = Request("sentiment", variants);
  alone.options.top_k = 2;
  auto without = Run(Service(), Method::kClassify, alone);
  ASSERT_TRUE(without.ok()) << without.status();
  for (size_t i = 0; i < text.tokens.size(); ++i) {
    ASSERT_EQ(text.tokens[i].occlusion.size(), 2u) << i;
    for (size_t j = 0; j < 2; ++j) {
      float p = 0;
      for (const auto& [label, score] : without->results[i].labels) {
        if (label == text.labels[j].first) p = score;
      }
      EXPECT_NEAR(text.tokens[i].occlusion[j], text.labels[j].second - p, 1e-5) << "token " << i << " label " << j;
    }
  }
  // A one-token text has no variant: nothing would be left to read.
  EXPECT_TRUE(out->results[1].tokens.at(0).occlusion.empty());
  // With the faithfulness check too: the texts are checked, their variants are not (they have no
  // check of their own), and the values are the same.
  r.options.faithfulness_top_k = 2;
  auto checked = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(checked.ok()) << checked.status();
  for (size_t i = 0; i < r.texts.size(); ++i) ASSERT_TRUE(checked->results[i].faithfulness.has_value()) << i;
  for (size_t i = 0; i < text.tokens.size(); ++i) {
    EXPECT_NEAR(checked->results[0].tokens[i].occlusion.at(0), text.tokens[i].occlusion[0], 1e-5) << i;
  }
  r.options.faithfulness_top_k = 0;
  // Without the option nothing is computed, and the labels are the same.
  r.options.outputs.reset();
  auto plain = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(plain.ok());
  // The same labels; their probabilities to float precision, not to the bit: here the text was batched
  // with its n variants, there with one other text, and a batch's shape may change a GEMM's sums.
  ASSERT_EQ(plain->results[0].labels.size(), text.labels.size());
  for (size_t j = 0; j < text.labels.size(); ++j) {
    EXPECT_EQ(plain->results[0].labels[j].first, text.labels[j].first) << j;
    EXPECT_NEAR(plain->results[0].labels[j].second, text.labels[j].second, 1e-6) << j;
  }
  EXPECT_TRUE(plain->results[0].tokens.empty());
}

TEST_F(InferenceServiceTest, TagOcclusionIsEachTokensDropInEachEntitysProbability) {
  InferenceRequest r = Request("ner", {"Angela Merkel met Barack Obama in Berlin on Tuesday ."});
  r.options.Ask(OutputSwitch::kOcclusion);
  auto out = Run(Service(), Method::kTag, r);
  ASSERT_TRUE(out.ok()) << out.status();
  const TextResult& text = out->results[0];
  const size_t n = text.tokens.size();
  ASSERT_GE(text.spans.size(), 2u);
  // The entities' probabilities in each variant, where the variant's own answer has the entity too
  // (shifted left when the deleted token came before it): there its probability is the record's.
  int compared = 0;
  for (size_t i = 0; i < n; ++i) {
    InferenceRequest v = Request("ner", {Without(text, static_cast<int>(i))});
    v.options.Ask(OutputSwitch::kOcclusion);
    auto variant = Run(Service(), Method::kTag, v);
    ASSERT_TRUE(variant.ok()) << variant.status();
    for (const SpanOutput& s : text.spans) {
      ASSERT_TRUE(s.probability.has_value());
      ASSERT_EQ(s.occlusion.size(), n);
      if (i >= s.token_start && i < s.token_end) {
        EXPECT_EQ(s.occlusion[i], 0.0f) << s.text << ": its own token " << i << " stays";
        continue;
      }
      const uint32_t shift = i < s.token_start ? 1 : 0;
      for (const SpanOutput& w : variant->results[0].spans) {
        if (w.token_start != s.token_start - shift || w.token_end != s.token_end - shift || w.label != s.label)
          continue;
        EXPECT_NEAR(s.occlusion[i], *s.probability - *w.probability, 1e-5) << s.text << " without token " << i;
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, static_cast<int>(n));
}

TEST_F(InferenceServiceTest, OcclusionIsLimitedBeforeItIsQueued) {
  // 9 tokens: 9 variants of 8 tokens, 72 variant tokens.
  InferenceRequest r = Request("sentiment", {"a moving , funny and far too long film"});
  r.options.Ask(OutputSwitch::kOcclusion);
  RequestLimits limits;
  limits.max_occlusion_tokens = 71;
  ExpectError(Run(Service(limits), Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.occlusion: the texts' leave-one-out variants hold 72 tokens (n·(n − 1) for a text of n "
              "tokens), over the limit of 71 (--max-occlusion-tokens)");
  limits.max_occlusion_tokens = 72;
  EXPECT_TRUE(Run(Service(limits), Method::kClassify, r).ok());
  // With the texts, the variants must fit the model's queue.
  std::unique_ptr<ModelRepository> repo = SmallQueue(60);
  ASSERT_NE(repo, nullptr);
  InferenceService service(repo.get(), executor_, RequestLimits{});
  ExpectError(Run(service, Method::kClassify, r), absl::StatusCode::kInvalidArgument,
              "options.occlusion: the texts and their variants, 10 rows of 81 tokens, can never fit model "
              "'sentiment''s queue of 1024 texts and 60 tokens");
  r.options.outputs.reset();
  EXPECT_TRUE(Run(service, Method::kClassify, r).ok());
}

TEST_F(InferenceServiceTest, UnknownAndFailedModels) {
  ExpectError(Run(Service(), Method::kClassify, Request("nope", {"x"})), absl::StatusCode::kNotFound,
              "model 'nope' not found; models: ner, sentiment, topics");
  InferenceRequest r = Request("sentiment", {"x"});
  r.version = 9;
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kNotFound, "has no version 9; versions: 1, 2");
  r.version = 2;
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kUnavailable, "version 2 is FAILED: cannot read");
}

TEST_F(InferenceServiceTest, ExpiredAndCancelledRequestsNeverRun) {
  InferenceRequest r = Request("sentiment", {"x"});
  r.deadline = Service().env().Now() - absl::Seconds(1);  // deadlines are times of the core's clock
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kDeadlineExceeded, "deadline");
  r.deadline = absl::InfiniteFuture();
  r.is_cancelled = [] { return true; };
  ExpectError(Run(Service(), Method::kClassify, r), absl::StatusCode::kCancelled, "cancelled");
}

TEST_F(InferenceServiceTest, LayerMapsAreSelectedAndReduced) {
  InferenceRequest r = Request("sentiment", {"a good film"});
  r.options.Ask(OutputSwitch::kLayerGates);
  r.options.Ask(OutputSwitch::kLayerAttention);
  r.options.layers.layers = {1};
  auto out = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(out.ok()) << out.status();
  const auto& maps = out->results[0].layers;
  ASSERT_EQ(maps.size(), 4u);  // one layer x 4 heads
  EXPECT_EQ(maps[0].layer, 1);
  EXPECT_EQ(maps[3].head, 3);
  EXPECT_EQ(maps[0].gates.size(), 3u);
  EXPECT_EQ(maps[0].attention.size(), 9u);
  float row = maps[0].attention[0] + maps[0].attention[1] + maps[0].attention[2];
  EXPECT_NEAR(row, 1.0f, 1e-5);
  r.options.layers.layers = {};
  r.options.layers.reduction = LayerSelection::Reduction::kMeanAll;
  out = Run(Service(), Method::kClassify, r);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->results[0].layers.size(), 1u);
  EXPECT_EQ(out->results[0].layers[0].layer, -1);
}

TEST_F(InferenceServiceTest, BatchingIsInvisibleInTheAnswers) {
  // One request's texts share a batch (padded to the longest); each must get the answer it gets alone.
  const std::vector<std::string> texts = {
      "Fine.",
      "A long, winding and in the end deeply rewarding film about memory, loss and music.",
      "Dull.",
      "北京 café 👍🏽 — not bad at all",
      "The plot is thin but the acting carries it through.",
      "Meh"};
  InferenceRequest together = Request("sentiment", texts);
  together.options.top_k = 2;
  together.options.Ask(OutputSwitch::kAttention);
  together.options.Ask(OutputSwitch::kGates);
  auto batched = Run(Service(), Method::kClassify, together);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (size_t i = 0; i < texts.size(); ++i) {
    InferenceRequest one = together;
    one.texts = {texts[i]};
    auto alone = Run(Service(), Method::kClassify, one);
    ASSERT_TRUE(alone.ok());
    const TextResult& a = alone->results[0];
    const TextResult& b = batched->results[i];
    ASSERT_EQ(a.labels.size(), b.labels.size());
    for (size_t k = 0; k < a.labels.size(); ++k) {
      EXPECT_EQ(a.labels[k].first, b.labels[k].first) << texts[i];
      EXPECT_NEAR(a.labels[k].second, b.labels[k].second, 1e-5) << texts[i];
    }
    ASSERT_EQ(a.tokens.size(), b.tokens.size());
    for (size_t t = 0; t < a.tokens.size(); ++t) {
      EXPECT_NEAR(*a.tokens[t].attention, *b.tokens[t].attention, 1e-5) << texts[i];
      EXPECT_NEAR(*a.tokens[t].gate, *b.tokens[t].gate, 1e-5) << texts[i];
    }
  }
}

TEST_F(InferenceServiceTest, OnlySelectedLayersAndHeadsLeaveTheModel) {
  absl::StatusOr<ServableHandle> h = repo_->Resolve("sentiment", 0);
  ASSERT_TRUE(h.ok()) << h.status();
  const Model& model = *(*h)->model;
  at::Tensor ids = torch::arange(2, 12, torch::kLong).view({2, 5});  // distinct tokens: heads differ
  at::Tensor mask = torch::ones({2, 5}, torch::kBool);
  auto all = model.Forward(ids, mask, testing::Named({"layer_attention", "layer_gates"}));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->at(Output::kLayerAttention).sizes(), (std::vector<int64_t>{2, 2, 4, 5, 5}));
  EXPECT_FALSE(all->layer_index.defined());
  auto some =
      model.Forward(ids, mask, testing::Named({"layer_attention", "layer_gates"}), OutputSelection{{1}, {0, 2}});
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->at(Output::kLayerAttention).sizes(), (std::vector<int64_t>{2, 1, 2, 5, 5}));
  EXPECT_EQ(some->at(Output::kLayerGates).sizes(), (std::vector<int64_t>{2, 1, 2, 5}));
  EXPECT_TRUE(torch::equal(some->layer_index, torch::tensor({1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(some->head_index, torch::tensor({0, 2}, torch::kLong)));
  EXPECT_TRUE(torch::allclose(some->at(Output::kLayerAttention)[0][0][1], all->at(Output::kLayerAttention)[0][1][2]));
  // A text asking for layer 1 head 2 of that cut gets the same numbers as from the full output.
  OutputOptions sel;
  sel.Ask(OutputSwitch::kLayerAttention);
  sel.layers.layers = {1};
  sel.layers.heads = {2};
  std::vector<LayerMapOutput> a = LayerMaps(*some, sel, 0, 5), b = LayerMaps(*all, sel, 0, 5);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].layer, 1);
  EXPECT_EQ(a[0].head, 2);
  EXPECT_EQ(a[0].attention, b[0].attention);

  // Heads averaged on the device: one head leaves it, and the summary equals the host's average.
  auto mean =
      model.Forward(ids, mask, testing::Named({"layer_attention", "layer_gates"}), OutputSelection{{}, {0, 2}, true});
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(mean->at(Output::kLayerAttention).sizes(), (std::vector<int64_t>{2, 2, 1, 5, 5}));
  EXPECT_TRUE(torch::equal(mean->head_index, torch::tensor({-1}, torch::kLong)));
  sel.Ask(OutputSwitch::kLayerGates);
  sel.layers.layers = {};
  sel.layers.heads = {0, 2};
  for (auto reduction : {LayerSelection::Reduction::kMeanHeads, LayerSelection::Reduction::kMeanAll}) {
    sel.layers.reduction = reduction;
    std::vector<LayerMapOutput> dev = LayerMaps(*mean, sel, 1, 5), host = LayerMaps(*all, sel, 1, 5);
    ASSERT_EQ(dev.size(), host.size());
    ASSERT_EQ(dev.size(), reduction == LayerSelection::Reduction::kMeanHeads ? 2u : 1u);
    for (size_t i = 0; i < dev.size(); ++i) {
      EXPECT_EQ(dev[i].layer, host[i].layer);
      EXPECT_EQ(dev[i].head, -1);
      ASSERT_EQ(dev[i].attention.size(), 25u);
      ASSERT_EQ(dev[i].gates.size(), 5u);
      for (size_t k = 0; k < 25; ++k) EXPECT_NEAR(dev[i].attention[k], host[i].attention[k], 1e-6);
      for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(dev[i].gates[k], host[i].gates[k], 1e-6);
    }
  }
}

// A batch that asks for no maps runs forward_without_maps (the maps are never formed); its answers
// equal those of forward, for the classifier (fused attention) and the tagger.
TEST_F(InferenceServiceTest, BatchesWithoutMapsSkipThemAndAnswerTheSame) {
  for (const char* name : {"sentiment", "ner"}) {
    absl::StatusOr<ServableHandle> h = repo_->Resolve(name, 0);
    ASSERT_TRUE(h.ok()) << h.status();
    const Model& model = *(*h)->model;
    ASSERT_TRUE(model.has_forward_without_maps())
        << name << ": re-export the demo models (python -m qvi demo --reexport)";
    at::Tensor ids = torch::arange(2, 20, torch::kLong).view({3, 6});
    at::Tensor mask = torch::ones({3, 6}, torch::kBool);
    mask.index_put_({1, torch::indexing::Slice(2)}, false);
    mask.index_put_({2, torch::indexing::Slice(4)}, false);
    const OutputSet explained = testing::Named({"logits", "emissions", "tags", "attention", "gates", "layer_gates"});
    OutputSet with_maps = explained;
    with_maps.set(static_cast<size_t>(Output::kLayerAttention));
    auto lean = model.Forward(ids, mask, explained);
    auto full = model.Forward(ids, mask, with_maps);
    ASSERT_TRUE(lean.ok()) << lean.status();
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_FALSE(lean->has(Output::kLayerAttention));
    EXPECT_TRUE(full->has(Output::kLayerAttention));
    size_t compared = 0;
    for (Output output : InOrder(lean->present())) {
      const at::Tensor& t = lean->at(output);
      ASSERT_TRUE(full->has(output)) << name << " " << OutputName(output);
      if (t.is_floating_point()) {
        EXPECT_TRUE(torch::allclose(t, full->at(output), 1e-5, 1e-5)) << name << " " << OutputName(output);
      } else {
        EXPECT_TRUE(torch::equal(t, full->at(output))) << name << " " << OutputName(output);
      }
      ++compared;
    }
    EXPECT_EQ(compared + 1, full->present().count()) << name;  // everything but the maps
  }
}

TEST_F(InferenceServiceTest, SubmitAnswersExactlyOnce) {
  auto svc = Service();
  Mutex mu;
  CondVar answered;
  int answers = 0;
  std::vector<int> per_request(3, 0);
  for (int i = 0; i < 3; ++i) {
    svc.Submit(Method::kClassify, Request("sentiment", {"good", "a longer second text", "bad"}),
               [&, i](absl::StatusOr<InferenceResponse> r) {
                 EXPECT_TRUE(r.ok() || r.status().code() == absl::StatusCode::kResourceExhausted) << r.status();
                 if (r.ok()) EXPECT_EQ(r->results.size(), 3u);
                 MutexLock l(&mu);
                 ++answers;
                 ++per_request[i];
                 answered.SignalAll();
               });
  }
  {
    MutexLock l(&mu);
    while (answers < 3) answered.Wait(&mu);
  }
  // A later request through the same queue is answered after anything still in flight for the
  // first three; a second answer to any of them would have arrived by then.
  ASSERT_TRUE(Run(svc, Method::kClassify, Request("sentiment", {"after"})).ok());
  MutexLock l(&mu);
  EXPECT_EQ(answers, 3);
  EXPECT_EQ(per_request, (std::vector<int>{1, 1, 1}));
}

// Occupies `executor`'s one worker until `release` is notified; returns once the worker runs it.
bool HoldTheOnlyWorker(Executor& executor, Notification& release) {
  auto started = std::make_shared<Notification>();
  if (!executor.TrySubmit([started, &release] {
        started->Notify();
        release.WaitForNotification();
      })) {
    return false;
  }
  started->WaitForNotification();
  return true;
}

TEST(InferenceServiceQueueTest, FullQueueIsResourceExhaustedAtOnce) {
  // One worker, room for one queued task: hold the worker, fill the queue, and the next request is
  // refused immediately without touching the queue; once released, the queued one is answered.
  Executor executor(1, 1);
  Notification release;
  ASSERT_TRUE(HoldTheOnlyWorker(executor, release));
  // No repository: the queued request has no texts, so it fails its checks before any lookup.
  InferenceService svc(nullptr, &executor, {});
  InferenceRequest queued;
  queued.model = "anything";
  Notification answered;
  absl::Status queued_status;
  svc.Submit(Method::kClassify, queued, [&](absl::StatusOr<InferenceResponse> r) {
    queued_status = r.status();
    answered.Notify();
  });
  absl::Status refused;
  bool refused_inline = false;
  svc.Submit(Method::kClassify, queued, [&](absl::StatusOr<InferenceResponse> r) {
    refused = r.status();
    refused_inline = true;
  });
  EXPECT_TRUE(refused_inline) << "the refusal must come at once, in the caller's thread";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(answered.HasBeenNotified());
  release.Notify();
  answered.WaitForNotification();
  EXPECT_EQ(queued_status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(InferenceServiceQueueTest, SmallRequestsArePreparedOnTheCallersThread) {
  // The only request thread is held and its queue is full: a request under inline_prepare_bytes is
  // still checked (in the caller's thread); one at the threshold goes to the full queue.
  Executor executor(1, 1);
  Notification release;
  ASSERT_TRUE(HoldTheOnlyWorker(executor, release));
  ASSERT_TRUE(executor.TrySubmit([] {}));
  InferenceService svc(nullptr, &executor, RequestLimits{.inline_prepare_bytes = 8});
  InferenceRequest small;
  small.model = "anything";
  small.texts = {"1234567"};  // 7 bytes, and a negative top_k: refused by the checks, not the queue
  small.options.top_k = -1;
  absl::Status status;
  bool inline_answer = false;
  svc.Submit(Method::kClassify, small, [&](absl::StatusOr<InferenceResponse> r) {
    status = r.status();
    inline_answer = true;
  });
  EXPECT_TRUE(inline_answer);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  InferenceRequest big = small;
  big.texts = {"12345678"};  // 8 bytes: a request thread, whose queue is full
  inline_answer = false;
  svc.Submit(Method::kClassify, big, [&](absl::StatusOr<InferenceResponse> r) {
    status = r.status();
    inline_answer = true;
  });
  EXPECT_TRUE(inline_answer);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  release.Notify();
  executor.Shutdown();
}

}  // namespace
}  // namespace qvi
