// GET /openapi.json: the HTTP routes as an OpenAPI 3.1 document, with the JSON Schema (2020-12) of every
// body: the qvi.serving.v1 messages in protobuf's JSON mapping, generated from their descriptors (so the
// document follows proto/ by construction), and KServe v2 REST's tensors written out here.
#ifndef QVI_SERVER_HTTP_OPENAPI_H_
#define QVI_SERVER_HTTP_OPENAPI_H_

#include <google/protobuf/descriptor.h>

#include <string>

#include "nlohmann/json.hpp"

namespace qvi {

// Built on first use, then the same text for every request.
const std::string& OpenApiDocument();

// The schema of `message` in protobuf's JSON mapping (field names in lowerCamelCase; 64-bit integers
// as strings, as answers write them, or numbers; enums by name), a $ref into components.schemas, where
// it and every message and enum it holds are added by full name.
nlohmann::json MessageSchemaRef(const google::protobuf::Descriptor* message, nlohmann::json& schemas);

// The pieces the document is built from, shared with its drop-in routes' part (drop_in_openapi.h).
// {"$ref": "#/components/schemas/<name>"}.
nlohmann::json Ref(const std::string& name);
// A JSON body's content: {"application/json": {"schema": schema}}.
nlohmann::json JsonBody(nlohmann::json schema);
// An operation answering `answer_schema` with 200, and the native error form otherwise.
nlohmann::json Operation(const std::string& summary, const std::string& answer, nlohmann::json answer_schema);
nlohmann::json Parameter(const char* name, const char* in, nlohmann::json schema, const char* what, bool required);
// The headers every inference route reads (docs/serving.md, "HTTP/JSON").
nlohmann::json InferenceHeaders();

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_OPENAPI_H_
