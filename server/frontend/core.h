// What a front end needs of the core: hand it a request, read its limits and its clock. The server's
// core is InferenceService (ServingCore below); the front ends' in-process tests put a fake in its
// place (tests/cpp/frontend/), so that an adapter is tested alone against answers it cannot get from
// a real model (an error of each code, an answer over the send limit, a request that never returns).
#ifndef QVI_SERVER_FRONTEND_CORE_H_
#define QVI_SERVER_FRONTEND_CORE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "server/core/base/env.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/inference_service.h"

namespace qvi {

class Core {
 public:
  using Done = InferenceService::Done;
  virtual ~Core() = default;

  // InferenceService::Submit's contract: `done` is called exactly once.
  virtual void Submit(Method method, InferenceRequest request, Done done, ServableHandle servable = nullptr) = 0;
  virtual const RequestLimits& limits() const = 0;
  // The clock of InferenceRequest::deadline.
  virtual const Env& env() const = 0;
  // Runs `work` off the caller's thread, on a request thread (InferenceService::TryRun); false when their queue
  // is full and nothing ran. A core with no threads of its own (the tests' fakes) runs it here.
  virtual bool TryRun(std::function<void()> work) {
    work();
    return true;
  }
  // ModelRepository::WhenLoaded: for a plan that resolved a model which loads on demand (WaitsForLoad).
  virtual void WhenLoaded(const std::string& model, absl::Time /*deadline*/, ModelRepository::LoadedDone ready) {
    ready(absl::UnavailableError(absl::StrCat("model '", Capped(model), "' is not loaded")));
  }
  // The comparisons of `model`'s shadow candidates so far (ShadowMirror::Summaries); none without a mirror.
  virtual std::vector<ShadowSummary> ShadowSummaries(const std::string& /*model*/) const { return {}; }
};

// The server's core.
class ServingCore final : public Core {
 public:
  explicit ServingCore(InferenceService* service) : service_(service) {}
  void Submit(Method method, InferenceRequest request, Done done, ServableHandle servable = nullptr) override {
    service_->Submit(method, std::move(request), std::move(done), std::move(servable));
  }
  const RequestLimits& limits() const override { return service_->limits(); }
  const Env& env() const override { return service_->env(); }
  bool TryRun(std::function<void()> work) override { return service_->TryRun(std::move(work)); }
  void WhenLoaded(const std::string& model, absl::Time deadline, ModelRepository::LoadedDone ready) override {
    service_->WhenLoaded(model, deadline, std::move(ready));
  }
  std::vector<ShadowSummary> ShadowSummaries(const std::string& model) const override {
    return service_->shadow() == nullptr ? std::vector<ShadowSummary>{} : service_->shadow()->Summaries(model);
  }

 private:
  InferenceService* const service_;
};

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_CORE_H_
