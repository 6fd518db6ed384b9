// Files that hold a secret (a token file, a TLS private key): the one rule for when such a file
// is exposed, shared by the server (--auth-token-file, --tls-key) and the CLI (--token-file).
// A warning, not an error: the owner may have reasons (a group of operators), and refusing to
// start over it would turn a hardening hint into an outage.
//
// Thread safety: a pure function of the file system.
#pragma once

#include <sys/stat.h>

#include <sstream>
#include <string>

namespace ampscope {

// "" when `path` cannot be examined or only its owner may read it; otherwise what to tell its
// owner: "group or others may read it (mode 644); chmod 600 it".
inline std::string secret_file_exposure(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & (S_IRGRP | S_IROTH)) == 0) return "";
  std::ostringstream os;
  os << "group or others may read it (mode " << std::oct << (st.st_mode & 0777)
     << "); chmod 600 it";
  return os.str();
}

}  // namespace ampscope
