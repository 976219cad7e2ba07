#include "server/http/json_body.h"

#include <google/protobuf/util/json_util.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace qvi {

namespace {

// The deepest a request body may nest: a Classify or Tag body nests 4 deep.
constexpr int kMaxJsonDepth = 16;  // (json_body.h)
// The most of the JSON parser's own message an error quotes.
constexpr size_t kMaxMessageBytes = 160;

// Walks a body once without building anything, before it is parsed: malformed JSON (named by byte),
// invalid UTF-8 or lone surrogates, nesting past kMaxJsonDepth, more texts than a request may hold
// (a Classify or Tag body's "texts") and more values than any request of that many texts needs are
// refused here, so that no body costs more than its bytes to refuse.
class BodyScan : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit BodyScan(int max_texts) : max_texts_(max_texts), max_values_(4 * int64_t{max_texts} + 1024) {}
  absl::Status status = absl::OkStatus();

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    key_ = k;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann's message names the line and column; the byte is what a client can look up.
    std::string what = e.what();
    if (const size_t colon = what.find(": syntax error"); colon != std::string::npos) what = what.substr(colon + 2);
    // It quotes what it last read, which is the client's and unbounded.
    what = Clip(what, kMaxMessageBytes);
    status = absl::InvalidArgumentError(absl::StrCat("request body: not valid JSON at byte ", position, ": ", what));
    return false;
  }

 private:
  bool Value() {
    if (++values_ > max_values_) {
      status = absl::InvalidArgumentError(absl::StrCat("request body: more than ", max_values_,
                                                       " JSON values; a request holds at most ", max_texts_, " texts"));
      return false;
    }
    if (in_texts_depth_ > 0 && depth_ == in_texts_depth_ && ++texts_ > max_texts_) {
      status = absl::InvalidArgumentError(
          absl::StrCat("texts: more than ", max_texts_, " texts; the limit is ", max_texts_, " per request"));
      return false;
    }
    return true;
  }
  bool Open(bool array) {
    if (!Value()) return false;
    if (++depth_ > kMaxJsonDepth) {
      status =
          absl::InvalidArgumentError(absl::StrCat("request body: JSON nested deeper than ", kMaxJsonDepth, " levels"));
      return false;
    }
    if (array && depth_ == 2 && key_ == "texts") in_texts_depth_ = depth_;
    return true;
  }
  bool Close() {
    if (depth_ == in_texts_depth_) in_texts_depth_ = 0;
    --depth_;
    return true;
  }

  const int max_texts_;
  const int64_t max_values_;
  int64_t values_ = 0;
  int depth_ = 0;
  int in_texts_depth_ = 0;
  int texts_ = 0;
  std::string key_;
};

}  // namespace

absl::Status ScanBody(std::string_view body, int max_texts) {
  BodyScan scan(max_texts);
  nlohmann::json::sax_parse(body.begin(), body.end(), &scan, nlohmann::json::input_format_t::json, /*strict=*/true);
  return scan.status;
}

absl::Status ParseBody(const std::string& body, int max_texts, google::protobuf::Message* message) {
  if (absl::Status s = ScanBody(body, max_texts); !s.ok()) return s;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(body, message, options);
  // protobuf's message names the field, which may be the client's (an unknown key): clipped.
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request body: ", Clip(status.message().as_string(), 300)));
  }
  return absl::OkStatus();
}

std::string Clip(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

}  // namespace qvi
