// `qvi-client batch`: a file of texts scored over ClassifyStream / TagStream, JSONL answers out,
// resumable (the ids already answered in the output are skipped), with a progress line and a summary.
// Many requests are in flight on one stream (--concurrency); a request refused with UNAVAILABLE or
// RESOURCE_EXHAUSTED is sent again after a backoff (never sooner than the server's retry advice), at
// most --retries times; a stream that breaks is opened again with its unanswered requests. The formats
// and rules are the Python client's (qvi_client.batch), so either can resume the other's run.
#ifndef QVI_CLIENT_BATCH_H_
#define QVI_CLIENT_BATCH_H_

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "client/batch_io.h"
#include "qvi/serving/v1/inference.grpc.pb.h"

namespace qvi::client {

struct BatchOptions {
  std::string input, output;
  std::string model;
  int64_t version = 0;
  std::string task = "classify";  // or "tag"
  serving::v1::OutputOptions outputs;
  serving::v1::Priority priority = serving::v1::PRIORITY_UNSPECIFIED;
  std::string format;  // "jsonl", "csv", "text"; empty: from the input's extension
  std::string text_field = "text", id_field = "id";
  int texts_per_request = 1;
  int concurrency = 64;
  int retries = 5;
  double backoff_seconds = 0.1, max_backoff_seconds = 10;
  std::string api_key;  // sent as `authorization: Bearer KEY`
  bool progress = false;
};

struct BatchSummary {
  int64_t texts = 0, skipped = 0, answered = 0, retries = 0;
  std::map<std::string, int64_t> errors;  // texts that failed, by gRPC code name
  double seconds = 0;
  int64_t failed() const;
  // "120 texts: 118 answered, 2 failed (INVALID_ARGUMENT 2), 0 already in the output; 3 requests sent
  // again; 1.2 s, 98.3 texts/s", as the Python client prints it.
  std::string Line() const;
};

// Scores `todo` over one stream after another until each text is answered or has failed, writing a
// line per text to `out`. Returns the status of a stream refused in a way no retry mends
// (UNAUTHENTICATED, say), else OK; `summary` counts what was done either way.
grpc::Status RunBatch(serving::v1::Inference::Stub& stub, const BatchOptions& options,
                      const std::vector<BatchText>& todo, std::ostream& out, BatchSummary* summary);

// The `batch` subcommand's options, into `options` (the API key and the server are the program's).
CLI::App* AddBatchCommand(CLI::App& app, BatchOptions& options, std::vector<std::string>& explain);

// Runs the subcommand: reads the input, skips what the output holds, scores the rest; prints the
// summary; the exit code (0 all answered, 1 some failed, 2 the run could not be done).
int RunBatchCommand(serving::v1::Inference::Stub& stub, BatchOptions options, const std::vector<std::string>& explain,
                    const std::string& server);

}  // namespace qvi::client

#endif  // QVI_CLIENT_BATCH_H_
