#include "tandem/tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>

#include "tandem/util/error.h"

namespace tandem::tokenizer {
namespace {

// Bounds on token text, far above real vocabularies (their longest tokens are a few hundred bytes, and the
// special ones at most a few hundred kilobytes in all) and low enough that a hostile vocabulary cannot make
// the tokenizer's tables or its per-position matching cost gigabytes or seconds.
constexpr size_t kMaxTokenBytes = size_t{1} << 16;
constexpr size_t kMaxSpecialBytes = size_t{1} << 20;

bool text_in(std::string_view text, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), text) != list.end();
}

uint32_t attr_from_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kNormal:
      return kAttrNormal;
    case TokenType::kUnknown:
      return kAttrUnknown;
    case TokenType::kControl:
      return kAttrControl;
    case TokenType::kUserDefined:
      return kAttrUserDefined;
    case TokenType::kUnused:
      return kAttrUnused;
    case TokenType::kByte:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

// Special ids: the per-model default (dropped when out of range), replaced by the metadata value. A value
// outside the vocabulary is an error naming the key, except the "none" that converters write (-1, or its
// unsigned 32- or 64-bit form), which keeps the default as in the reference.
void read_special_id(const gguf::File& file, std::string_view key, int32_t n_vocab, int32_t& id) {
  if (id >= n_vocab) id = -1;
  const gguf::Value* value = file.find(key);
  if (!value) return;
  if (value->is_integer() &&
      (value->i == -1 || (value->type == gguf::ValueType::U32 && value->u == 0xFFFFFFFF)))
    return;
  const int64_t v = *file.get_int(key);
  if (v < 0 || v >= n_vocab)
    throw Error("'" + file.path() + "': metadata '" + std::string(key) + "' is " + std::to_string(v) +
                ", outside the vocabulary (ids 0 to " + std::to_string(n_vocab - 1) + ")");
  id = static_cast<int32_t>(v);
}

void require_special(bool add, int32_t id, const char* add_key, const char* id_key) {
  if (add && id < 0)
    throw Error(std::string("invalid tokenizer metadata: ") + add_key + " is true, but " + id_key +
                " is not set (or is out of the vocabulary's range)");
}

// Finds a token by text among the conventional spellings (earlier spellings first) when `id` is not set yet,
// and marks it as control.
void detect_by_text(Vocab& v, int32_t& id, std::initializer_list<std::string_view> texts) {
  if (id >= 0) return;
  for (std::string_view text : texts) {
    int32_t t = v.find(text);
    if (t >= 0) {
      id = t;
      v.attrs[t] |= kAttrControl;
      return;
    }
  }
}

void build_eog_set(Vocab& v) {
  std::vector<int32_t> eog;
  for (int32_t id : {v.fim_pad, v.fim_rep, v.fim_sep})
    if (id >= 0) eog.push_back(id);
  for (int32_t t = 0; t < v.n_vocab(); ++t) {
    if (text_in(v.text(t), {"<|eot_id|>",
                            "<|im_end|>",
                            "<|end|>",
                            "<|return|>",
                            "<|call|>",
                            "<|flush|>",
                            "<|calls|>",
                            "<end_of_turn>",
                            "<|endoftext|>",
                            "</s>",
                            "<|eom_id|>",
                            "<EOT>",
                            "_<EOT>",
                            "[EOT]",
                            "[EOS]",
                            "<|end_of_text|>",
                            "<end_of_utterance>",
                            "<eos>",
                            "<turn|>",
                            "<|tool_response>",
                            "<\xef\xbd\x9c"
                            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                            "[e~["})) {
      eog.push_back(t);
      v.attrs[t] |= kAttrControl;
    }
  }
  // Tokens that the chat formats of some models render rather than hide.
  for (int32_t t = 0; t < v.n_vocab(); ++t)
    if (text_in(v.text(t), {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}))
      v.attrs[t] = kAttrUserDefined;
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id >= 0) eog.push_back(id);
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  // Harmony-style formats end a message with <|end|> but only stop at <|return|> / <|call|>.
  auto has = [&](std::initializer_list<std::string_view> texts, int32_t* which = nullptr) {
    for (int32_t id : eog) {
      if (text_in(v.text(id), texts)) {
        if (which) *which = id;
        return true;
      }
    }
    return false;
  };
  int32_t end_id = -1;
  if (has({"<|end|>"}, &end_id) && has({"<|call|>", "<|calls|>"}) &&
      (has({"<|return|>"}) || has({"<|flush|>"}))) {
    eog.erase(std::find(eog.begin(), eog.end(), end_id));
    v.attrs[end_id] = kAttrUserDefined;
  }
  int32_t s_id = -1;
  if (has({"<|tool_response>"}) && has({"</s>"}, &s_id)) {
    eog.erase(std::find(eog.begin(), eog.end(), s_id));
    v.attrs[s_id] = kAttrNormal;
  }
  v.eog_ids = std::move(eog);
}

