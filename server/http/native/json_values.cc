#include "server/http/native/json_values.h"

#include <google/protobuf/reflection.h>

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qvi::json_body {

using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

namespace {

// Text that protobuf's mapping reads as a number: an integer, or a JSON number (`fraction`).
bool NumberText(const std::string& s, bool fraction) {
  size_t i = s.size() > 1 && s[0] == '-' ? 1 : 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > from;
  };
  if (!digits()) return false;
  if (fraction && i < s.size() && s[i] == '.' && !(++i, digits())) return false;
  if (fraction && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

// `x` as a T when T holds it exactly.
template <typename T, typename X>
std::optional<T> Fit(X x) {
  if constexpr (std::is_signed_v<X>) {
    if (x < 0) {
      if constexpr (std::is_signed_v<T>) {
        if (x >= static_cast<int64_t>(std::numeric_limits<T>::min())) return static_cast<T>(x);
      }
      return std::nullopt;
    }
  }
  if (static_cast<uint64_t>(x) > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
  return static_cast<T>(x);
}

// An integer field's value: a JSON integer, a number with no fraction, or a string of digits.
template <typename T>
std::optional<T> Integer(const Scalar& v) {
  switch (v.kind) {
    case Scalar::kSigned:
      return Fit<T>(v.i);
    case Scalar::kUnsigned:
      return Fit<T>(v.u);
    case Scalar::kFloat: {
      // The bounds are powers of two, so exact as doubles: [min, max + 1).
      const double low = static_cast<double>(std::numeric_limits<T>::min());
      const double high = 2.0 * static_cast<double>(std::numeric_limits<T>::max() / 2 + 1);
      if (!(v.d >= low && v.d < high) || v.d != std::trunc(v.d)) return std::nullopt;
      return static_cast<T>(v.d);
    }
    case Scalar::kString: {
      T t;
      if (!NumberText(*v.text, false) || !absl::SimpleAtoi(*v.text, &t)) return std::nullopt;
      return t;
    }
    default:
      return std::nullopt;
  }
}

// A floating-point field's value: a number (an integer only where a double holds it exactly), or a
// string holding one, "NaN", "Infinity" or "-Infinity".
std::optional<double> Floating(const Scalar& v) {
  constexpr double kTwo63 = 9223372036854775808.0;
  switch (v.kind) {
    case Scalar::kSigned:
      if (const double d = static_cast<double>(v.i); d < kTwo63 && static_cast<int64_t>(d) == v.i) return d;
      return std::nullopt;
    case Scalar::kUnsigned:
      if (const double d = static_cast<double>(v.u); d < 2 * kTwo63 && static_cast<uint64_t>(d) == v.u) return d;
      return std::nullopt;
    case Scalar::kFloat:
      return v.d;
    case Scalar::kString: {
      const std::string& s = *v.text;
      if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
      if (s == "Infinity" || s == "-Infinity") return (s[0] == '-' ? -1 : 1) * std::numeric_limits<double>::infinity();
      double d = 0;
      if (!NumberText(s, true) || !absl::SimpleAtod(s, &d) || std::isinf(d)) return std::nullopt;
      return d;
    }
    default:
      return std::nullopt;
  }
}

// A float field's value: Floating's, within float's range.
std::optional<float> Float(const Scalar& v) {
  const std::optional<double> d = Floating(v);
  if (!d || (std::isfinite(*d) && std::abs(*d) > std::numeric_limits<float>::max())) return std::nullopt;
  return static_cast<float>(*d);
}

// An enum field's value: a value's name, or a whole number (a proto2 enum's only when it names one).
std::optional<int> EnumNumber(const FieldDescriptor* f, const Scalar& v) {
  if (v.kind == Scalar::kString) {
    const EnumValueDescriptor* e = f->enum_type()->FindValueByName(*v.text);
    return e != nullptr ? std::optional<int>(e->number()) : std::nullopt;
  }
  if (v.kind == Scalar::kNull || v.kind == Scalar::kBool) return std::nullopt;
  const std::optional<int> number = Integer<int32_t>(v);
  const bool open = f->enum_type()->file()->syntax() == FileDescriptor::SYNTAX_PROTO3;
  if (number && !open && f->enum_type()->FindValueByNumber(*number) == nullptr) return std::nullopt;
  return number;
}

}  // namespace

bool Assign(Message* m, const FieldDescriptor* f, bool add, const Scalar& v) {
  const Reflection& r = *m->GetReflection();
  const auto put = [&](auto value, auto set, auto append) {
    if (!value) return false;
    add ? (r.*append)(m, f, *value) : (r.*set)(m, f, *value);
    return true;
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      if (v.kind != Scalar::kString) return false;
      add ? r.AddString(m, f, *v.text) : r.SetString(m, f, *v.text);
      return true;
    case FieldDescriptor::CPPTYPE_BOOL:
      return put(v.kind == Scalar::kBool ? std::optional<bool>(v.boolean) : std::nullopt, &Reflection::SetBool,
                 &Reflection::AddBool);
    case FieldDescriptor::CPPTYPE_INT32:
      return put(Integer<int32_t>(v), &Reflection::SetInt32, &Reflection::AddInt32);
    case FieldDescriptor::CPPTYPE_INT64:
      return put(Integer<int64_t>(v), &Reflection::SetInt64, &Reflection::AddInt64);
    case FieldDescriptor::CPPTYPE_UINT32:
      return put(Integer<uint32_t>(v), &Reflection::SetUInt32, &Reflection::AddUInt32);
    case FieldDescriptor::CPPTYPE_UINT64:
      return put(Integer<uint64_t>(v), &Reflection::SetUInt64, &Reflection::AddUInt64);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return put(Floating(v), &Reflection::SetDouble, &Reflection::AddDouble);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return put(Float(v), &Reflection::SetFloat, &Reflection::AddFloat);
    case FieldDescriptor::CPPTYPE_ENUM:
      return put(EnumNumber(f, v), &Reflection::SetEnumValue, &Reflection::AddEnumValue);
    default:
      return false;
  }
}

std::string Expected(const FieldDescriptor* f, bool in_list) {
  std::string one;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      one = absl::StrCat("an object (", f->message_type()->name(), ")");
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      one = absl::StrCat("one of ", f->enum_type()->name(), "'s names (");
      for (int i = 0; i < f->enum_type()->value_count() && i < 8; ++i) {
        absl::StrAppend(&one, i > 0 ? ", " : "", f->enum_type()->value(i)->name());
      }
      absl::StrAppend(&one, ") or a number");
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      one = "a string";
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      one = "true or false";
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      one = absl::StrCat("a number within ", f->type_name(), R"( (or "NaN", "Infinity", "-Infinity"))");
      break;
    default:
      one = absl::StrCat("a whole number within ", f->type_name());
  }
  return f->is_repeated() && !in_list ? absl::StrCat("a list of which each is ", one) : one;
}

}  // namespace qvi::json_body
