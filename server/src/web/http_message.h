// An HTTP request and response as the server's routes see them, without sockets: the listener
// (http_listener.h) fills an HttpRequest from the wire and writes the HttpResponse back, and a
// route (web_routes.h, metrics_endpoint.h) is a plain function from one to the other, so that
// unit tests and the fuzz target call it directly.
//
// Thread safety: plain values; the functions are pure.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ampscope::server {

using QueryParams = std::multimap<std::string, std::string>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // the request target as sent: "/api/runs/demo?width=10"
  std::vector<std::pair<std::string, std::string>> headers;  // as sent, in order
  std::string body;                                          // POST only
  std::string remote_address;                                // "127.0.0.1", for logs
  bool tls = false;                                          // arrived over HTTPS

  // The first header named `name` (case-insensitive), nullopt when absent.
  std::optional<std::string_view> header(std::string_view name) const;
  // The same, empty when absent.
  std::string_view header_or_empty(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;  // empty: no Content-Type (a redirect, a 304)
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type
  bool close = false;  // close the connection after this answer

  void set_header(std::string name, std::string value);
  // The first header named `name` (case-insensitive); empty when absent.
  std::string_view header(std::string_view name) const;
  void set_content(std::string text, std::string type);
  void redirect(std::string location, int code = 303);
};

// The request target split and decoded: the path with %XX decoded ("+" stays "+"), and the
// query's parameters with "+" as a space, then %XX decoded. An invalid escape ("%zz", a lone
// "%") is kept as written. Bytes are not checked for UTF-8: the routes quote what they echo.
struct Target {
  std::string path;
  QueryParams params;
};
Target parse_target(std::string_view target);

// "a=1&b=x+y" -> {a: "1", b: "x y"}; an application/x-www-form-urlencoded body as well.
QueryParams parse_query(std::string_view query);
std::string percent_decode(std::string_view text, bool plus_is_space);
// Everything but unreserved characters (RFC 3986) as %XX: a value for a query parameter.
std::string percent_encode(std::string_view text);

// Decodes standard base64 (RFC 4648, padding optional); nullopt on any other character.
std::optional<std::string> base64_decode(std::string_view text);

// Whether `accept_encoding` (an Accept-Encoding value) accepts gzip (a "gzip" item without
// q=0, or "*").
bool accepts_gzip(std::string_view accept_encoding);

}  // namespace ampscope::server
