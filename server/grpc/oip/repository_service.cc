#include "server/grpc/oip/repository_service.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/base/exception_text.h"
#include "server/core/request/request_checks.h"
#include "server/grpc/infer_call.h"
#include "server/grpc/status.h"
#include "spdlog/spdlog.h"

namespace qvi {
namespace {

constexpr char kService[] = "/inference.GRPCInferenceService/";
enum class RepoMethod { kIndex, kLoad, kUnload, kUnknown };

RepoMethod MethodOf(const std::string& path) {
  if (path == absl::StrCat(kService, "RepositoryIndex")) return RepoMethod::kIndex;
  if (path == absl::StrCat(kService, "RepositoryModelLoad")) return RepoMethod::kLoad;
  if (path == absl::StrCat(kService, "RepositoryModelUnload")) return RepoMethod::kUnload;
  return RepoMethod::kUnknown;
}

// One unary call: reads the request, hands it to the service, writes the one answer.
class UnaryReactor final : public grpc::ServerGenericBidiReactor {
 public:
  UnaryReactor(grpc::GenericCallbackServerContext* ctx, const RepositoryService* service)
      : ctx_(ctx), service_(service) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message"));
    service_->Handle(ctx_, request_, [this](const absl::Status& status, grpc::ByteBuffer response) {
      if (!status.ok()) {
        AddRetryPushback(ctx_, status);
        return Finish(ToGrpcStatus(status));
      }
      response_ = std::move(response);
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    });
  }
  void OnDone() override { delete this; }

 private:
  grpc::GenericCallbackServerContext* ctx_;
  const RepositoryService* service_;
  grpc::ByteBuffer request_, response_;
};

class UnimplementedReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit UnimplementedReactor(const std::string& method) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat("method ", Capped(method, 128), " is not served here")));
  }
  void OnDone() override { delete this; }
};

template <typename Response>
grpc::ByteBuffer Serialize(const Response& response, absl::Status* status) {
  grpc::ByteBuffer out;
  bool own = false;
  const grpc::Status s = grpc::SerializationTraits<Response>::Serialize(response, &out, &own);
  if (!s.ok()) *status = absl::InternalError(s.error_message());
  return out;
}

// KServe's fields of the answer (Triton's clients skip them).
void Fill(const std::string& model, inference::RepositoryModelLoadResponse& r) {
  r.set_model_name(model);
  r.set_loaded(true);
}
void Fill(const std::string& model, inference::RepositoryModelUnloadResponse& r) {
  r.set_model_name(model);
  r.set_unloaded(true);
}

// Loads and unloads are rare and change what every caller sees: each is logged with who asked.
void LogControl(const char* method, const std::string& model, const std::string& key, const absl::Status& s) {
  spdlog::info("{} '{}' ({}): {}", method, Capped(model), key.empty() ? "no API keys" : "key " + key,
               s.ok() ? "OK" : s.ToString());
}

template <typename Request, typename Control>
void RunControl(const char* method, const grpc::ByteBuffer& raw, const WireCaps& caps, const std::string& key,
                Control&& control, RepositoryService::Answer answer) {
  Request request;
  if (absl::Status s = DecodeRequest(raw, caps, &request); !s.ok()) return answer(s, {});
  const std::string model = ControlledModel(request.repository_name(), request.model_name());
  control(request, [method, model, key, answer = std::move(answer)](const absl::Status& s) {
    LogControl(method, model, key, s);
    absl::Status status = s;
    typename std::conditional<std::is_same_v<Request, inference::RepositoryModelLoadRequest>,
                              inference::RepositoryModelLoadResponse, inference::RepositoryModelUnloadResponse>::type
        response;
    Fill(model, response);
    grpc::ByteBuffer out = status.ok() ? Serialize(response, &status) : grpc::ByteBuffer();
    answer(status, std::move(out));
  });
}

}  // namespace

grpc::ServerGenericBidiReactor* RepositoryService::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  if (MethodOf(ctx->method()) == RepoMethod::kUnknown) return new UnimplementedReactor(ctx->method());
  return new UnaryReactor(ctx, this);
}

void RepositoryService::Handle(grpc::GenericCallbackServerContext* ctx, const grpc::ByteBuffer& raw,
                               Answer answer) const {
  try {
    std::shared_ptr<const ApiKey> key;
    if (absl::Status allowed = calls_->Authorize(Authorization(ctx, *calls_), Scope::kAdmin, &key); !allowed.ok()) {
      return answer(allowed, {});
    }
    const std::string who = key ? key->name : "";
    switch (MethodOf(ctx->method())) {
      case RepoMethod::kIndex: {
        inference::RepositoryIndexRequest request;
        inference::RepositoryIndexResponse response;
        absl::Status s = DecodeRequest(raw, caps_, &request);
        if (s.ok()) s = repository_->Index(request, &response);
        grpc::ByteBuffer out = s.ok() ? Serialize(response, &s) : grpc::ByteBuffer();
        return answer(s, std::move(out));
      }
      case RepoMethod::kLoad:
        return RunControl<inference::RepositoryModelLoadRequest>(
            "RepositoryModelLoad", raw, caps_, who,
            [this](const auto& r, OipRepository::Done done) { repository_->Load(r, std::move(done)); },
            std::move(answer));
      case RepoMethod::kUnload:
        return RunControl<inference::RepositoryModelUnloadRequest>(
            "RepositoryModelUnload", raw, caps_, who,
            [this](const auto& r, OipRepository::Done done) { repository_->Unload(r, std::move(done)); },
            std::move(answer));
      case RepoMethod::kUnknown:
        break;
    }
    answer(absl::UnimplementedError("not a repository method"), {});
  } catch (...) {
    answer(absl::InternalError(absl::StrCat("answering failed: ", CurrentExceptionText())), {});
  }
}

}  // namespace qvi
