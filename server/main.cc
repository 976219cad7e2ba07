// qvi-server: parse options, load the model store, serve qvi.serving.v1.Inference and the Open
// Inference Protocol with health and reflection, and on SIGTERM/SIGINT drain and exit 0. The parts
// and their order live in server.h; this file is the process: options, signals, logging, exit code.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "server/core/base/env.h"
#include "server/core/sched/cpu_policy.h"
#include "server/logging.h"
#include "server/server.h"
#include "server/server_options.h"

namespace qvi {
namespace {

int WaitForSignal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
}

// Waits until start-up has ended or a signal came, whichever is first; returns the signal, or 0.
// Start-up runs on a thread of its own so that a signal is acted on from the first second, not
// after every model has loaded (minutes, or never for a hung load).
int WaitForStartOrSignal(const std::future<absl::Status>& started, const sigset_t& signals) {
  const timespec tick{0, 100 * 1000 * 1000};  // how often to look at the start-up thread
  while (started.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig > 0) return sig;
  }
  return 0;
}

// The process's way out when abandoned model loads still run: their threads may be inside torch,
// and exit()'s destructors must not run under them. Logs are flushed first.
int ExitWithoutWaitingForLoads(const Server& server, int code) {
  const std::vector<std::string> running = server.LoadsStillRunning();
  if (running.empty()) return code;
  spdlog::warn("not waiting for {} abandoned model load(s) still running: {}", running.size(),
               absl::StrJoin(running, ", "));
  ShutdownLogging();
  std::_Exit(code);
}

int Run(ServerOptions options, const sigset_t& signals, const absl::Status& policy) {
  ConfigureLogging(options.logging.level, options.logging.format == "json" ? LogFormat::kJson : LogFormat::kText,
                   static_cast<size_t>(options.logging.access_log_queue));
  RouteLibraryLogs();
  if (!policy.ok())
    spdlog::warn("--sched-batch: {}; the threads keep the default policy", std::string(policy.message()));
  auto server = std::make_unique<Server>(std::move(options));
  std::promise<absl::Status> start;
  std::future<absl::Status> started = start.get_future();
  std::thread starter = Env::Default()->StartThread("qvi-start", [&] { start.set_value(server->Start()); });
  int sig = WaitForStartOrSignal(started, signals);
  if (sig != 0 && started.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    spdlog::info("received signal {} during start-up: abandoning model loads, not serving", sig);
    server->Abort();
  }
  starter.join();
  if (absl::Status status = started.get(); !status.ok()) {
    if (sig != 0) {
      spdlog::info("stopped during start-up");
      return ExitWithoutWaitingForLoads(*server, 0);
    }
    spdlog::critical("{}", std::string(status.message()));
    return ExitWithoutWaitingForLoads(*server, 1);
  }
  // Serving: SIGHUP reads the key file again; SIGTERM or SIGINT drains.
  sigset_t serving = signals;
  sigaddset(&serving, SIGHUP);
  while (sig == 0 || sig == SIGHUP) {
    if (sig == SIGHUP) server->Reload();
    sig = WaitForSignal(serving);
  }
  if (server->Drain(sig, signals) != 0) {
    FlushLogsNow();  // not the access queue: stderr may be what is stuck
    std::_Exit(1);   // a call or batch still runs: no destructor may wait for it
  }
  return ExitWithoutWaitingForLoads(*server, 0);
}

}  // namespace
}  // namespace qvi

#ifdef QVI_WITH_JEMALLOC
// jemalloc's start-up options, read from this symbol of the executable (MALLOC_CONF in the
// environment overrides them): a background thread returns dirty pages to the system as they age,
// not only when some thread next allocates. The 30-minute soak measured this setting
// (docs/serving.md "Soak").
extern "C" {
const char* malloc_conf = "background_thread:true";
}
#endif

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition against a graph of lock orders (its deadlock
  // detection, on unless Abseil itself was built with NDEBUG): 2-3 % of the server's CPU under load
  // (docs/performance.md, "The cost of serving itself"). The server's unit, stress and lock-analysis
  // tests keep it on, so a lock-order cycle is still caught there.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Block the shutdown signals in every thread (they inherit this mask); the main thread takes them
  // with sigwait, so no handler runs in an arbitrary thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // SIGHUP (read the key file again) is blocked too, and taken only while serving (Run).
  sigset_t blocked = signals;
  sigaddset(&blocked, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  // A handler besides the mask: as a container's PID 1 the process would otherwise not be sent
  // SIGTERM at all (the kernel drops signals that PID 1 leaves at their default action). Never runs:
  // the signals stay blocked and sigwait takes them.
  struct sigaction noop = {};
  noop.sa_handler = [](int) {};
  sigaction(SIGTERM, &noop, nullptr);
  sigaction(SIGINT, &noop, nullptr);
  sigaction(SIGHUP, &noop, nullptr);

  absl::StatusOr<qvi::ServerOptions> options = qvi::ParseServerOptions(argc, argv);
  if (!options.ok()) {
    const bool info = options.status().code() == absl::StatusCode::kCancelled;
    (info ? std::cout : std::cerr) << options.status().message();
    return info ? 0 : 2;
  }
  // Before Run() starts the logging, gRPC and model threads, so that they all inherit the policy.
  absl::Status policy = options->threads.sched_batch ? qvi::UseBatchScheduling() : absl::OkStatus();
  const int code = qvi::Run(*std::move(options), signals, policy);
  qvi::ShutdownLogging();
  return code;
}
