#include "server/http/openapi.h"

#include "server/http/drop_in_openapi.h"

#include <string>

#include "qvi/serving/v1/inference.pb.h"

namespace qvi {

using json = nlohmann::json;
using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

json Ref(const std::string& name) { return {{"$ref", "#/components/schemas/" + name}}; }

namespace {

json EnumSchemaRef(const EnumDescriptor* e, json& schemas) {
  if (!schemas.contains(e->full_name())) {
    json names = json::array();
    for (int i = 0; i < e->value_count(); ++i) names.push_back(e->value(i)->name());
    // Answers write the name; requests may give the number too (protobuf's JSON mapping).
    schemas[e->full_name()] = {{"anyOf", json::array({{{"type", "string"}, {"enum", names}}, {{"type", "integer"}}})}};
  }
  return Ref(e->full_name());
}

// One value of the field (an element, when it is repeated).
json ValueSchema(const FieldDescriptor* f, json& schemas) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_UINT32:
      return {{"type", "integer"}};
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64:
      return {{"type", json::array({"string", "integer"})}, {"pattern", "^-?[0-9]+$"}};
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return {{"type", "number"}};
    case FieldDescriptor::CPPTYPE_BOOL:
      return {{"type", "boolean"}};
    case FieldDescriptor::CPPTYPE_STRING:
      return f->type() == FieldDescriptor::TYPE_BYTES ? json{{"type", "string"}, {"contentEncoding", "base64"}}
                                                      : json{{"type", "string"}};
    case FieldDescriptor::CPPTYPE_ENUM:
      return EnumSchemaRef(f->enum_type(), schemas);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageSchemaRef(f->message_type(), schemas);
  }
  return json::object();
}

json FieldSchema(const FieldDescriptor* f, json& schemas) {
  if (f->is_map()) {
    return {{"type", "object"}, {"additionalProperties", ValueSchema(f->message_type()->map_value(), schemas)}};
  }
  json value = ValueSchema(f, schemas);
  return f->is_repeated() ? json{{"type", "array"}, {"items", std::move(value)}} : value;
}

// KServe v2 REST's bodies (kserve_rest.h), which no proto describes.
void AddKServeSchemas(json& schemas) {
  const json parameters = {{"type", "object"},
                           {"additionalProperties", {{"type", json::array({"boolean", "integer", "string"})}}}};
  const json shape = {{"type", "array"}, {"items", {{"type", "integer"}}}};
  const json string = {{"type", "string"}};
  schemas["v2.Parameters"] = parameters;
  schemas["v2.InferRequest"] = {
      {"type", "object"},
      {"required", json::array({"inputs"})},
      {"additionalProperties", false},
      {"properties",
       {{"id", string},
        {"model_name", string},
        {"model_version", string},
        {"parameters", Ref("v2.Parameters")},
        {"inputs",
         {{"type", "array"},
          {"items",
           {{"type", "object"},
            {"required", json::array({"name", "shape", "datatype"})},
            {"properties",
             {{"name", string},
              {"shape", shape},
              {"datatype", string},
              {"parameters", Ref("v2.Parameters")},
              {"data", {{"description", "the elements, flat or nested as the shape (absent: binary data)"}}}}}}}}},
        {"outputs",
         {{"type", "array"},
          {"items",
           {{"type", "object"},
            {"required", json::array({"name"})},
            {"properties", {{"name", string}, {"parameters", Ref("v2.Parameters")}}}}}}}}}};
  schemas["v2.InferResponse"] = {
      {"type", "object"},
      {"required", json::array({"model_name", "outputs"})},
      {"properties",
       {{"model_name", string},
        {"model_version", string},
        {"id", string},
        {"outputs",
         {{"type", "array"},
          {"items",
           {{"type", "object"},
            {"required", json::array({"name", "datatype", "shape"})},
            {"properties",
             {{"name", string},
              {"datatype", string},
              {"shape", shape},
              {"parameters", {{"type", "object"}}},
              {"data", {{"type", "array"}, {"description", "flat, row-major (absent: binary data)"}}}}}}}}}}}};
  const json tensor = {{"type", "object"},
                       {"required", json::array({"name", "datatype", "shape"})},
                       {"properties", {{"name", string}, {"datatype", string}, {"shape", shape}}}};
  schemas["v2.ModelMetadata"] = {{"type", "object"},
                                 {"required", json::array({"name", "versions", "platform", "inputs", "outputs"})},
                                 {"properties",
                                  {{"name", string},
                                   {"versions", {{"type", "array"}, {"items", string}}},
                                   {"platform", string},
                                   {"inputs", {{"type", "array"}, {"items", tensor}}},
                                   {"outputs", {{"type", "array"}, {"items", tensor}}},
                                   {"parameters", {{"type", "object"}}}}}};
  schemas["v2.ServerMetadata"] = {
      {"type", "object"},
      {"required", json::array({"name", "version", "extensions"})},
      {"properties", {{"name", string}, {"version", string}, {"extensions", {{"type", "array"}, {"items", string}}}}}};
  schemas["v2.ModelReady"] = {{"type", "object"},
                              {"required", json::array({"name", "ready"})},
                              {"properties", {{"name", string}, {"ready", {{"type", "boolean"}}}}}};
  schemas["Error"] = {{"type", "object"}, {"required", json::array({"error"})}, {"properties", {{"error", string}}}};
}

}  // namespace

