// decentrain-gpt train --status-port P: a small HTTP server on its own thread, on 127.0.0.1 by
// default, that serves the status page (GET /) and its data (GET /metrics, JSON). Anything that
// reaches the port is bounded: a request must arrive whole within 5 s and 8 KiB, at most 32
// connections are open at once (more are closed at accept), and each connection answers one
// request and closes. Nothing a client sends can stop or slow the training.
#pragma once

#include "status_page.hpp"

#include <decentrain/detail/error.hpp>

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace cli {

class status_server {
 public:
  // Listens on host:port (port 0: any free one); `metrics` is called on the server's thread.
  status_server(const std::string& host, int port, std::function<std::string()> metrics)
      : metrics_(std::move(metrics)), acceptor_(io_) {
    asio::error_code ec;
    const auto address = asio::ip::make_address(host, ec);
    decentrain::detail::check(!ec, "--status-host ", host, " is not an IP address (", ec.message(), ")");
    const asio::ip::tcp::endpoint at(address, static_cast<unsigned short>(port));
    acceptor_.open(at.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(at, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    decentrain::detail::check(!ec, "--status-port: cannot listen on ", host, ":", port, " (", ec.message(), ")");
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~status_server() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  status_server(const status_server&) = delete;
  status_server& operator=(const status_server&) = delete;

  int port() const { return acceptor_.local_endpoint().port(); }

 private:
  static constexpr std::size_t max_request_bytes = 8192;
  static constexpr int max_open = 32;

  struct connection {
    explicit connection(asio::io_context& io) : socket(io), deadline(io), request(max_request_bytes) {}
    asio::ip::tcp::socket socket;
    asio::steady_timer deadline;
    asio::streambuf request;
    std::string response;
  };

  void accept() {
    acceptor_.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        if (open_ >= max_open) {
          asio::error_code ignored;
          socket.close(ignored);
        } else {
          serve(std::move(socket));
        }
      } else {
        // Out of descriptors, say: pause rather than spin, then go on accepting.
        auto pause = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
        pause->async_wait([this, pause](const asio::error_code&) { accept(); });
        return;
      }
      accept();
    });
  }

  void serve(asio::ip::tcp::socket socket) {
    auto c = std::make_shared<connection>(io_);
    c->socket = std::move(socket);
    ++open_;
    c->deadline.expires_after(std::chrono::seconds(5));
    c->deadline.async_wait([c](const asio::error_code& ec) {
      if (ec) return;  // cancelled: answered in time
      asio::error_code ignored;
      c->socket.close(ignored);
    });
    asio::async_read_until(c->socket, c->request, "\r\n\r\n", [this, c](const asio::error_code& ec, std::size_t) {
      if (ec) return done(c);  // closed, too long or too slow
      std::istream in(&c->request);
      std::string method, target;
      in >> method >> target;
      answer(*c, method, target);
      asio::async_write(c->socket, asio::buffer(c->response), [this, c](const asio::error_code&, std::size_t) { done(c); });
    });
  }

  void answer(connection& c, const std::string& method, const std::string& target) {
    const auto path = target.substr(0, target.find('?'));
    std::string status = "200 OK", type = "text/plain; charset=utf-8", body;
    if (method != "GET" && method != "HEAD") {
      status = "405 Method Not Allowed";
      body = "only GET\n";
    } else if (path == "/") {
      type = "text/html; charset=utf-8";
      body = status_page_html;
    } else if (path == "/metrics") {
      type = "application/json";
      body = metrics_();
    } else {
      status = "404 Not Found";
      body = "the status page is / and its data /metrics\n";
    }
    c.response = "HTTP/1.0 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
                 "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" + (method == "HEAD" ? std::string() : body);
  }

  void done(const std::shared_ptr<connection>& c) {
    asio::error_code ignored;
    c->deadline.cancel();
    c->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    --open_;
  }

  std::function<std::string()> metrics_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::atomic<int> open_{0};
  std::thread thread_;
};

}  // namespace cli
