// qvi-client: call a qvi-server from the command line.
//   qvi-client classify --model sentiment "A moving film." --attention --gates
//   qvi-client tag --model ner "Barack Obama visited Paris."
//   qvi-client classify --model sentiment "A moving film." --html why.html
//   qvi-client models            qvi-client health [--model NAME]
//   qvi-client batch --model sentiment texts.jsonl answers.jsonl --explain gates   (client/batch.h)
// Human output by default (heat-maps of α and β over the tokens when the terminal allows colour, and
// of each token's signed contribution with --contributions: green for, magenta against);
// --json prints the response message as JSON for scripts; --html FILE writes a report to open in
// a browser (client/html_report.h).
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <fstream>

#include "client/batch.h"
#include "client/channel.h"
#include "client/errors.h"
#include "client/faithfulness.h"
#include "client/html_report.h"
#include "client/input.h"
#include "client/output_names.h"
#include "client/shadow.h"
#include "client/terminal.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "qvi/serving/v1/inference.grpc.pb.h"

namespace v1 = qvi::serving::v1;
using qvi::client::PrintClassification;
using qvi::client::PrintEntityOcclusion;
using qvi::client::PrintLayers;
using qvi::client::PrintTokens;

namespace {

struct Common {
  std::string server = "localhost:8500";
  std::string model;
  int64_t version = 0;
  bool json = false;
  double timeout = 30;
  std::string color = "auto";
  int chunk = 256;       // texts per request (the server's default --max-texts-per-request)
  std::string api_key;   // sent as `authorization: Bearer KEY` when set (--api-key, QVI_API_KEY)
  std::string priority;  // classify/tag: "high", "normal", "low"; "" = the key's default
};

struct Explain {
  int top_k = 0;
  bool attention = false;
  bool gates = false;
  bool tokens = false;
  bool error_on_truncation = false;
  bool layer_gates = false;
  bool attention_maps = false;
  std::vector<int> layers, heads;
  std::string reduce = "none";
  std::string html;            // write an HTML report here
  int faithfulness_top_k = 0;  // Classify: options.faithfulness.top_k
  bool contributions = false;  // Classify: options.contributions
  bool occlusion = false;      // options.occlusion
  bool subwords = false;       // options.subwords: a sub-word model's answer per sub-word
  bool raw_scores = false;     // options.raw_scores: the uncalibrated softmax (CRF marginals)
  // Classify: options.coverage; options.abstain_below. NaN: not given (any value given is sent, for the
  // server to check).
  double coverage = std::nan("");
  double abstain_below = std::nan("");
};

bool UseColor(const Common& c) {
  if (c.color == "always") return true;
  if (c.color == "never" || c.json) return false;
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) && term != nullptr && std::string(term) != "dumb" && std::getenv("NO_COLOR") == nullptr;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

int Fail(const grpc::Status& s, const Common& c) {
  std::cerr << qvi::client::ErrorLines(s, c.server);
  return 1;
}

// What every call carries: the deadline (--timeout) and the API key, when one is given.
void SetUp(grpc::ClientContext& ctx, const Common& c) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(c.timeout * 1000)));
  if (!c.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + c.api_key);
}

void Fill(v1::OutputOptions* o, const Explain& e) {
  o->set_top_k(e.top_k);
  o->set_attention(e.attention);
  o->set_gates(e.gates);
  o->set_contributions(e.contributions);
  o->set_occlusion(e.occlusion);
  o->set_subwords(e.subwords);
  o->set_raw_scores(e.raw_scores);
  if (!std::isnan(e.coverage)) o->set_coverage(e.coverage);
  if (!std::isnan(e.abstain_below)) o->set_abstain_below(e.abstain_below);
  o->set_tokens(e.tokens || e.faithfulness_top_k > 0);  // the check names the tokens it deleted
  if (e.error_on_truncation) o->set_truncation(v1::TRUNCATION_POLICY_ERROR);
  if (e.faithfulness_top_k > 0) o->mutable_faithfulness()->set_top_k(e.faithfulness_top_k);
  if (e.layer_gates || e.attention_maps) {
    v1::LayerOptions* l = o->mutable_layers();
    l->set_gates(e.layer_gates);
    l->set_attention_maps(e.attention_maps);
    for (int x : e.layers) l->add_layers(x);
    for (int x : e.heads) l->add_heads(x);
    l->set_reduction(e.reduce == "mean-heads" ? v1::LAYER_REDUCTION_MEAN_HEADS
                     : e.reduce == "mean-all" ? v1::LAYER_REDUCTION_MEAN_ALL
                                              : v1::LAYER_REDUCTION_NONE);
  }
}

