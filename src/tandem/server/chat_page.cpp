#include "tandem/server/chat_page.h"

namespace tandem::server {
namespace {

// chat_page.html's bytes, as the hex list cmake/embed.cmake writes into the build folder.
constexpr unsigned char kPage[] = {
#include "tandem/server/chat_page_html.inc"
};

}  // namespace

std::string_view chat_page() {
  return {reinterpret_cast<const char*>(kPage), sizeof kPage};
}

}  // namespace tandem::server
