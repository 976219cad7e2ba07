// The drop-in routes' part of the OpenAPI document (openapi.h): TEI's routes (tei/), Hugging Face's
// token-classification shape on them (hf/), OpenAI-style /classify (openai/).
#include "server/http/drop_in_openapi.h"

#include <string>
#include <utility>

#include "server/http/openapi.h"

namespace qvi {
namespace {

using json = nlohmann::json;

// TEI's /tokenize and /decode (tei/tokenize_routes.h).
void AddTokenPaths(json& paths, json& schemas, const json& tei_error, const json& model) {
  const json text = {{"type", "string"}, {"minLength", 1}};
  const json offset = {{"type", {"integer", "null"}}, {"description", "bytes; null for a special token"}};
  schemas["tei.TokenizeRequest"] = {
      {"type", "object"},
      {"required", {"inputs"}},
      {"properties",
       {{"inputs", {{"oneOf", {text, {{"type", "array"}, {"items", text}, {"minItems", 1}}}}}},
        {"add_special_tokens", {{"type", {"boolean", "null"}}, {"description", "default true"}}}}}};
  schemas["tei.Tokens"] = {{"type", "array"},
                           {"description", "a list per text"},
                           {"items",
                            {{"type", "array"},
                             {"items",
                              {{"type", "object"},
                               {"required", {"id", "text", "special", "start", "stop"}},
                               {"properties",
                                {{"id", {{"type", "integer"}}},
                                 {"text", {{"type", "string"}}},
                                 {"special", {{"type", "boolean"}}},
                                 {"start", offset},
                                 {"stop", offset}}}}}}}};
  const json ids = {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}}, {"minItems", 1}};
  schemas["tei.DecodeRequest"] = {
      {"type", "object"},
      {"required", {"ids"}},
      {"properties",
       {{"ids", {{"oneOf", {ids, {{"type", "array"}, {"items", ids}, {"minItems", 1}}}}}},
        {"skip_special_tokens", {{"type", {"boolean", "null"}}, {"description", "default true"}}}}}};
  for (const char* verb : {"tokenize", "decode"}) {
    const bool tokenize = verb == std::string("tokenize");
    for (const std::string& path : {"/" + std::string(verb), "/models/{model}/" + std::string(verb)}) {
      json o = tokenize ? Operation("TEI's tokenize: each text's tokens, ids and byte offsets", "the tokens",
                                    Ref("tei.Tokens"))
                        : Operation("TEI's decode: each list of ids as text (a sub-word model's decoder)",
                                    "a text per list", {{"type", "array"}, {"items", {{"type", "string"}}}});
      o["responses"]["default"] = tei_error;
      o["parameters"] = InferenceHeaders();
      if (path[1] == 'm') o["parameters"].push_back(model);
      o["requestBody"] = {{"required", true},
                          {"content", JsonBody(Ref(tokenize ? "tei.TokenizeRequest" : "tei.DecodeRequest"))}};
      paths[path]["post"] = std::move(o);
    }
  }
}

// What POST / and /models/{model} answer for a tagger: Hugging Face's token-classification pipeline shape
// (hf/pipeline_routes.h).
json TokenClassificationSchemas(json& schemas) {
  schemas["hf.Entities"] = {{"type", "array"},
                            {"items",
                             {{"type", "object"},
                              {"required", {"entity_group", "score", "word", "start", "end"}},
                              {"properties",
                               {{"entity_group", {{"type", "string"}}},
                                {"score", {{"type", "number"}}},
                                {"word", {{"type", "string"}}},
                                {"start", {{"type", "integer"}, {"description", "characters (code points)"}}},
                                {"end", {{"type", "integer"}}},
                                {"explanation", Ref("qvi.Explanation")}}}}}};
  // anyOf: a text with no entities answers [], which both shapes (and TEI's) hold.
  return {{"anyOf", {Ref("hf.Entities"), {{"type", "array"}, {"items", Ref("hf.Entities")}}}}};
}

