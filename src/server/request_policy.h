// The checks a request's headers pass before any route runs: the Host header against the names
// the server answers for (DNS rebinding), the API key (constant time, case-insensitive scheme),
// the POST body's media type, and the CORS origin list. Pure functions, tested in isolation.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kestrel::server {

// The host of a Host header value ("name", "name:port", "[v6]", "[v6]:port"), lowercase, without
// a trailing dot; "" when the value is not of that form.
std::string host_of(std::string_view host_header);

// True when `host_header` names a host in `allowed` (lowercase names, "*": any), or any IP literal
// when `allow_ip` is set.
bool host_allowed(std::string_view host_header, const std::vector<std::string>& allowed,
                  bool allow_ip);

// True when `authorization` is "Bearer <key>" (the scheme in any case, spaces around the token)
// and the token equals `key`. The comparison's time depends on the key's length only.
bool bearer_matches(std::string_view authorization, std::string_view key);

// True for "application/json" with optional parameters ("; charset=utf-8"), in any case.
bool is_json_media_type(std::string_view content_type);

// True when `origin` is listed (exactly, scheme://host[:port]) or the list holds "*".
bool origin_allowed(std::string_view origin, const std::vector<std::string>& allowed);

// The default --allowed-hosts for a server bound to `bind_host`: its own name and, on a loopback
// address, localhost's names. Sets `allow_ip` for a wildcard bind (0.0.0.0, ::), where the
// address a client uses is any of the machine's.
std::vector<std::string> default_allowed_hosts(const std::string& bind_host, bool& allow_ip);

}  // namespace kestrel::server
