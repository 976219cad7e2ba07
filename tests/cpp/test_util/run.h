// The core's answer to one request, waited for: InferenceService::Submit with a done-callback that
// hands the answer back. For tests, which want a value; the server itself never waits.
#ifndef QVI_TESTS_CPP_TEST_UTIL_RUN_H_
#define QVI_TESTS_CPP_TEST_UTIL_RUN_H_

#include <memory>
#include <string>

#include "server/core/serving/inference_service.h"

namespace qvi::testing {

// The catalogue's outputs of these names (outputs.h); a name it lacks fails the test at once.
OutputSet Named(std::initializer_list<std::string_view> names);
OutputSet Named(const std::vector<std::string>& names);

// A repository over the store at `root` on the CPU with the default settings, polled once (so the
// versions the store holds are loaded, or failed, when it returns).
absl::StatusOr<std::unique_ptr<ModelRepository>> PolledCpuRepository(const std::string& root);

// `servable`: the version the caller resolved (see InferenceService::Submit); null: the core resolves.
absl::StatusOr<InferenceResponse> RunAndWait(InferenceService& service, Method method, InferenceRequest request,
                                             ServableHandle servable = nullptr);

}  // namespace qvi::testing

#endif  // QVI_TESTS_CPP_TEST_UTIL_RUN_H_
