#include "run_ownership.h"

#include "ampscope/proto/target.h"

namespace ampscope::server {

std::string check_advertise_address(const std::string& advertise) {
  if (advertise.empty()) return "";
  if (std::string why = proto::check_target(advertise); !why.empty()) return why;
  if (proto::is_wildcard_address(advertise)) {
    return "'" + advertise +
           "' is a wildcard address, for listening; agents need one they can connect to";
  }
  return "";
}

std::string advertised_address(const std::string& advertise, const std::string& listen,
                               const std::string& bound) {
  if (!advertise.empty()) return advertise;
  return proto::is_wildcard_address(listen) ? "" : bound;
}

}  // namespace ampscope::server