// Text Embeddings Inference's routes (tei/tei_routes.h; docs/serving.md, "Drop-in routes"): a classifier's
// labels in TEI's shapes, the model from the path, --default-model or the store's only one.
// QVI's addition to the drop-in answers ("explain": true; drop_in.h's Explanation).
json ExplanationSchema(json& schemas) {
  const json numbers = {{"type", "array"}, {"items", {{"type", "number"}}}};
  schemas["qvi.Explanation"] = {
      {"type", "object"},
      {"required", {"words"}},
      {"description",
       "the text's words (characters) with α, β and each label's exact contributions (a tagger's entity: its "
       "occlusion), one a word"},
      {"properties",
       {{"words",
         {{"type", "array"},
          {"items",
           {{"type", "object"},
            {"properties",
             {{"text", {{"type", "string"}}}, {"start", {{"type", "integer"}}}, {"end", {{"type", "integer"}}}}}}}}},
        {"alpha", numbers},
        {"beta", numbers},
        {"contributions", {{"type", "object"}, {"additionalProperties", numbers}}},
        {"occlusion",
         {{"allOf", {numbers}}, {"description", "an entity's: its probability's drop without each word"}}}}}};
  return Ref("qvi.Explanation");
}

json ExplainFlag() {
  return {{"type", {"boolean", "null"}},
          {"description",
           "QVI's addition: the answer carries the words' α, β and contributions (a tagger's entities: α, β and "
           "occlusion)"}};
}

// TEI's request and answer schemas.
void AddTeiSchemas(json& schemas) {
  const json text = {{"type", "string"}, {"minLength", 1}};
  const json one = {{"type", "array"}, {"items", text}, {"minItems", 1}, {"maxItems", 1}};
  const json prediction = {{"type", "object"},
                           {"required", {"score", "label"}},
                           {"properties",
                            {{"score", {{"type", "number"}}},
                             {"label", {{"type", "string"}}},
                             {"explanation", ExplanationSchema(schemas)}}}};
  schemas["tei.Predictions"] = {{"type", "array"}, {"items", prediction}};
  schemas["tei.PredictRequest"] = {
      {"type", "object"},
      {"required", {"inputs"}},
      {"properties",
       {{"inputs", {{"oneOf", {text, one, {{"type", "array"}, {"items", one}, {"minItems", 1}}}}}},
        {"truncate",
         {{"type", {"boolean", "null"}}, {"description", "false: a text over max_input_length is refused"}}},
        {"explain", ExplainFlag()},
        {"raw_scores", {{"type", {"boolean", "null"}}, {"description", "only false: logits are not answered"}}},
        {"truncation_direction", {{"type", {"string", "null"}}, {"enum", {"right", "Right", nullptr}}}},
        {"parameters",
         {{"type", {"object", "null"}},
          {"description",
           "Hugging Face InferenceClient's: top_k, function_to_apply (softmax); with it the answer is "
           "a list of lists"},
          {"properties",
           {{"top_k", {{"type", {"integer", "null"}}, {"minimum", 1}}},
            {"function_to_apply", {{"type", {"string", "null"}}, {"enum", {"softmax", nullptr}}}},
            {"aggregation_strategy",
             {{"type", {"string", "null"}},
              {"enum", {"simple", "first", nullptr}},
              {"description", "a tagger's (POST / and /models/{model}): its entities either way"}}},
            {"ignore_labels",
             {{"type", {"array", "null"}},
              {"items", {{"type", "string"}}},
              {"description", "a tagger's: entity types left out"}}}}}}}}}};
  schemas["tei.Info"] = {{"type", "object"},
                         {"required", {"model_id", "model_type", "max_input_length", "max_client_batch_size"}},
                         {"properties",
                          {{"model_id", {{"type", "string"}}},
                           {"served_model_name", {{"type", "string"}}},
                           {"model_type", {{"type", "object"}}},
                           {"max_input_length", {{"type", "integer"}}},
                           {"max_batch_tokens", {{"type", "integer"}}},
                           {"max_client_batch_size", {{"type", "integer"}}},
                           {"version", {{"type", "string"}}}}}};
  schemas["tei.Error"] = {
      {"type", "object"},
      {"required", {"error", "error_type"}},
      {"properties",
       {{"error", {{"type", "string"}}},
        {"error_type",
         {{"type", "string"}, {"enum", {"Validation", "Empty", "Overloaded", "Unhealthy", "Backend"}}}}}}};
}

