#define PCRE2_CODE_UNIT_WIDTH 8
#include "tandem/tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>

#include "tandem/tokenizer/pretokenizer_scan.h"
#include "tandem/tokenizer/unicode.h"
#include "tandem/util/error.h"

namespace tandem::tokenizer {
namespace {

// Collapsed text: one byte per code point. ASCII stays; other code points become one byte per category, and
// non-ASCII whitespace becomes \v so that \s still matches it.
constexpr char kCollapsedOther = '\xD0';
constexpr char kCollapsedNumber = '\xD1';
constexpr char kCollapsedLetter = '\xD2';
constexpr char kCollapsedPunct = '\xD3';
constexpr char kCollapsedMark = '\xD4';
constexpr char kCollapsedSymbol = '\xD5';

struct UnicodeClass {
  std::string_view name;
  char collapsed;
  std::string_view ascii;  // the ASCII members, as class syntax
};
constexpr std::array<UnicodeClass, 10> kClasses = {{
    {"\\p{N}", kCollapsedNumber, "0-9"},
    {"\\p{L}", kCollapsedLetter, "A-Za-z"},
    {"\\p{P}", kCollapsedPunct, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", kCollapsedMark, ""},
    {"\\p{S}", kCollapsedSymbol, "\\$\\+<->^`\\|"},
    {"\\p{Lu}", kCollapsedLetter, "A-Za-z"},
    {"\\p{Ll}", kCollapsedLetter, "A-Za-z"},
    {"\\p{Lt}", kCollapsedLetter, "A-Za-z"},
    {"\\p{Lm}", kCollapsedLetter, "A-Za-z"},
    {"\\p{Lo}", kCollapsedLetter, "A-Za-z"},
}};

bool uses_unicode_classes(const std::string& re) {
  return std::any_of(kClasses.begin(), kClasses.end(),
                     [&](const UnicodeClass& c) { return re.find(c.name) != std::string::npos; });
}

// Rewrites \p{..} classes into the collapsed alphabet: "[<category byte><ASCII members>]" outside a bracket
// expression, the same without brackets inside one.
std::string collapse_regex(const std::string& re) {
  std::string out;
  bool inside = false;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
      out += '[';
      inside = true;
      continue;
    }
    if (inside && re[i] == ']' && re[i - 1] != '\\') {
      out += ']';
      inside = false;
      continue;
    }
    if (re[i] == '\\' && i + 3 < re.size() && re[i + 1] == 'p' && re[i + 2] == '{') {
      size_t close = re.find('}', i + 3);
      if (close != std::string::npos && close <= i + 10) {
        std::string_view name(re.data() + i, close - i + 1);
        auto it = std::find_if(kClasses.begin(), kClasses.end(),
                               [&](const UnicodeClass& c) { return c.name == name; });
        if (it != kClasses.end()) {
          if (!inside) out += '[';
          out += it->collapsed;
          out += it->ascii;
          if (!inside) out += ']';
          i = close;
          continue;
        }
      }
    }
    out += re[i];
  }
  return out;
}

char collapse_cp(uint32_t cp) {
  if (cp < 0x80) return static_cast<char>(cp);
  CpFlags f = cp_flags(cp);
  if (f.is_whitespace()) return '\v';
  switch (f.category()) {
    case Category::kNumber:
      return kCollapsedNumber;
    case Category::kLetter:
      return kCollapsedLetter;
    case Category::kPunctuation:
      return kCollapsedPunct;
    case Category::kAccentMark:
      return kCollapsedMark;
    case Category::kSymbol:
      return kCollapsedSymbol;
    default:
      return kCollapsedOther;
  }
}

// A match context with a JIT stack of up to 256 MiB (reserved, committed as used), for the rare long match.
struct JitStack {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  JitStack() {
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitStack() {
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
  JitStack(const JitStack&) = delete;
  JitStack& operator=(const JitStack&) = delete;
};

// Per-call views of the text the ops work on.
struct SplitContext {
  const std::vector<uint32_t>* cps = nullptr;
  std::vector<uint8_t> flags;      // (n) CpFlags bits
  std::string collapsed;           // (n) one byte per code point
  std::string wide;                // UTF-8 of the code points, non-ASCII whitespace as \v
  std::vector<uint32_t> wide_off;  // (n + 1) byte offset of each code point in `wide`
};

}  // namespace

struct PreTokenizer::Op {
  enum class Kind { kGpt2, kLlama3, kCollapsed, kWide } kind = Kind::kGpt2;
  pcre2_code* code = nullptr;

