// Boost.Beast HTTP/1.1 server: accept, read (with a body limit), route, and
// either answer or drive a generation whose engine events are posted onto the
// connection's strand. Streams use chunked transfer encoding; a closed client
// cancels its request; a client that stops reading is cut off once its
// unsent bytes pass a bound.
#include "server/http_server.h"

#include <csignal>
#include <functional>
#include <mutex>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/logging.h"
#include "lora/adapter_store.h"
#include "server/http_error.h"

namespace kestrel::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Engine-thread callbacks post onto strands only while the io_context lives.
struct Gate {
  std::mutex mu;
  bool open = true;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

struct HttpServer::Impl {
  Impl(Api& a, ServerOptions o) : api(a), opt(std::move(o)) {}

  void accept();
  void begin_shutdown();
  void wait_for_exchanges(Clock::time_point deadline);

  Api& api;
  ServerOptions opt;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  asio::signal_set signals{ioc, SIGINT, SIGTERM};
  std::shared_ptr<Gate> gate = std::make_shared<Gate>();
  std::atomic<int64_t> exchanges{0};  // requests being answered
  std::atomic<bool> stopping{false};
  std::thread drain_thread;
  std::unique_ptr<asio::steady_timer> grace_timer;
};

namespace {

class Session : public std::enable_shared_from_this<Session>, public ResponseChannel {
 public:
  Session(tcp::socket socket, HttpServer::Impl& srv) : stream_(std::move(socket)), srv_(srv) {}

  void start() {
    beast::error_code ec;
    stream_.socket().non_blocking(true, ec);
    stream_.socket().set_option(tcp::no_delay(true), ec);
    read();
  }

  // ResponseChannel
  void reply(Reply r) override {
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " +
                      std::string(http::obsolete_reason(http::int_to_status(r.status))) + "\r\n";
    out += "Content-Type: " + r.content_type + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    for (const auto& [k, v] : extra_headers_) out += k + ": " + v + "\r\n";
    out += adapter_headers();
    out += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    out += r.body;
    response_done_ = true;
    queue(std::move(out), /*bounded=*/false);
  }

  void begin_stream(const std::string& content_type) override {
    chunked_ = http11_;
    if (!chunked_) keep_alive_ = false;
    std::string out = "HTTP/1.1 200 OK\r\nContent-Type: " + content_type +
                      "\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
    out += chunked_ ? "Transfer-Encoding: chunked\r\n" : "";
    for (const auto& [k, v] : extra_headers_) out += k + ": " + v + "\r\n";
    out += adapter_headers();
    out += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    queue(std::move(out), false);
  }

  void stream(std::string bytes) override {
    if (bytes.empty()) return;
    if (!chunked_) {
      queue(std::move(bytes), true);
      return;
    }
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
    queue(size + std::move(bytes) + "\r\n", true);
  }

  void end_stream() override {
    response_done_ = true;
    if (chunked_)
      queue("0\r\n\r\n", false);
    else
      keep_alive_ = false;
    maybe_finish();
  }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(srv_.api.options().max_body_bytes);
    stream_.expires_after(srv_.opt.idle_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  void on_header(beast::error_code ec, size_t) {
    if (ec) return on_read_error(ec);
    begin_exchange();
    const auto& req = parser_->get();
    http11_ = req.version() >= 11;
    keep_alive_ = req.keep_alive();
    const auto length = parser_->content_length();
    if (length && *length > srv_.api.options().max_body_bytes) return too_large();
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto self = shared_from_this();
      auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      asio::async_write(stream_, asio::buffer(*msg), [self, msg](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_body, shared_from_this()));
  }

  void on_body(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) return too_large();
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    handle();
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::body_limit) {  // a Content-Length over the limit fails the header read
      begin_exchange();
      return too_large();
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        (!in_exchange_ && !parser_->got_some())) {
      end_exchange();
      return close();
    }
    // A request we cannot parse: answer 400 (or 431) and close.
    begin_exchange();
    keep_alive_ = false;
    if (ec == http::error::header_limit)
      reply(error_reply(ErrorKind::kHeadersTooLarge, "request headers too large"));
    else
      reply(error_reply(ErrorKind::kMalformed, "malformed HTTP request: " + ec.message()));
  }

  void too_large() {
    keep_alive_ = false;
    lingering_ = true;
    srv_.api.metrics().request_failed("validation");
    reply(error_reply(ErrorKind::kTooLarge, "request body exceeds the limit of " +
                                                std::to_string(srv_.api.options().max_body_bytes) +
                                                " bytes"));
  }

