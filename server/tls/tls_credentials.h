// TLS for the gRPC port that fails safe. The certificate, its key and the client CA are checked
// with OpenSSL before use — at start-up (a bad set stops the server with the file named) and at
// every reload (a bad set is refused and the last good one keeps serving). gRPC's own file watcher
// would drop a working pair for whatever the files hold: a renewal that writes the certificate and
// the key in two steps, or one bad write, would fail every new connection.
//
// Reloads go through gRPC's certificate-config fetcher (grpc_ssl_server_credentials_create_options_
// using_config_fetcher), which gRPC asks at each new connection: it answers "unchanged" until the
// watcher thread has accepted a new set, and gRPC keeps what it has whenever the answer is not a
// new set.
#ifndef QVI_SERVER_TLS_TLS_CREDENTIALS_H_
#define QVI_SERVER_TLS_TLS_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/base/sync.h"

namespace qvi {

struct TlsFiles {
  std::string cert;       // PEM certificate chain, the server's own certificate first
  std::string key;        // PEM private key of that certificate (not encrypted)
  std::string client_ca;  // PEM CA bundle for mutual TLS; empty for none
};

// A set of files read and checked: every PEM block parses, the key is the certificate's, the
// certificate has not expired, the CA bundle (when given) holds at least one certificate.
struct TlsSet {
  std::string cert_pem, key_pem, client_ca_pem;
  absl::Time not_after;     // the server certificate's expiry
  std::string fingerprint;  // SHA-256 of the server certificate, hex: which certificate serves
};

// Reads and checks `files` at `now`; the error names the flag and the file.
absl::StatusOr<TlsSet> LoadTlsSet(const TlsFiles& files, absl::Time now);

// The gRPC server credentials of a checked set, reloaded from the files every `reload` by a thread
// of its own. Must outlive the grpc::Server it was given to.
class ReloadingTlsCredentials {
 public:
  // Called from the watcher thread after each reload attempt whose files changed: OK with the new
  // set, or why the files were refused; `in_use` is the set that serves from then on (the last good
  // one after a refusal).
  using Listener = std::function<void(const absl::StatusOr<TlsSet>& reload, const TlsSet& in_use)>;

  // `initial`: the set LoadTlsSet accepted at start-up. With files.client_ca, clients must present
  // a certificate it signed (mutual TLS).
  ReloadingTlsCredentials(TlsFiles files, TlsSet initial, absl::Duration reload, Listener listener);
  ~ReloadingTlsCredentials();

  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  uint64_t reload_failures() const { return failures_.load(); }
  // The expiry of the certificate in use, as seconds since the epoch.
  double expiry_seconds() const;
  // The set in use now (the HTTP port builds its TLS context from it) and its generation, which
  // grows with each accepted reload.
  std::pair<TlsSet, uint64_t> current() const;

 private:
  struct State;
  void WatchLoop();

  const TlsFiles files_;
  const absl::Duration reload_;
  const Listener listener_;
  std::shared_ptr<State> state_;  // what gRPC's fetcher reads
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::atomic<uint64_t> failures_{0};
  Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace qvi

#endif  // QVI_SERVER_TLS_TLS_CREDENTIALS_H_