// Per-model token attributes the GGUF files do not carry (the reference sets them by name).
void apply_model_attrs(Vocab& v, const gguf::File& file) {
  std::string name(file.get_string("general.name").value_or(""));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string arch(file.get_string("general.architecture").value_or(""));
  auto set = [&](std::string_view text, uint32_t attr, bool on) {
    int32_t id = v.find(text);
    if (id < 0) return;
    v.attrs[id] = on ? (v.attrs[id] | attr) : (v.attrs[id] & ~attr);
  };
  auto contains = [](const std::string& s, std::initializer_list<std::string_view> subs) {
    for (auto sub : subs)
      if (s.find(sub) != std::string::npos) return true;
    return false;
  };
  if (contains(v.pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set("<mask>", kAttrLstrip, true);
  } else if (contains(name, {"phi-3", "phi3"})) {
    for (int32_t id : v.special_tokens) v.attrs[id] |= kAttrRstrip;
    set("</s>", kAttrRstrip, true);
    for (auto text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, kAttrRstrip, false);
  } else if (contains(name, {"modern-bert"})) {
    set("[MASK]", kAttrLstrip, true);
  }
}

}  // namespace

bool Vocab::is_eog(int32_t id) const {
  return std::binary_search(eog_ids.begin(), eog_ids.end(), id);
}

int32_t Vocab::byte_token(uint8_t b) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const char hex[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
  int32_t id = find(std::string_view(hex, 6));
  if (id >= 0) return id;
  const char one = static_cast<char>(b);
  return find(std::string_view(&one, 1));
}

VocabKind parse_vocab_kind(const gguf::File& file) {
  auto model = file.get_string("tokenizer.ggml.model");
  if (!model)
    throw Error("'" + file.path() + "' has no tokenizer (metadata key tokenizer.ggml.model is missing)");
  if (*model == "llama") return VocabKind::kSpm;
  if (*model == "gpt2") return VocabKind::kBpe;
  if (*model == "bert") return VocabKind::kWpm;
  if (*model == "t5") return VocabKind::kUgm;
  throw Error(
      "'" + file.path() + "': unsupported tokenizer model '" + std::string(*model) +
      "' (tokenizer.ggml.model); supported: llama (SentencePiece), gpt2 (byte-level BPE), bert (WordPiece), "
      "t5 (unigram)");
}

