// The drop-in routes' part of the OpenAPI document (openapi.h): TEI's routes, Hugging Face's token
// classification on them, OpenAI-style /classify (docs/serving.md, "Drop-in routes").
#ifndef QVI_SERVER_HTTP_DROP_IN_OPENAPI_H_
#define QVI_SERVER_HTTP_DROP_IN_OPENAPI_H_

#include "nlohmann/json.hpp"

namespace qvi {

// Their paths, and their bodies' schemas into `schemas`.
void AddDropInPaths(nlohmann::json& paths, nlohmann::json& schemas);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_DROP_IN_OPENAPI_H_
