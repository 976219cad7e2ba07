#include "server/http/kserve/repository_routes.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/request/request_checks.h"
#include "spdlog/spdlog.h"

namespace qvi {
namespace {

using Parameters = google::protobuf::Map<std::string, inference::ModelRepositoryParameter>;

// The body: empty, or a JSON object whose fields are among `fields`.
absl::StatusOr<nlohmann::json> Body(const HttpRequest& request, std::initializer_list<const char*> fields) {
  if (request.body.empty()) return nlohmann::json::object();
  nlohmann::json body = nlohmann::json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) return absl::InvalidArgumentError("the body is not a JSON object");
  for (const auto& item : body.items()) {
    const std::string& name = item.key();  // not a structured binding: C++17 lambdas cannot capture one (clang)
    if (std::find_if(fields.begin(), fields.end(), [&](const char* f) { return name == f; }) == fields.end()) {
      return absl::InvalidArgumentError(absl::StrCat(Capped(name, 64), ": not a field of this request"));
    }
  }
  return body;
}

absl::Status ReadParameters(const nlohmann::json& body, Parameters* out) {
  auto it = body.find("parameters");
  if (it == body.end()) return absl::OkStatus();
  if (!it->is_object()) return absl::InvalidArgumentError("parameters: must be an object");
  for (const auto& [name, value] : it->items()) {
    inference::ModelRepositoryParameter& p = (*out)[name];
    if (value.is_boolean()) {
      p.set_bool_param(value.get<bool>());
    } else if (value.is_number_integer()) {
      p.set_int64_param(value.get<int64_t>());
    } else if (value.is_string()) {
      p.set_string_param(value.get<std::string>());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters.", Capped(name, 64), ": must be a bool, an integer or a string"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadRepositoryName(const nlohmann::json& body, std::string* out) {
  auto it = body.find("repository_name");
  if (it == body.end()) return absl::OkStatus();
  if (!it->is_string()) return absl::InvalidArgumentError("repository_name: must be a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

HttpResponse IndexResponse(const inference::RepositoryIndexResponse& index) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : index.models()) {
    nlohmann::json entry = {{"name", m.name()}, {"state", m.state()}};
    if (!m.version().empty()) entry["version"] = m.version();
    if (!m.reason().empty()) entry["reason"] = m.reason();
    out.push_back(std::move(entry));
  }
  return HttpResponse{200, "application/json", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), {}};
}

void Index(const OipRepository* repository, const nlohmann::json& body, HttpServer::Reply& reply) {
  inference::RepositoryIndexRequest request;
  absl::Status s = ReadRepositoryName(body, request.mutable_repository_name());
  auto ready = body.find("ready");
  if (s.ok() && ready != body.end()) {
    if (!ready->is_boolean()) s = absl::InvalidArgumentError("ready: must be true or false");
    if (s.ok()) request.set_ready(ready->get<bool>());
  }
  inference::RepositoryIndexResponse response;
  if (s.ok()) s = repository->Index(request, &response);
  reply(s.ok() ? IndexResponse(response) : ErrorResponse(s));
}

}  // namespace

void ServeRepository(const OipRepository* repository, const Calls* calls, const HttpRoute& route,
                     const HttpRequest& request, HttpServer::Reply reply) {
  using Kind = HttpRoute::Kind;
  std::shared_ptr<const ApiKey> key;
  if (absl::Status s = calls->Authorize(request.Header("Authorization"), Scope::kAdmin, &key); !s.ok()) {
    return reply(ErrorResponse(s));
  }
  absl::StatusOr<nlohmann::json> body = route.kind == Kind::kRepositoryIndex
                                            ? Body(request, {"ready", "repository_name"})
                                            : Body(request, {"parameters", "repository_name"});
  if (!body.ok()) return reply(ErrorResponse(body.status()));
  if (route.kind == Kind::kRepositoryIndex) return Index(repository, *body, reply);

  const bool load = route.kind == Kind::kRepositoryLoad;
  const char* method = load ? "RepositoryModelLoad" : "RepositoryModelUnload";
  auto done = [method, model = route.model, who = key ? "key " + key->name : std::string("no API keys"),
               reply = std::move(reply)](const absl::Status& s) {
    spdlog::info("{} '{}' ({}, HTTP): {}", method, Capped(model), who, s.ok() ? "OK" : s.ToString());
    reply(s.ok() ? HttpResponse{200, "application/json", "{}", {}} : ErrorResponse(s));
  };
  absl::Status s;
  if (load) {
    inference::RepositoryModelLoadRequest r;
    r.set_model_name(route.model);
    s = ReadRepositoryName(*body, r.mutable_repository_name());
    if (s.ok()) s = ReadParameters(*body, r.mutable_parameters());
    if (s.ok()) return repository->Load(r, std::move(done));
  } else {
    inference::RepositoryModelUnloadRequest r;
    r.set_model_name(route.model);
    s = ReadRepositoryName(*body, r.mutable_repository_name());
    if (s.ok()) s = ReadParameters(*body, r.mutable_parameters());
    if (s.ok()) return repository->Unload(r, std::move(done));
  }
  done(s);
}

}  // namespace qvi
