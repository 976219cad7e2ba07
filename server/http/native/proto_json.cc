#include "server/http/native/proto_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The code points protobuf's JSON writer escapes beyond ASCII's: C1 controls and the invisible format
// characters (soft hyphen, bidi controls, zero-width and byte-order marks, ...), as its json_escaping.cc.
bool EscapedAboveAscii(uint32_t cp) {
  static constexpr std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x80, 0x9f},       {0xad, 0xad},       {0x600, 0x603},     {0x6dd, 0x6dd},    {0x70f, 0x70f},   {0x17b4, 0x17b5},
      {0x200b, 0x200f},   {0x2028, 0x202e},   {0x2060, 0x2064},   {0x206a, 0x206f},  {0xfeff, 0xfeff}, {0xfff9, 0xfffb},
      {0x110bd, 0x110bd}, {0x1d173, 0x1d17a}, {0xe0001, 0xe0001}, {0xe0020, 0xe007f}};
  for (const auto& [low, high] : kRanges) {
    if (cp >= low && cp <= high) return true;
  }
  return false;
}

// `unit` is one UTF-16 code unit (<= 0xFFFF): four lower-case hex digits, as protobuf writes them.
void AppendEscape(uint32_t unit, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  const char escape[6] = {
      '\\', 'u', kHex[(unit >> 12) & 0xF], kHex[(unit >> 8) & 0xF], kHex[(unit >> 4) & 0xF], kHex[unit & 0xF]};
  out->append(escape, sizeof escape);
}

// The code point at s[i] and its length in bytes; 0 for a byte that does not begin a well-formed one.
size_t DecodeUtf8(const std::string& s, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = n == 1 ? c : c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (byte(i + k) & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;  // overlong, too big, surrogate
  *cp = v;
  return n;
}

// A string as protobuf's JSON writer escapes it: quotes, backslashes, control characters, '<' and '>',
// and the code points above; false for a string that is not UTF-8.
bool AppendString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = DecodeUtf8(s, i, &cp);
    if (n == 0) return false;
    switch (cp) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (cp < 0x20 || cp == '<' || cp == '>' || cp == 0x7f || EscapedAboveAscii(cp)) {
          if (cp >= 0x10000) {  // as a UTF-16 surrogate pair
            AppendEscape(0xd800 + ((cp - 0x10000) >> 10), out);
            AppendEscape(0xdc00 + ((cp - 0x10000) & 0x3ff), out);
          } else {
            AppendEscape(cp, out);
          }
        } else {
          out->append(s, i, n);
        }
    }
    i += n;
  }
  out->push_back('"');
  return true;
}

// protobuf's SimpleFtoa / SimpleDtoa: the shortest of 6 (15) or 9 (17) significant digits that reads
// back as the same value; non-finite values as the strings JSON has for them.
template <typename T>
void AppendFloating(T v, std::string* out) {
  if (std::isnan(v)) {
    out->append("\"NaN\"");
    return;
  }
  if (std::isinf(v)) {
    out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    return;
  }
  constexpr bool kFloat = sizeof(T) == sizeof(float);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", kFloat ? FLT_DIG : DBL_DIG, static_cast<double>(v));
  // As protobuf: a float reads back through safe_strtof, for which a denormal is out of range (so not
  // exact), a double through plain strtod.
  errno = 0;
  const bool same = kFloat ? std::strtof(buf, nullptr) == static_cast<float>(v) : std::strtod(buf, nullptr) == v;
  const bool exact = same && !(kFloat && errno == ERANGE);
  if (!exact) std::snprintf(buf, sizeof buf, "%.*g", kFloat ? FLT_DIG + 3 : DBL_DIG + 2, static_cast<double>(v));
  out->append(buf);
}

bool AppendMessage(const Message& m, std::string* out);

