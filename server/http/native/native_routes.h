// The native API (qvi.serving.v1) over HTTP/JSON, in protobuf's JSON mapping (what grpcurl -d takes):
//   GET  /v1/models                                 ListModels
//   GET  /v1/models/{m}[/versions/{v}]              GetModel
//   POST /v1/models/{m}[/versions/{v}]:classify     Classify: the body is a ClassifyRequest, the model
//   POST /v1/models/{m}[/versions/{v}]:tag          from the path; the answer a ClassifyResponse (TagResponse)
// The same core, limits, metrics and access log as gRPC, through the frontend's Call (http_call.h)
// and the native API's conversions (server/frontend/native/api.h).
#ifndef QVI_SERVER_HTTP_NATIVE_NATIVE_ROUTES_H_
#define QVI_SERVER_HTTP_NATIVE_NATIVE_ROUTES_H_

#include "server/core/repository/model_repository.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/oip/repository.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

// POST ...:classify and ...:tag.
void ServeNativeInfer(Core* core, Calls* calls, const HttpRoute& route, HttpRequest request, HttpServer::Reply reply);
// GET /v1/models and /v1/models/{m}[/versions/{v}].
HttpResponse ListModelsRoute(const ModelRepository& repository);
HttpResponse GetModelRoute(const ModelRepository& repository, const Core& core, const HttpRoute& route);
// GET /v1/models/{m}/shadow: the model's shadow comparisons ({"model", "comparisons": [ShadowComparison]}).
HttpResponse GetShadowRoute(const ModelRepository& repository, const Core& core, const HttpRoute& route);
// PUT /v1/models/{m}/shadow ({"version", "fraction", "keep_texts"}) and DELETE: an admin's shadow candidate, or
// none, over serving.json's until the server restarts (ModelRepository::SetShadow); answers as GET does.
HttpResponse SetShadowRoute(const OipRepository& control, const ModelRepository& repository, const Core& core,
                            const HttpRoute& route, const std::string& body);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_NATIVE_NATIVE_ROUTES_H_
