#ifndef QVI_CLIENT_ERRORS_H_
#define QVI_CLIENT_ERRORS_H_

#include <grpcpp/support/status.h>

#include <string>
#include <vector>

namespace qvi::client {

// "error: NOT_FOUND: <the server's message>", and on a second line what to try where the code says
// it: no server answering at `server` (start one with scripts/run.sh, or name it with --server), a
// deadline (--timeout), a model that is not there (qvi-client models).
std::string ErrorLines(const grpc::Status& s, const std::string& server);

// When the first word of the command line that is not an option is not one of `subcommands`, the
// line that says so and lists them; empty otherwise.
std::string UnknownSubcommand(const std::vector<std::string>& args, const std::vector<std::string>& subcommands);

}  // namespace qvi::client

#endif  // QVI_CLIENT_ERRORS_H_
