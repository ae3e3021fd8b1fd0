// The header checks before routing (server/request_policy.h) and the one kind -> status map.
#include <gtest/gtest.h>

#include "server/http_error.h"
#include "server/request_policy.h"

namespace kestrel::server {
namespace {

TEST(HostHeader, ParsesNamesPortsAndBracketedAddresses) {
  EXPECT_EQ(host_of("Example.COM"), "example.com");
  EXPECT_EQ(host_of("example.com.:8080"), "example.com");
  EXPECT_EQ(host_of("127.0.0.1:80"), "127.0.0.1");
  EXPECT_EQ(host_of("[::1]:8080"), "::1");
  EXPECT_EQ(host_of("[::1]"), "::1");
  for (const char* bad : {"", "a b", "host:port", "[::1", "[::1]x", "evil.com/x", "a@b"})
    EXPECT_EQ(host_of(bad), "") << bad;
}

TEST(HostHeader, AllowedByNameOrAsAnIpLiteral) {
  const std::vector<std::string> loop = {"127.0.0.1", "localhost", "::1"};
  EXPECT_TRUE(host_allowed("127.0.0.1:8080", loop, false));
  EXPECT_TRUE(host_allowed("LOCALHOST:1", loop, false));
  EXPECT_TRUE(host_allowed("[::1]:9", loop, false));
  // DNS rebinding: a name that resolves to 127.0.0.1 is still not one of ours.
  EXPECT_FALSE(host_allowed("attacker.example:8080", loop, false));
  EXPECT_FALSE(host_allowed("10.0.0.5", loop, false));
  EXPECT_TRUE(host_allowed("10.0.0.5:8080", {"localhost"}, true));
  EXPECT_FALSE(host_allowed("attacker.example", {"localhost"}, true));
  EXPECT_TRUE(host_allowed("anything.example", {"*"}, false));
  EXPECT_FALSE(host_allowed("bad host", loop, true));
}

TEST(HostHeader, DefaultsFollowTheBoundAddress) {
  bool ip = true;
  auto hosts = default_allowed_hosts("127.0.0.1", ip);
  EXPECT_FALSE(ip);
  EXPECT_TRUE(host_allowed("localhost:8080", hosts, ip));
  EXPECT_FALSE(host_allowed("192.168.1.2", hosts, ip));
  hosts = default_allowed_hosts("0.0.0.0", ip);
  EXPECT_TRUE(ip);
  EXPECT_TRUE(host_allowed("192.168.1.2:8080", hosts, ip));
  EXPECT_FALSE(host_allowed("rebound.example", hosts, ip));
  hosts = default_allowed_hosts("::", ip);
  EXPECT_TRUE(ip);
  hosts = default_allowed_hosts("10.1.2.3", ip);
  EXPECT_FALSE(ip);
  EXPECT_TRUE(host_allowed("10.1.2.3:80", hosts, ip));
  EXPECT_FALSE(host_allowed("localhost", hosts, ip));
}

TEST(ApiKey, BearerSchemeAnyCaseAndExactToken) {
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("BEARER   s3cret  ", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cretX", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer S3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearers3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer ", "s3cret"));
}

TEST(ContentType, OnlyJson) {
  EXPECT_TRUE(is_json_media_type("application/json"));
  EXPECT_TRUE(is_json_media_type("Application/JSON; charset=utf-8"));
  EXPECT_FALSE(is_json_media_type("text/plain"));
  EXPECT_FALSE(is_json_media_type("application/x-www-form-urlencoded"));
  EXPECT_FALSE(is_json_media_type("multipart/form-data; boundary=x"));
  EXPECT_FALSE(is_json_media_type("application/jsonp"));
}

TEST(Cors, ListedOriginsOrAny) {
  EXPECT_FALSE(origin_allowed("https://a.example", {}));
  EXPECT_TRUE(origin_allowed("https://a.example", {"https://a.example"}));
  EXPECT_FALSE(origin_allowed("https://b.example", {"https://a.example"}));
  EXPECT_FALSE(origin_allowed("http://a.example", {"https://a.example"}));
  EXPECT_TRUE(origin_allowed("https://b.example", {"*"}));
}

// Each kind has one status: a client's mistake is a 4xx, shutting down 503, only a fault 500.
TEST(HttpStatus, OneStatusPerKind) {
  EXPECT_EQ(http_status(ErrorKind::kInvalidArgument).status, 422);
  EXPECT_EQ(http_status(ErrorKind::kMalformed).status, 400);
  EXPECT_EQ(http_status(ErrorKind::kNotFound).status, 404);
  EXPECT_EQ(http_status(ErrorKind::kMethodNotAllowed).status, 405);
  EXPECT_EQ(http_status(ErrorKind::kUnauthenticated).status, 401);
  EXPECT_EQ(http_status(ErrorKind::kForbidden).status, 403);
  EXPECT_EQ(http_status(ErrorKind::kTooLarge).status, 413);
  EXPECT_EQ(http_status(ErrorKind::kHeadersTooLarge).status, 431);
  EXPECT_EQ(http_status(ErrorKind::kUnsupportedMediaType).status, 415);
  EXPECT_EQ(http_status(ErrorKind::kOverloaded).status, 429);
  EXPECT_EQ(http_status(ErrorKind::kUnavailable).status, 503);
  EXPECT_EQ(http_status(ErrorKind::kInternal).status, 500);
  EXPECT_STREQ(http_status(ErrorKind::kInvalidArgument).error_type, "validation");
  EXPECT_EQ(validation_message(ValidationError("x", "bad")), "Input validation error: bad");
  EXPECT_EQ(validation_message(ValidationError("x", "gone", ErrorKind::kNotFound)), "gone");
}

}  // namespace
}  // namespace kestrel::server
