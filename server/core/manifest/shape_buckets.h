// The batch shapes a model's CUDA graphs are captured at: a batch of B texts padded to T tokens runs
// the graph of the smallest bucket (b, t) with b >= B and t >= T, padded up to it; a batch that
// fits no bucket runs without a graph. Pure arithmetic, no torch (tested alone).
#ifndef QVI_SERVER_CORE_MANIFEST_SHAPE_BUCKETS_H_
#define QVI_SERVER_CORE_MANIFEST_SHAPE_BUCKETS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace qvi {

// `first`, 2·first, 4·first, ... while below `max`, then `max` itself: {1,2,4,8,16,32} for (1, 32),
// {8,16,32,64,100} for (8, 100). Empty when max < 1; {max} when max <= first.
std::vector<int64_t> PowersOfTwoUpTo(int64_t first, int64_t max);

struct ShapeBucket {
  int64_t batch = 0;
  int64_t tokens = 0;
  bool operator==(const ShapeBucket& o) const { return batch == o.batch && tokens == o.tokens; }
  bool operator<(const ShapeBucket& o) const { return batch != o.batch ? batch < o.batch : tokens < o.tokens; }
};

class ShapeBuckets {
 public:
  // The most graphs one model instance may hold (batch sizes × lengths): each costs capture time at
  // load and device memory for its outputs.
  static constexpr size_t kMaxBuckets = 256;

  ShapeBuckets() = default;
  // Both lists strictly ascending and positive (Check() says so first).
  ShapeBuckets(std::vector<int64_t> batch_sizes, std::vector<int64_t> lengths);

  // Why these lists cannot be buckets (empty, unsorted, repeated, < 1, above the model's maxima, too
  // many together), naming `where` (e.g. "serving.json: 'cuda_graphs'") and the limit; OK otherwise.
  static absl::Status Check(const std::vector<int64_t>& batch_sizes, const std::vector<int64_t>& lengths,
                            int64_t max_batch, int64_t max_tokens, const std::string& where);

  // The smallest bucket that holds a batch of `batch` texts of `tokens` tokens; none when it is
  // larger than every bucket.
  std::optional<ShapeBucket> Fit(int64_t batch, int64_t tokens) const;

  // Every bucket, smallest batch first, then by length.
  std::vector<ShapeBucket> All() const;
  size_t size() const { return batch_sizes_.size() * lengths_.size(); }
  const std::vector<int64_t>& batch_sizes() const { return batch_sizes_; }
  const std::vector<int64_t>& lengths() const { return lengths_; }

 private:
  std::vector<int64_t> batch_sizes_;
  std::vector<int64_t> lengths_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MANIFEST_SHAPE_BUCKETS_H_
