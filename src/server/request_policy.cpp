// Header checks before routing (request_policy.h).
#include "server/request_policy.h"

#include <algorithm>
#include <cctype>

#include <boost/asio/ip/address.hpp>

namespace kestrel::server {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_ip_literal(const std::string& host) {
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

std::string host_of(std::string_view v) {
  v = trim(v);
  if (v.empty()) return "";
  std::string_view host;
  if (v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string_view::npos) return "";
    host = v.substr(1, close - 1);
    std::string_view rest = v.substr(close + 1);
    if (!rest.empty() && !(rest.front() == ':' && all_digits(rest.substr(1)))) return "";
  } else {
    const size_t colon = v.find(':');
    host = v.substr(0, colon);
    if (colon != std::string_view::npos && !all_digits(v.substr(colon + 1))) return "";
  }
  for (char c : host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
          c == ':'))
      return "";
  std::string out = lower(host);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

bool host_allowed(std::string_view host_header, const std::vector<std::string>& allowed,
                  bool allow_ip) {
  if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) return true;
  const std::string host = host_of(host_header);
  if (host.empty()) return false;
  if (std::find(allowed.begin(), allowed.end(), host) != allowed.end()) return true;
  return allow_ip && is_ip_literal(host);
}

bool bearer_matches(std::string_view authorization, std::string_view key) {
  std::string_view v = trim(authorization);
  constexpr std::string_view kScheme = "bearer";
  if (v.size() <= kScheme.size() || lower(v.substr(0, kScheme.size())) != kScheme ||
      (v[kScheme.size()] != ' ' && v[kScheme.size()] != '\t'))
    return false;
  const std::string_view token = trim(v.substr(kScheme.size()));
  // Every byte of the key is compared whatever the token holds: no early exit on a mismatch.
  unsigned diff = token.size() != key.size() ? 1u : 0u;
  for (size_t i = 0; i < key.size(); ++i)
    diff |= static_cast<unsigned char>(i < token.size() ? token[i] : 0) ^
            static_cast<unsigned char>(key[i]);
  return diff == 0;
}

bool is_json_media_type(std::string_view content_type) {
  return lower(trim(content_type.substr(0, content_type.find(';')))) == "application/json";
}

bool origin_allowed(std::string_view origin, const std::vector<std::string>& allowed) {
  for (const std::string& a : allowed)
    if (a == "*" || lower(a) == lower(trim(origin))) return true;
  return false;
}

std::vector<std::string> default_allowed_hosts(const std::string& bind_host, bool& allow_ip) {
  std::string host = lower(bind_host);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  allow_ip = false;
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(host, ec);
  if (!ec && addr.is_unspecified()) {
    allow_ip = true;
    return {"localhost"};
  }
  if (host == "localhost" || (!ec && addr.is_loopback()))
    return {host, "localhost", "127.0.0.1", "::1"};
  return {host};
}

}  // namespace kestrel::server