json JsonBody(json schema) { return {{"application/json", {{"schema", std::move(schema)}}}}; }

json Operation(const std::string& summary, const std::string& answer, json answer_schema) {
  json o = {{"summary", summary}};
  o["responses"]["200"] = {{"description", answer}, {"content", JsonBody(std::move(answer_schema))}};
  o["responses"]["default"] = {{"description", "an error, with the HTTP status of its gRPC code (docs/serving.md)"},
                               {"content", JsonBody(Ref("Error"))}};
  return o;
}

json Parameter(const char* name, const char* in, json schema, const char* what, bool required) {
  return {{"name", name}, {"in", in}, {"required", required}, {"description", what}, {"schema", std::move(schema)}};
}

// The headers every inference route reads (docs/serving.md, "HTTP/JSON").
json InferenceHeaders() {
  const json string = {{"type", "string"}};
  return json::array(
      {Parameter("X-Request-Id", "header", string, "the request id when the body gives none (echoed)", false),
       Parameter("X-Request-Timeout-Ms", "header", {{"type", "integer"}, {"minimum", 1}, {"maximum", 86400000}},
                 "the call's deadline, in milliseconds from its arrival", false),
       Parameter("X-Request-Priority", "header",
                 {{"type", "string"}, {"enum", {"high", "normal", "low", "default", "1", "2", "3", "0"}}},
                 "the request's priority in the model's batch queue when the body names none", false),
       Parameter("traceparent", "header", string, "W3C Trace Context: the call is traced in the access log", false)});
}