Vocab load_vocab(const gguf::File& file, const PreDefaults& pre_defaults) {
  Vocab v;
  v.kind = parse_vocab_kind(file);
  v.model = std::string(*file.get_string("tokenizer.ggml.model"));
  v.pre = std::string(file.get_string("tokenizer.ggml.pre").value_or("default"));

  // Per-model defaults, as the reference sets them before reading the metadata.
  switch (v.kind) {
    case VocabKind::kSpm:
      v.bos = 1, v.eos = 2, v.unk = 0;
      v.add_space_prefix = true, v.add_bos = true;
      break;
    case VocabKind::kBpe:
      v.bos = 11, v.eos = 11;
      v.add_bos = pre_defaults.add_bos;
      v.ignore_merges = pre_defaults.ignore_merges;
      v.add_sep = pre_defaults.add_sep;
      if (pre_defaults.clear_bos) v.bos = -1;
      break;
    case VocabKind::kWpm:
      v.bos = 101, v.unk = 100, v.sep = 102, v.pad = 0, v.mask = 103;
      v.add_bos = true, v.add_sep = true;
      break;
    case VocabKind::kUgm:
      v.eos = 1, v.unk = 2, v.pad = 0;
      v.add_eos = true;
      break;
  }
  if (auto b = file.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
  if (auto b = file.get_bool("tokenizer.ggml.remove_extra_whitespaces")) v.remove_extra_whitespaces = *b;

  auto tokens = file.get_strings("tokenizer.ggml.tokens");
  if (tokens.empty())
    throw Error("'" + file.path() +
                "' has no vocabulary (metadata key tokenizer.ggml.tokens is missing or empty)");
  if (tokens.size() > size_t(INT32_MAX) - 1) throw Error("'" + file.path() + "': vocabulary too large");
  const auto n = static_cast<int32_t>(tokens.size());
  std::vector<float> scores = file.get_f32_array("tokenizer.ggml.scores");
  std::vector<int32_t> types = file.get_i32_array("tokenizer.ggml.token_type");
  if (!scores.empty() && scores.size() != tokens.size())
    throw Error("'" + file.path() + "': tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                " entries for " + std::to_string(n) + " tokens (tokenizer.ggml.tokens); they must match");
  if (!types.empty() && types.size() != tokens.size())
    throw Error("'" + file.path() + "': tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                " entries for " + std::to_string(n) + " tokens (tokenizer.ggml.tokens); they must match");
  for (size_t i = 0; i < types.size(); ++i)
    if (types[i] < static_cast<int32_t>(TokenType::kUndefined) ||
        types[i] > static_cast<int32_t>(TokenType::kByte))
      throw Error("'" + file.path() + "': tokenizer.ggml.token_type of token " + std::to_string(i) + " is " +
                  std::to_string(types[i]) +
                  ", expected 0 to 6 (undefined, normal, unknown, control, "
                  "user-defined, unused, byte)");

  size_t total = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].size() > kMaxTokenBytes)
      throw Error("'" + file.path() + "': token " + std::to_string(i) + " of tokenizer.ggml.tokens is " +
                  std::to_string(tokens[i].size()) + " bytes long, more than the " +
                  std::to_string(kMaxTokenBytes) + " a token may hold");
    total += tokens[i].empty() ? 16 : tokens[i].size();
  }
  v.arena.reserve(total);
  v.text_offset.reserve(tokens.size() + 1);
  for (int32_t i = 0; i < n; ++i) {
    v.text_offset.push_back(static_cast<uint32_t>(v.arena.size()));
    std::string_view t = tokens[i];
    std::string placeholder;
    if (t.empty()) {
      placeholder = "[EMPTY_" + std::to_string(i) + "]";
      t = placeholder;
    }
    v.arena.insert(v.arena.end(), t.begin(), t.end());
  }
  v.text_offset.push_back(static_cast<uint32_t>(v.arena.size()));
  v.scores.assign(tokens.size(), 0.0f);
  if (!scores.empty()) std::copy(scores.begin(), scores.begin() + n, v.scores.begin());
  v.attrs.assign(tokens.size(), kAttrNormal);
  if (!types.empty())
    for (int32_t i = 0; i < n; ++i) v.attrs[i] = attr_from_type(types[i]);
  v.text_to_id.reserve(tokens.size());
  for (int32_t i = 0; i < n; ++i) {
    std::string_view text = v.text(i);
    int32_t first = v.text_to_id.insert(text, i);
    if (first != i)
      throw Error("'" + file.path() + "': duplicate token in vocabulary: '" + std::string(text) +
                  "' has ids " + std::to_string(first) + " and " + std::to_string(i));
    v.max_token_len = std::max(v.max_token_len, text.size());
  }

  const std::pair<const char*, int32_t*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},         {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},         {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},     {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},     {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},  {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& [key, id] : ids) read_special_id(file, key, n, *id);

  if (auto b = file.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (auto b = file.get_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
  if (auto b = file.get_bool("tokenizer.ggml.add_sep_token")) v.add_sep = *b;
  require_special(v.add_bos, v.bos, "tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id");
  require_special(v.add_eos, v.eos, "tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id");
  require_special(v.add_sep, v.sep, "tokenizer.ggml.add_sep_token", "tokenizer.ggml.seperator_token_id");

  if (auto b = file.get_bool("tokenizer.ggml.normalizer.lowercase")) v.lowercase = *b;
  v.strip_accents = v.lowercase;
  if (auto b = file.get_bool("tokenizer.ggml.normalizer.strip_accents")) v.strip_accents = *b;

  // Conventional texts of end-of-turn and fill-in-the-middle tokens, for files that do not name them.
  const std::string_view kEosDeepseek =
      "<\xef\xbd\x9c"
      "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
  detect_by_text(v, v.eot,
                 {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                  "<EOT>", "_<EOT>", "[EOT]", kEosDeepseek, "<end_of_utterance>"});
  detect_by_text(v, v.eom, {"<|eom_id|>"});
  detect_by_text(v, v.fim_pre,
                 {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                  "<\xef\xbd\x9c"
                  "fim\xe2\x96\x81"
                  "begin\xef\xbd\x9c>",
                  "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect_by_text(v, v.fim_suf,
                 {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                  "<\xef\xbd\x9c"
                  "fim\xe2\x96\x81"
                  "hole\xef\xbd\x9c>",
                  "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect_by_text(v, v.fim_mid,
                 {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                  "<\xef\xbd\x9c"
                  "fim\xe2\x96\x81"
                  "end\xef\xbd\x9c>",
                  "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  detect_by_text(v, v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect_by_text(v, v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect_by_text(v, v.fim_sep, {"<|file_sep|>"});

  // Control tokens named "unused..." are placeholders.
  for (int32_t t = 0; t < n; ++t)
    if ((v.attrs[t] & kAttrControl) && v.text(t).find("unused") != std::string_view::npos)
      v.attrs[t] |= kAttrUnused;

  build_eog_set(v);

  for (int32_t t = 0; t < n; ++t)
    if (v.attrs[t] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) v.special_tokens.push_back(t);
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(),
                   [&](int32_t a, int32_t b) { return v.text(a).size() > v.text(b).size(); });
  // The splitter builds a trie node per byte of special text (tens of bytes each), and matches every input
  // position against it: bound its size by the text, not by what a file may claim.
  size_t special_bytes = 0;
  for (int32_t t : v.special_tokens) special_bytes += v.text(t).size();
  if (special_bytes > kMaxSpecialBytes)
    throw Error("'" + file.path() +
                "': the special (control, user-defined and unknown) tokens of "
                "tokenizer.ggml.tokens hold " +
                std::to_string(special_bytes) + " bytes of text, more than the " +
                std::to_string(kMaxSpecialBytes) + " allowed; check tokenizer.ggml.token_type");

  apply_model_attrs(v, file);
  return v;
}

}  // namespace tandem::tokenizer