// A number or boolean of `f` (element `index` when it is repeated, -1 otherwise); false for another type.
bool AppendScalar(const Message& m, const Reflection& r, const FieldDescriptor* f, int index, std::string* out) {
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(out, rep ? r.GetRepeatedInt32(m, f, index) : r.GetInt32(m, f));
      return true;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(out, rep ? r.GetRepeatedUInt32(m, f, index) : r.GetUInt32(m, f));
      return true;
    case FieldDescriptor::CPPTYPE_INT64:  // 64-bit integers as strings, as JSON numbers lose digits
      absl::StrAppend(out, "\"", rep ? r.GetRepeatedInt64(m, f, index) : r.GetInt64(m, f), "\"");
      return true;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(out, "\"", rep ? r.GetRepeatedUInt64(m, f, index) : r.GetUInt64(m, f), "\"");
      return true;
    case FieldDescriptor::CPPTYPE_FLOAT:
      AppendFloating(rep ? r.GetRepeatedFloat(m, f, index) : r.GetFloat(m, f), out);
      return true;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      AppendFloating(rep ? r.GetRepeatedDouble(m, f, index) : r.GetDouble(m, f), out);
      return true;
    case FieldDescriptor::CPPTYPE_BOOL:
      out->append((rep ? r.GetRepeatedBool(m, f, index) : r.GetBool(m, f)) ? "true" : "false");
      return true;
    default:
      return false;
  }
}

// One value of `f` (element `index` when it is repeated, -1 otherwise).
bool AppendValue(const Message& m, const Reflection& r, const FieldDescriptor* f, int index, std::string* out) {
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_ENUM:
      return AppendString((rep ? r.GetRepeatedEnum(m, f, index) : r.GetEnum(m, f))->name(), out);
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& s =
          rep ? r.GetRepeatedStringReference(m, f, index, &scratch) : r.GetStringReference(m, f, &scratch);
      return AppendString(f->type() == FieldDescriptor::TYPE_BYTES ? absl::Base64Escape(s) : s, out);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return AppendMessage(rep ? r.GetRepeatedMessage(m, f, index) : r.GetMessage(m, f), out);
    default:
      return AppendScalar(m, r, f, index, out);
  }
}

// One field, "name":value; false when it cannot be written here.
bool AppendField(const Message& m, const Reflection& r, const FieldDescriptor* f, bool* first, std::string* out) {
  if (!*first) out->push_back(',');
  *first = false;
  if (!AppendString(f->json_name(), out)) return false;
  out->push_back(':');
  if (!f->is_repeated()) return AppendValue(m, r, f, -1, out);
  out->push_back('[');
  const int n = r.FieldSize(m, f);
  for (int k = 0; k < n; ++k) {
    if (k > 0) out->push_back(',');
    if (!AppendValue(m, r, f, k, out)) return false;
  }
  out->push_back(']');
  return true;
}

// protobuf's order: the fields outside oneofs in declaration order -- every repeated and singular
// scalar one, defaults and empty lists included, and the messages that are set -- then the set members
// of oneofs (proto3 `optional` fields among them) by field number.
bool AppendMessage(const Message& m, std::string* out) {
  const Descriptor* d = m.GetDescriptor();
  const Reflection& r = *m.GetReflection();
  out->push_back('{');
  bool first = true;
  std::vector<const FieldDescriptor*> in_oneofs;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) return false;
    if (f->containing_oneof() != nullptr) {
      if (r.HasField(m, f)) in_oneofs.push_back(f);
      continue;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated() && !r.HasField(m, f)) continue;
    if (!AppendField(m, r, f, &first, out)) return false;
  }
  std::sort(in_oneofs.begin(), in_oneofs.end(),
            [](const FieldDescriptor* a, const FieldDescriptor* b) { return a->number() < b->number(); });
  for (const FieldDescriptor* f : in_oneofs) {
    if (!AppendField(m, r, f, &first, out)) return false;
  }
  out->push_back('}');
  return true;
}

}  // namespace

bool WriteProtoJson(const Message& message, std::string* out) {
  out->clear();
  return AppendMessage(message, out);
}

}  // namespace qvi