void AddTeiPaths(json& paths, json& schemas) {
  AddTeiSchemas(schemas);
  const json tei_error = {{"description",
                           "TEI's error: Validation 422 (an unknown model 404), Empty 400, "
                           "Overloaded 429, Unhealthy 503, Backend otherwise"},
                          {"content", JsonBody(Ref("tei.Error"))}};
  const json answer = {{"oneOf", {Ref("tei.Predictions"), {{"type", "array"}, {"items", Ref("tei.Predictions")}}}}};
  const json entities = TokenClassificationSchemas(schemas);
  const json model =
      Parameter("model", "path", {{"type", "string"}}, "the model's name (its folder in the store)", true);
  for (const std::string& path :
       {std::string("/predict"), std::string("/models/{model}/predict"), std::string("/models/{model}")}) {
    const bool by_model_type = path != "/predict" && path != "/models/{model}/predict";
    json o = Operation(
        by_model_type ? "TEI's predict for a classifier (every label with its score, best first; a list per text for "
                        "a batch); for a tagger, Hugging Face's token classification (its entities)"
                      : "TEI's predict: every label with its score, best first (a list per text for a batch)",
        by_model_type ? "the predictions, or a tagger's entities" : "the predictions",
        by_model_type ? json{{"anyOf", {answer, entities}}} : answer);
    o["responses"]["default"] = tei_error;
    o["parameters"] = InferenceHeaders();
    if (path != "/predict") o["parameters"].push_back(model);
    o["requestBody"] = {{"required", true}, {"content", JsonBody(Ref("tei.PredictRequest"))}};
    paths[path]["post"] = o;
    if (path == "/predict") {
      o["summary"] =
          "TEI's /: predict for a classifier, token classification for a tagger (Hugging Face "
          "InferenceClient(base_url=...) posts here)";
      o["responses"]["200"]["content"] = JsonBody({{"anyOf", {answer, entities}}});
      paths["/"]["post"] = o;
    }
  }
  for (const std::string& path : {std::string("/info"), std::string("/models/{model}/info")}) {
    json o = Operation("TEI's info: the model, its labels (model_type.classifier.id2label) and limits", "the info",
                       Ref("tei.Info"));
    o["responses"]["default"] = tei_error;
    if (path != "/info") o["parameters"] = json::array({model});
    paths[path]["get"] = std::move(o);
  }
  AddTokenPaths(paths, schemas, tei_error, model);
}

// vLLM's /pooling for token_classify and classify (openai/pooling_routes.h).
void AddPoolingPath(json& paths, json& schemas) {
  json request = schemas["openai.ClassifyRequest"];
  request["properties"]["task"] = {{"type", {"string", "null"}}, {"enum", {"token_classify", "classify", nullptr}}};
  request["properties"]["encoding_format"] = {{"type", {"string", "null"}}, {"enum", {"float", nullptr}}};
  schemas["openai.PoolingRequest"] = std::move(request);
  const json numbers = {{"type", "array"}, {"items", {{"type", "number"}}}};
  const json item = {
      {"type", "object"},
      {"required", {"index", "object", "data"}},
      {"properties",
       {{"index", {{"type", "integer"}}},
        {"object", {{"const", "pooling"}}},
        {"data", {{"anyOf", {numbers, {{"type", "array"}, {"items", numbers}}}}}},
        {"words", {{"type", "array"}, {"description", "token_classify: the rows' words, with their tags"}}},
        {"entities", {{"type", "array"}, {"description", "token_classify: the entities, Hugging Face's shape"}}},
        {"explanation", Ref("qvi.Explanation")}}}};
  schemas["openai.PoolingResponse"] = {
      {"type", "object"},
      {"required", {"id", "object", "created", "model", "data", "usage"}},
      {"properties",
       {{"id", {{"type", "string"}}},
        {"object", {{"const", "list"}}},
        {"created", {{"type", "integer"}}},
        {"model", {{"type", "string"}}},
        {"data", {{"type", "array"}, {"items", item}}},
        {"usage", {{"type", "object"}}},
        {"labels", {{"type", "array"}, {"items", {{"type", "string"}}}, {"description", "the columns' names"}}}}}};
  json o = Operation(
      "vLLM's /pooling: token_classify (each word's tag probabilities, with the words and entities) "
      "or classify",
      "the pooling answer", Ref("openai.PoolingResponse"));
  o["responses"]["default"] = {{"description", "OpenAI's error"}, {"content", JsonBody(Ref("openai.Error"))}};
  o["parameters"] = InferenceHeaders();
  o["requestBody"] = {{"required", true}, {"content", JsonBody(Ref("openai.PoolingRequest"))}};
  paths["/pooling"]["post"] = std::move(o);
}

