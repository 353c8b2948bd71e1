// The chat page `tandem serve` answers at `/`: one self-contained HTML document (styles and script inline)
// that chats with the served model through /v1/chat/completions, streaming. Its source is chat_page.html
// beside this file, compiled into the binary at build time (cmake/embed.cmake), so the server needs no files
// to serve it.
#pragma once

#include <string_view>

namespace tandem::server {

// The page's HTML (UTF-8).
std::string_view chat_page();

// The Content-Security-Policy sent with the page: inline styles and script only, connections to this server
// only, so the page cannot load or send anything elsewhere.
inline constexpr const char* kChatPagePolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace tandem::server
