// The server's TLS files (--tls-cert, --tls-key, --tls-client-ca), read and checked with OpenSSL
// before gRPC and the web UI's listener are given them: gRPC takes any bytes and fails only when
// it builds the port, with raw log lines and a "cannot bind" that names the wrong flag. Here each
// file is named with what is wrong with it, in one line.
//
// Thread safety: pure functions (OpenSSL's error queue is per thread).
#pragma once

#include <string>

namespace ampscope::server {

struct TlsFiles {
  std::string cert_pem;       // the certificate chain, leaf first
  std::string key_pem;        // the leaf's private key
  std::string client_ca_pem;  // empty: no client certificates asked for
};

// Reads the files (client_ca may be empty) and checks that each can be read, that the
// certificate files hold PEM certificates, that the key is an unencrypted PEM private key and
// that it belongs to the first certificate of `cert`. Throws ampscope::Error naming the flag,
// the file and the reason ("--tls-key 'k.pem': does not match the certificate of --tls-cert
// 'c.pem'"). Logs a warning when group or others may read the key.
TlsFiles load_tls_files(const std::string& cert, const std::string& key,
                        const std::string& client_ca);

}  // namespace ampscope::server
