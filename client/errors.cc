#include "client/errors.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"

namespace qvi::client {

std::string ErrorLines(const grpc::Status& s, const std::string& server) {
  // grpc::StatusCode and absl::StatusCode share their numbers (both are the canonical gRPC codes).
  std::string out = "error: " + absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())) + ": " +
                    s.error_message() + "\n";
  const std::string& m = s.error_message();
  std::string hint;
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
      (m.find("failed to connect") != std::string::npos || m.find("Connection refused") != std::string::npos)) {
    hint = "no server answered at " + server +
           ": start one with scripts/run.sh, or name where one runs with --server host:port";
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    hint = "no answer within --timeout; give it longer (seconds), or ask for fewer texts or explanations";
  } else if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    hint = "qvi-client models lists the models the server has";
  } else if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && m.find("API key") != std::string::npos) {
    hint = "give the key with --api-key KEY, or in the environment as QVI_API_KEY (kept out of the shell's history)";
  } else if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED && m.rfind("priority:", 0) == 0) {
    hint = "ask for a lower --priority, or for a key that may ask for this one";
  } else if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    hint = "ask whoever runs the server for a key with that scope";
  } else if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED || m.find("handshake") != std::string::npos) {
    hint = "a server with TLS needs --tls-ca (and --tls-cert/--tls-key where it asks for a client certificate)";
  }
  if (!hint.empty()) out += "hint: " + hint + "\n";
  return out;
}

std::string UnknownSubcommand(const std::vector<std::string>& args, const std::vector<std::string>& subcommands) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("-", 0) == 0) {
      // an option; "--server host:port" and the like take the next word as their value
      const bool bare = a == "--json" || a == "--help" || a == "-h";
      if (a.find('=') == std::string::npos && !bare && i + 1 < args.size()) ++i;
      continue;
    }
    if (std::find(subcommands.begin(), subcommands.end(), a) != subcommands.end()) return "";
    std::string names;
    for (size_t k = 0; k < subcommands.size(); ++k) {
      names += (k == 0 ? "" : k + 1 == subcommands.size() ? " or " : ", ") + subcommands[k];
    }
    return "qvi-client: '" + a + "' is not a subcommand: use " + names + " (qvi-client --help)";
  }
  return "";
}

}  // namespace qvi::client
