// What the HTTP port answers (docs/serving.md, "HTTP/JSON"): the same core, limits, metrics and
// access log as gRPC, in JSON.
//   GET  /v2/health/live, /v2/health/ready         Kubernetes probes (KServe v2's health routes)
//   GET  /v1/models                                 ListModels, in protobuf's JSON mapping (native/)
//   GET  /v1/models/{m}[/versions/{v}]              GetModel
//   POST /v1/models/{m}[/versions/{v}]:classify     Classify: the body is a ClassifyRequest in
//   POST /v1/models/{m}[/versions/{v}]:tag          protobuf's JSON (what grpcurl -d takes), the model
//                                                   from the path; the answer a ClassifyResponse
//   GET  /v2                                        KServe v2 REST (kserve/): server metadata,
//   GET  /v2/models/{m}[/versions/{v}][/ready]      model metadata and readiness,
//   POST /v2/models/{m}[/versions/{v}]/infer        inference with JSON tensors, as OIP over gRPC
//   POST /predict, / , /models/{m}[/predict]        Text Embeddings Inference's routes (tei/): a classifier's
//   GET  /info, /models/{m}/info                    labels in TEI's shapes, for TEI's and InferenceClient's callers
//   POST /classify, /v1/classify                    OpenAI-style classification as vLLM serves it (openai/)
//   GET  /openapi.json                              this list as an OpenAPI 3.1 document
//   GET  /                                          the explanation page (explain_page.h), unless off
// Errors are {"error": "..."} with the HTTP status of the gRPC code (HttpStatus, routes.h). With TLS the
// port is HTTPS only (http_server.h). Each inference route is a thin adapter (http_call.h) around the
// protocol-neutral call of server/frontend/; nothing here knows of gRPC.
#ifndef QVI_SERVER_HTTP_HTTP_API_H_
#define QVI_SERVER_HTTP_HTTP_API_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/oip/api.h"
#include "server/frontend/oip/repository.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

class HttpApi {
 public:
  // `serving` is the server's readiness (false from the start of a drain); `oip` plans and answers
  // KServe v2's routes as it does OIP's gRPC calls; `calls` is shared with every other front end.
  struct Options {
    // The origins a browser may call from ("*": any); none: no CORS headers, and preflights from any
    // origin are refused.
    std::vector<std::string> cors_origins;
    // GET / answers the explanation page; off, it is 404 like any unknown path.
    bool explain_page = true;
    // OIP's repository extension (/v2/repository/...); null: those routes answer UNIMPLEMENTED.
    const OipRepository* repository_control = nullptr;
    // The model of the routes that name none (TEI's); "": the store's only model.
    std::string default_model;
    // The threads that tokenise (--inference-threads): TEI's /info tokenization_workers.
    int tokenization_workers = 0;
  };
  HttpApi(Core* core, const ModelRepository* repository, Calls* calls, const OipApi* oip,
          const std::atomic<bool>* serving, Options options)
      : core_(core),
        repository_(repository),
        calls_(calls),
        oip_(oip),
        serving_(serving),
        options_(std::move(options)) {}

  void Handle(HttpRequest request, HttpServer::Reply reply);

 private:
  bool CorsAllows(const std::string& origin) const;
  HttpResponse Preflight(const HttpRequest& request) const;
  // `reply`, adding the CORS headers when the request's origin is allowed.
  HttpServer::Reply WithCors(const HttpRequest& request, HttpServer::Reply reply) const;
  HttpResponse Describe(const HttpRoute& route) const;
  HttpResponse ChangeShadow(const HttpRoute& route, const HttpRequest& request) const;
  // TEI's routes, Hugging Face's shape on them and OpenAI-style /classify (docs/serving.md, "Drop-in routes").
  void ServeDropIn(const HttpRoute& route, HttpRequest request, HttpServer::Reply reply);

  Core* core_;
  const ModelRepository* repository_;
  Calls* calls_;
  const OipApi* oip_;
  const std::atomic<bool>* serving_;
  const Options options_;
};

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_HTTP_API_H_
