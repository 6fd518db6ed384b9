// The web UI's files, compiled into the server (cmake/embed_assets.cmake writes the table at
// build time from the files server/CMakeLists.txt lists), so that the UI needs no file on disk
// and nothing from the network.
//
// Thread safety: the table is constant; any thread may read it.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace ampscope::server {

struct WebAsset {
  std::string_view name;          // the file name, served as /assets/<name>
  std::string_view content_type;  // from the extension, e.g. "text/javascript; charset=utf-8"
  std::string_view etag;          // quoted hash of the bytes, e.g. "\"3f1c0a7e9d2b4c6e\""
  const unsigned char* data;
  std::size_t size;

  std::string_view bytes() const { return {reinterpret_cast<const char*>(data), size}; }
};

// The asset named `name` ("app.js"), or nullptr.
const WebAsset* find_web_asset(std::string_view name);
// Every asset.
std::span<const WebAsset> web_assets();

}  // namespace ampscope::server
