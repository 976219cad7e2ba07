#include "server/http/native/json_body.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/native/json_values.h"

namespace qvi {

namespace {

// The deepest a request body may nest: a Classify or Tag body nests 4 deep.
constexpr int kMaxJsonDepth = 16;  // (json_body.h)
// The most of the JSON parser's own message an error quotes.
constexpr size_t kMaxMessageBytes = 160;

// Walks a body once without building anything: malformed JSON (named by byte), invalid UTF-8 or lone
// surrogates, nesting past kMaxJsonDepth, more texts than a request may hold (a Classify or Tag
// body's "texts") and more values than any request of that many texts needs are refused as they are
// read, so that no body costs more than its bytes to refuse. MessageBuild builds on the same walk.
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

 protected:
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

 private:
  const int max_texts_;
  const int64_t max_values_;
  int64_t values_ = 0;
  int depth_ = 0;
  int in_texts_depth_ = 0;
  int texts_ = 0;
  std::string key_;
};

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using json_body::Assign;
using json_body::Expected;
using json_body::Scalar;

// Whether MessageBuild reads every field `d` can reach: no maps, bytes, groups, oneofs or protobuf's
// well-known types, whose JSON forms are their own, and at most 64 fields a message (a bit each for "given
// twice"). A proto3 `optional` field (a oneof of its own, synthetic) is read: setting it marks it present.
// Other messages go to protobuf's converter.
bool BuildReads(const Descriptor* d, int depth = 0) {
  if (depth > kMaxJsonDepth) return true;  // a recursive message: no body nests deeper than this
  if (d->file()->name().rfind("google/protobuf/", 0) == 0 || d->field_count() > 64) return false;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map() || f->real_containing_oneof() != nullptr || f->type() == FieldDescriptor::TYPE_BYTES ||
        f->type() == FieldDescriptor::TYPE_GROUP) {
      return false;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !BuildReads(f->message_type(), depth + 1)) return false;
  }
  return true;
}

// Builds a message from the scan's walk, in protobuf's JSON mapping (protobuf.dev/programming-guides/
// proto3/#json): fields by their JSON or proto name, integers as numbers without a fraction or as
// strings of digits, 64-bit ones included; floating point as numbers or strings ("NaN", "Infinity");
// enums by name or number; null as the field's default. The forms the mapping leaves open are refused
// rather than guessed at: a field given twice, null in a list, quoted booleans, lower-cased enum names.
// One walk, no tree and no binary round trip: protobuf's own converter (JsonStringToMessage) cost
// more than a tenth of the server's CPU per HTTP call (docs/performance.md).
class MessageBuild final : public BodyScan {
 public:
  MessageBuild(int max_texts, Message* root) : BodyScan(max_texts), root_(root) {}

  bool null() override { return Value() && Put(Scalar{}); }
  bool boolean(bool b) override { return Value() && Put(Scalar{Scalar::kBool, b}); }
  bool number_integer(number_integer_t i) override { return Value() && Put(Scalar{Scalar::kSigned, false, i}); }
  bool number_unsigned(number_unsigned_t u) override { return Value() && Put(Scalar{Scalar::kUnsigned, false, 0, u}); }
  bool number_float(number_float_t d, const string_t& written) override {
    return Value() && Put(Scalar{Scalar::kFloat, false, 0, 0, d, &written});
  }
  bool string(string_t& s) override { return Value() && Put(Scalar{Scalar::kString, false, 0, 0, 0, &s}); }
  bool key(string_t& k) override;
  bool start_object(std::size_t n) override;
  bool end_object() override;
  bool start_array(std::size_t n) override;
  bool end_array() override;

 private:
  struct Frame {
    Message* message;
    const FieldDescriptor* field = nullptr;  // the key just read, while its value is read
    bool in_list = false;
    uint64_t given = 0;  // a bit per field index: the fields already given
  };