  void handle() {
    auto& req = parser_->get();
    RequestHead head;
    head.method = std::string(req.method_string());
    head.target = std::string(req.target());
    head.authorization = std::string(req[http::field::authorization]);
    head.content_type = std::string(req[http::field::content_type]);
    head.host = std::string(req[http::field::host]);
    head.origin = std::string(req[http::field::origin]);
    head.accept = std::string(req[http::field::accept]);
    head.access_control_request_method =
        std::string(req[http::field::access_control_request_method]);
    Routed r = srv_.api.route(head, req.body());
    req.body().clear();
    req.body().shrink_to_fit();
    extra_headers_ = std::move(r.headers);
    if (r.reply) return reply(std::move(*r.reply));
    if (r.deferred) return run_deferred(std::move(r.deferred));
    submit(std::move(r));
  }

  // An answer another thread gives later (an adapter loaded at run time): delivered on this
  // strand. The pending answer holds the session; a server shutting down drops it.
  void run_deferred(std::function<void(std::function<void(Reply)>)> action) {
    auto gate = srv_.gate;
    auto ex = stream_.get_executor();
    const uint64_t exchange = exchange_;
    auto done = [self = shared_from_this(), gate, ex, exchange](Reply r) {
      std::lock_guard lock(gate->mu);
      if (!gate->open) return;
      asio::post(ex, [self, exchange, r = std::move(r)]() mutable {
        if (exchange == self->exchange_) self->reply(std::move(r));
      });
    };
    try {
      action(done);
    } catch (const std::exception& e) {
      spdlog::error("deferred reply: {}", e.what());
      done(error_reply(ErrorKind::kInternal, "internal error (the server log has the details)"));
    }
  }

  void submit(Routed r) {
    Api& api = srv_.api;
    if (api.draining() || srv_.stopping) {
      api.metrics().request_failed("unavailable");
      return reply(error_reply(ErrorKind::kUnavailable, "the server is shutting down"));
    }
    if (!api.try_acquire()) {
      api.metrics().request_failed("overloaded");
      return reply(error_reply(
          ErrorKind::kOverloaded,
          "Model is overloaded: " + std::to_string(api.options().max_concurrent_requests) +
              " requests in flight (--max-concurrent-requests)"));
    }
    if (!r.adapter_key.empty() && !api.try_acquire_adapter(r.adapter_key)) {
      api.release();
      api.metrics().request_failed("overloaded");
      return reply(
          error_reply(ErrorKind::kOverloaded,
                      "adapter '" + (r.adapter ? r.adapter->id : r.adapter_key) + "' has " +
                          std::to_string(api.options().max_requests_per_adapter) +
                          " requests in flight (--max-requests-per-adapter); retry later"));
    }
    adapter_key_ = std::move(r.adapter_key);
    job_ = std::move(r.job);
    active_ = true;
    self_ref_ = shared_from_this();
    started_ = Clock::now();
    first_token_seconds_ = -1;
    prompt_length_ = static_cast<int64_t>(r.request.prompt_ids.size());
    max_new_tokens_ = r.request.params.max_new_tokens;
    adapter_label_ = r.adapter ? r.adapter->id : "";
    metrics_label_.clear();
    adapter_source_ = r.adapter && r.adapter->source == AdapterSource::kHub ? "hub" : "local";
    if (r.adapter) {
      const AdapterRef ref = *r.adapter;
      return wait_for_adapter(std::move(r.request), ref.id, [this, ref](AdapterStore::Callback cb) {
        srv_.api.options().adapters->get(ref.id, ref.source, std::move(cb));
      });
    }
    if (r.merged) {
      auto merged = std::make_shared<const Routed::Merged>(std::move(*r.merged));
      return wait_for_adapter(
          std::move(r.request), "merged_adapters", [this, merged](AdapterStore::Callback cb) {
            srv_.api.options().adapters->get_merged(merged->spec, merged->source, std::move(cb));
          });
    }
    start_generation(std::move(r.request));
  }