namespace {

// The model routes, with and without a version in the path.
void AddModelPaths(json& paths, json& schemas) {
  namespace v1 = serving::v1;
  const json model =
      Parameter("model", "path", {{"type", "string"}}, "the model's name (its folder in the store)", true);
  const json version = Parameter("version", "path", {{"type", "integer"}},
                                 "a version of the model (default: the version policy's newest)", true);
  for (const bool with_version : {false, true}) {
    const std::string base = with_version ? "/models/{model}/versions/{version}" : "/models/{model}";
    const json in_path = with_version ? json::array({model, version}) : json::array({model});
    const auto add = [&](const std::string& path, const char* method, json o, json request_schema = nullptr) {
      o["parameters"] = in_path;
      if (!request_schema.is_null()) {
        for (json& header : InferenceHeaders()) o["parameters"].push_back(std::move(header));
        o["requestBody"] = {{"required", true}, {"content", JsonBody(std::move(request_schema))}};
      }
      paths[path][method] = std::move(o);
    };
    add("/v1" + base, "get",
        Operation("GetModel", "its versions, states and metadata",
                  MessageSchemaRef(v1::GetModelResponse::descriptor(), schemas)));
    if (!with_version) {
      const json shadow = MessageSchemaRef(v1::GetShadowResponse::descriptor(), schemas);
      add("/v1" + base + "/shadow", "get",
          Operation("the model's shadow candidate compared with its serving version (serving.json's shadow)",
                    "one comparison per pair of versions, newest first", shadow));
      json put = Operation("an admin names the model's shadow candidate (over serving.json's, until a restart)",
                           "the comparisons so far", shadow);
      put["requestBody"] = {
          {"required", true},
          {"content", JsonBody({{"type", "object"},
                                {"required", {"version", "fraction"}},
                                {"properties",
                                 {{"version", {{"type", "integer"}, {"minimum", 1}}},
                                  {"fraction", {{"type", "number"}, {"exclusiveMinimum", 0}, {"maximum", 1}}},
                                  {"keep_texts", {{"type", "boolean"}}}}}})}};
      add("/v1" + base + "/shadow", "put", std::move(put));
      add("/v1" + base + "/shadow", "delete",
          Operation("an admin removes the model's shadow candidate (the newest version serves again: promotion)",
                    "the comparisons so far", shadow));
    }
    add("/v1" + base + ":classify", "post",
        Operation("Classify (the model from the path)", "labels, and tokens with alpha and beta when asked",
                  MessageSchemaRef(v1::ClassifyResponse::descriptor(), schemas)),
        MessageSchemaRef(v1::ClassifyRequest::descriptor(), schemas));
    add("/v1" + base + ":tag", "post",
        Operation("Tag (the model from the path)", "entity spans and tokens",
                  MessageSchemaRef(v1::TagResponse::descriptor(), schemas)),
        MessageSchemaRef(v1::TagRequest::descriptor(), schemas));
    add("/v2" + base, "get", Operation("KServe v2 model metadata", "its tensors", Ref("v2.ModelMetadata")));
    add("/v2" + base + "/ready", "get",
        Operation("KServe v2 model readiness (503 when not ready)", "its readiness", Ref("v2.ModelReady")));
    json infer = Operation("KServe v2 inference with JSON tensors (or Triton's binary-data extension)",
                           "the output tensors", Ref("v2.InferResponse"));
    add("/v2" + base + "/infer", "post", std::move(infer), Ref("v2.InferRequest"));
    paths["/v2" + base + "/infer"]["post"]["parameters"].push_back(Parameter(
        "Inference-Header-Content-Length", "header", {{"type", "integer"}, {"minimum", 0}},
        "the binary-data extension: the body's first N bytes are the JSON, the rest the inputs' contents", false));
  }
}

}  // namespace

json MessageSchemaRef(const Descriptor* message, json& schemas) {
  const std::string& name = message->full_name();
  if (!schemas.contains(name)) {
    schemas[name] = json::object();  // placed first: a message that holds itself refers to it
    json properties = json::object();
    for (int i = 0; i < message->field_count(); ++i) {
      const FieldDescriptor* f = message->field(i);
      properties[f->json_name()] = FieldSchema(f, schemas);
    }
    schemas[name] = {{"type", "object"}, {"properties", std::move(properties)}};
  }
  return Ref(name);
}

