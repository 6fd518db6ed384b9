// Loopback networking for tests: a free port, and plain HTTP GETs (libcurl, no proxy).
#pragma once

#include <chrono>
#include <string>

namespace ampscope::testing {

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close). Another
// process may take it before the test binds it again: where a server can pick its own port
// and report it (ServerProcess), let it.
int free_loopback_port();

// GET `url`; returns the HTTP status (0 when the connection failed) and the body in *body.
long http_get(const std::string& url, std::string* body,
              std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Percent-encodes a query parameter value.
std::string url_encode(const std::string& value);

}  // namespace ampscope::testing