// GetModel of --model (and --version, 0 = every version).
grpc::Status GetModel(v1::Inference::Stub& stub, const Common& c, v1::GetModelResponse& resp) {
  v1::GetModelRequest req;
  req.mutable_model()->set_name(c.model);
  req.mutable_model()->set_version(c.version);
  grpc::ClientContext ctx;
  SetUp(ctx, c);
  return stub.GetModel(&ctx, req, &resp);
}

// For --html: the model's version as GetModel describes it, and every explanation it can give.
// Transformers' maps come one per layer (mean of heads) unless the user chose layer options.
bool PrepareReport(v1::Inference::Stub& stub, const Common& c, Explain& e, v1::ModelVersion& model) {
  v1::GetModelResponse resp;
  grpc::Status s = GetModel(stub, c, resp);
  if (!s.ok()) {
    Fail(s, c);
    return false;
  }
  for (const auto& v : resp.model().versions()) {
    if (v.state() == v1::MODEL_STATE_READY && (c.version == 0 || v.version() == c.version)) {
      model = v;
      break;
    }
  }
  if (model.version() == 0) {
    std::cerr << "error: model '" << c.model << "' has no ready version to explain\n";
    return false;
  }
  // Whether the model has any output of `names` (an option's outputs, output_names.h).
  auto has_any = [&model](const std::vector<std::string_view>& names) {
    for (const auto& o : model.metadata().outputs())
      for (std::string_view name : names)
        if (o.name() == name) return true;
    return false;
  };
  e.tokens = true;
  e.attention = e.attention || has_any(qvi::client::kAttentionOutputs);
  e.gates = e.gates || has_any(qvi::client::kGateOutputs);
  e.contributions = e.contributions || has_any(qvi::client::kContributionOutputs);
  e.occlusion = true;  // every model: n + 1 forwards per text, worth it for a report a person reads
  if (model.metadata().layers() > 0 && !e.layer_gates && !e.attention_maps) {
    e.attention_maps = has_any(qvi::client::kLayerAttentionOutputs);
    e.layer_gates = has_any(qvi::client::kLayerGateOutputs);
    e.reduce = "mean-heads";
  }
  return true;
}

bool WriteReport(const std::string& path, const std::string& html) {
  std::ofstream out(path, std::ios::binary);
  out << html;
  if (!out) {
    std::cerr << "error: cannot write " << path << "\n";
    return false;
  }
  std::cerr << "wrote " << path << "\n";
  return true;
}

// Builds Classify or Tag requests of at most --chunk texts each, calls `rpc` for each in turn, gathers
// their results into `resp` in the texts' order, and prints JSON when asked. Returns the exit code when
// the caller has nothing more to print, or -1 when `resp` is to be printed for humans.
template <typename Request, typename Response, typename Rpc>
int Call(Rpc rpc, const Common& c, const Explain& e, const std::vector<std::string>& texts, Response& resp) {
  const size_t chunk = static_cast<size_t>(c.chunk);
  for (size_t start = 0; start < texts.size(); start += chunk) {
    const size_t end = std::min(texts.size(), start + chunk);
    Request req;
    req.mutable_model()->set_name(c.model);
    req.mutable_model()->set_version(c.version);
    for (size_t i = start; i < end; ++i) req.add_texts(texts[i]);
    Fill(req.mutable_options(), e);
    if (!c.priority.empty()) {
      req.set_priority(c.priority == "high"  ? v1::PRIORITY_HIGH
                       : c.priority == "low" ? v1::PRIORITY_LOW
                                             : v1::PRIORITY_NORMAL);
    }
    grpc::ClientContext ctx;
    SetUp(ctx, c);
    Response part;
    grpc::Status s = rpc(&ctx, req, &part);
    if (!s.ok()) {
      if (texts.size() > chunk) std::cerr << "texts " << start + 1 << "-" << end << " of " << texts.size() << ": ";
      return Fail(s, c);
    }
    if (start == 0) {
      resp = std::move(part);
    } else {
      resp.mutable_results()->MergeFrom(part.results());
    }
  }
  if (c.json) {
    std::cout << Json(resp);
    return 0;
  }
  return -1;
}

