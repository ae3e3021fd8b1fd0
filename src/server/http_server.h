// The HTTP/1.1 server (Boost.Beast over Asio): a few I/O threads serve every
// connection asynchronously; engine events are posted onto each connection's
// strand, so thousands of streams need no thread each. SIGTERM / SIGINT stop
// the listener, drain the engine (bounded) and return from run().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/routes.h"

namespace kestrel::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port (the bound one is printed)
  int threads = 2;       // I/O threads
  std::chrono::milliseconds drain_timeout{30000};
  std::chrono::seconds idle_timeout{60};  // keep-alive / header read
  // A streaming client that lets this many bytes pile up unread is cut off
  // (its request cancelled) rather than buffered without bound.
  size_t max_stream_buffer_bytes = 4 << 20;
};

class HttpServer {
 public:
  HttpServer(Api& api, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port; throws kestrel::Error naming the address on failure.
  // Returns the bound port.
  uint16_t listen();
  // Serves until a signal or stop(), then drains; returns when done.
  void run();
  // Thread-safe: begins the same shutdown as SIGTERM.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel::server
