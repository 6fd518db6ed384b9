#include "tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/secret_file.h"
#include "log.h"

namespace ampscope::server {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

// "--tls-key 'server.key'"
std::string named(const char* flag, const std::string& path) {
  return std::string(flag) + " '" + path + "'";
}

std::string read_whole(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(named(flag, path) + ": cannot read it (" + std::strerror(errno) + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Bio memory_bio(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

bool holds(const std::string& text, const char* marker) {
  return text.find(marker) != std::string::npos;
}

// The certificates of a PEM file, in order; throws when there is none.
std::vector<Cert> certificates(const char* flag, const std::string& path,
                               const std::string& text) {
  std::vector<Cert> out;
  Bio bio = memory_bio(text);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the end of the file reads as an error
  if (out.empty()) {
    throw Error(named(flag, path) + ": no PEM certificate in it" +
                (text.empty()                        ? " (the file is empty)"
                 : !holds(text, "PRIVATE KEY-----") ? ""
                 : std::string(flag) == "--tls-cert" ? " (it holds a private key: swapped with "
                                                       "--tls-key?)"
                                                     : " (it holds a private key)"));
  }
  return out;
}

// Never prompts on the terminal for a passphrase: an encrypted key is an error.
int no_passphrase(char*, int, int, void*) { return -1; }

Pkey private_key(const char* flag, const std::string& path, const std::string& text) {
  Bio bio = memory_bio(text);
  Pkey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  const unsigned long err = ERR_peek_last_error();
  ERR_clear_error();
  if (key) return key;
  std::string why = "no PEM private key in it";
  if (holds(text, "ENCRYPTED")) {
    why = "the private key is encrypted; give it without a passphrase (openssl pkey -in KEY "
          "-out KEY.plain)";
  } else if (holds(text, "CERTIFICATE-----") && !holds(text, "PRIVATE KEY-----")) {
    why += " (it holds a certificate: swapped with --tls-cert?)";
  } else if (text.empty()) {
    why += " (the file is empty)";
  } else if (const char* reason = ERR_reason_error_string(err)) {
    why += std::string(" (") + reason + ")";
  }
  throw Error(named(flag, path) + ": " + why);
}

}  // namespace

TlsFiles load_tls_files(const std::string& cert, const std::string& key,
                        const std::string& client_ca) {
  TlsFiles files;
  files.cert_pem = read_whole("--tls-cert", cert);
  files.key_pem = read_whole("--tls-key", key);
  if (!client_ca.empty()) files.client_ca_pem = read_whole("--tls-client-ca", client_ca);

  const std::vector<Cert> chain = certificates("--tls-cert", cert, files.cert_pem);
  const Pkey pkey = private_key("--tls-key", key, files.key_pem);
  const bool match = X509_check_private_key(chain.front().get(), pkey.get()) == 1;
  ERR_clear_error();
  if (!match) {
    throw Error(named("--tls-key", key) + ": does not match the certificate of " +
                named("--tls-cert", cert) + " (the key of another certificate?)");
  }
  if (!client_ca.empty()) certificates("--tls-client-ca", client_ca, files.client_ca_pem);
  if (const std::string exposed = secret_file_exposure(key); !exposed.empty()) {
    log_warning(named("--tls-key", key), ": ", exposed);
  }
  return files;
}

}  // namespace ampscope::server