  ~Op() {
    if (code) pcre2_code_free(code);
  }

  // Appends the lengths (in code points) of the pieces of segment [begin, begin + len).
  void apply(const SplitContext& ctx, pcre2_match_data* md, size_t begin, size_t len,
             std::vector<uint32_t>& pieces) const {
    if (len == 0) return;
    switch (kind) {
      case Kind::kGpt2:
        return scan_gpt2(ctx.cps->data(), ctx.flags.data(), begin, begin + len, pieces);
      case Kind::kLlama3:
        return scan_llama3(ctx.cps->data(), ctx.flags.data(), begin, begin + len, pieces);
      case Kind::kCollapsed:
        return regex_split(ctx, md, begin, len, pieces, false);
      case Kind::kWide:
        return regex_split(ctx, md, begin, len, pieces, true);
    }
  }

 private:
  void regex_split(const SplitContext& ctx, pcre2_match_data* md, size_t begin, size_t len,
                   std::vector<uint32_t>& pieces, bool wide) const {
    // Subject units: bytes of the collapsed text (= code points) or of the wide UTF-8 text.
    const char* base = wide ? ctx.wide.data() + ctx.wide_off[begin] : ctx.collapsed.data() + begin;
    const size_t n_units = wide ? ctx.wide_off[begin + len] - ctx.wide_off[begin] : len;
    auto to_cp = [&](size_t unit) -> size_t {  // unit offset -> code point offset within the segment
      if (!wide) return unit;
      auto first = ctx.wide_off.begin() + static_cast<ptrdiff_t>(begin);
      auto it = std::lower_bound(first, first + static_cast<ptrdiff_t>(len) + 1,
                                 static_cast<uint32_t>(ctx.wide_off[begin] + unit));
      return static_cast<size_t>(it - first);
    };
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(base);
    size_t start = 0;
    size_t last = 0;  // end of the previous match, in code points
    uint32_t options = 0;
    while (start <= n_units) {
      int rc =
          pcre2_match(code, subject, n_units, start, options | (wide ? PCRE2_NO_UTF_CHECK : 0), md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // Long runs under patterns that backtrack per character (tekken, gpt-4o) outgrow the default 32 KiB
        // machine stack: retry on a large JIT stack, then with the interpreter.
        JitStack big;
        rc = pcre2_match(code, subject, n_units, start, options | (wide ? PCRE2_NO_UTF_CHECK : 0), md,
                         big.context);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
          rc = pcre2_match(code, subject, n_units, start,
                           options | PCRE2_NO_JIT | (wide ? PCRE2_NO_UTF_CHECK : 0), md, nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) {
        if (options == 0 || start >= n_units) break;
        // After an empty match: step over one character and search again.
        size_t step = wide ? utf8_lead_length(static_cast<unsigned char>(base[start])) : 1;
        start += step;
        options = 0;
        continue;
      }
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw Error("pre-tokenizer regex failed on the input: " +
                    std::string(reinterpret_cast<char*>(msg.data())));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t ms = to_cp(ov[0]), me = to_cp(ov[1]);
      if (ms > last) pieces.push_back(static_cast<uint32_t>(ms - last));
      if (me > ms) pieces.push_back(static_cast<uint32_t>(me - ms));
      last = me;
      start = ov[1];
      options = ov[0] == ov[1] ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
      if (start >= n_units && options == 0) break;
    }
    if (last < len) pieces.push_back(static_cast<uint32_t>(len - last));
  }
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& regexes) {
  const std::string gpt2 = pre_regex_gpt2(), llama3 = pre_regex_llama3();
  for (const std::string& re : regexes) {
    auto op = std::make_unique<Op>();
    std::string pattern = re;
    uint32_t flags = PCRE2_DOLLAR_ENDONLY;
    if (re == gpt2) {
      op->kind = Op::Kind::kGpt2;
    } else if (re == llama3) {
      op->kind = Op::Kind::kLlama3;
    } else if (uses_unicode_classes(re)) {
      op->kind = Op::Kind::kCollapsed;
      pattern = collapse_regex(re);
      need_collapsed_ = true;
    } else {
      op->kind = Op::Kind::kWide;
      flags |= PCRE2_UTF;
      need_wide_ = true;
    }
    if (op->kind == Op::Kind::kCollapsed || op->kind == Op::Kind::kWide) {
      int err = 0;
      PCRE2_SIZE err_off = 0;
      op->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err,
                               &err_off, nullptr);
      if (!op->code) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(err, msg.data(), msg.size());
        throw Error("cannot compile pre-tokenizer regex '" + re +
                    "': " + std::string(reinterpret_cast<char*>(msg.data())) + " at offset " +
                    std::to_string(err_off));
      }
      pcre2_jit_compile(op->code, PCRE2_JIT_COMPLETE);  // optional: matching falls back to the interpreter
    }
    ops_.push_back(std::move(op));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, PreTokenized& out) const {
  std::vector<uint32_t> cps;
  decode_utf8_lenient(text, cps);
  const size_t n = cps.size();

  SplitContext ctx;
  ctx.cps = &cps;
  std::vector<uint32_t> cp_off(n + 1);
  out.text.clear();
  out.text.reserve(text.size() + 16);
  ctx.flags.resize(n);
  for (size_t i = 0; i < n; ++i) {
    cp_off[i] = static_cast<uint32_t>(out.text.size());
    append_utf8_raw(out.text, cps[i]);
    ctx.flags[i] = cp_flags(cps[i]).bits;
  }
  cp_off[n] = static_cast<uint32_t>(out.text.size());
  if (need_collapsed_) {
    ctx.collapsed.resize(n);
    for (size_t i = 0; i < n; ++i) ctx.collapsed[i] = collapse_cp(cps[i]);
  }
  if (need_wide_) {
    ctx.wide.reserve(out.text.size());
    ctx.wide_off.resize(n + 1);
    for (size_t i = 0; i < n; ++i) {
      ctx.wide_off[i] = static_cast<uint32_t>(ctx.wide.size());
      uint32_t cp = cps[i];
      if (cp >= 0x80 && CpFlags{ctx.flags[i]}.is_whitespace()) cp = '\v';
      if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;  // keep the subject valid UTF-8
      append_utf8_raw(ctx.wide, cp);
    }
    ctx.wide_off[n] = static_cast<uint32_t>(ctx.wide.size());
  }

  std::vector<uint32_t> pieces{static_cast<uint32_t>(n)}, next;
  for (const auto& op : ops_) {
    pcre2_match_data* md = op->code ? pcre2_match_data_create_from_pattern(op->code, nullptr) : nullptr;
    next.clear();
    next.reserve(pieces.size() * 2);
    size_t begin = 0;
    try {
      for (uint32_t len : pieces) {
        op->apply(ctx, md, begin, len, next);
        begin += len;
      }
    } catch (...) {
      if (md) pcre2_match_data_free(md);
      throw;
    }
    if (md) pcre2_match_data_free(md);
    pieces.swap(next);
  }

  out.ends.clear();
  out.ends.reserve(pieces.size());
  size_t pos = 0;
  for (uint32_t len : pieces) {
    if (len == 0) continue;
    pos += len;
    out.ends.push_back(cp_off[pos]);
  }
}

}  // namespace tandem::tokenizer
