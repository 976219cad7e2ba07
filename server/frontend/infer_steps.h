// The steps of every inference call once its transport has admitted and decoded it, written once here
// for all of them: gRPC's native API and OIP (server/grpc/infer_call.h), each request of a gRPC stream
// (infer_stream.h), HTTP's native routes and OIP's REST (server/http/). A new step of every call is an
// edit here.
//
//   plan     the API checks the decoded request against a model and says what to run (a Planned);
//   wait     a plan that found its model loading on demand (WaitsForLoad) waits for the load, within
//            the call's deadline, and plans again on the thread that loaded it, with the version the load
//            made READY (Call::loaded); again only when that version is not the one asked for (another
//            version of the model is still loading): each wait ends with a load or at the deadline; the
//            call keeps when its waiting began and ended, for its trace (qvi.load_wait);
//   prepare  the transport's request id, deadline, priority and cancellation, then Call::Prepare (the
//            limits, the request held);
//   submit   to the core, whose answer the transport turns into its own.
// The call is answered exactly once, whatever fails (an exception too: bad_alloc decoding or planning).
//
// A transport's call is a `Steps` value, copied into the wait's callback when there is one:
//   Call& call();
//   absl::Time WaitDeadline();                     the wait's deadline, on the core's clock
//   absl::StatusOr<P> Plan();                      P: Planned, or a type derived from it
//   absl::Status Prepare(InferenceRequest&, absl::Duration timeout);
//   void Fail(const absl::Status&);                answers with the error (a second answer is ignored)
//   Core::Done Answerer(P&&);                      what answers the core's answer
#ifndef QVI_SERVER_FRONTEND_INFER_STEPS_H_
#define QVI_SERVER_FRONTEND_INFER_STEPS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/core/base/exception_text.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"

namespace qvi {

// What an API makes of one call once it has decoded and checked it.
struct Planned {
  Method method = Method::kClassify;
  InferenceRequest request;  // request_id: the client's, or empty for one made up when prepared
  // The version the plan was checked against (OIP reads its manifest to plan the tensors): the core
  // answers from it. Null: the core resolves the request's model and version, once.
  ServableHandle servable;
  absl::Duration timeout = absl::InfiniteDuration();  // the API's own timeout, beside the transport's deadline
};

template <typename Steps>
void PlanAndSubmit(Core* core, Steps steps, bool waited = false) {
  try {
    auto planned = steps.Plan();
    if (!planned.ok() && (!waited || steps.call().loaded != nullptr) && WaitsForLoad(planned.status())) {
      const std::string model = steps.call().model;
      const absl::Time deadline = steps.WaitDeadline();
      // The version an earlier wait handed over is not the one asked for: not held while waiting again,
      // so that it does not keep the memory the next load may need.
      steps.call().loaded = nullptr;
      if (steps.call().load_wait_start == absl::InfiniteFuture()) steps.call().load_wait_start = core->env().Now();
      // `steps` copied, not moved: a throw from here on still answers through it (the catch below).
      core->WhenLoaded(model, deadline, [core, steps](absl::StatusOr<ServableHandle> loaded) mutable {
        steps.call().load_wait_end = core->env().Now();
        if (!loaded.ok()) return steps.Fail(loaded.status());
        steps.call().loaded = *std::move(loaded);
        PlanAndSubmit(core, std::move(steps), /*waited=*/true);
      });
      return;
    }
    if (!planned.ok()) return steps.Fail(planned.status());
    InferenceRequest request = std::move(planned->request);
    ServableHandle servable = std::move(planned->servable);
    if (servable == nullptr) servable = Serving(steps.call().loaded, request.model, request.version);
    steps.call().loaded = nullptr;  // the request holds it from here
    if (absl::Status s = steps.Prepare(request, planned->timeout); !s.ok()) return steps.Fail(s);
    const Method method = planned->method;
    core->Submit(method, std::move(request), steps.Answerer(*std::move(planned)), std::move(servable));
  } catch (...) {
    steps.Fail(absl::InternalError(absl::StrCat("accepting the request failed: ", CurrentExceptionText())));
  }
}

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_INFER_STEPS_H_
