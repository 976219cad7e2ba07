// qvi-perf's closed loop over ClassifyStream / TagStream (--protocol stream): the same requests as the
// unary loop, sent as messages of long-lived streams, so that the cost of a call per text can be set
// beside the cost of a message per text.
#ifndef QVI_CLIENT_PERF_STREAM_H_
#define QVI_CLIENT_PERF_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "client/perf_step.h"
#include "qvi/serving/v1/inference.grpc.pb.h"

namespace qvi::perf {

struct StreamLoad {
  std::vector<std::shared_ptr<grpc::Channel>> channels;  // a stream on each
  const std::vector<serving::v1::ClassifyRequest>* classify = nullptr;
  const std::vector<serving::v1::TagRequest>* tag = nullptr;
  bool tag_method = false;
  std::string api_key;  // sent as `authorization: Bearer KEY`
};

// `concurrency` requests in flight, spread over a stream per channel; each answer read lets its
// stream write the next request. A request's latency runs from its write to its answer's read; an
// answer's `error` counts under its code. Until `warmup` + `duration` seconds from now.
Step ClosedLoopStream(const StreamLoad& load, int concurrency, double warmup, double duration);

}  // namespace qvi::perf

#endif  // QVI_CLIENT_PERF_STREAM_H_
