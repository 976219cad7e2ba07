// The pieces the OpenAPI document (openapi.h) is built from, shared by its parts: the native and KServe
// routes (openapi.cc) and the drop-in routes' (drop_in_openapi.cc).
#ifndef QVI_SERVER_HTTP_OPENAPI_PARTS_H_
#define QVI_SERVER_HTTP_OPENAPI_PARTS_H_

#include <string>

#include "nlohmann/json.hpp"

namespace qvi {

// {"$ref": "#/components/schemas/<name>"}.
nlohmann::json Ref(const std::string& name);
// A JSON body's content: {"application/json": {"schema": schema}}.
nlohmann::json JsonBody(nlohmann::json schema);
// An operation answering `answer_schema` with 200, and the native error form otherwise.
nlohmann::json Operation(const std::string& summary, const std::string& answer, nlohmann::json answer_schema);
nlohmann::json Parameter(const char* name, const char* in, nlohmann::json schema, const char* what, bool required);
// The headers every inference route reads (docs/serving.md, "HTTP/JSON").
nlohmann::json InferenceHeaders();

// TEI's routes, Hugging Face's pipeline shape on them, OpenAI-style /classify (docs/serving.md, "Drop-in routes").
void AddDropInPaths(nlohmann::json& paths, nlohmann::json& schemas);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_OPENAPI_PARTS_H_