int Classify(v1::Inference::Stub& stub, const Common& c, Explain e, const std::vector<std::string>& texts) {
  v1::ModelVersion model;
  if (!e.html.empty() && !PrepareReport(stub, c, e, model)) return 1;
  v1::ClassifyResponse resp;
  auto rpc = [&stub](grpc::ClientContext* ctx, const v1::ClassifyRequest& req, v1::ClassifyResponse* out) {
    return stub.Classify(ctx, req, out);
  };
  const int rc = Call<v1::ClassifyRequest>(rpc, c, e, texts, resp);
  if (rc > 0) return rc;
  if (!e.html.empty() && !WriteReport(e.html, qvi::client::HtmlReport(model, c.model, texts, resp))) return 1;
  if (rc == 0) return 0;
  const bool color = UseColor(c);
  for (int i = 0; i < resp.results_size(); ++i) {
    std::cout << texts[i] << "\n";
    PrintClassification(resp.results(i), e.attention || e.gates || e.tokens, e.abstain_below, color);
  }
  std::cout << "(" << resp.model().name() << "@" << resp.model().version() << ")\n";
  return 0;
}

int Tag(v1::Inference::Stub& stub, const Common& c, Explain e, const std::vector<std::string>& texts) {
  v1::ModelVersion model;
  if (!e.html.empty() && !PrepareReport(stub, c, e, model)) return 1;
  v1::TagResponse resp;
  auto rpc = [&stub](grpc::ClientContext* ctx, const v1::TagRequest& req, v1::TagResponse* out) {
    return stub.Tag(ctx, req, out);
  };
  const int rc = Call<v1::TagRequest>(rpc, c, e, texts, resp);
  if (rc > 0) return rc;
  if (!e.html.empty() && !WriteReport(e.html, qvi::client::HtmlReport(model, c.model, texts, resp))) return 1;
  if (rc == 0) return 0;
  const bool color = UseColor(c);
  for (int i = 0; i < resp.results_size(); ++i) {
    const v1::Tagging& r = resp.results(i);
    std::cout << texts[i] << "\n";
    if (r.spans_size() == 0) std::cout << "  (no entities)\n";
    for (const auto& sp : r.spans()) {
      std::printf("  %-14s %-30s [%u,%u) score %.3f%s\n", sp.label().c_str(), sp.text().c_str(), sp.start(), sp.end(),
                  sp.score(), sp.abstained() ? " (abstained)" : "");
    }
    PrintEntityOcclusion(r, color);
    if (e.attention || e.gates || e.tokens) PrintTokens(r.tokens(), color);
    PrintLayers(r.layers(), r.tokens());
  }
  std::cout << "(" << resp.model().name() << "@" << resp.model().version() << ")\n";
  return 0;
}

// The proto's own name of the state without its prefix ("READY"); UNKNOWN for a value this build's
// proto does not know.
std::string StateName(v1::ModelState s) {
  const std::string& name = v1::ModelState_Name(s);
  constexpr std::string_view kPrefix = "MODEL_STATE_";
  if (name.empty() || s == v1::MODEL_STATE_UNSPECIFIED) return "UNKNOWN";
  return name.rfind(kPrefix, 0) == 0 ? name.substr(kPrefix.size()) : name;
}

// One line per version; with `details`, under each READY one its faithfulness heading and lines.
void PrintVersions(const v1::ModelInfo& m, bool details) {
  for (const auto& v : m.versions()) {
    const auto& md = v.metadata();
    std::printf("%-16s v%-4lld %-9s %s", m.name().c_str(), static_cast<long long>(v.version()),
                StateName(v.state()).c_str(), md.display_name().c_str());
    if (v.state() == v1::MODEL_STATE_READY) {
      std::printf(" (%s, %s, %d %s)", md.task().c_str(), md.device().c_str(),
                  md.task() == "classification" ? md.labels_size() : md.entity_types_size(),
                  md.task() == "classification" ? "labels" : "entity types");
    } else {
      std::printf(" %s", v.reason().c_str());
    }
    std::printf("\n");
    if (!details || v.state() != v1::MODEL_STATE_READY) continue;
    std::printf("  %s\n", qvi::client::FaithfulnessHeading(md.faithfulness()).c_str());
    for (const std::string& line : qvi::client::FaithfulnessLines(md.faithfulness())) {
      std::printf("    %s\n", line.c_str());
    }
  }
}

