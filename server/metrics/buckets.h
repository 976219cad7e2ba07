// The histograms' buckets, shared by the metrics' files.
#ifndef QVI_SERVER_METRICS_BUCKETS_H_
#define QVI_SERVER_METRICS_BUCKETS_H_

#include <prometheus/histogram.h>

namespace qvi {

// 100 µs .. 10 s in 1-2-5 steps.
inline prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10};
}
inline prometheus::Histogram::BucketBoundaries PowersOfTwo(double from, double to) {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = from; v <= to; v *= 2) b.push_back(v);
  return b;
}
inline prometheus::Histogram::BucketBoundaries Ratios() {
  return {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
}

}  // namespace qvi

#endif  // QVI_SERVER_METRICS_BUCKETS_H_
