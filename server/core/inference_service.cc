#include "server/core/inference_service.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/sync.h"
#include "server/core/postprocess.h"

namespace qvi {
namespace {

const char* MethodName(Method m) { return m == Method::kClassify ? "Classify" : "Tag"; }

absl::Status CheckRequest(const InferenceRequest& r, const RequestLimits& limits) {
  if (r.model.empty()) return absl::InvalidArgumentError("model.name: empty; name the model to use (see ListModels)");
  if (static_cast<int64_t>(r.model.size()) > limits.max_model_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("model.name: ", r.model.size(), " bytes exceed the limit of ",
                                                   limits.max_model_name_bytes, " bytes"));
  }
  if (static_cast<int64_t>(r.request_id.size()) > limits.max_request_id_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: ", r.request_id.size(), " bytes exceed the limit of ",
                                                   limits.max_request_id_bytes, " bytes"));
  }
  if (r.version < 0) return absl::InvalidArgumentError(absl::StrCat("model.version: ", r.version, " is negative; use 0 for the newest"));
  if (r.texts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("texts: empty; send between 1 and ", limits.max_texts, " texts"));
  }
  if (static_cast<int>(r.texts.size()) > limits.max_texts) {
    return absl::InvalidArgumentError(absl::StrCat("texts: ", r.texts.size(), " texts exceed the limit of ",
                                                   limits.max_texts, " per request"));
  }
  for (size_t i = 0; i < r.texts.size(); ++i) {
    if (static_cast<int>(r.texts[i].size()) > limits.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", r.texts[i].size(),
                                                     " bytes exceed the limit of ", limits.max_text_bytes, " bytes"));
    }
    absl::Status utf8 = ValidateUtf8(r.texts[i]);
    if (!utf8.ok()) return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", utf8.message()));
  }
  if (r.options.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("options.top_k: ", r.options.top_k, " is negative; 0 returns the best label"));
  }
  return absl::OkStatus();
}

// Layer or head indices: at most `count` of them (the model has no more), each in range, none
// repeated. Checked in that order, so that a long list is refused before it is walked.
absl::Status CheckIndices(const char* field, const std::vector<int>& indices, int count, const char* what) {
  if (static_cast<int64_t>(indices.size()) > count) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", indices.size(), " indices exceed the model's ", count, " ",
                                                   what, "; name each at most once"));
  }
  std::vector<int> first(count, -1);  // where each index was first named
  for (size_t i = 0; i < indices.size(); ++i) {
    const int v = indices[i];
    if (v < 0 || v >= count) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", v, " is out of range [0, ", count, ")"));
    }
    if (first[v] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", v, " repeats ", field, "[", first[v],
                                                     "]; name each at most once"));
    }
    first[v] = static_cast<int>(i);
  }
  return absl::OkStatus();
}

