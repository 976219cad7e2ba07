#include "server/grpc/wire/wire_scan.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/core/text/tokenizer.h"

namespace qvi {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// One step of the path to the field being read, for messages: "inputs[0]", "contents".
struct Step {
  const FieldDescriptor* field;
  int index;  // -1: not repeated
};

class Scanner {
 public:
  Scanner(const Descriptor& root, const WireCaps& caps) : root_(root), caps_(caps) {}

  absl::Status Message(const Descriptor& type, CodedInputStream& in) {
    // Elements of each repeated field seen in this message so far, for the index in messages.
    absl::InlinedVector<std::pair<const FieldDescriptor*, int>, 4> local;
    while (true) {
      const uint32_t tag = in.ReadTag();
      if (tag == 0) {  // the end of the message (of its limit, or of the input), or a bad tag
        if (in.ConsumedEntireMessage()) break;
        return Malformed(in, nullptr, -1);
      }
      const int number = WireFormatLite::GetTagFieldNumber(tag);
      const auto wire = WireFormatLite::GetTagWireType(tag);
      if (wire == WireFormatLite::WIRETYPE_START_GROUP || wire == WireFormatLite::WIRETYPE_END_GROUP) {
        return absl::InvalidArgumentError(absl::StrCat(Where(), "field ", number, ": groups are not accepted"));
      }
      const FieldDescriptor* field = type.FindFieldByNumber(number);
      if (field == nullptr || !Expected(*field, wire)) {
        if (++unknown_ > caps_.unknown_fields) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(), "more than ", caps_.unknown_fields,
                           " fields this server does not know in one request (the cap); the last is field ", number));
        }
        if (!WireFormatLite::SkipField(&in, tag)) return Malformed(in, nullptr, -1);
        continue;
      }
      int index = -1;
      if (field->is_repeated()) {
        int* seen = nullptr;
        for (auto& [f, n] : local) {
          if (f == field) seen = &n;
        }
        if (seen == nullptr) seen = &local.emplace_back(field, 0).second;
        index = *seen;
        absl::StatusOr<int> elements = Elements(*field, wire, in);
        if (!elements.ok()) return elements.status();
        *seen += *elements;
        if (absl::Status s = Count(*field, tag, *elements, in); !s.ok()) return s;
        if (wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED && field->is_packable()) continue;  // counted, read
      }
      if (absl::Status s = Value(*field, tag, index, in); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // Whether `wire` is how `field` may be sent (packed or not, for repeated scalars).
  static bool Expected(const FieldDescriptor& field, WireFormatLite::WireType wire) {
    const auto want = WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(field.type()));
    return wire == want ||
           (field.is_packable() && field.is_repeated() && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  }

  // How many elements this occurrence of a repeated field holds: 1, or a packed run's count (read
  // through, so that the caller does not read it again).
  absl::StatusOr<int> Elements(const FieldDescriptor& field, WireFormatLite::WireType wire, CodedInputStream& in) {
    if (!(wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED && field.is_packable())) return 1;
    uint32_t length = 0;
    if (!in.ReadVarint32(&length) || !in.ReadString(&scratch_, static_cast<int>(length))) {
      return Malformed(in, &field, -1);
    }
    switch (WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(field.type()))) {
      case WireFormatLite::WIRETYPE_FIXED32:
        if (length % 4 != 0) return Malformed(in, &field, -1);
        return static_cast<int>(length / 4);
      case WireFormatLite::WIRETYPE_FIXED64:
        if (length % 8 != 0) return Malformed(in, &field, -1);
        return static_cast<int>(length / 8);
      default: {  // varints: one ends at each byte without the continuation bit
        int n = 0;
        for (char c : scratch_) n += (static_cast<uint8_t>(c) & 0x80) == 0 ? 1 : 0;
        if (!scratch_.empty() && (static_cast<uint8_t>(scratch_.back()) & 0x80) != 0) return Malformed(in, &field, -1);
        return n;
      }
    }
  }