// OpenAI-style classification as vLLM serves it (openai/classify_routes.h).
// GET /v1/models answers the native listing and vLLM's (openai/model_list.h): its body, both schemas at once.
void AddModelListFields(json& paths, json& schemas) {
  schemas["openai.ModelList"] = {{"type", "object"},
                                 {"required", {"object", "data"}},
                                 {"properties",
                                  {{"object", {{"const", "list"}}},
                                   {"data",
                                    {{"type", "array"},
                                     {"items",
                                      {{"type", "object"},
                                       {"required", {"id", "object", "created", "owned_by"}},
                                       {"properties",
                                        {{"id", {{"type", "string"}}},
                                         {"object", {{"const", "model"}}},
                                         {"created", {{"type", "integer"}}},
                                         {"owned_by", {{"type", "string"}}},
                                         {"root", {{"type", "string"}}},
                                         {"parent", {{"type", "null"}}},
                                         {"max_model_len", {{"type", "integer"}}}}}}}}}}}};
  json& schema = paths["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
  json native = std::move(schema);
  schema = {{"allOf", {std::move(native), Ref("openai.ModelList")}}};
  paths["/v1/models"]["get"]["summary"] =
      "ListModels: every model and the state of its versions; beside them, OpenAI's model list (vLLM's)";
}

void AddOpenAiPaths(json& paths, json& schemas) {
  schemas["openai.ClassifyRequest"] = {
      {"type", "object"},
      {"required", {"input"}},
      {"properties",
       {{"model", {{"type", {"string", "null"}}, {"description", "default: --default-model, else the only model"}}},
        {"input",
         {{"oneOf", {{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}, {"minItems", 1}}}}}},
        {"explain", ExplainFlag()}}}};
  schemas["openai.ClassifyResponse"] = {
      {"type", "object"},
      {"required", {"id", "object", "created", "model", "data", "usage"}},
      {"properties",
       {{"id", {{"type", "string"}}},
        {"object", {{"const", "list"}}},
        {"created", {{"type", "integer"}}},
        {"model", {{"type", "string"}}},
        {"data",
         {{"type", "array"},
          {"items",
           {{"type", "object"},
            {"required", {"index", "label", "probs", "num_classes"}},
            {"properties",
             {{"index", {{"type", "integer"}}},
              {"label", {{"type", "string"}}},
              {"probs", {{"type", "array"}, {"items", {{"type", "number"}}}}},
              {"num_classes", {{"type", "integer"}}},
              {"explanation", Ref("qvi.Explanation")}}}}}}},
        {"usage", {{"type", "object"}, {"required", {"prompt_tokens", "total_tokens"}}}}}}};
  schemas["openai.Error"] = {
      {"type", "object"},
      {"required", {"error"}},
      {"properties",
       {{"error",
         {{"type", "object"},
          {"required", {"message", "type", "code"}},
          {"properties",
           {{"message", {{"type", "string"}}}, {"type", {{"type", "string"}}}, {"code", {{"type", "integer"}}}}}}}}}};
  AddPoolingPath(paths, schemas);
  AddModelListFields(paths, schemas);
  for (const char* path : {"/classify", "/v1/classify"}) {
    json o = Operation(
        "OpenAI-style classification (vLLM's /classify): each text's label and every label's "
        "probability in the model's order",
        "the classifications", Ref("openai.ClassifyResponse"));
    o["responses"]["default"] = {{"description", "OpenAI's error: BadRequestError 400, NotFoundError 404, ..."},
                                 {"content", JsonBody(Ref("openai.Error"))}};
    o["parameters"] = InferenceHeaders();
    o["requestBody"] = {{"required", true}, {"content", JsonBody(Ref("openai.ClassifyRequest"))}};
    paths[path]["post"] = std::move(o);
  }
}

}  // namespace

void AddDropInPaths(json& paths, json& schemas) {
  AddTeiPaths(paths, schemas);
  AddOpenAiPaths(paths, schemas);
}

}  // namespace qvi
