// An HTTP/1.1 server on Boost.Beast: event-driven (a few threads run every connection, so idle
// keep-alive connections hold no thread), with limits decided before the work they guard:
//   - a request's header must arrive within header_timeout of its first byte (a client that sends
//     it a byte a second is cut off), and an idle keep-alive connection is closed after idle_timeout;
//   - a header over max_header_bytes is answered 431, a body over max_body_bytes 413 — from the
//     Content-Length before a byte of the body is read, or as a chunked body passes the limit;
//   - a request that does not parse is answered 400; after any of these the connection closes.
// One request per connection at a time (no pipelining): the next is read once the answer is sent.
// With Options::tls every connection is HTTPS (a plain-text request fails its handshake).
// What a request means is the handler's business (http_api.h); it answers through `Reply`, once,
// from any thread.
#ifndef QVI_SERVER_HTTP_HTTP_SERVER_H_
#define QVI_SERVER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace boost::asio::ssl {
class context;
}

namespace qvi {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // path and query, as sent
  std::string body;
  std::string peer;  // "ipv4:1.2.3.4:5678" / "ipv6:[::1]:5678", as gRPC names peers
  std::vector<std::pair<std::string, std::string>> headers;
  // The value of the first header of this name (case-insensitive), or "".
  std::string Header(std::string_view name) const;
  // How many headers of this name (case-insensitive) the request has.
  size_t HeaderCount(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Allow, X-Request-Id, ...)
};

class HttpServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    int port = 8501;  // 0 picks a free port
    int threads = 2;
    double header_timeout_seconds = 10;
    double idle_timeout_seconds = 75;
    double body_timeout_seconds = 60;
    uint32_t max_header_bytes = 16384;
    uint64_t max_body_bytes = 16 << 20;
    // HTTPS: asked at each new connection for the TLS context to serve it with (the handshake must
    // finish within header_timeout); null: plain HTTP.
    std::function<std::shared_ptr<boost::asio::ssl::context>()> tls;
  };
  // Answers a request once, from any thread.
  using Reply = std::function<void(HttpResponse)>;
  using Handler = std::function<void(HttpRequest, Reply)>;

  HttpServer(Options options, Handler handler);
  ~HttpServer();

  // Binds and starts the threads; the bound port, or why it could not listen.
  absl::StatusOr<int> Start();
  // Stops accepting, lets the requests being answered finish until `deadline` (their connections
  // close after the answer), then closes every connection and joins the threads.
  void Shutdown(std::chrono::system_clock::time_point deadline);
  // Requests read and not yet answered.
  int64_t in_flight() const;

  struct State;  // shared with the connections (http_server.cc)

  // PEM files' contents for HTTPS: the certificate chain, its key, and for mutual TLS the CA that
  // must have signed each client's certificate (empty: clients are not asked for one).
  struct TlsPem {
    std::string cert, key, client_ca;
  };
  // An Options::tls that serves `current()`'s set, building a new context when its generation
  // changes (a reload) and keeping the last good one when a set cannot be used. TLS 1.2 and 1.3.
  static std::function<std::shared_ptr<boost::asio::ssl::context>()> TlsContexts(
      std::function<std::pair<TlsPem, uint64_t>()> current);

 private:
  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
};

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_HTTP_SERVER_H_
