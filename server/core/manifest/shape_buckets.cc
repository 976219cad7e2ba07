#include "server/core/manifest/shape_buckets.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace qvi {

std::vector<int64_t> PowersOfTwoUpTo(int64_t first, int64_t max) {
  std::vector<int64_t> out;
  if (max < 1) return out;
  for (int64_t v = std::max<int64_t>(first, 1); v < max; v *= 2) out.push_back(v);
  out.push_back(max);
  return out;
}

ShapeBuckets::ShapeBuckets(std::vector<int64_t> batch_sizes, std::vector<int64_t> lengths)
    : batch_sizes_(std::move(batch_sizes)), lengths_(std::move(lengths)) {}

absl::Status ShapeBuckets::Check(const std::vector<int64_t>& batch_sizes, const std::vector<int64_t>& lengths,
                                 int64_t max_batch, int64_t max_tokens, const std::string& where) {
  auto check = [&](const std::vector<int64_t>& v, const char* field, int64_t max, const char* max_name) {
    if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " '", field, "' is empty"));
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 1 || v[i] > max) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " '", field, "' has ", v[i], "; each must be in 1..", max, " (", max_name, ")"));
      }
      if (i > 0 && v[i] <= v[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " '", field, "' must be strictly ascending; ", v[i], " follows ", v[i - 1]));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check(batch_sizes, "batch_sizes", max_batch, "max_batch_size"); !s.ok()) return s;
  if (absl::Status s = check(lengths, "lengths", max_tokens, "the model's max_tokens"); !s.ok()) return s;
  if (batch_sizes.size() * lengths.size() > kMaxBuckets) {
    return absl::InvalidArgumentError(absl::StrCat(where, " asks for ", batch_sizes.size(), " batch sizes × ",
                                                   lengths.size(), " lengths = ", batch_sizes.size() * lengths.size(),
                                                   " graphs per instance; at most ", kMaxBuckets));
  }
  return absl::OkStatus();
}

std::optional<ShapeBucket> ShapeBuckets::Fit(int64_t batch, int64_t tokens) const {
  auto b = std::lower_bound(batch_sizes_.begin(), batch_sizes_.end(), batch);
  auto t = std::lower_bound(lengths_.begin(), lengths_.end(), tokens);
  if (b == batch_sizes_.end() || t == lengths_.end()) return std::nullopt;
  return ShapeBucket{*b, *t};
}

std::vector<ShapeBucket> ShapeBuckets::All() const {
  std::vector<ShapeBucket> out;
  out.reserve(size());
  for (int64_t b : batch_sizes_) {
    for (int64_t t : lengths_) out.push_back({b, t});
  }
  return out;
}

}  // namespace qvi
