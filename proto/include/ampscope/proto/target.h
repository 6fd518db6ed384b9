// gRPC addresses as ampscope writes them, one reading for every side: the agent's `server`
// option (a list), the owner's address in a Redirect, the server's --advertise-address.
//
// A target is "host:port" ("[::1]:50051", a name with several addresses: gRPC's DNS resolver
// finds them all and its default pick_first policy connects to the first that answers) or a URI
// gRPC resolves itself ("dns:///host:port", "ipv4:10.0.0.1:50051", "unix:/path"). A list is
// targets separated by commas, each trimmed of spaces; a comma always separates the list's
// entries, so a gRPC URI that carries its own list ("ipv4:a:1,b:2") reads as two entries, which
// the agent tries in turn anyway.
//
// Thread safety: pure functions.
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::proto {

// Why `target` cannot be a server's address, one line ("expected host:port with a port in
// 1..65535, got 'x'"); empty when it can. A port outside 1..65535 would only have a client retry
// forever, so it is refused where the address is given.
inline std::string check_target(std::string_view target) {
  for (std::string_view scheme : {"unix:", "unix-abstract:", "vsock:"}) {
    if (target.substr(0, scheme.size()) == scheme) return "";
  }
  std::string_view rest = target;
  if (const auto sep = rest.find(":///"); sep != std::string_view::npos)
    rest.remove_prefix(sep + 4);
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    return "expected host:port, got '" + std::string(target) + "'";
  }
  const std::string_view host = rest.substr(0, colon), port = rest.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() ||
      value < 1 || value > 65535) {
    return "expected host:port with a port in 1..65535, got '" + std::string(target) + "'";
  }
  return "";
}

// The entries of a comma-separated list, each trimmed of spaces and tabs; an empty entry stays
// (empty) so that a check can name it. "" is an empty list, " " a list of one empty entry.
inline std::vector<std::string> split_targets(std::string_view list) {
  std::vector<std::string> out;
  if (list.empty()) return out;
  for (;;) {
    const auto comma = list.find(',');
    std::string_view entry = list.substr(0, comma);
    const auto first = entry.find_first_not_of(" \t");
    entry = first == std::string_view::npos
                ? std::string_view()
                : entry.substr(first, entry.find_last_not_of(" \t") - first + 1);
    out.emplace_back(entry);
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

// Why the comma-separated `list` cannot be used, naming the entry ("entry 2 of 2: expected
// host:port ..."); empty when every entry is a target.
inline std::string check_target_list(std::string_view list) {
  const std::vector<std::string> entries = split_targets(list);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string where = entries.size() == 1 ? ""
                                                  : "entry " + std::to_string(i + 1) + " of " +
                                                        std::to_string(entries.size()) + ": ";
    if (entries[i].empty()) return where + "empty (a list is host:port,host:port,...)";
    if (std::string why = check_target(entries[i]); !why.empty()) return where + why;
  }
  return "";
}

// "0.0.0.0:50051", "[::]:50051", ":50051", "*:50051": an address to listen on that no client
// can connect to.
inline bool is_wildcard_address(std::string_view address) {
  const auto colon = address.rfind(':');
  const std::string_view host = address.substr(0, colon == std::string_view::npos ? 0 : colon);
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "*";
}

}  // namespace ampscope::proto