  bool Put(const Scalar& v);
  // The dotted proto names of the fields being read, down to the innermost ("options.top_k").
  std::string Path() const;
  bool Fail(const std::string& what) {
    status = absl::InvalidArgumentError(absl::StrCat("request body: ", what));
    return false;
  }
  bool Refuse(const Scalar& v) {
    const Frame& top = frames_.back();
    const std::string given = v.kind == Scalar::kString     ? absl::StrCat("\"", Clip(*v.text, 40), "\"")
                              : v.kind == Scalar::kFloat    ? Clip(*v.text, 40)
                              : v.kind == Scalar::kSigned   ? absl::StrCat(v.i)
                              : v.kind == Scalar::kUnsigned ? absl::StrCat(v.u)
                              : v.kind == Scalar::kBool     ? (v.boolean ? "true" : "false")
                                                            : "null";
    return Fail(absl::StrCat(Path(), ": ", given, " is not ", Expected(top.field, top.in_list)));
  }

  Message* const root_;
  std::vector<Frame> frames_;
};

std::string MessageBuild::Path() const {
  std::string path;
  for (const Frame& f : frames_) {
    if (f.field != nullptr) absl::StrAppend(&path, path.empty() ? "" : ".", f.field->name());
  }
  return path;
}

bool MessageBuild::key(string_t& k) {
  if (!BodyScan::key(k)) return false;
  Frame& top = frames_.back();
  const Descriptor* d = top.message->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (k != f->json_name() && k != f->name()) continue;
    top.field = f;
    if (top.given & (uint64_t{1} << i)) return Fail(absl::StrCat(Path(), ": given twice"));
    top.given |= uint64_t{1} << i;
    return true;
  }
  std::string fields;
  for (int i = 0; i < d->field_count(); ++i) absl::StrAppend(&fields, i > 0 ? ", " : "", d->field(i)->json_name());
  const std::string path = Path();
  return Fail(
      absl::StrCat(path, path.empty() ? "" : ".", Clip(k, 64), ": no such field; ", d->name(), " has ", fields));
}

bool MessageBuild::Put(const Scalar& v) {
  if (frames_.empty()) return Fail("a JSON object is expected");
  Frame& top = frames_.back();
  const FieldDescriptor* f = top.field;
  if (v.kind == Scalar::kNull) {
    if (top.in_list) return Refuse(v);
    top.message->GetReflection()->ClearField(top.message, f);
  } else if ((f->is_repeated() && !top.in_list) || !Assign(top.message, f, top.in_list, v)) {
    return Refuse(v);
  }
  if (!top.in_list) top.field = nullptr;
  return true;
}

bool MessageBuild::start_object(std::size_t n) {
  if (!BodyScan::start_object(n)) return false;
  if (frames_.empty()) {
    frames_.push_back(Frame{root_});
    return true;
  }
  Frame& top = frames_.back();
  const FieldDescriptor* f = top.field;
  if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || (f->is_repeated() && !top.in_list)) {
    return Fail(absl::StrCat(Path(), ": an object is not ", Expected(f, top.in_list)));
  }
  const Reflection& r = *top.message->GetReflection();
  frames_.push_back(Frame{top.in_list ? r.AddMessage(top.message, f) : r.MutableMessage(top.message, f)});
  return true;
}

bool MessageBuild::end_object() {
  if (!BodyScan::end_object()) return false;
  frames_.pop_back();
  if (!frames_.empty() && !frames_.back().in_list) frames_.back().field = nullptr;
  return true;
}

bool MessageBuild::start_array(std::size_t n) {
  if (!BodyScan::start_array(n)) return false;
  if (frames_.empty()) return Fail("a JSON object is expected");
  Frame& top = frames_.back();
  if (top.in_list || !top.field->is_repeated()) {
    return Fail(absl::StrCat(Path(), ": a list is not ", Expected(top.field, top.in_list)));
  }
  top.in_list = true;
  return true;
}

bool MessageBuild::end_array() {
  if (!BodyScan::end_array()) return false;
  frames_.back().in_list = false;
  frames_.back().field = nullptr;
  return true;
}

}  // namespace

absl::Status ScanBody(std::string_view body, int max_texts) {
  BodyScan scan(max_texts);
  nlohmann::json::sax_parse(body.begin(), body.end(), &scan, nlohmann::json::input_format_t::json, /*strict=*/true);
  return scan.status;
}

absl::Status ParseBody(const std::string& body, int max_texts, google::protobuf::Message* message) {
  if (BuildReads(message->GetDescriptor())) {
    MessageBuild build(max_texts, message);
    nlohmann::json::sax_parse(body.begin(), body.end(), &build, nlohmann::json::input_format_t::json, /*strict=*/true);
    return build.status;
  }
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