  // The adapter loads (or merges) on the store's thread; its callback posts back onto this
  // strand, so neither this session's thread nor the engine waits. The request holds its gate
  // slot meanwhile. `get` asks the store; `what` names the request's adapter in the log.
  void wait_for_adapter(GenerationRequest request, const std::string& what,
                        const std::function<void(AdapterStore::Callback)>& get) {
    waiting_request_ = std::move(request);
    waiting_adapter_ = true;
    std::weak_ptr<Session> weak = shared_from_this();
    auto gate = srv_.gate;
    auto ex = stream_.get_executor();
    const uint64_t exchange = exchange_;
    auto done = [weak, gate, ex, exchange](std::shared_ptr<const LoraAdapter> adapter,
                                           const AdapterError* error) {
      std::lock_guard lock(gate->mu);
      if (!gate->open) return;
      AdapterError failure = error ? *error : AdapterError{};
      asio::post(ex, [weak, exchange, adapter = std::move(adapter), failure]() mutable {
        if (auto self = weak.lock()) self->on_adapter(exchange, std::move(adapter), failure);
      });
    };
    try {
      get(done);
    } catch (const std::exception& e) {
      spdlog::error("adapter store: get '{}' threw: {}", what, e.what());
      const AdapterError failure{ErrorKind::kInternal, "the adapter store failed", e.what()};
      done(nullptr, &failure);
    }
    watch_disconnect();
  }

  void on_adapter(uint64_t exchange, std::shared_ptr<const LoraAdapter> adapter,
                  const AdapterError& error) {
    if (!waiting_adapter_ || exchange != exchange_) return;  // the client left meanwhile
    auto self = shared_from_this();
    waiting_adapter_ = false;
    GenerationRequest request = std::move(waiting_request_);
    waiting_request_ = {};
    if (!adapter) {
      // The store's kind says whose problem it is: the adapter's own is the client's (4xx); a store
      // full of adapters in use (429) or shutting down (503) is not.
      srv_.api.metrics().request_failed("adapter");
      end_request();
      return reply(error_reply(error.kind, error.message));
    }
    // Metrics count the adapter by the name it is loaded under, not the request's spelling.
    metrics_label_ = adapter->name();
    request.adapter = std::move(adapter);
    start_generation(std::move(request));
  }

  void start_generation(GenerationRequest request) {
    Api& api = srv_.api;
    if (api.draining() || srv_.stopping) {
      end_request();
      api.metrics().request_failed("unavailable");
      return reply(error_reply(ErrorKind::kUnavailable, "the server is shutting down"));
    }
    std::weak_ptr<Session> weak = shared_from_this();
    auto gate = srv_.gate;
    auto ex = stream_.get_executor();
    try {
      auto handle = api.engine().submit(std::move(request), [weak, gate, ex](EngineEvent ev) {
        std::lock_guard lock(gate->mu);
        if (!gate->open) return;
        asio::post(ex, [weak, ev = std::move(ev)]() mutable {
          if (auto self = weak.lock()) self->on_event(std::move(ev));
        });
      });
      request_id_ = handle->id();
    } catch (const ValidationError& e) {
      end_request();
      api.metrics().request_failed("validation");
      return reply(error_reply(e.kind(), validation_message(e)));
    } catch (const Error& e) {
      end_request();
      api.metrics().request_failed(http_status(e.kind()).error_type);
      if (e.kind() == ErrorKind::kInternal) spdlog::error("submit: {}", e.what());
      return reply(error_reply(e.kind(), e.kind() == ErrorKind::kInternal
                                             ? "internal error (the server log has the details)"
                                             : e.what()));
    } catch (const std::exception& e) {
      end_request();
      api.metrics().request_failed("internal");
      spdlog::error("submit: {}", e.what());
      return reply(
          error_reply(ErrorKind::kInternal, "internal error (the server log has the details)"));
    }
    job_->start(*this);
    watch_disconnect();
  }

  void on_event(EngineEvent ev) {
    if (!active_) return;
    auto self = shared_from_this();  // end_request() drops self_ref_
    Metrics& m = srv_.api.metrics();
    switch (ev.kind) {
      case EngineEvent::Kind::kToken:
        if (first_token_seconds_ < 0) first_token_seconds_ = seconds_since(started_);
        if (!gone_) job_->on_token(ev.token, *this);
        return;
      case EngineEvent::Kind::kFinished: {
        const GenerationResult& res = *ev.result;
        if (res.finish_reason == FinishReason::kCancelled) {
          m.request_failed("cancelled");
        } else {
          RequestRecord rec;
          rec.total_seconds = seconds_since(started_);
          rec.queue_seconds = res.queue_seconds;
          rec.inference_seconds = res.inference_seconds;
          rec.first_token_seconds = first_token_seconds_;
          rec.input_length = prompt_length_;
          rec.generated_tokens = static_cast<int64_t>(res.tokens.size());
          rec.max_new_tokens = max_new_tokens_;
          rec.adapter = metrics_label_;
          m.request_succeeded(rec);
        }
        auto job = std::move(job_);
        end_request();
        if (!gone_) job->on_finished(res, *this);
        break;
      }
      case EngineEvent::Kind::kError: {
        m.request_failed(ev.error_kind == ErrorKind::kInternal
                             ? "generation"
                             : http_status(ev.error_kind).error_type);
        spdlog::warn("request {} failed: {}", request_id_, ev.error);
        auto job = std::move(job_);
        end_request();
        if (!gone_) job->on_error(ev.error_kind, ev.error, *this);
        break;
      }
    }
    maybe_finish();
  }