absl::Status CheckAgainstModel(Method method, const InferenceRequest& r, const Model& model) {
  const Manifest& m = model.manifest();
  const bool tagging = m.task == Task::kTagging;
  if ((method == Method::kTag) != tagging) {
    return absl::InvalidArgumentError(absl::StrCat("model '", m.name, "' is a ", tagging ? "tagging" : "classification",
                                                   " model; call ", tagging ? "Tag" : "Classify", ", not ", MethodName(method)));
  }
  if (r.options.gates && !m.HasOutput("gates") && !m.HasOutput("lambda_q")) {
    return absl::InvalidArgumentError(absl::StrCat("options.gates: model '", m.name, "' (", m.display_name,
                                                   ") has no gates; it was trained without QVI"));
  }
  const LayerSelection& l = r.options.layers;
  if (l.any() || !l.layers.empty() || !l.heads.empty()) {
    if (!m.HasOutput("layer_attention")) {
      return absl::InvalidArgumentError(absl::StrCat("options.layers: model '", m.name, "' (", m.display_name,
                                                     ") has no per-layer outputs"));
    }
    if (l.gates && !m.HasOutput("layer_gates") && !m.HasOutput("layer_lambda_q")) {
      return absl::InvalidArgumentError(absl::StrCat("options.layers.gates: model '", m.name, "' has no per-layer gates"));
    }
    if (absl::Status s = CheckIndices("options.layers.layers", l.layers, m.layers, "layers"); !s.ok()) return s;
    if (absl::Status s = CheckIndices("options.layers.heads", l.heads, m.heads, "heads"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<std::string> WantedOutputs(const Manifest& m, const OutputOptions& o) {
  std::vector<std::string> wanted;
  if (m.task == Task::kClassification) {
    wanted = {"logits"};
  } else {
    wanted = {"tags", "emissions"};
  }
  if (o.attention) wanted.insert(wanted.end(), {"attention", "sentence_attention"});
  if (o.gates) wanted.insert(wanted.end(), {"gates", "sentence_gates", "lambda_q", "lambda_k"});
  if (o.layers.gates) wanted.insert(wanted.end(), {"layer_gates", "layer_lambda_q", "layer_lambda_k"});
  if (o.layers.attention_maps) wanted.push_back("layer_attention");
  return wanted;
}

absl::Status CheckLive(const InferenceRequest& r) {
  if (r.is_cancelled && r.is_cancelled()) return absl::CancelledError("the client cancelled the request");
  if (absl::Now() > r.deadline) return absl::DeadlineExceededError("the deadline passed before the model ran");
  return absl::OkStatus();
}

}  // namespace

std::string Capped(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return absl::StrCat(s.substr(0, cut), "...(", s.size(), " bytes)");
}

int64_t EstimateResponseBytes(Method method, const Manifest& m, const InferenceRequest& r,
                              const InferenceResponse& response) {
  const OutputOptions& o = r.options;
  const LayerSelection& l = o.layers;
  size_t longest_label = 0;
  for (const std::string& label : method == Method::kClassify ? m.labels : m.tags) {
    longest_label = std::max(longest_label, label.size());
  }
  const bool keep_tokens = method == Method::kTag || o.attention || o.gates || o.tokens || l.any();
  // Per-layer maps per text: one per selected layer and head (one per layer when the heads are
  // averaged, one in all when everything is), each T gates per gate output and T x T attention.
  int64_t maps = 0, gate_outputs = 0;
  if (l.any()) {
    const int64_t layers = l.layers.empty() ? m.layers : static_cast<int64_t>(l.layers.size());
    const int64_t heads = l.heads.empty() ? m.heads : static_cast<int64_t>(l.heads.size());
    maps = l.reduction == LayerSelection::Reduction::kMeanAll    ? 1
           : l.reduction == LayerSelection::Reduction::kMeanHeads ? layers
                                                                   : layers * heads;
    if (l.gates) {
      for (const char* name : {"layer_gates", "layer_lambda_q", "layer_lambda_k"}) gate_outputs += m.HasOutput(name);
    }
  }
  int64_t bytes = 64 + static_cast<int64_t>(r.model.size() + r.request_id.size());
  for (size_t i = 0; i < response.results.size(); ++i) {
    const TextResult& t = response.results[i];
    const int64_t n = static_cast<int64_t>(t.tokens.size());
    bytes += 16;
    if (method == Method::kClassify) {
      const int64_t labels = std::min<int64_t>(std::max(o.top_k, 1), static_cast<int64_t>(m.labels.size()));
      bytes += labels * static_cast<int64_t>(longest_label + 8);
    } else {
      // Spans: at most one per token, each with its label, offsets, score and text.
      bytes += n * static_cast<int64_t>(longest_label + 32) + static_cast<int64_t>(r.texts[i].size());
    }
    if (keep_tokens) {
      for (const TokenOutput& token : t.tokens) {
        bytes += 32 + static_cast<int64_t>(token.token.text.size() + token.token.normalized.size() + longest_label);
        bytes += 5 * ((o.attention ? 2 : 0) + (o.gates ? 4 : 0));
      }
    }
    bytes += maps * (8 + gate_outputs * (4 * n + 4) + (l.attention_maps ? 4 * n * n + 4 : 0));
  }
  return bytes;
}

absl::StatusOr<InferenceService::Prepared> InferenceService::Prepare(Method method, const InferenceRequest& r) const {
  if (absl::Status s = CheckRequest(r, limits_); !s.ok()) return s;
  absl::StatusOr<ServableHandle> handle = repository_->Resolve(r.model, r.version);
  if (!handle.ok()) return handle.status();
  const Model& model = *(*handle)->model;
  const Manifest& m = model.manifest();
  if (absl::Status s = CheckAgainstModel(method, r, model); !s.ok()) return s;

  const ServingConfig& serving = (*handle)->serving;
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
  response.request_id = r.request_id;
  response.results.resize(r.texts.size());
  const int max_tokens = m.tokenizer.max_tokens;
  p.ids.resize(r.texts.size());
  for (size_t i = 0; i < r.texts.size(); ++i) {
    absl::StatusOr<std::vector<TextToken>> tokens = model.tokenizer().Tokenize(r.texts[i]);
    if (!tokens.ok()) return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", tokens.status().message()));
    TextResult& result = response.results[i];
    result.num_tokens = static_cast<uint32_t>(tokens->size());
    if (static_cast<int>(tokens->size()) > max_tokens) {
      if (r.options.error_on_truncation) {
        return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: ", tokens->size(), " tokens exceed model '", m.name,
                                                       "' max_tokens of ", max_tokens, " (options.truncation = ERROR)"));
      }
      tokens->resize(max_tokens);
      result.truncated = true;
    }
    if (tokens->empty() && method == Method::kClassify) {
      return absl::InvalidArgumentError(absl::StrCat("texts[", i, "]: has no tokens; Classify needs at least one word"));
    }
    result.tokens.reserve(tokens->size());
    for (TextToken& t : *tokens) {
      TokenOutput out;
      out.id = model.vocabulary().Id(t.normalized);
      out.token = std::move(t);
      p.ids[i].push_back(out.id);
      result.tokens.push_back(std::move(out));
    }
  }
  int64_t tokens = 0;
  for (const std::vector<int64_t>& ids : p.ids) tokens += static_cast<int64_t>(ids.size());
  if (tokens > serving.max_queued_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("texts: ", tokens, " tokens in all can never fit model '", r.model,
                                                   "''s queue of ", serving.max_queued_tokens,
                                                   " tokens (max_queued_tokens); send fewer per request"));
  }
  if (limits_.max_response_bytes > 0) {
    const int64_t estimate = EstimateResponseBytes(method, m, r, response);
    if (estimate > limits_.max_response_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options: the answer would be about ", estimate, " bytes, over the limit of ", limits_.max_response_bytes,
          " bytes (--max-message-bytes); ask for fewer texts, layers, heads or attention maps, or average the heads"));
    }
  }
  return p;
}


