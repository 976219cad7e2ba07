// qvi-server: parse options, load the model store, serve qvi.serving.v1.Inference and the Open
// Inference Protocol with health and reflection, and on SIGTERM/SIGINT drain and exit 0. The parts
// and their order live in server.h; this file is the process: options, signals, logging, exit code.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <iostream>

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

int Run(ServerOptions options, const sigset_t& signals) {
  ConfigureLogging(options.logging.level, options.logging.format == "json" ? LogFormat::kJson : LogFormat::kText,
                   static_cast<size_t>(options.logging.access_log_queue));
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(options));
  if (!server.ok()) {
    spdlog::critical("{}", std::string(server.status().message()));
    return 1;
  }
  const int sig = WaitForSignal(signals);
  if ((*server)->Drain(sig, signals) != 0) {
    FlushLogsNow();  // not the access queue: stderr may be what is stuck
    std::_Exit(1);   // a call or batch still runs: no destructor may wait for it
  }
  return 0;
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
  // Block the shutdown signals in every thread (they inherit this mask); the main thread takes them
  // with sigwait, so no handler runs in an arbitrary thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A handler besides the mask: as a container's PID 1 the process would otherwise not be sent
  // SIGTERM at all (the kernel drops signals that PID 1 leaves at their default action). Never runs:
  // the signals stay blocked and sigwait takes them.
  struct sigaction noop = {};
  noop.sa_handler = [](int) {};
  sigaction(SIGTERM, &noop, nullptr);
  sigaction(SIGINT, &noop, nullptr);

  absl::StatusOr<qvi::ServerOptions> options = qvi::ParseServerOptions(argc, argv);
  if (!options.ok()) {
    const bool info = options.status().code() == absl::StatusCode::kCancelled;
    (info ? std::cout : std::cerr) << options.status().message();
    return info ? 0 : 2;
  }
  const int code = qvi::Run(*std::move(options), signals);
  qvi::ShutdownLogging();
  return code;
}
