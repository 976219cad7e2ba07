// The channel credentials of qvi-client and qvi-perf: plain text, TLS (--tls-ca) or mutual TLS
// (--tls-cert and --tls-key as well), with flags shared by both programs.
#ifndef QVI_CLIENT_CHANNEL_H_
#define QVI_CLIENT_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

namespace qvi {

struct TlsClientOptions {
  std::string ca;           // PEM CA bundle that signed the server's certificate; set: TLS
  std::string cert, key;    // the client's PEM certificate and key, for servers that require them
  std::string server_name;  // the name to check the server's certificate against, if not the host's
};

inline void AddTlsOptions(CLI::App& app, TlsClientOptions& o) {
  app.add_option("--tls-ca", o.ca, "PEM CA bundle of the server's certificate: connect with TLS")
      ->check(CLI::ExistingFile)
      ->group("TLS");
  app.add_option("--tls-cert", o.cert, "PEM client certificate, for a server that requires one (mutual TLS)")
      ->check(CLI::ExistingFile)
      ->group("TLS");
  app.add_option("--tls-key", o.key, "PEM private key of --tls-cert")->check(CLI::ExistingFile)->group("TLS");
  app.add_option("--tls-server-name", o.server_name, "check the server's certificate for this name instead of the host")
      ->group("TLS");
}

inline std::string ReadPem(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Throws std::runtime_error naming the file it cannot read.
inline std::shared_ptr<grpc::Channel> MakeChannel(const std::string& server, const TlsClientOptions& tls,
                                                  grpc::ChannelArguments args) {
  if (tls.ca.empty()) {
    if (!tls.cert.empty() || !tls.key.empty()) throw std::runtime_error("--tls-cert and --tls-key need --tls-ca");
    return grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args);
  }
  if (tls.cert.empty() != tls.key.empty()) throw std::runtime_error("give --tls-cert and --tls-key together");
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadPem(tls.ca);
  if (!tls.cert.empty()) {
    ssl.pem_cert_chain = ReadPem(tls.cert);
    ssl.pem_private_key = ReadPem(tls.key);
  }
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(server, grpc::SslCredentials(ssl), args);
}

}  // namespace qvi

#endif  // QVI_CLIENT_CHANNEL_H_
