// KServe v2 REST (the Open Inference Protocol's REST binding, with Triton's binary-data extension) on
// the HTTP port, over the same OipApi as OIP's gRPC service (server/frontend/oip/api.h):
//   GET  /v2                                        server metadata
//   GET  /v2/models/{m}[/versions/{v}][/ready]      model metadata and readiness
//   POST /v2/models/{m}[/versions/{v}]/infer        inference with JSON tensors (kserve_rest.h)
#ifndef QVI_SERVER_HTTP_KSERVE_KSERVE_ROUTES_H_
#define QVI_SERVER_HTTP_KSERVE_KSERVE_ROUTES_H_

#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/oip/api.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

// POST /v2/models/{m}[/versions/{v}]/infer: the JSON tensors become an OIP ModelInfer request,
// planned and answered by OipApi, the answer's tensors written back as JSON (and binary).
void ServeKServeInfer(Core* core, Calls* calls, const OipApi* oip, const HttpRoute& route, HttpRequest request,
                      HttpServer::Reply reply);
// GET /v2/models/{m}[/versions/{v}][/ready].
HttpResponse KServeModelRoute(const OipApi* oip, const HttpRoute& route);
// GET /v2.
HttpResponse KServeServerMetadata();

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_KSERVE_KSERVE_ROUTES_H_
