#include "server/http/http_server.h"

#include <spdlog/spdlog.h>

#include <pthread.h>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <algorithm>
#include <mutex>
#include <optional>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/sched/cpu_policy.h"

namespace qvi {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return "";
}

size_t HttpRequest::HeaderCount(std::string_view name) const {
  return std::count_if(headers.begin(), headers.end(), [&](const auto& header) {
    return absl::EqualsIgnoreCase(header.first, absl::string_view(name.data(), name.size()));
  });
}

struct HttpServer::State {
  State(Options o, Handler h) : options(std::move(o)), handler(std::move(h)), acceptor(ioc) {}
  const Options options;
  const Handler handler;
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::atomic<int64_t> in_flight{0};
  std::atomic<bool> stopping{false};
};

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string PeerName(const tcp::socket& socket) {
  beast::error_code ec;
  const tcp::endpoint e = socket.remote_endpoint(ec);
  if (ec) return "unknown";
  const std::string address = e.address().to_string();
  return e.address().is_v4() ? absl::StrCat("ipv4:", address, ":", e.port())
                             : absl::StrCat("ipv6:[", address, "]:", e.port());
}

HttpResponse JsonError(int status, const std::string& message) {
  return HttpResponse{status,
                      "application/json",
                      nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      {}};
}

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One connection: reads a request, hands it to the handler, writes the answer, and reads the next
// one if the connection is kept alive. Every step runs on the connection's strand. `Stream` is
// beast::tcp_stream (HTTP) or TlsStream (HTTPS, after its handshake).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, HttpServer::State* state) : stream_(std::move(stream)), state_(state) {
    peer_ = PeerName(Tcp().socket());
  }

  std::shared_ptr<net::ssl::context> keep_context;  // HTTPS: the context the stream was made with

  void Start() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (std::is_same_v<Stream, TlsStream>) {
        // The handshake counts as the start of the first request's header.
        self->Tcp().expires_after(Seconds(self->options().header_timeout_seconds));
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->Close();  // not TLS, no client certificate under mTLS, or too slow
          self->WaitForRequest();
        });
      } else {
        self->WaitForRequest();
      }
    });
  }

 private:
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;
  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }
  const HttpServer::Options& options() const { return state_->options; }

  // An idle connection waits up to idle_timeout for the first byte of its next request.
  void WaitForRequest() {
    if (state_->stopping) return Close();
    if (buffer_.size() > 0) return ReadHeader();
    Tcp().expires_after(Seconds(options().idle_timeout_seconds));
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->Close();  // closed by the client, or idle too long
      self->buffer_.commit(n);
      self->ReadHeader();
    });
  }

  // From its first byte, a request's header has header_timeout to arrive.
  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(options().max_header_bytes);
    parser_->body_limit(options().max_body_bytes);
    Tcp().expires_after(Seconds(options().header_timeout_seconds));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Refuses what a header alone decides (431, 413 by Content-Length, a malformed request); then reads
  // the body, after a 100 Continue when the client waits for one.
  void OnHeader(beast::error_code ec) {
    if (ec) return Refuse(ec, "header");
    const auto& header = parser_->get();
    if (absl::EqualsIgnoreCase(std::string(header[http::field::expect]), "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      Tcp().expires_after(Seconds(options().body_timeout_seconds));
      http::async_write(stream_, *cont, [self = shared_from_this(), cont](beast::error_code ec2, size_t) {
        if (ec2) return self->Close();
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    Tcp().expires_after(Seconds(options().body_timeout_seconds));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    if (ec) return Refuse(ec, "body");
    http::request<http::string_body> req = parser_->release();
    parser_.reset();
    keep_alive_ = req.keep_alive();
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    request.peer = peer_;
    for (const auto& field : req) request.headers.emplace_back(field.name_string(), field.value());
    request.body = std::move(req.body());
    Tcp().expires_never();
    state_->in_flight.fetch_add(1);
    auto replied = std::make_shared<std::atomic<bool>>(false);
    Reply reply = [self = shared_from_this(), replied](HttpResponse response) {
      if (replied->exchange(true)) return;
      net::post(self->stream_.get_executor(), [self, response = std::move(response)]() mutable {
        self->Write(std::move(response), /*counted=*/true);
      });
    };
    try {
      state_->handler(std::move(request), reply);
    } catch (const std::exception& e) {
      reply(JsonError(500, absl::StrCat("handling the request failed: ", e.what())));
    }
  }

  // A request refused before the handler saw it: the answer says why, and the connection closes
  // (what is left of the request is not read).
  void Refuse(beast::error_code ec, const char* part) {
    keep_alive_ = false;
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted) {
      return Close();
    }
    if (ec == http::error::header_limit) {
      return Write(JsonError(431, absl::StrCat("the request's header is over ", options().max_header_bytes,
                                               " bytes (--http-max-header-bytes)")),
                   false);
    }
    if (ec == http::error::body_limit) {
      return Write(JsonError(413, absl::StrCat("the request's body is over the limit of ", options().max_body_bytes,
                                               " bytes (--max-message-bytes)")),
                   false);
    }
    // A header or body that did not arrive in time: Beast has closed the socket already, so there
    // is no one to answer (a 408 cannot be sent).
    if (ec == beast::error::timeout) return Close();
    Write(JsonError(400, absl::StrCat("the request's ", part, " is not valid HTTP/1.1: ", ec.message())), false);
  }

  void Write(HttpResponse r, bool counted) {
    const bool close = !keep_alive_ || state_->stopping;
    response_ = {};
    response_.version(11);
    response_.result(static_cast<unsigned>(r.status));
    response_.set(http::field::server, "qvi-server");
    response_.set(http::field::content_type, r.content_type);
    for (auto& [name, value] : r.headers) response_.set(name, value);
    response_.body() = std::move(r.body);
    response_.keep_alive(!close);
    response_.prepare_payload();
    Tcp().expires_after(Seconds(options().body_timeout_seconds));
    http::async_write(stream_, response_, [self = shared_from_this(), close, counted](beast::error_code ec, size_t) {
      if (counted) self->state_->in_flight.fetch_sub(1);
      if (ec || close) return self->Close();
      self->WaitForRequest();
    });
  }

  // Closes the connection (without TLS's close_notify: the answers' lengths delimit them).
  void Close() {
    beast::error_code ec;
    Tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
    Tcp().close();
  }

  using Reply = HttpServer::Reply;
  Stream stream_;
  HttpServer::State* const state_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  std::string peer_;
  bool keep_alive_ = true;
};

void Accept(HttpServer::State* state) {
  state->acceptor.async_accept(net::make_strand(state->ioc), [state](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !state->acceptor.is_open()) return;
    if (!ec) {
      if (state->options.tls) {
        std::shared_ptr<net::ssl::context> context = state->options.tls();
        if (context) {
          // The context lives as long as its connections (a reload makes a new one for the next).
          auto session =
              std::make_shared<Session<TlsStream>>(TlsStream(beast::tcp_stream(std::move(socket)), *context), state);
          session->keep_context = std::move(context);
          session->Start();
        }
      } else {
        std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), state)->Start();
      }
      return Accept(state);
    }
    // Out of descriptors, say: try again shortly rather than spin.
    spdlog::warn("HTTP: accepting a connection failed: {}", ec.message());
    auto timer = std::make_shared<net::steady_timer>(state->ioc, std::chrono::milliseconds(50));
    timer->async_wait([state, timer](beast::error_code) { Accept(state); });
  });
}

}  // namespace