// With --model, GetModel of that model: its versions, each READY one with its faithfulness figures.
int Model(v1::Inference::Stub& stub, const Common& c) {
  v1::GetModelResponse resp;
  grpc::Status s = GetModel(stub, c, resp);
  if (!s.ok()) return Fail(s, c);
  if (c.json) {
    std::cout << Json(resp);
    return 0;
  }
  PrintVersions(resp.model(), /*details=*/true);
  return 0;
}

// `shadow`: the model's shadow comparisons (client/shadow.h).
int Shadow(v1::Inference::Stub& stub, const Common& c) {
  v1::GetModelResponse resp;
  if (grpc::Status s = GetModel(stub, c, resp); !s.ok()) return Fail(s, c);
  if (c.json) std::cout << Json(resp);
  return c.json ? 0 : qvi::client::PrintShadow(resp, std::cout);
}

int Models(v1::Inference::Stub& stub, const Common& c) {
  if (!c.model.empty()) return Model(stub, c);
  v1::ListModelsResponse resp;
  grpc::ClientContext ctx;
  SetUp(ctx, c);
  grpc::Status s = stub.ListModels(&ctx, v1::ListModelsRequest(), &resp);
  if (!s.ok()) return Fail(s, c);
  if (c.json) {
    std::cout << Json(resp);
    return 0;
  }
  for (const auto& m : resp.models()) PrintVersions(m, /*details=*/false);
  return 0;
}

int Health(const std::shared_ptr<grpc::Channel>& channel, const Common& c) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(c.model);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  SetUp(ctx, c);
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return Fail(s, c);
  const std::string status = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  if (c.json) {
    std::cout << Json(resp);
  } else {
    std::cout << (c.model.empty() ? "server" : c.model) << ": " << status << "\n";
  }
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 3;
}

