// Token ids -> text: per-token pieces, whole-sequence decoding and the streaming decoder.
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/tokenizer/tokenizer_impl.h"
#include "tandem/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";    // U+2581
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpaceMark.size()) == kSpaceMark) {
      out += ' ';
      i += kSpaceMark.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// Byte-level BPE stand-ins back to bytes; a code point outside the alphabet is kept as its UTF-8.
std::string bytes_from_alphabet(std::string_view text) {
  const ByteAlphabet& a = byte_alphabet();
  std::vector<uint32_t> cps;
  decode_utf8_lenient(text, cps);
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) {
    if (cp < a.cp_to_byte.size() && a.cp_to_byte[cp] >= 0)
      out += static_cast<char>(a.cp_to_byte[cp]);
    else
      append_utf8_raw(out, cp);
  }
  return out;
}

// "<0xNN>" -> the byte; anything else -> the text itself.
std::string byte_token_piece(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() == 6 && text.substr(0, 3) == "<0x" && text[5] == '>' && hex(text[3]) >= 0 &&
      hex(text[4]) >= 0)
    return std::string(1, static_cast<char>(hex(text[3]) * 16 + hex(text[4])));
  return std::string(text);
}

// Length of the longest prefix of `s` that a well-formed UTF-8 sequence can start with (at least 1), and the
// length of the complete sequence its first byte announces (0 when the first byte cannot start one).
std::pair<size_t, size_t> utf8_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned char c = p[0];
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {1, 0};
  }
  size_t k = 1;
  while (k < need && k < s.size()) {
    unsigned char b = p[k];
    bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++k;
  }
  return {k, need};
}

}  // namespace

std::string repair_utf8(std::string_view bytes, bool keep_incomplete_tail, size_t* tail) {
  std::string out;
  out.reserve(bytes.size());
  if (tail) *tail = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      out += bytes[i++];
      continue;
    }
    auto [have, need] = utf8_prefix(bytes.substr(i));
    if (need != 0 && have == need) {
      out.append(bytes.substr(i, need));
      i += need;
      continue;
    }
    if (need != 0 && i + have == bytes.size() && keep_incomplete_tail) {
      if (tail) *tail = have;
      break;
    }
    out += kReplacement;
    i += have;
  }
  return out;
}

void Tokenizer::Impl::build_pieces() {
  const bool hash_style = wpm && wpm->hash_continuations();
  pieces.resize(vocab.n_vocab());
  for (int32_t id = 0; id < vocab.n_vocab(); ++id) {
    const uint32_t attr = vocab.attrs[id];
    std::string_view text = vocab.text(id);
    std::string& piece = pieces[id];
    if (attr & (kAttrControl | kAttrUnknown)) {
      piece.clear();
    } else if (attr & kAttrUserDefined) {
      piece = text;
    } else if (attr & kAttrNormal) {
      if (bpe) {
        piece = bytes_from_alphabet(text);
      } else if (hash_style) {
        if (text.substr(0, 2) == "##") {
          piece.assign(text.substr(2));
        } else {
          piece.assign(1, ' ');
          piece.append(text);
        }
      } else {
        piece = unescape_spaces(text);
      }
    } else if (attr & kAttrByte) {
      piece = byte_token_piece(text);
    } else {
      piece.clear();  // unused and undefined tokens render as nothing
    }
  }
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  impl_->check_id(id);
  if (render_special && impl_->vocab.has_attr(id, kAttrControl | kAttrUnknown))
    return std::string(impl_->vocab.text(id));
  return impl_->pieces[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  bool at_start = true;
  for (int32_t id : ids) {
    impl_->check_id(id);
    std::string_view piece = impl_->pieces[id];
    if (piece.empty()) continue;
    if (at_start && impl_->strip_leading_space && piece[0] == ' ') piece.remove_prefix(1);
    at_start = false;
    bytes += piece;
  }
  return repair_utf8(bytes);
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, TextPosition position)
    : tokenizer_(tokenizer), at_start_(position == TextPosition::kStart) {}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl& m = *tokenizer_.impl_;
  m.check_id(id);
  std::string_view piece = m.pieces[id];
  if (piece.empty()) return {};
  if (at_start_ && m.strip_leading_space && piece[0] == ' ') piece.remove_prefix(1);
  at_start_ = false;
  pending_ += piece;
  size_t tail = 0;
  std::string ready = repair_utf8(pending_, true, &tail);
  pending_.erase(0, pending_.size() - tail);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest = repair_utf8(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tandem::tokenizer
