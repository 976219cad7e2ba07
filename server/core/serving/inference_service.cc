#include "server/core/serving/inference_service.h"
#include "server/core/base/exception_text.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/base/sync.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/occlusion.h"
#include "server/core/serving/postprocess.h"
#include "server/core/serving/subwords.h"
#include "server/core/serving/trust.h"

namespace qvi {
namespace {

const char* MethodName(Method m) { return m == Method::kClassify ? "Classify" : "Tag"; }

// A switch the request turned on whose outputs the model has none of.
absl::Status CheckSwitch(const InferenceRequest& r, const Manifest& m, OutputSwitch on, const char* why) {
  if (!r.options.Asks(on) || HasAny(m, SwitchedBy(on))) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(NamesOf(on).option, ": model '", m.name, "' (", m.display_name, ") ", why));
}

// The explanation switches against what the model has: its outputs, and a tagger's CRF for occlusion.
absl::Status CheckExplanations(const InferenceRequest& r, const Model& model) {
  const Manifest& m = model.manifest();
  if (absl::Status s = CheckSwitch(r, m, OutputSwitch::kAttention, "has no attention to explain its answer with");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSwitch(r, m, OutputSwitch::kGates, "has no gates; it was trained without QVI"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSwitch(r, m, OutputSwitch::kContributions,
                                   "has no token contributions: classifiers with an attention pooling have them "
                                   "(Classify), from an export of 2026-11-28 or later");
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

absl::Status CheckAgainstModel(Method method, const InferenceRequest& r, const Model& model) {
  const Manifest& m = model.manifest();
  const bool tagging = m.task == Task::kTagging;
  if ((method == Method::kTag) != tagging) {
    return absl::InvalidArgumentError(absl::StrCat("model '", m.name, "' is a ", tagging ? "tagging" : "classification",
                                                   " model; call ", tagging ? "Tag" : "Classify", ", not ",
                                                   MethodName(method)));
  }
  if (absl::Status s = CheckExplanations(r, model); !s.ok()) return s;
  if (absl::Status s = CheckTrustOptions(method, r.options, m); !s.ok()) return s;
  if (r.options.faithfulness_top_k > 0) {
    if (method != Method::kClassify) {
      return absl::InvalidArgumentError("options.faithfulness: the check is for Classify; Tag does not take it");
    }
    if (!HasOutput(m, Output::kAttention) || m.subwords()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.faithfulness: model '", m.name, "' (", m.display_name, ") ",
          m.subwords() ? "reads sub-words; the check is not built for sub-word models" : "has no attention to check"));
    }
  }
  const LayerSelection& l = r.options.layers;
  if (r.options.AsksLayers() || !l.layers.empty() || !l.heads.empty()) {
    if (!HasOutput(m, Output::kLayerAttention)) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.layers: model '", m.name, "' (", m.display_name, ") has no per-layer outputs"));
    }
    if (r.options.Asks(OutputSwitch::kLayerGates) && !HasAny(m, SwitchedBy(OutputSwitch::kLayerGates))) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.layers.gates: model '", m.name, "' has no per-layer gates"));
    }
    if (absl::Status s = CheckIndices("options.layers.layers", l.layers, m.layers, "layers"); !s.ok()) return s;
    if (absl::Status s = CheckIndices("options.layers.heads", l.heads, m.heads, "heads"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// options.occlusion's variants, Σ n·(n − 1) tokens in Σ n more rows, against --max-occlusion-tokens
// and, with the texts, against the model's queue.
// `tokens`: the texts' own, counted already.
// A sub-word model's variants delete words (`results`' words), not sub-words.
absl::Status CheckOcclusion(const InferenceRequest& r, const std::vector<std::vector<int64_t>>& ids,
                            const std::vector<TextResult>& results, bool subwords, int64_t tokens,
                            const ServingConfig& serving, const RequestLimits& limits) {
  if (!r.options.Asks(OutputSwitch::kOcclusion)) return absl::OkStatus();
  int64_t rows = 0, variant_tokens = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto n = static_cast<int64_t>(ids[i].size());
    const std::vector<WordPieces>& words = results[i].words;
    rows += 1 + (subwords ? OcclusionVariants(static_cast<int64_t>(words.size())) : OcclusionVariants(n));
    variant_tokens += subwords ? WordOcclusionVariantTokens(n, words) : OcclusionVariantTokens(n);
  }
  if (variant_tokens > limits.max_occlusion_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.occlusion: the texts' leave-one-out variants hold ", variant_tokens,
                     " tokens (n·(n − 1) for a text of n tokens), over the limit of ", limits.max_occlusion_tokens,
                     " (--max-occlusion-tokens); send shorter or fewer texts"));
  }
  if (rows > serving.max_queued_texts || tokens + variant_tokens > serving.max_queued_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.occlusion: the texts and their variants, ", rows, " rows of ", tokens + variant_tokens,
        " tokens, can never fit model '", r.model, "''s queue of ", serving.max_queued_texts, " texts and ",
        serving.max_queued_tokens, " tokens (max_queued_texts, max_queued_tokens); send shorter or fewer texts"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLive(const InferenceRequest& r, const Env& env) {
  if (r.is_cancelled && r.is_cancelled()) return absl::CancelledError("the client cancelled the request");
  if (env.Now() > r.deadline) return absl::DeadlineExceededError("the deadline passed before the model ran");
  return absl::OkStatus();
}

namespace {
// The answer's size as the request's API will send it: its own estimate (OIP's padded tensors), or
// the native answer's.
int64_t AnswerEstimate(Method method, const Manifest& m, const InferenceRequest& r,
                       const InferenceResponse& tokenised) {
  return r.estimate_response_bytes ? r.estimate_response_bytes(r, tokenised)
                                   : EstimateResponseBytes(method, m, r, tokenised);
}

// Refuses, before the model runs, an answer larger than the send limit (INVALID_ARGUMENT: the same
// request can never be answered) and one the bytes in flight have no room for (the caller's
// hold_answer_bytes: RESOURCE_EXHAUSTED, a load limit).
absl::Status CheckAnswerSize(Method method, const Manifest& m, const InferenceRequest& r,
                             const InferenceResponse& tokenised, int64_t max_response_bytes) {
  if (max_response_bytes <= 0 && !r.hold_answer_bytes) return absl::OkStatus();
  const int64_t estimate = AnswerEstimate(method, m, r, tokenised);
  if (max_response_bytes > 0 && estimate > max_response_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options: the answer would be about ", estimate, " bytes, over the limit of ", max_response_bytes,
        " bytes (--max-message-bytes); ask for fewer texts, layers, heads or attention maps, or average the heads"));
  }
  return r.hold_answer_bytes ? r.hold_answer_bytes(estimate) : absl::OkStatus();
}
// Reads text `i` of `r` as `model`'s tokens into `result` (their outputs to come) and `ids`.
absl::Status ReadText(Method method, const Model& model, const InferenceRequest& r, size_t i, TextResult& result,
                      std::vector<int64_t>& ids) {
  const Manifest& m = model.manifest();
  const int max_tokens = m.tokenizer.max_tokens;
  if (m.subwords()) {
    absl::Status read = TokenizeSubwords(model, r.texts[i], r.options.error_on_truncation, result, ids);
    if (!read.ok()) return absl::Status(read.code(), absl::StrCat("texts[", i, "]: ", read.message()));
    if (result.words.empty() && method == Method::kClassify) {
      return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: has no words; Classify needs at least one word"));
    }
    result.vocab_units = static_cast<uint32_t>(result.words.size());
    for (const WordPieces& w : result.words) result.vocab_unknown += w.end - w.first > 1 ? 1 : 0;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<TextToken>> tokens = model.tokenizer().Tokenize(r.texts[i]);
  if (!tokens.ok()) return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", tokens.status().message()));
  result.num_tokens = static_cast<uint32_t>(tokens->size());
  if (static_cast<int>(tokens->size()) > max_tokens) {
    if (r.options.error_on_truncation) {
      return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", tokens->size(), " tokens exceed model '",
                                                     m.name, "' max_tokens of ", max_tokens,
                                                     " (options.truncation = ERROR)"));
    }
    tokens->resize(max_tokens);
    result.truncated = true;
  }
  if (tokens->empty() && method == Method::kClassify) {
    return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: has no tokens; Classify needs at least one word"));
  }
  result.tokens.reserve(tokens->size());
  ids.reserve(tokens->size());
  result.vocab_units = static_cast<uint32_t>(tokens->size());
  for (TextToken& t : *tokens) {
    TokenOutput out;
    out.id = TokenId(model.vocabulary(), m.tokenizer, t);
    // (A cased model's id is the vocabulary's plus its size times the case class.)
    result.vocab_unknown += out.id % static_cast<int64_t>(model.vocabulary().size()) == Vocabulary::kUnkId ? 1 : 0;
    out.token = std::move(t);
    ids.push_back(out.id);
    result.tokens.push_back(std::move(out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InferenceService::Prepared> InferenceService::Prepare(Method method, InferenceRequest& r,
                                                                     ServableHandle servable) const {
  if (absl::Status s = CheckRequest(r, limits_); !s.ok()) return s;
  if (absl::Status s = CheckTrustRanges(r.options); !s.ok()) return s;
  absl::StatusOr<ServableHandle> handle = std::move(servable);
  if (*handle == nullptr) {
    handle = repository_->Resolve(r.model, r.version);
  } else if ((*handle)->name != r.model || (r.version != 0 && (*handle)->version != r.version)) {
    return absl::InternalError(absl::StrCat("the request for '", r.model, "' version ", r.version, " was resolved to '",
                                            (*handle)->name, "' version ", (*handle)->version));
  }
  if (!handle.ok()) return handle.status();
  const Model& model = *(*handle)->model;
  const Manifest& m = model.manifest();
  const ServingConfig& serving = (*handle)->serving;
  ApplyServingDefaults(serving, r.options);
  if (absl::Status s = CheckAgainstModel(method, r, model); !s.ok()) return s;

  if (static_cast<int64_t>(r.texts.size()) > serving.max_queued_texts) {
    return absl::InvalidArgumentError(absl::StrCat("texts: ", r.texts.size(), " texts can never fit model '", r.model,
                                                   "''s queue of ", serving.max_queued_texts,
                                                   " texts (max_queued_texts); send fewer per request"));
  }

  Prepared p;
  p.handle = *handle;
  InferenceResponse& response = p.response;
  response.model = r.model;
  response.version = (*handle)->version;
  response.manifest = model.shared_manifest();  // not the handle: an answer must not hold its version loaded
  response.request_id = r.request_id;
  response.abstain_below = r.options.abstain_below;
  response.results.resize(r.texts.size());
  p.ids.resize(r.texts.size());
  for (size_t i = 0; i < r.texts.size(); ++i) {
    if (absl::Status s = ReadText(method, model, r, i, response.results[i], p.ids[i]); !s.ok()) return s;
  }
  int64_t tokens = 0;
  for (const std::vector<int64_t>& ids : p.ids) tokens += static_cast<int64_t>(ids.size());
  if (tokens > serving.max_queued_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("texts: ", tokens, " tokens in all can never fit model '", r.model,
                                                   "''s queue of ", serving.max_queued_tokens,
                                                   " tokens (max_queued_tokens); send fewer per request"));
  }
  if (absl::Status s = CheckOcclusion(r, p.ids, response.results, m.subwords(), tokens, serving, limits_); !s.ok())
    return s;
  if (absl::Status s = CheckAnswerSize(method, m, r, response, limits_.max_response_bytes); !s.ok()) return s;
  return p;
}

void InferenceService::Submit(Method method, InferenceRequest request, Done done, ServableHandle servable) {
  if (drift_ != nullptr && !request.internal) done = WithDrift(request.options.raw_scores, std::move(done));
  if (shadow_ != nullptr && !request.internal) done = WithShadow(method, request, std::move(done));
  if (limits_.inline_prepare_bytes > 0) {
    int64_t bytes = 0;
    for (const std::string& t : request.texts) bytes += static_cast<int64_t>(t.size());
    if (bytes < limits_.inline_prepare_bytes) {
      Dispatch(method, std::move(request), std::move(done), std::move(servable));
      return;
    }
  }
  struct Work {
    InferenceRequest request;
    Done done;
    ServableHandle servable;
  };
  auto work = std::make_shared<Work>(Work{std::move(request), std::move(done), std::move(servable)});
  const bool queued = executor_->TrySubmit([this, method, work] {
    Dispatch(method, std::move(work->request), std::move(work->done), std::move(work->servable));
  });
  if (!queued) work->done(absl::ResourceExhaustedError("the server's request queue is full; retry with backoff"));
}

InferenceService::Done InferenceService::WithShadow(Method method, const InferenceRequest& request, Done done) {
  std::optional<ShadowSettings> settings = shadow_->Wants(request.model, request.version);
  if (!settings) return done;
  return [this, method, settings = *settings, texts = request.texts,
          done = std::move(done)](absl::StatusOr<InferenceResponse> out) {
    if (!out.ok()) return done(std::move(out));
    // What the mirror needs of the answer, kept: the caller's answer is sent first, and not waited on after.
    InferenceResponse head;
    head.model = out->model;
    head.version = out->version;
    head.manifest = out->manifest;
    head.request_id = out->request_id;
    done(std::move(out));
    shadow_->Mirror(method, settings, texts, head, env().Now(), [this](Method m, InferenceRequest r, Done d) {
      auto work = std::make_shared<std::pair<InferenceRequest, Done>>(std::move(r), std::move(d));
      return executor_->TrySubmit([this, m, work] {
        Dispatch(m, std::move(work->first), std::move(work->second), nullptr, false, /*cached=*/true);
      });
    });
  };
}

InferenceService::Done InferenceService::WithDrift(bool raw_scores, Done done) {
  return [this, raw_scores, done = std::move(done)](absl::StatusOr<InferenceResponse> out) {
    if (out.ok()) {
      // Counted before the answer is sent (a pass over its texts' labels and a few sums): a scrape after the
      // caller's answer sees its texts.
      try {
        drift_->Observe(out->model, out->version, out->manifest, DriftMonitor::Read(*out, raw_scores));
      } catch (...) {  // (std::bad_alloc) the gauges miss this answer; the caller does not
      }
    }
    done(std::move(out));
  };
}

bool InferenceService::WaitHere(const absl::Status& prepared, bool resolves, bool waited) {
  return !prepared.ok() && resolves && !waited && WaitsForLoad(prepared);
}

void InferenceService::DispatchWhenLoaded(Method method, InferenceRequest r, Done done) {
  // Once the model is loaded (or not), back to a request thread: the load's own thread calls this.
  auto work = std::make_shared<std::pair<InferenceRequest, Done>>(std::move(r), std::move(done));
  const std::string model = work->first.model;
  const absl::Time deadline = work->first.deadline;
  repository_->WhenLoaded(model, deadline, [this, method, work](absl::StatusOr<ServableHandle> loaded) {
    if (!loaded.ok()) return work->second(loaded.status());
    // Served by the version loaded for it, which it holds from here: no other load can unload it first.
    ServableHandle held = Serving(loaded, work->first.model, work->first.version);
    // Another version than the one asked for (still loading): the request resolves and may wait again.
    const bool waited = held != nullptr;
    const bool queued = executor_->TrySubmit([this, method, work, held, waited]() mutable {
      Dispatch(method, std::move(work->first), std::move(work->second), std::move(held), waited, /*cached=*/false);
    });
    if (!queued) work->second(absl::ResourceExhaustedError("the server's request queue is full; retry with backoff"));
  });
}

namespace {

// What a dispatched request's callbacks share.
struct DispatchState {
  InferenceResponse response;
  InferenceService::Done done;
  std::weak_ptr<RunnableRequest> request;      // alive whenever it calls on_done
  std::unique_ptr<OcclusionRecord> occlusion;  // options.occlusion's rows' leavings
  // The request holds its version until it is answered: a version being replaced or removed is
  // unloaded only after its last request (ModelRepository). Not a moment longer: the batch that ran
  // it may live on after its answer, and a version held is busy to the memory budget.
  ServableHandle servable;
};

// options.occlusion: the variants of each text, as more rows of the same request after its texts
// (OcclusionRecord's order), and the record they leave their values in. A sub-word model's variants
// delete words (each whole).
std::unique_ptr<OcclusionRecord> AddOcclusionRows(const Model& model, const std::vector<TextResult>& results,
                                                  std::vector<std::vector<int64_t>>& ids, double temperature) {
  const bool subwords = model.manifest().subwords();
  std::vector<int64_t> counts;
  std::vector<std::vector<WordPieces>> words;
  for (size_t i = 0; i < results.size(); ++i) {
    counts.push_back(static_cast<int64_t>(subwords ? results[i].words.size() : ids[i].size()));
    if (subwords) words.push_back(results[i].words);
  }
  auto record = std::make_unique<OcclusionRecord>(model.manifest(), model.crf(), counts, words, temperature);
  for (size_t i = 0; i < results.size(); ++i) {
    for (std::vector<int64_t>& variant :
         subwords ? WordOcclusionVariantIds(ids[i], words[i]) : OcclusionVariantIds(ids[i])) {
      ids.push_back(std::move(variant));
    }
  }
  return record;
}

}  // namespace

void InferenceService::Dispatch(Method method, InferenceRequest r, Done done, ServableHandle resolved, bool waited,
                                bool cached) {
  if (!cached && AnswerWithCache(method, r, done, resolved, waited)) return;
  const bool resolves = resolved == nullptr;
  absl::StatusOr<Prepared> prepared;
  try {
    prepared = Prepare(method, r, std::move(resolved));
  } catch (...) {  // std::bad_alloc tokenizing, say: this request fails, nothing else
    prepared = absl::InternalError(absl::StrCat("preparing the request failed: ", CurrentExceptionText()));
  }
  if (WaitHere(prepared.status(), resolves, waited)) return DispatchWhenLoaded(method, std::move(r), std::move(done));
  if (prepared.ok()) {
    absl::Status live = CheckLive(r, env());  // the scheduler checks again when it forms a batch
    if (!live.ok()) prepared = live;
  }
  if (!prepared.ok()) {
    done(prepared.status());
    return;
  }
  using State = DispatchState;
  auto state =
      std::make_shared<State>(State{std::move(prepared->response), std::move(done), {}, nullptr, prepared->handle});
  const ServableHandle servable = std::move(prepared->handle);  // through Enqueue: it may be answered at once
  std::shared_ptr<const Model> model = servable->model;
  const int texts = static_cast<int>(prepared->ids.size());
  if (r.options.Asks(OutputSwitch::kOcclusion)) {
    state->occlusion = AddOcclusionRows(*model, state->response.results, prepared->ids,
                                        model->manifest().ScoreTemperature(r.options.raw_scores));
  }
  for (const std::vector<int64_t>& text : prepared->ids) state->response.tokens += static_cast<int64_t>(text.size());
  auto request = std::make_shared<RunnableRequest>(
      std::move(prepared->ids), WantedOutputs(model->manifest(), r.options), r.deadline, r.is_cancelled,
      [state, model, method, texts, options = r.options, text = std::move(r.texts)](int i, const ModelOutputs& out,
                                                                                    int64_t row) {
        if (i < texts) PostProcessRow(method, *model, options, text[i], out, row, state->response.results[i]);
        if (state->occlusion) state->occlusion->Record(i, out, row);
        return absl::OkStatus();
      },
      [state, texts, subwords = r.options.subwords](absl::Status status) {
        if (status.ok() && state->occlusion) {
          status = FillOcclusion(*state->occlusion, texts, subwords, state->response);
        }
        if (std::shared_ptr<RunnableRequest> self = state->request.lock()) {
          const RunnableRequest::Timing timing = self->timing();
          state->response.queued_at = timing.queued;
          state->response.queue_time = timing.queue;
          state->response.compute_time = timing.compute;
          state->response.forward_time = timing.forward;
          state->response.postprocess_time = timing.postprocess;
        }
        state->servable.reset();  // idle to the budget once this answer is handed over (the model stays)
        if (status.ok()) {
          state->done(std::move(state->response));
        } else {
          state->done(status);
        }
      },
      OutputSelection{std::vector<int64_t>(r.options.layers.layers.begin(), r.options.layers.layers.end()),
                      std::vector<int64_t>(r.options.layers.heads.begin(), r.options.layers.heads.end()),
                      r.options.layers.reduction != LayerSelection::Reduction::kNone});
  request->set_faithfulness_top_k(r.options.faithfulness_top_k);
  request->set_texts(texts);
  request->set_priority(r.priority);
  request->set_span(r.span);
  state->request = request;
  if (absl::Status s = servable->runner->Enqueue(std::move(request)); !s.ok()) {
    state->servable.reset();
    state->done(s);
  }
}

}  // namespace qvi
