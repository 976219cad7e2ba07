// OIP's model-repository extension on the HTTP port (KServe v2 REST as Triton serves it; the core's
// side: server/frontend/oip/repository.h), behind the `admin` scope:
//   POST /v2/repository/index                  {"ready": bool} -> [{"name", "version", "state", "reason"}]
//   POST /v2/repository/models/{m}/load        {"parameters": {...}} (none taken) -> {} once it serves
//   POST /v2/repository/models/{m}/unload      {"parameters": {"unload_dependents": bool}} -> {}
// A body is optional. A load is answered from the poll worker that finished it.
#ifndef QVI_SERVER_HTTP_KSERVE_REPOSITORY_ROUTES_H_
#define QVI_SERVER_HTTP_KSERVE_REPOSITORY_ROUTES_H_

#include "server/frontend/call.h"
#include "server/frontend/oip/repository.h"
#include "server/http/http_server.h"
#include "server/http/routes.h"

namespace qvi {

void ServeRepository(const OipRepository* repository, const Calls* calls, const HttpRoute& route,
                     const HttpRequest& request, HttpServer::Reply reply);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_KSERVE_REPOSITORY_ROUTES_H_