void InferenceService::Submit(Method method, InferenceRequest request, Done done) {
  if (limits_.inline_prepare_bytes > 0) {
    int64_t bytes = 0;
    for (const std::string& t : request.texts) bytes += static_cast<int64_t>(t.size());
    if (bytes < limits_.inline_prepare_bytes) {
      Dispatch(method, request, std::move(done));
      return;
    }
  }
  auto shared = std::make_shared<std::pair<InferenceRequest, Done>>(std::move(request), std::move(done));
  const bool queued = executor_->TrySubmit([this, method, shared] { Dispatch(method, shared->first, std::move(shared->second)); });
  if (!queued) {
    shared->second(absl::ResourceExhaustedError("the server's request queue is full; retry with backoff"));
  }
}

void InferenceService::Dispatch(Method method, const InferenceRequest& r, Done done) {
  absl::StatusOr<Prepared> prepared = Prepare(method, r);
  if (prepared.ok()) {
    absl::Status live = CheckLive(r);  // the scheduler checks again when it forms a batch
    if (!live.ok()) prepared = live;
  }
  if (!prepared.ok()) {
    done(prepared.status());
    return;
  }
  struct State {
    InferenceResponse response;
    Done done;
    std::weak_ptr<RunnableRequest> request;  // alive whenever it calls on_done
  };
  auto state = std::make_shared<State>(State{std::move(prepared->response), std::move(done), {}});
  for (const std::vector<int64_t>& text : prepared->ids) state->response.tokens += static_cast<int64_t>(text.size());
  // The request holds its version until it is answered: a version being replaced or removed is
  // unloaded only after its last request (ModelRepository).
  ServableHandle servable = std::move(prepared->handle);
  std::shared_ptr<const Model> model = servable->model;
  auto request = std::make_shared<RunnableRequest>(
      std::move(prepared->ids), WantedOutputs(model->manifest(), r.options), r.deadline, r.is_cancelled,
      [state, model, method, options = r.options, texts = r.texts](int i, const ModelOutputs& out, int64_t row) {
        PostProcessRow(method, model->manifest(), options, texts[i], out, row, state->response.results[i]);
        return absl::OkStatus();
      },
      [state, servable](absl::Status status) {
        if (std::shared_ptr<RunnableRequest> self = state->request.lock()) {
          const RunnableRequest::Timing timing = self->timing();
          state->response.queue_time = timing.queue;
          state->response.compute_time = timing.compute;
        }
        if (status.ok()) {
          state->done(std::move(state->response));
        } else {
          state->done(status);
        }
      },
      OutputSelection{std::vector<int64_t>(r.options.layers.layers.begin(), r.options.layers.layers.end()),
                      std::vector<int64_t>(r.options.layers.heads.begin(), r.options.layers.heads.end()),
                      r.options.layers.reduction != LayerSelection::Reduction::kNone});
  state->request = request;
  if (absl::Status s = servable->runner->Enqueue(std::move(request)); !s.ok()) state->done(s);
}

absl::StatusOr<InferenceResponse> InferenceService::Run(Method method, const InferenceRequest& r) {
  Notification finished;
  absl::StatusOr<InferenceResponse> result;
  Dispatch(method, r, [&](absl::StatusOr<InferenceResponse> out) {
    result = std::move(out);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

void InferenceService::PostProcessRow(Method method, const Manifest& m, const OutputOptions& o, const std::string& text,
                                      const ModelOutputs& outputs, int64_t row, TextResult& result) {
  if (method == Method::kClassify) {
    result.labels = TopK(outputs.at("logits")[row], m.labels, o.top_k);
  } else {
    DecodeTagging(m, outputs.at("tags"), outputs.at("emissions"), row, text, result);
  }
  FillTokenExplanations(outputs, o, row, result);
  if (o.layers.any()) result.layers = LayerMaps(outputs, o.layers, row, static_cast<int64_t>(result.tokens.size()));
  const bool keep_tokens = method == Method::kTag || o.attention || o.gates || o.tokens || o.layers.any();
  if (!keep_tokens) result.tokens.clear();
}

}  // namespace qvi