  void end_request() {
    if (!active_) return;
    active_ = false;
    waiting_adapter_ = false;
    job_.reset();
    srv_.api.release();
    if (!adapter_key_.empty()) srv_.api.release_adapter(adapter_key_);
    adapter_key_.clear();
    self_ref_.reset();  // callers hold their own reference
  }

  // While a request runs, a readable socket with nothing to read means the
  // client closed: cancel. Pipelined bytes end the watch (they are the next request).
  void watch_disconnect() {
    // One watch per exchange (an adapter wait, then the generation, would arm it twice).
    if (!active_ || gone_ || buffer_.size() > 0 || watched_exchange_ == exchange_) return;
    watched_exchange_ = exchange_;
    auto self = shared_from_this();
    const uint64_t exchange = exchange_;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        asio::bind_executor(stream_.get_executor(), [self, exchange](beast::error_code ec) {
          self->on_readable(ec, exchange);
        }));
  }

  void on_readable(beast::error_code ec, uint64_t exchange) {
    if (exchange != exchange_) return;
    watched_exchange_ = 0;
    if (!active_ || gone_) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) client_gone();
      return;
    }
    char c;
    beast::error_code peek_ec;
    const size_t n =
        stream_.socket().receive(asio::buffer(&c, 1), tcp::socket::message_peek, peek_ec);
    if (peek_ec == asio::error::would_block || peek_ec == asio::error::try_again)
      return watch_disconnect();
    if (peek_ec || n == 0) client_gone();
  }

  void client_gone() {
    if (gone_) return;
    gone_ = true;
    keep_alive_ = false;
    pending_.clear();
    auto self = shared_from_this();
    const bool waiting = waiting_adapter_;
    if (waiting) {  // not in the engine yet: the load's callback will find the request over
      srv_.api.metrics().request_failed("cancelled");
      waiting_request_ = {};
      end_request();
    } else if (active_) {
      srv_.api.engine().cancel(request_id_);
    }
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    if (waiting) maybe_finish();
  }

  void queue(std::string bytes, bool bounded) {
    if (gone_) return;
    pending_ += bytes;
    if (bounded && pending_.size() + writing_.size() > srv_.opt.max_stream_buffer_bytes) {
      spdlog::warn("request {}: client reads too slowly ({} bytes unsent); cancelling", request_id_,
                   pending_.size() + writing_.size());
      srv_.api.metrics().request_failed("slow_reader");
      return client_gone();
    }
    flush();
  }

  void flush() {
    if (write_in_flight_ || pending_.empty() || gone_) return;
    writing_.swap(pending_);
    pending_.clear();
    write_in_flight_ = true;
    stream_.expires_after(std::chrono::seconds(120));
    asio::async_write(stream_, asio::buffer(writing_),
                      beast::bind_front_handler(&Session::on_written, shared_from_this()));
  }

  void on_written(beast::error_code ec, size_t) {
    write_in_flight_ = false;
    writing_.clear();
    if (ec) {
      client_gone();
      return maybe_finish();
    }
    flush();
    maybe_finish();
  }

  void maybe_finish() {
    if (gone_) {
      if (!active_ && !write_in_flight_) end_exchange();
      return;
    }
    if (write_in_flight_ || !pending_.empty() || !response_done_ || active_) return;
    end_exchange();
    response_done_ = false;
    chunked_ = false;
    if (lingering_) return linger();
    if (keep_alive_ && !srv_.stopping) return read();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    close();
  }

  // After a 413 the client may still be sending: read and drop it (bounded)
  // so that it sees the answer rather than a reset.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(5));
    linger_read();
  }

  void linger_read() {
    if (!scratch_) scratch_ = std::make_unique<char[]>(kScratch);
    stream_.async_read_some(asio::buffer(scratch_.get(), kScratch),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->lingered_ += n;
                              if (ec || self->lingered_ > (256u << 20)) return self->close();
                              self->linger_read();
                            });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  // LoRAX's response headers for a request under an adapter (left out for an id that holds
  // characters a header cannot carry).
  std::string adapter_headers() const {
    if (adapter_label_.empty()) return "";
    for (unsigned char c : adapter_label_)
      if (c < 0x20 || c == 0x7f) return "";
    return "x-adapter-id: " + adapter_label_ + "\r\nx-adapter-source: " + adapter_source_ + "\r\n";
  }

  void begin_exchange() {
    if (in_exchange_) return;
    in_exchange_ = true;
    adapter_label_.clear();
    extra_headers_.clear();
    ++exchange_;
    ++srv_.exchanges;
  }
  void end_exchange() {
    if (!in_exchange_) return;
    in_exchange_ = false;
    --srv_.exchanges;
  }

  static constexpr size_t kScratch = 64 << 10;

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpServer::Impl& srv_;
  bool http11_ = true;
  bool keep_alive_ = false;
  bool chunked_ = false;
  bool lingering_ = false;
  size_t lingered_ = 0;
  std::unique_ptr<char[]> scratch_;
  bool in_exchange_ = false;
  uint64_t exchange_ = 0;
  uint64_t watched_exchange_ = 0;  // the exchange a disconnect watch is armed for
  bool response_done_ = false;

  std::unique_ptr<GenerationJob> job_;
  std::shared_ptr<Session> self_ref_;  // alive while the engine holds the request
  uint64_t request_id_ = 0;
  bool active_ = false;
  bool gone_ = false;
  Clock::time_point started_;
  double first_token_seconds_ = -1;
  int64_t prompt_length_ = 0;
  int64_t max_new_tokens_ = 0;
  std::string adapter_source_;  // "local" / "hub", with adapter_label_
  std::string adapter_label_;   // the request's adapter id ("": the base model), for headers
  std::string metrics_label_;   // the loaded adapter's name ("": the base model), for metrics
  std::string adapter_key_;     // the --max-requests-per-adapter slot it holds ("": none)
  std::vector<std::pair<std::string, std::string>> extra_headers_;  // CORS, on every response
  bool waiting_adapter_ = false;  // active, its adapter loading: not in the engine yet
  GenerationRequest waiting_request_;

  std::string pending_, writing_;
  bool write_in_flight_ = false;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      spdlog::warn("accept: {}", ec.message());
    } else {
      std::make_shared<Session>(std::move(socket), *this)->start();
    }
    accept();
  });
}

