// The pre-tokenizers `tokenizer.ggml.pre` can name, as data: each name stands for a list of regexes (applied
// in order, see pretokenizer.h) and the per-model defaults the reference implementation attaches to it.
// Non-ASCII characters in the regexes are written as \x{...} so that no editor or tool can normalize them.
#include "tandem/tokenizer/pretokenizer.h"
#include "tandem/tokenizer/pretokenizer_scan.h"
#include "tandem/util/error.h"

namespace tandem::tokenizer {
namespace {

// GPT-2. Matched by a hand-written scanner (pretokenizer_scan.cpp) when given exactly like this.
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

// LLaMA-3 (case-insensitive contractions spelled out). Also matched by a scanner.
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Qwen2: LLaMA-3 with single digits.
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Cased letters (Lu, Ll, Lt) as DeepSeek's tokenizer lists them.
constexpr const char* kDeepseekLlmLetters =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{"
    "295}-"
    "\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{"
    "38E}-"
    "\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}"
    "-"
    "\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}"
    "-"
    "\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}"
    "-"
    "\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}"
    "-"
    "\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{"
    "1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{"
    "118DF}"
    "\\x{1E900}-\\x{1E943}]+";
// ASCII and full-width punctuation, general punctuation quotes, CJK space and marks.
constexpr const char* kDeepseekLlmPunct =
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+";
// CJK ideographs (U+4E00..U+9FA5), U+0800..U+4E00 and Hangul.
constexpr const char* kDeepseekCjk = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";
// CJK ideographs and kana.
constexpr const char* kDeepseek3Cjk = "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
constexpr const char* kDeepseek3Main =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

// BLOOM / Poro: anything up to whitespace or sentence punctuation (the parentheses and bar are literal).
constexpr const char* kBloom =
    " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+";

// Tekken / GPT-4o: an upper-case run then a lower-case run, spelled with lookaheads (no \p{Lu} in the
// collapsed text).
constexpr const char* kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])"
    "([^a-"
    "z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'"
    "[mM]|'["
    "lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR]"
    "[eE]|'["
    "vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kQwen35 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kBailing =
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
constexpr const char* kSeedCoder =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
    "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct Entry {
  const char* names[20];  // null-terminated
  const char* regexes[8];
  bool add_bos = false;
  bool ignore_merges = false;
  bool clear_bos = false;
  bool add_sep = false;
};

// clang-format off
const Entry kEntries[] = {
    {{"default"}, {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}, {kLlama3},
     /*add_bos=*/true, /*ignore_merges=*/true},
    {{"dbrx", "smaug-bpe", "smaug"}, {kLlama3}},
    {{"glm4", "chatglm-bpe", "chatglm"}, {kLlama3}, false, false, /*clear_bos=*/true},
    {{"deepseek-llm"}, {"[\r\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, "\\s+$", kDeepseekCjk, "\\p{N}+"}},
    {{"deepseek-coder"}, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kDeepseekCjk, "\\p{N}"}},
    {{"deepseek-v3", "hunyuan-dense"}, {"\\p{N}{1,3}", kDeepseek3Cjk, kDeepseek3Main}},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "minerva"},
     {"\\p{N}", kGpt2}},
    {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert", "exaone4", "mpt", "olmo", "gpt-neox", "jais", "trillion", "granite-docling"},
     {kGpt2}},
    {{"jina-v1-en", "jina-v2-code", "roberta-bpe"}, {kGpt2}, false, false, false, /*add_sep=*/true},
    {{"qwen2", "deepseek-r1-qwen", "megrez", "hunyuan", "stablelm2"}, {kQwen2}},
    {{"qwen35"}, {kQwen35}},
    {{"poro-chat", "poro", "bloom", "gpt3-finnish"}, {kBloom}},
    {{"viking"}, {kBloom, "\\p{N}"}},
    {{"tekken"}, {kTekken}, /*add_bos=*/true, /*ignore_merges=*/true},
    {{"chameleon"},
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", kGpt2},
     /*add_bos=*/true},
    {{"gpt-4o", "llama4"}, {kGpt4o}},
    {{"superbpe"}, {"\\p{N}+", "(?=(\\d{3})+(?!\\d))"}},
    {{"bailingmoe", "bailingmoe2", "llada-moe"}, {kBailing}},
    {{"seed-coder"}, {kSeedCoder}},
};
// clang-format on

}  // namespace

std::string pre_regex_gpt2() {
  return kGpt2;
}
std::string pre_regex_llama3() {
  return kLlama3;
}

PreTokenizerSpec pre_tokenizer_spec(std::string_view name) {
  if (name.empty()) name = "default";
  for (const Entry& e : kEntries) {
    bool match = false;
    for (const char* const* n = e.names; *n && !match; ++n) match = name == *n;
    if (!match) continue;
    PreTokenizerSpec spec;
    for (const char* const* r = e.regexes; *r; ++r) spec.regexes.emplace_back(*r);
    spec.defaults.add_bos = e.add_bos;
    spec.defaults.ignore_merges = e.ignore_merges;
    spec.defaults.clear_bos = e.clear_bos;
    spec.add_sep = e.add_sep;
    return spec;
  }
  std::string known;
  for (const Entry& e : kEntries)
    for (const char* const* n = e.names; *n; ++n) known += (known.empty() ? "" : ", ") + std::string(*n);
  throw Error("unknown pre-tokenizer '" + std::string(name) +
              "' (metadata key tokenizer.ggml.pre); this build knows: " + known);
}

}  // namespace tandem::tokenizer
