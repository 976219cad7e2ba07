// The real qvi-server binary as a child process, for the end-to-end tests: a copy of the demo store
// (plus a corrupt version and a serving.json) in a temporary folder, a free port, the debug log and
// the access log in <folder>/server.log. Needs no torch: e2e_test links only gRPC.
#ifndef QVI_TESTS_CPP_TEST_UTIL_SERVER_PROCESS_H_
#define QVI_TESTS_CPP_TEST_UTIL_SERVER_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>

namespace qvi::testing {

class ServerProcess {
 public:
  // Starts the server and waits (at most 120 s) until it has written its port; a failure is a test
  // failure (gtest ASSERT). `name` keeps the folders of servers started by one test process apart.
  void Start(const std::string& name = "shared");

  // Sends `sig` and returns the exit code (128 + signal when killed).
  int StopAndWait(int sig);
  void Signal(int sig);
  int Wait();

  ~ServerProcess();

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string Log() const;

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace qvi::testing

#endif  // QVI_TESTS_CPP_TEST_UTIL_SERVER_PROCESS_H_