HttpServer::HttpServer(Options options, Handler handler)
    : state_(std::make_shared<State>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() {
  if (!threads_.empty()) Shutdown(std::chrono::system_clock::now());
}

absl::StatusOr<int> HttpServer::Start() {
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(state_->options.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--host '", state_->options.host, "': ", ec.message()));
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(state_->options.port));
  tcp::acceptor& a = state_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("HTTP: cannot listen on ", state_->options.host, ":", state_->options.port, ": ", ec.message()));
  }
  const int port = a.local_endpoint().port();
  Accept(state_.get());
  for (int i = 0; i < std::max(1, state_->options.threads); ++i) {
    threads_.emplace_back([state = state_.get()] {
      pthread_setname_np(pthread_self(), "qvi-http");
      // Best effort: under the other policy HTTP answers are slower, not wrong.
      if (absl::Status s = UseDefaultSchedulingHere(); !s.ok())
        spdlog::debug("HTTP thread: {}", std::string(s.message()));
      state->ioc.run();
    });
  }
  return port;
}

void HttpServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (threads_.empty()) return;
  state_->stopping = true;
  net::post(state_->ioc, [state = state_.get()] {
    beast::error_code ec;
    state->acceptor.close(ec);
  });
  while (state_->in_flight.load() > 0 && std::chrono::system_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  state_->ioc.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

int64_t HttpServer::in_flight() const { return state_->in_flight.load(); }

std::function<std::shared_ptr<net::ssl::context>()> HttpServer::TlsContexts(
    std::function<std::pair<TlsPem, uint64_t>()> current) {
  struct Cache {
    std::mutex mu;
    uint64_t generation = 0;
    std::shared_ptr<net::ssl::context> context;
  };
  auto cache = std::make_shared<Cache>();
  return [current = std::move(current), cache]() -> std::shared_ptr<net::ssl::context> {
    std::lock_guard<std::mutex> lock(cache->mu);
    auto [pem, generation] = current();
    if (generation == cache->generation && cache->context) return cache->context;
    try {
      auto context = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
      context->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                           net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 |
                           net::ssl::context::single_dh_use);
      context->use_certificate_chain(net::buffer(pem.cert));
      context->use_private_key(net::buffer(pem.key), net::ssl::context::pem);
      if (!pem.client_ca.empty()) {
        context->add_certificate_authority(net::buffer(pem.client_ca));
        context->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
      }
      cache->context = std::move(context);
    } catch (const std::exception& e) {
      spdlog::error("HTTPS: the TLS set of generation {} cannot be used ({}); {}", generation, e.what(),
                    cache->context ? "the last good one still serves" : "no connection can be served");
    }
    cache->generation = generation;
    return cache->context;
  };
}

}  // namespace qvi