void HttpServer::Impl::begin_shutdown() {
  if (stopping.exchange(true)) return;
  spdlog::info("shutting down: no new connections, draining in-flight requests (up to {} ms)",
               opt.drain_timeout.count());
  beast::error_code ec;
  acceptor.close(ec);
  signals.cancel(ec);
  api.set_draining();
  drain_thread = std::thread([this] {
    api.engine().drain(opt.drain_timeout);
    asio::post(ioc, [this] { wait_for_exchanges(Clock::now() + std::chrono::seconds(2)); });
  });
}

// Lets the last responses go out after the engine drained.
void HttpServer::Impl::wait_for_exchanges(Clock::time_point deadline) {
  if (exchanges.load() <= 0 || Clock::now() >= deadline) {
    spdlog::info("drained; {} responses unfinished", std::max<int64_t>(0, exchanges.load()));
    ioc.stop();
    return;
  }
  grace_timer = std::make_unique<asio::steady_timer>(ioc, std::chrono::milliseconds(20));
  grace_timer->async_wait([this, deadline](beast::error_code) { wait_for_exchanges(deadline); });
}

HttpServer::HttpServer(Api& api, ServerOptions options)
    : impl_(std::make_unique<Impl>(api, std::move(options))) {}

HttpServer::~HttpServer() {
  {
    std::lock_guard lock(impl_->gate->mu);
    impl_->gate->open = false;
  }
  if (impl_->drain_thread.joinable()) impl_->drain_thread.join();
}

uint16_t HttpServer::listen() {
  Impl& s = *impl_;
  const std::string where = s.opt.host + ":" + std::to_string(s.opt.port);
  beast::error_code ec;
  tcp::resolver resolver(s.ioc);
  auto results = resolver.resolve(s.opt.host, std::to_string(s.opt.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) KESTREL_FAIL("cannot resolve --host ", s.opt.host, ": ", ec.message());
  const tcp::endpoint ep = results.begin()->endpoint();
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) KESTREL_FAIL("cannot listen on ", where, ": ", ec.message());
  return s.acceptor.local_endpoint().port();
}

void HttpServer::run() {
  Impl& s = *impl_;
  s.signals.async_wait([&s](beast::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("received signal {}", sig);
    s.begin_shutdown();
  });
  s.accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, s.opt.threads); ++i) threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : threads) t.join();
  if (s.drain_thread.joinable()) s.drain_thread.join();
}

void HttpServer::stop() {
  asio::post(impl_->ioc, [this] { impl_->begin_shutdown(); });
}

}  // namespace kestrel::server
