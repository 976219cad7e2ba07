#include "tests/cpp/test_util/server_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "tests/cpp/test_util/store.h"

namespace qvi::testing {

namespace fs = std::filesystem;

void ServerProcess::Start(const std::string& name) {
  dir_ = fs::temp_directory_path() / ("qvi_e2e_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir_);
  fs::create_directories(dir_ / "store");
  for (const char* model : kGloveDemoModels) {  // whatever else the demo store holds
    fs::copy(fs::path(QVI_SOURCE_DIR) / "model_store" / "store" / model, dir_ / "store" / model,
             fs::copy_options::recursive);
  }
  fs::create_directories(dir_ / "store" / "sentiment" / "7");
  std::ofstream(dir_ / "store" / "sentiment" / "7" / "model.pt") << "corrupt";
  std::ofstream(dir_ / "store" / "sentiment" / "serving.json") << R"({"max_batch_size": 4, "instances": 2})";
  const std::string port_file = (dir_ / "port").string();
  const std::string store = (dir_ / "store").string();
  const std::string log = (dir_ / "server.log").string();
  pid_ = fork();
  if (pid_ == 0) {
    freopen(log.c_str(), "w", stderr);
    freopen(log.c_str(), "a", stdout);
    execl(QVI_SERVER_BINARY, QVI_SERVER_BINARY, "--model-store", store.c_str(), "--port", "0", "--host", "127.0.0.1",
          "--port-file", port_file.c_str(), "--device", "cpu", "--access-log", "--max-texts-per-request", "8",
          "--max-text-bytes", "1000", "--log-level", "debug", "--metrics-port", "0", "--shutdown-delay-seconds", "2",
          "--http-port", "-1", nullptr);
    _exit(127);
  }
  for (int i = 0; i < 1200 && !fs::exists(port_file); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // waiting on a process, not a clock
    int status = 0;
    ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "qvi-server exited early; see " << log;
  }
  ASSERT_TRUE(fs::exists(port_file)) << "qvi-server did not start within 120 s";
  std::ifstream(port_file) >> port_;
  channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials());
}

int ServerProcess::StopAndWait(int sig) {
  Signal(sig);
  return Wait();
}

void ServerProcess::Signal(int sig) { kill(pid_, sig); }

int ServerProcess::Wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) StopAndWait(SIGKILL);
  fs::remove_all(dir_);
}

std::string ServerProcess::Log() const {
  std::ifstream in(dir_ / "server.log");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace qvi::testing
