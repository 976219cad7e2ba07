#include "server/tls/tls_credentials.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/core/base/env.h"
#include "server/core/store/store_source.h"

namespace qvi {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

absl::StatusOr<std::string> ReadWhole(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot be read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": empty"));
  return buffer.str();
}

// OpenSSL's most recent error as text, and its error queue emptied.
std::string OpenSslError() {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block found";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// Every PEM certificate in `pem`, in order; an error when there is none or one does not parse.
absl::StatusOr<std::vector<Cert>> ParseCertificates(const std::string& flag, const std::string& path,
                                                    const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  std::vector<Cert> certs;
  while (true) {
    Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!cert) break;
    certs.push_back(std::move(cert));
  }
  // The loop ends at the end of the data (PEM_R_NO_START_LINE) or at a block that does not parse.
  const unsigned long last = ERR_peek_last_error();
  const bool clean_end = ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE;
  if (certs.empty() || (last != 0 && !clean_end)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": not a PEM certificate",
                                                   certs.empty() ? "" : " chain", " (", OpenSslError(), ")"));
  }
  ERR_clear_error();
  return certs;
}

absl::Time NotAfter(const X509* cert) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

std::string Fingerprint(X509* cert) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  X509_digest(cert, EVP_sha256(), digest, &size);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

// What tells the watcher that one of the files was written (store_source.h).
std::string Stamp(const TlsFiles& files) {
  return absl::StrCat(FileIdentity(files.cert), ";", FileIdentity(files.key), ";", FileIdentity(files.client_ca));
}

// Our credentials object around gRPC's C one (what grpc::SslServerCredentials does inside gRPC).
class FetcherServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit FetcherServerCredentials(grpc_server_credentials* c) : c_(c) {}
  ~FetcherServerCredentials() override { grpc_server_credentials_release(c_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), c_);
  }
  grpc_server_credentials* const c_;
};

}  // namespace

absl::StatusOr<TlsSet> LoadTlsSet(const TlsFiles& files, absl::Time now) {
  TlsSet set;
  absl::StatusOr<std::string> cert_pem = ReadWhole("--tls-cert", files.cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadWhole("--tls-key", files.key);
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::vector<Cert>> chain = ParseCertificates("--tls-cert", files.cert, *cert_pem);
  if (!chain.ok()) return chain.status();
  X509* leaf = chain->front().get();
  Bio key_bio(BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size())));
  // No passphrase callback: an encrypted key fails here rather than prompting.
  Key key(PEM_read_bio_PrivateKey(
      key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", files.key, ": not an unencrypted PEM private key (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", files.key,
                                                   " is not the key of the certificate in --tls-cert ", files.cert,
                                                   " (a renewal half done?)"));
  }
  set.not_after = NotAfter(leaf);
  if (set.not_after <= now) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", files.cert, ": the certificate expired at ",
                                                   absl::FormatTime(set.not_after, absl::UTCTimeZone())));
  }
  set.fingerprint = Fingerprint(leaf);
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca_pem = ReadWhole("--tls-client-ca", files.client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    absl::StatusOr<std::vector<Cert>> cas = ParseCertificates("--tls-client-ca", files.client_ca, *ca_pem);
    if (!cas.ok()) return cas.status();
    set.client_ca_pem = *std::move(ca_pem);
  }
  set.cert_pem = *std::move(cert_pem);
  set.key_pem = *std::move(key_pem);
  return set;
}

// The set gRPC's fetcher hands out; `generation` counts accepted sets, `served` is the one gRPC has.
struct ReloadingTlsCredentials::State {
  Mutex mu;
  TlsSet set ABSL_GUARDED_BY(mu);
  uint64_t generation ABSL_GUARDED_BY(mu) = 1;
  uint64_t served ABSL_GUARDED_BY(mu) = 0;

  // grpc_ssl_server_certificate_config_callback: asked at each new connection, so it must be cheap.
  static grpc_ssl_certificate_config_reload_status Fetch(void* user_data, grpc_ssl_server_certificate_config** config) {
    auto* state = static_cast<State*>(user_data);
    MutexLock lock(&state->mu);
    if (state->served == state->generation) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    const grpc_ssl_pem_key_cert_pair pair{state->set.key_pem.c_str(), state->set.cert_pem.c_str()};
    // gRPC (1.51) insists on root certificates in a fetched config even when it asks clients for no
    // certificate. Without a client CA it is given the server's own chain, which it then never uses:
    // clients are not asked for a certificate (GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE).
    const std::string& roots = state->set.client_ca_pem.empty() ? state->set.cert_pem : state->set.client_ca_pem;
    *config = grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
    state->served = state->generation;
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
  }
};

ReloadingTlsCredentials::ReloadingTlsCredentials(TlsFiles files, TlsSet initial, absl::Duration reload,
                                                 Listener listener)
    : files_(std::move(files)), reload_(reload), listener_(std::move(listener)), state_(std::make_shared<State>()) {
  {
    MutexLock lock(&state_->mu);
    state_->set = std::move(initial);
  }
  grpc_ssl_server_credentials_options* options = grpc_ssl_server_credentials_create_options_using_config_fetcher(
      files_.client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                               : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
      &State::Fetch, state_.get());
  credentials_ = std::make_shared<FetcherServerCredentials>(grpc_ssl_server_credentials_create_with_options(options));
  watcher_ = Env::Default()->StartThread("qvi-tls-watch", [this] { WatchLoop(); });
}

ReloadingTlsCredentials::~ReloadingTlsCredentials() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    stop_cv_.SignalAll();
  }
  if (watcher_.joinable()) watcher_.join();
}

std::pair<TlsSet, uint64_t> ReloadingTlsCredentials::current() const {
  MutexLock lock(&state_->mu);
  return {state_->set, state_->generation};
}

double ReloadingTlsCredentials::expiry_seconds() const {
  MutexLock lock(&state_->mu);
  return absl::ToDoubleSeconds(state_->set.not_after - absl::UnixEpoch());
}

void ReloadingTlsCredentials::WatchLoop() {
  std::string seen = Stamp(files_);
  while (true) {
    {
      MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + reload_;
      while (!stopping_ && absl::Now() < until) stop_cv_.WaitWithTimeout(&mu_, until - absl::Now());
      if (stopping_) return;
    }
    const std::string stamp = Stamp(files_);
    if (stamp == seen) continue;  // nothing written since the last look: nothing to log or count
    seen = stamp;
    absl::StatusOr<TlsSet> set = LoadTlsSet(files_, absl::Now());
    TlsSet in_use;
    {
      MutexLock lock(&state_->mu);
      if (set.ok() && set->cert_pem == state_->set.cert_pem && set->key_pem == state_->set.key_pem &&
          set->client_ca_pem == state_->set.client_ca_pem) {
        continue;  // the same contents written again (a touch, a re-synced volume): nothing to say
      }
      if (set.ok()) {
        state_->set = *set;
        ++state_->generation;
      }
      in_use = state_->set;
    }
    if (!set.ok()) ++failures_;
    if (listener_) listener_(set, in_use);
  }
}

}  // namespace qvi