// The options of classify and tag.
void AddInferOptions(CLI::App* sub, Common& common, Explain& explain, std::vector<std::string>& texts) {
  sub->add_option("--model", common.model, "model name")->required();
  sub->add_option("--version", common.version, "model version; 0 = newest ready");
  sub->add_option("--priority", common.priority,
                  "the requests' place in a busy model's queue: high, normal or low (default: the API key's, "
                  "else normal)")
      ->check(CLI::IsMember({"high", "normal", "low"}));
  sub->add_option("--top-k", explain.top_k, "labels to return (Classify)");
  sub->add_flag("--attention", explain.attention, "per-token attention weights α");
  sub->add_flag("--gates", explain.gates, "per-token QVI gates β");
  sub->add_flag("--contributions", explain.contributions,
                "Classify: each token's signed share of each returned label's margin (the most faithful "
                "explanation served)");
  sub->add_flag("--occlusion", explain.occlusion,
                "leave-one-out: how much the answer (each returned label; each entity) drops without each token "
                "(n more rows per text of n tokens)");
  sub->add_flag("--tokens", explain.tokens, "list the tokens");
  sub->add_flag("--subwords", explain.subwords, "a sub-word model (qvi import): each sub-word read, not each word");
  sub->add_flag("--raw-scores", explain.raw_scores,
                "the raw softmax (CRF marginals), not the probabilities calibrated by the model card");
  sub->add_option("--coverage", explain.coverage,
                  "Classify: the set of labels that holds the true one with this probability (a level the model "
                  "card was calibrated for, e.g. 0.9)");
  sub->add_option("--abstain-below", explain.abstain_below,
                  "mark answers (a text's top label; each entity) whose calibrated probability is below this");
  sub->add_flag("--error-on-truncation", explain.error_on_truncation, "fail instead of truncating long texts");
  sub->add_option("--faithfulness-top-k", explain.faithfulness_top_k,
                  "Classify: also check α by deleting its top K tokens and running the rest again");
  sub->add_flag("--layer-gates", explain.layer_gates, "Transformers: gates of each layer and head");
  sub->add_flag("--attention-maps", explain.attention_maps, "Transformers: T x T self-attention maps");
  sub->add_option("--layers", explain.layers, "layers to return (default all)")->delimiter(',');
  sub->add_option("--heads", explain.heads, "heads to return (default all)")->delimiter(',');
  sub->add_option("--reduce", explain.reduce, "none, mean-heads or mean-all")
      ->check(CLI::IsMember({"none", "mean-heads", "mean-all"}));
  sub->add_option(
      "--html", explain.html,
      "also write a self-contained HTML report of every explanation the model gives (open it in a browser)");
  sub->add_option("texts", texts,
                  "texts to send; '-' reads one text per line from standard input (blank lines skipped)")
      ->required();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qvi-client: call a qvi-server (Classify, Tag, ListModels, health)", "qvi-client"};
  app.require_subcommand(1);
  // Global options (--server, --json, --timeout, --color, TLS) are also taken after the subcommand,
  // as people type them: `qvi-client classify --server host:port ...`. Subcommands created after
  // this inherit it.
  app.fallthrough();
  Common common;
  Explain explain;
  std::vector<std::string> texts;
  app.add_option("--server", common.server, "host:port of the server")->capture_default_str();
  app.add_flag("--json", common.json, "print the response as JSON");
  app.add_option("--timeout", common.timeout, "seconds before giving up")->capture_default_str();
  app.add_option("--api-key", common.api_key,
                 "the API key of a server with --api-keys (sent as 'authorization: Bearer KEY'); better given in "
                 "the environment, where the shell's history does not keep it")
      ->envname("QVI_API_KEY");
  app.add_option("--color", common.color, "auto, always or never")->check(CLI::IsMember({"auto", "always", "never"}));
  app.add_option("--chunk", common.chunk,
                 "classify/tag: send at most this many texts per request (more go in further requests, answered "
                 "in order)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));

  CLI::App* classify = app.add_subcommand("classify", "labels for each text");
  AddInferOptions(classify, common, explain, texts);
  CLI::App* tag = app.add_subcommand("tag", "entity spans for each text");
  AddInferOptions(tag, common, explain, texts);
  CLI::App* models = app.add_subcommand(
      "models",
      "the models and the state of each version; with --model, one model's versions and how faithful its "
      "explanations were measured to be");
  models->add_option("--model", common.model, "model name: show its details");
  models->add_option("--version", common.version, "with --model: this version only (0 = all)");
  CLI::App* shadow = app.add_subcommand("shadow", "a model's shadow candidate against its serving version");
  shadow->add_option("--model", common.model, "model name")->required();
  CLI::App* health = app.add_subcommand("health", "grpc.health.v1 status, of the server or of one model");
  health->add_option("--model", common.model, "model name (empty: the whole server)");
  qvi::client::BatchOptions batch_options;
  std::vector<std::string> batch_explain;
  CLI::App* batch = qvi::client::AddBatchCommand(app, batch_options, batch_explain);
  qvi::TlsClientOptions tls;
  qvi::AddTlsOptions(app, tls);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const std::string unknown = qvi::client::UnknownSubcommand(
        {argv + 1, argv + argc}, {"classify", "tag", "models", "shadow", "health", "batch"});
    if (e.get_exit_code() != 0 && !unknown.empty()) {
      std::cerr << unknown << "\n";
      return e.get_exit_code();
    }
    return app.exit(e);
  }

  if (const int rc = qvi::client::TextsToSend(texts); rc >= 0) return rc;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 * 1024 * 1024);
  std::shared_ptr<grpc::Channel> channel;
  try {
    channel = qvi::MakeChannel(common.server, tls, args);
  } catch (const std::exception& e) {
    std::cerr << "qvi-client: " << e.what() << "\n";
    return 2;
  }
  auto stub = v1::Inference::NewStub(channel);
  if (*classify) return Classify(*stub, common, explain, texts);
  if (*tag) return Tag(*stub, common, explain, texts);
  if (*models) return Models(*stub, common);
  if (*shadow) return Shadow(*stub, common);
  if (*health) return Health(channel, common);
  if (*batch) {
    batch_options.api_key = common.api_key;
    return qvi::client::RunBatchCommand(*stub, batch_options, batch_explain, common.server);
  }
  return 2;
}
