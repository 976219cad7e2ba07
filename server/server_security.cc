// The server's security start-up: TLS (its files checked, then reloaded as they are renewed) and the
// API keys (--api-keys: loaded and checked before any model loads, reloaded when the file changes or on
// SIGHUP), each counted on /metrics.
#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/server.h"

namespace qvi {
namespace {

std::string DescribeCertificate(const TlsSet& set) {
  return absl::StrCat("certificate sha256:", set.fingerprint.substr(0, 16), " valid until ",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", set.not_after, absl::UTCTimeZone()));
}

}  // namespace

absl::Status Server::StartTls() {
  const ServerOptions::Tls& tls = options_.tls;
  if (tls.cert.empty()) return absl::OkStatus();
  const TlsFiles files{tls.cert, tls.key, tls.client_ca};
  absl::StatusOr<TlsSet> set = LoadTlsSet(files, absl::Now());  // checked with the flags; the files may change
  if (!set.ok()) return set.status();
  spdlog::info("TLS {}; the files are checked for changes every {} s", DescribeCertificate(*set), tls.reload_seconds);
  tls_ = std::make_shared<ReloadingTlsCredentials>(
      files, *set, absl::Seconds(tls.reload_seconds), [](const absl::StatusOr<TlsSet>& reload, const TlsSet& in_use) {
        if (reload.ok()) {
          spdlog::info("TLS files reloaded: {} serves new connections", DescribeCertificate(in_use));
        } else {
          // One line per change of the files, not per connection: the watcher looks again only
          // once they change again.
          spdlog::error("TLS files changed and were refused ({}); the {} still serves",
                        std::string(reload.status().message()), DescribeCertificate(in_use));
        }
      });
  if (metrics_) {
    // The scrapes hold the credentials: /metrics may be read while the server is torn down.
    metrics_->AddScrapedCounter("qvi_tls_reload_failures_total",
                                "Changes of the TLS files refused (bad PEM, key not the certificate's, expired); the "
                                "last good set kept serving",
                                [tls = tls_] { return static_cast<double>(tls->reload_failures()); });
    metrics_->AddScrapedGauge("qvi_tls_certificate_expiry_timestamp_seconds",
                              "Expiry of the TLS certificate in use, in seconds since the epoch",
                              [tls = tls_] { return tls->expiry_seconds(); });
  }
  return absl::OkStatus();
}

absl::Status Server::StartApiKeys() {
  const ServerOptions::Auth& auth = options_.auth;
  if (auth.api_keys.empty()) return absl::OkStatus();
  absl::StatusOr<ApiKeySet> set = LoadApiKeys(auth.api_keys, auth.allow_empty);
  if (!set.ok()) return set.status();
  spdlog::info(
      "API keys: {} key(s) from {}; every call but the probes must present one; the file is checked "
      "for changes every {} s and read again on SIGHUP",
      set->keys.size(), auth.api_keys, auth.reload_seconds);
  api_keys_ = std::make_shared<ApiKeys>(
      auth.api_keys, *std::move(set), absl::Seconds(auth.reload_seconds),
      [path = auth.api_keys](const absl::Status& reload, size_t in_use) {
        if (reload.ok()) {
          spdlog::info("API keys reloaded from {}: {} key(s)", path, in_use);
        } else {
          spdlog::error("API keys: {} was refused ({}); the {} key(s) loaded before stay in use", path,
                        std::string(reload.message()), in_use);
        }
      });
  if (metrics_) {
    metrics_->AddScrapedCounter("qvi_api_keys_reload_failures_total",
                                "Changes of the --api-keys file refused (not valid JSON, a bad field); the keys "
                                "loaded before stayed in use",
                                [keys = api_keys_] { return static_cast<double>(keys->reload_failures()); });
  }
  return absl::OkStatus();
}

void Server::Reload() {
  if (!api_keys_) {
    spdlog::info("SIGHUP: nothing to read again (no --api-keys)");
    return;
  }
  (void)api_keys_->Reload();  // the listener logs the outcome
}

}  // namespace qvi