namespace {

// OIP's repository extension (docs/serving.md, "Model control"), with the admin scope; the body is optional.
void AddRepositoryPaths(json& paths) {
  const json string = {{"type", "string"}};
  const json parameters = {{"type", "object"},
                           {"additionalProperties", {{"type", json::array({"boolean", "integer", "string"})}}}};
  const json entry = {{"type", "object"},
                      {"required", json::array({"name", "state"})},
                      {"properties", {{"name", string}, {"version", string}, {"state", string}, {"reason", string}}}};
  const json index_request = {{"type", "object"},
                              {"properties", {{"ready", {{"type", "boolean"}}}, {"repository_name", string}}}};
  const json control_request = {{"type", "object"},
                                {"properties", {{"parameters", parameters}, {"repository_name", string}}}};
  json index = Operation("RepositoryIndex (admin): the store's models and each version's state",
                         "one entry per version; a model not loaded once, UNAVAILABLE \"not loaded\"",
                         {{"type", "array"}, {"items", entry}});
  index["requestBody"] = {{"required", false}, {"content", JsonBody(index_request)}};
  paths["/v2/repository/index"]["post"] = std::move(index);
  const json model = Parameter("model", "path", string, "a model of the store", true);
  for (const char* verb : {"load", "unload"}) {
    json o = Operation(std::string(verb == std::string("load") ? "RepositoryModelLoad" : "RepositoryModelUnload") +
                           " (admin; --model-control explicit)",
                       verb == std::string("load") ? "once a version of the model is READY"
                                                   : "once no version of the model is handed out",
                       {{"type", "object"}});
    o["parameters"] = json::array({model});
    o["requestBody"] = {{"required", false}, {"content", JsonBody(control_request)}};
    paths[std::string("/v2/repository/models/{model}/") + verb]["post"] = std::move(o);
  }
}

std::string BuildOpenApiDocument() {
  namespace v1 = serving::v1;
  json schemas = json::object();
  AddKServeSchemas(schemas);
  json paths = json::object();
  const json object = {{"type", "object"}};
  paths["/v2/health/live"]["get"] = Operation("liveness (Kubernetes probes)", "{\"live\": true}",
                                              {{"type", "object"}, {"properties", {{"live", {{"type", "boolean"}}}}}});
  paths["/v2/health/ready"]["get"] =
      Operation("readiness: 503 from the start of a drain", "{\"ready\": true}",
                {{"type", "object"}, {"properties", {{"ready", {{"type", "boolean"}}}}}});
  paths["/v1/models"]["get"] = Operation("ListModels", "every model and the state of its versions",
                                         MessageSchemaRef(v1::ListModelsResponse::descriptor(), schemas));
  paths["/v2"]["get"] = Operation("KServe v2 server metadata", "name, version, extensions", Ref("v2.ServerMetadata"));
  paths["/openapi.json"]["get"] = Operation("this document", "OpenAPI 3.1", object);
  paths["/"]["get"] = Operation("the explanation page (HTML; 404 with --http-explain-page=false)", "text/html", object);
  paths["/"]["get"]["responses"]["200"]["content"] = {{"text/html", {{"schema", {{"type", "string"}}}}}};
  AddModelPaths(paths, schemas);
  AddDropInPaths(paths, schemas);
  AddRepositoryPaths(paths);
  json doc = {{"openapi", "3.1.0"}, {"paths", std::move(paths)}};
  doc["components"]["schemas"] = std::move(schemas);
  // With --api-keys every route but the probes, this document and the page wants a key (docs/security.md).
  doc["components"]["securitySchemes"]["apiKey"] = {
      {"type", "http"},
      {"scheme", "bearer"},
      {"description",
       "With qvi-server --api-keys: 'Authorization: Bearer KEY'; the read scope for the models' list, cards and "
       "metadata, infer for classify, tag and infer, admin for /v2/repository/. The health routes, a model's ready "
       "route, this document "
       "and the page need none. Without --api-keys no key is asked for."}};
  doc["security"] = json::array({json::object(), {{"apiKey", json::array()}}});  // optional: the server decides
  doc["info"] = {{"title", "qvi-server HTTP/JSON"},
                 {"version", QVI_VERSION},
                 {"description",
                  "Classify and Tag with their explanations (alpha, beta) over HTTP/JSON, and KServe v2 REST: the "
                  "calls of the gRPC API qvi.serving.v1.Inference (docs/serving.md, \"HTTP/JSON\"). The "
                  "qvi.serving.v1 schemas are the proto's messages in protobuf's JSON mapping; requests may also "
                  "name fields in snake_case."}};
  return doc.dump(2);
}

}  // namespace

const std::string& OpenApiDocument() {
  static const std::string document = BuildOpenApiDocument();  // fixed by the build: made once
  return document;
}

}  // namespace qvi