  // Adds this occurrence's elements to the field's count in the request; over its cap, the rest of
  // the message is read through (counting the field, allocating nothing) so that the error says how
  // many the request holds, as the checks after parsing would.
  absl::Status Count(const FieldDescriptor& field, uint32_t tag, int elements, CodedInputStream& in) {
    auto [it, fresh] = counts_.try_emplace(&field, 0);
    it->second += elements;
    if (fresh) {
      if (auto named = caps_.fields.find(field.full_name()); named != caps_.fields.end()) {
        caps_of_.emplace(&field, &named->second);
      }
    }
    const auto named = caps_of_.find(&field);
    const int cap = named != caps_of_.end() ? named->second->elements : caps_.repeated;
    if (it->second <= cap) return absl::OkStatus();
    int64_t total = it->second;
    auto packed = [&field](uint32_t t) {
      return WireFormatLite::GetTagWireType(t) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED && field.is_packable();
    };
    if (!packed(tag) && !WireFormatLite::SkipField(&in, tag)) return Malformed(in, &field, -1);  // this element
    while (const uint32_t next = in.ReadTag()) {
      const auto wire = WireFormatLite::GetTagWireType(next);
      if (WireFormatLite::GetTagFieldNumber(next) == field.number() && Expected(field, wire)) {
        absl::StatusOr<int> more = Elements(field, wire, in);
        if (!more.ok()) return more.status();
        total += *more;
        if (packed(next)) continue;
      }
      if (!WireFormatLite::SkipField(&in, next)) return Malformed(in, &field, -1);
    }
    const std::string& unit =
        named != caps_of_.end() && !named->second->unit.empty() ? named->second->unit : field.name();
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), field.name(), ": ", total, " ", unit, " exceed the limit of ", cap, " per request"));
  }

  absl::Status Value(const FieldDescriptor& field, uint32_t tag, int index, CodedInputStream& in) {
    switch (field.type()) {
      case FieldDescriptor::TYPE_MESSAGE: {
        uint32_t length = 0;
        if (!in.ReadVarint32(&length)) return Malformed(in, &field, index);
        const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
        if (!in.IncrementRecursionDepth()) {
          return absl::InvalidArgumentError(absl::StrCat(Where(), field.name(), ": nested too deeply"));
        }
        path_.push_back({&field, field.is_map() ? -1 : index});
        absl::Status s = Message(*field.message_type(), in);
        path_.pop_back();
        in.DecrementRecursionDepth();
        if (s.ok() && in.BytesUntilLimit() != 0) s = Malformed(in, &field, index);
        in.PopLimit(limit);
        return s;
      }
      case FieldDescriptor::TYPE_STRING:
      case FieldDescriptor::TYPE_BYTES: {
        uint32_t length = 0;
        if (!in.ReadVarint32(&length) || !in.ReadString(&scratch_, static_cast<int>(length))) {
          return Malformed(in, &field, index);
        }
        if (field.type() == FieldDescriptor::TYPE_STRING && field.file()->syntax() == FileDescriptor::SYNTAX_PROTO3) {
          if (absl::Status s = ValidateUtf8(scratch_); !s.ok()) {
            return absl::InvalidArgumentError(absl::StrCat(Where(), Name(field, index), ": ", s.message()));
          }
        }
        return absl::OkStatus();
      }
      default:
        if (!WireFormatLite::SkipField(&in, tag)) return Malformed(in, &field, index);
        return absl::OkStatus();
    }
  }

  static std::string Name(const FieldDescriptor& field, int index) {
    return index < 0 ? field.name() : absl::StrCat(field.name(), "[", index, "]");
  }

  // The path of the message being read, as the API spells it, with a trailing dot: "inputs[0].contents.".
  std::string Where() const {
    std::string out;
    for (const Step& s : path_) absl::StrAppend(&out, Name(*s.field, s.index), ".");
    return out;
  }

  absl::Status Malformed(const CodedInputStream& in, const FieldDescriptor* field, int index) const {
    std::string where = Where();
    if (field != nullptr) where += Name(*field, index);
    if (!where.empty() && where.back() == '.') where.pop_back();
    return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ", root_.full_name(), ": truncated or ",
                                                   "malformed at byte ", in.CurrentPosition(),
                                                   where.empty() ? "" : absl::StrCat(" (in ", where, ")")));
  }

  const Descriptor& root_;
  const WireCaps& caps_;
  absl::flat_hash_map<const FieldDescriptor*, int> counts_;
  absl::flat_hash_map<const FieldDescriptor*, const WireCaps::Cap*> caps_of_;
  int unknown_ = 0;
  std::string scratch_;  // the last string or packed run read, reused
  std::vector<Step> path_;
};

absl::Status Decode(google::protobuf::io::ZeroCopyInputStream* scan, google::protobuf::io::ZeroCopyInputStream* parse,
                    const WireCaps& caps, google::protobuf::Message* out) {
  if (absl::Status s = ScanWire(*out->GetDescriptor(), scan, caps); !s.ok()) return s;
  if (!out->ParseFromZeroCopyStream(parse)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", out->GetDescriptor()->full_name(), " (protobuf refused it)"));
  }
  return absl::OkStatus();
}

}  // namespace

WireCaps DefaultWireCaps(const RequestLimits& limits) {
  WireCaps caps;
  const std::pair<const char*, WireCaps::Cap> named[] = {
      {"qvi.serving.v1.ClassifyRequest.texts", {limits.max_texts, "texts"}},
      {"qvi.serving.v1.TagRequest.texts", {limits.max_texts, "texts"}},
      {"qvi.serving.v1.LayerOptions.layers", {1024, "layer indices"}},
      {"qvi.serving.v1.LayerOptions.heads", {1024, "head indices"}},
      {"inference.InferTensorContents.bytes_contents", {limits.max_texts, "texts"}},
      {"inference.ModelInferRequest.inputs", {16, "inputs"}},
      {"inference.ModelInferRequest.outputs", {64, "outputs"}},
      {"inference.ModelInferRequest.raw_input_contents", {16, "raw input buffers"}},
      {"inference.ModelInferRequest.InferInputTensor.shape", {16, "dimensions"}},
      // TEI's Decode: a list of ids, as long as HTTP's /decode reads in a whole request (drop_in_bodies.h).
      {"tei.v1.DecodeRequest.ids", {limits.max_texts * 128, "ids"}},
  };
  for (const auto& [name, cap] : named) caps.fields.emplace(name, cap);
  return caps;
}

absl::Status ScanWire(const Descriptor& type, google::protobuf::io::ZeroCopyInputStream* in, const WireCaps& caps) {
  CodedInputStream coded(in);
  Scanner scanner(type, caps);
  return scanner.Message(type, coded);
}

absl::Status DecodeRequest(const grpc::ByteBuffer& raw, const WireCaps& caps, google::protobuf::Message* out) {
  // Copies of a ByteBuffer share its slices; each reader consumes its own copy.
  grpc::ByteBuffer for_scan(raw), for_parse(raw);
  grpc::ProtoBufferReader scan(&for_scan), parse(&for_parse);
  return Decode(&scan, &parse, caps, out);
}

absl::Status DecodeRequest(const void* data, size_t size, const WireCaps& caps, google::protobuf::Message* out) {
  google::protobuf::io::ArrayInputStream scan(data, static_cast<int>(size)), parse(data, static_cast<int>(size));
  return Decode(&scan, &parse, caps, out);
}

}  // namespace qvi
