// Tokenizer tests: the reference's vocabulary goldens (every ../shared/vocab/ggml-vocab-*.gguf with
// .inp/.out), prompt ids of the model goldens, round trips, streaming decode, UTF-8 repair and special
// tokens.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem::tokenizer {
namespace {

using testing::run_command;
using testing::shared_path;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Tokenizers are loaded once per file for the whole run.
const Tokenizer& load(const std::string& relative) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[relative];
  if (!slot) slot = Tokenizer::from_gguf(gguf::File::open(shared_path(relative)));
  return *slot;
}

std::vector<std::string> split_inputs(const std::string& inp) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size())
    texts.push_back(inp.substr(pos, next - pos));
  if (pos < inp.size()) texts.push_back(inp.substr(pos));
  return texts;
}

std::vector<std::vector<int32_t>> parse_outputs(const std::string& out) {
  std::vector<std::vector<int32_t>> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    lines.emplace_back(std::istream_iterator<int32_t>(ids), std::istream_iterator<int32_t>());
  }
  return lines;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// All vocabulary goldens present in ../shared/vocab, so that new files are covered without code changes.
std::vector<std::string> vocab_files() {
  std::vector<std::string> names;
  std::filesystem::path dir = std::filesystem::path(TANDEM_SHARED_DIR) / "vocab";
  if (!std::filesystem::exists(dir)) return names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind("ggml-vocab-", 0) == 0 && e.path().extension() == ".gguf" &&
        std::filesystem::exists(e.path().string() + ".inp") &&
        std::filesystem::exists(e.path().string() + ".out"))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TokenizerVocab, PublicGoldensArePresent) {
  std::vector<std::string> files = vocab_files();
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf",
                           "ggml-vocab-deepseek-llm.gguf"})
    EXPECT_NE(std::find(files.begin(), files.end(), name), files.end())
        << name << " missing from ../shared/vocab";
}

TEST(TokenizerVocab, EveryCaseMatchesTheReference) {
  for (const std::string& name : vocab_files()) {
    SCOPED_TRACE(name);
    const Tokenizer* tok = nullptr;
    try {
      tok = &load("vocab/" + name);
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    std::vector<std::string> texts = split_inputs(read_file(shared_path("vocab/" + name + ".inp")));
    std::vector<std::vector<int32_t>> expected =
        parse_outputs(read_file(shared_path("vocab/" + name + ".out")));
    ASSERT_EQ(texts.size(), expected.size()) << "inputs and outputs of " << name << " do not pair up";
    size_t passed = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> got = tok->encode(texts[i], false, false);
      if (got == expected[i]) {
        ++passed;
      } else {
        ADD_FAILURE() << "case " << i << " text '" << texts[i] << "'\n  expected: " << ids_str(expected[i])
                      << "\n  got:      " << ids_str(got);
      }
    }
    std::printf("[ vocab    ] %-32s %zu/%zu cases match\n", name.c_str(), passed, texts.size());
  }
}

void check_prompt_goldens(const std::string& golden, const std::string& model) {
  const Tokenizer& tok = load(model);
  std::istringstream in(read_file(shared_path(golden)));
  size_t n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    std::string prompt = j.at("prompt").get<std::string>();
    std::vector<int32_t> expected = j.at("prompt_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(ids_str(tok.encode(prompt, true, true)), ids_str(expected)) << "prompt '" << prompt << "'";
    ++n;
  }
  EXPECT_GT(n, 0u) << golden << " has no prompts";
}

TEST(TokenizerGolden, Stories260KPrompts) {
  check_prompt_goldens("golden/stories260K.public.jsonl", "models/stories260K.gguf");
}

TEST(TokenizerGolden, SynthQwen2Gpt2Prompts) {
  check_prompt_goldens("golden/synth-qwen2-d64-Q8_0.public.jsonl", "models/synth/synth-qwen2-d64-Q8_0.gguf");
}

TEST(TokenizerRoundTrip, VocabInputsDecodeToThemselves) {
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "deepseek-llm"}) {
    std::string file = std::string("vocab/ggml-vocab-") + name + ".gguf";
    const Tokenizer& tok = load(file);
    std::vector<std::string> texts = split_inputs(read_file(shared_path(file + ".inp")));
    texts.push_back("Tabs\tand\r\nCRLF,  double  spaces, trailing space ");
    texts.push_back(" leading space and \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 emoji");
    for (const std::string& text : texts) {
      std::vector<int32_t> ids = tok.encode(text, false, false);
      EXPECT_EQ(tok.decode(ids), text) << name << ": '" << text << "'";
      // With BOS/EOS added the text is the same: control tokens decode to nothing.
      EXPECT_EQ(tok.decode(tok.encode(text, true, false)), text) << name << ": '" << text << "'";
    }
  }
}

TEST(TokenizerDecode, PiecesFollowTheTokenKinds) {
  const Tokenizer& spm = load("vocab/ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(spm.token_to_piece(spm.token_id("\xE2\x96\x81the")), " the");
  EXPECT_EQ(spm.token_to_piece(spm.token_id("<0x41>")), "A");
  EXPECT_EQ(spm.token_to_piece(spm.bos_id()), "");
  EXPECT_EQ(spm.token_to_piece(spm.bos_id(), true), "<s>");
  const Tokenizer& bpe = load("vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(bpe.token_to_piece(bpe.token_id("\xC4\xA0the")), " the");  // U+0120 stands for the space byte
  EXPECT_EQ(bpe.token_to_piece(bpe.eos_id()), "");
  EXPECT_THROW(bpe.token_to_piece(bpe.n_vocab()), Error);
  EXPECT_THROW(bpe.decode(std::vector<int32_t>{-1}), Error);
}

// Concatenated pushes + flush equal decode(), and no push returns a partial character.
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& expected) {
  StreamDecoder stream(tok);
  std::string all;
  for (int32_t id : ids) {
    std::string part = stream.push(id);
    for (size_t i = 0; i < part.size();) {  // every returned chunk is whole characters
      auto c = static_cast<unsigned char>(part[i]);
      size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      ASSERT_LE(i + n, part.size()) << "push returned a partial character";
      i += n;
    }
    all += part;
  }
  all += stream.flush();
  EXPECT_EQ(all, expected);
  EXPECT_EQ(all, tok.decode(ids));
}

TEST(TokenizerStream, MultiByteCharactersSplitAcrossTokens) {
  const Tokenizer& spm = load("vocab/ggml-vocab-llama-spm.gguf");
  const std::string llama = "\xF0\x9F\xA6\x99";  // U+1F999, only in byte tokens
  std::vector<int32_t> ids = spm.encode("a " + llama + " b", false, false);
  ASSERT_GE(ids.size(), 6u);
  StreamDecoder stream(spm);
  std::string out = stream.push(ids[0]) + stream.push(ids[1]);
  size_t before = out.size();
  out += stream.push(ids[2]);  // first byte token of the character: held back
  EXPECT_EQ(out.size(), before);
  check_stream(spm, ids, "a " + llama + " b");

  const Tokenizer& bpe = load("vocab/ggml-vocab-gpt-2.gguf");
  check_stream(bpe, bpe.encode("Ünïcödé \xF0\x9F\xA6\x99\xF0\x9F\x9A\x80 ok", false, false),
               "Ünïcödé \xF0\x9F\xA6\x99\xF0\x9F\x9A\x80 ok");
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer& spm = load("vocab/ggml-vocab-llama-spm.gguf");
  auto byte = [&](int b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    return spm.token_id(hex);
  };
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(spm.decode(std::vector<int32_t>{byte(0xFF)}), fffd);
  // A truncated 3-byte sequence followed by ASCII: one U+FFFD for the maximal invalid prefix.
  EXPECT_EQ(spm.decode(std::vector<int32_t>{byte(0xE2), byte(0x82), byte('a')}), fffd + "a");
  EXPECT_EQ(spm.decode(std::vector<int32_t>{byte(0x80), byte(0x80)}), fffd + fffd);

  StreamDecoder stream(spm);
  EXPECT_EQ(stream.push(byte(0xE2)), "");
  EXPECT_EQ(stream.push(byte(0x82)), "");
  EXPECT_EQ(stream.flush(), fffd);  // incomplete at the end
  EXPECT_EQ(stream.push(byte(0xC3)), "");
  EXPECT_EQ(stream.push(byte('x')), fffd + "x");  // can no longer complete
}

TEST(TokenizerSpecial, ControlTokensOnlyWhenParsingSpecial) {
  const Tokenizer& phi = load("vocab/ggml-vocab-phi-3.gguf");
  const int32_t user = phi.token_id("<|user|>");
  ASSERT_GE(user, 0);
  std::vector<int32_t> parsed = phi.encode("<|user|>\nHi<|end|>", false, true);
  EXPECT_EQ(parsed.front(), user);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), phi.token_id("<|end|>")), parsed.end());
  std::vector<int32_t> plain = phi.encode("<|user|>\nHi<|end|>", false, false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), user), plain.end());
  EXPECT_EQ(phi.decode(plain), "<|user|>\nHi<|end|>");

  const Tokenizer& gpt2 = load("vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(gpt2.encode("<|endoftext|>", false, true), std::vector<int32_t>{50256});
  std::vector<int32_t> text = gpt2.encode("<|endoftext|>", false, false);
  EXPECT_GT(text.size(), 1u);
  EXPECT_EQ(gpt2.decode(text), "<|endoftext|>");
}

TEST(TokenizerSpecial, SpmAddsTheSpacePrefixAfterSpecialTokens) {
  const Tokenizer& spm = load("vocab/ggml-vocab-llama-spm.gguf");
  std::vector<int32_t> ids = spm.encode("<s>Hello</s>", true, true);
  std::vector<int32_t> hello = spm.encode("Hello", false, false);  // "▁Hello"
  std::vector<int32_t> expected = {1, 1};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(2);
  EXPECT_EQ(ids, expected);
}

TEST(TokenizerSpecial, EndOfGenerationIds) {
  const Tokenizer& spm = load("vocab/ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(spm.bos_id(), 1);
  EXPECT_EQ(spm.eos_id(), 2);
  EXPECT_TRUE(spm.is_eog(2));
  EXPECT_FALSE(spm.is_eog(1));
  const Tokenizer& phi = load("vocab/ggml-vocab-phi-3.gguf");
  EXPECT_TRUE(phi.is_eog(phi.token_id("<|endoftext|>")));
  EXPECT_TRUE(phi.is_eog(phi.token_id("<|end|>")));
  EXPECT_FALSE(phi.is_eog(phi.token_id("<|user|>")));
  EXPECT_EQ(phi.eot_id(), phi.token_id("<|end|>"));
  const Tokenizer& gpt2 = load("vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_TRUE(gpt2.is_eog(50256));
  EXPECT_FALSE(gpt2.add_bos());
  EXPECT_EQ(gpt2.encode("Hello", true, false), gpt2.encode("Hello", false, false));
}

// Minimal GGUF v3 image with metadata only, for synthetic vocabularies.
class GgufImage {
 public:
  GgufImage& str(const std::string& key, const std::string& v) {
    head(key, 8);
    string(v);
    return *this;
  }
  GgufImage& boolean(const std::string& key, bool v) {
    head(key, 7);
    bytes_.push_back(v ? 1 : 0);
    return *this;
  }
  GgufImage& u32(const std::string& key, uint32_t v) {
    head(key, 4);
    pod(v);
    return *this;
  }
  GgufImage& strings(const std::string& key, const std::vector<std::string>& v) {
    head(key, 9);
    pod(uint32_t{8});
    pod(uint64_t{v.size()});
    for (const auto& s : v) string(s);
    return *this;
  }
  GgufImage& f32s(const std::string& key, const std::vector<float>& v) {
    head(key, 9);
    pod(uint32_t{6});
    pod(uint64_t{v.size()});
    for (float x : v) pod(x);
    return *this;
  }
  GgufImage& i32s(const std::string& key, const std::vector<int32_t>& v) {
    head(key, 9);
    pod(uint32_t{5});
    pod(uint64_t{v.size()});
    for (int32_t x : v) pod(x);
    return *this;
  }
  std::unique_ptr<Tokenizer> tokenizer() const {
    std::vector<uint8_t> file = {'G', 'G', 'U', 'F'};
    auto put = [&](auto x) {
      const auto* p = reinterpret_cast<const uint8_t*>(&x);
      file.insert(file.end(), p, p + sizeof x);
    };
    put(uint32_t{3});
    put(uint64_t{0});
    put(uint64_t{n_kv_});
    file.insert(file.end(), bytes_.begin(), bytes_.end());
    file.resize((file.size() + 31) / 32 * 32, 0);
    gguf::File f = gguf::File::parse(file.data(), file.size(), "synthetic.gguf");
    return Tokenizer::from_gguf(f);
  }

 private:
  template <typename T>
  void pod(T x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    bytes_.insert(bytes_.end(), p, p + sizeof x);
  }
  void string(const std::string& s) {
    pod(uint64_t{s.size()});
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void head(const std::string& key, uint32_t type) {
    string(key);
    pod(type);
    ++n_kv_;
  }
  std::vector<uint8_t> bytes_;
  uint64_t n_kv_ = 0;
};

// A byte-level BPE vocabulary: the 256 byte stand-ins plus `extra` tokens, with `merges`.
GgufImage bpe_image(const std::string& pre, const std::vector<std::string>& extra,
                    const std::vector<std::string>& merges) {
  std::vector<std::string> tokens;
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? b : next++;
    std::string t;
    if (cp < 0x80) {
      t += static_cast<char>(cp);
    } else {
      t += static_cast<char>(0xC0 | (cp >> 6));
      t += static_cast<char>(0x80 | (cp & 0x3F));
    }
    tokens.push_back(t);
  }
  tokens.insert(tokens.end(), extra.begin(), extra.end());
  GgufImage img;
  img.str("tokenizer.ggml.model", "gpt2")
      .str("tokenizer.ggml.pre", pre)
      .strings("tokenizer.ggml.tokens", tokens);
  img.strings("tokenizer.ggml.merges", merges);
  return img;
}

TEST(TokenizerSynthetic, UnknownPreTokenizerIsNamed) {
  try {
    bpe_image("no-such-pre", {}, {}).tokenizer();
    ADD_FAILURE() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'no-such-pre'"), std::string::npos) << e.what();
  }
  GgufImage rwkv;
  rwkv.str("tokenizer.ggml.model", "rwkv").strings("tokenizer.ggml.tokens", {"a"});
  try {
    rwkv.tokenizer();
    ADD_FAILURE() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'rwkv'"), std::string::npos) << e.what();
  }
}

TEST(TokenizerSynthetic, PreTokenizersSplitDigitsTheirOwnWay) {
  // Merges that would join any digits: what comes out shows where the pre-tokenizer cut.
  std::vector<std::string> extra = {"12", "123", "1234", "34"};
  std::vector<std::string> merges = {"1 2", "12 3", "123 4", "3 4"};
  auto ids = [&](const std::string& pre) {
    auto tok = bpe_image(pre, extra, merges).tokenizer();
    std::vector<std::string> words;
    for (int32_t id : tok->encode("12345", false, false)) words.emplace_back(tok->token_text(id));
    return words;
  };
  using W = std::vector<std::string>;
  EXPECT_EQ(ids("gpt-2"), (W{"1234", "5"}));
  EXPECT_EQ(ids("llama-bpe"), (W{"123", "4", "5"}));  // whole-word lookup first, then digits in threes
  EXPECT_EQ(ids("qwen2"), (W{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(ids("starcoder"), (W{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(ids("deepseek-llm"), (W{"1234", "5"}));
  EXPECT_EQ(ids("default"), (W{"123", "4", "5"}));
}

TEST(TokenizerSynthetic, UserDefinedTokensMatchEvenWithoutParsingSpecial) {
  GgufImage img = bpe_image("gpt-2", {"<ctl>", "<usr>"}, {});
  std::vector<int32_t> types(258, 1);
  types[256] = 3;  // control
  types[257] = 4;  // user defined
  img.i32s("tokenizer.ggml.token_type", types);
  auto tok = img.tokenizer();
  EXPECT_EQ(tok->encode("<usr>", false, false), std::vector<int32_t>{257});
  EXPECT_EQ(tok->encode("<ctl>", false, true), std::vector<int32_t>{256});
  EXPECT_EQ(tok->encode("<ctl>", false, false).size(), 5u);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{256, 257}), "<usr>");
}

TEST(TokenizerSynthetic, WordPieceBothSpellings) {
  // The reference's GGUF form: word starts marked with U+2581, continuations bare.
  const std::string w = "\xE2\x96\x81";
  GgufImage gguf_style;
  gguf_style.str("tokenizer.ggml.model", "bert")
      .strings("tokenizer.ggml.tokens", {"[PAD]", "[UNK]", "[CLS]", "[SEP]", w + "hello", w + "world",
                                         w + "un", "aff", "able", w + ",", w + "!", w + "cafe"})
      .u32("tokenizer.ggml.unknown_token_id", 1)
      .u32("tokenizer.ggml.bos_token_id", 2)
      .u32("tokenizer.ggml.seperator_token_id", 3)
      .u32("tokenizer.ggml.padding_token_id", 0);
  auto a = gguf_style.tokenizer();
  EXPECT_EQ(a->encode("Hello, WORLD! unaffable Café xyz", true, false),
            (std::vector<int32_t>{2, 4, 9, 5, 10, 6, 7, 8, 11, 1, 3}));
  // Original BERT form: continuations spelled "##piece".
  GgufImage hf_style;
  hf_style.str("tokenizer.ggml.model", "bert")
      .strings("tokenizer.ggml.tokens",
               {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "un", "##aff", "##able", ","})
      .i32s("tokenizer.ggml.token_type", {3, 2, 3, 3, 1, 1, 1, 1, 1})
      .u32("tokenizer.ggml.unknown_token_id", 1)
      .u32("tokenizer.ggml.bos_token_id", 2)
      .u32("tokenizer.ggml.seperator_token_id", 3);
  auto b = hf_style.tokenizer();
  std::vector<int32_t> ids = b->encode("hello, unaffable qq", false, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 8, 5, 6, 7, 1}));
  EXPECT_EQ(b->decode(ids), "hello , unaffable");
}

TEST(TokenizerSynthetic, UnigramPicksTheBestScoringSegmentation) {
  const std::string w = "\xE2\x96\x81";
  GgufImage img;
  img.str("tokenizer.ggml.model", "t5")
      .strings("tokenizer.ggml.tokens",
               {"<pad>", "</s>", "<unk>", w + "hello", w + "he", "llo", w, "h", "e", "l", "o"})
      .i32s("tokenizer.ggml.token_type", {3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1})
      .boolean("tokenizer.ggml.add_space_prefix", true)
      .boolean("tokenizer.ggml.remove_extra_whitespaces", true);
  // Scores: log probabilities; "▁hello" (-1) beats "▁he" + "llo" (-2 + -2).
  std::vector<float> scores = {0, 0, 0, -1, -2, -2, -3, -5, -5, -5, -5};
  img.f32s("tokenizer.ggml.scores", scores);
  auto tok = img.tokenizer();
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{3}));
  // Extra spaces merge; a run of characters no token covers becomes one unknown token; EOS is added.
  EXPECT_EQ(tok->encode("  hello   xyz ", true, false), (std::vector<int32_t>{3, 6, 2, 1}));
  EXPECT_EQ(tok->encode("hellohe", false, false), (std::vector<int32_t>{3, 7, 8}));
  EXPECT_EQ(tok->decode(tok->encode("hello hello", false, false)), "hello hello");
}

// Whether `bytes` stop inside a multi-byte UTF-8 character (a lead byte whose sequence is not complete).
bool ends_inside_character(const std::string& bytes) {
  size_t i = bytes.size();
  while (i > 0 && i + 4 > bytes.size() && (static_cast<unsigned char>(bytes[i - 1]) & 0xC0) == 0x80) --i;
  if (i == 0) return false;
  const auto c = static_cast<unsigned char>(bytes[i - 1]);
  const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  return bytes.size() - (i - 1) < need;
}

// At every split of encode(text, with BOS/EOS) into a prompt P and a continuation C, the text the
// continuation adds (StreamDecoder from kContinuation) is decode(P + C) minus decode(P); after a prompt that
// decodes to nothing (BOS alone) it is C's pieces whole, the leading space included. Returns how many
// continuations began with a space, which the start-of-text rule would have dropped.
size_t check_continuations(const Tokenizer& tok, const std::string& text, const std::string& name) {
  const std::vector<int32_t> ids = tok.encode(text, true, false);
  const std::string whole = tok.decode(ids);
  size_t spaced = 0;
  std::string prompt_bytes;
  for (size_t k = 1; k < ids.size(); ++k) {
    prompt_bytes += tok.token_to_piece(ids[k - 1]);
    if (ends_inside_character(prompt_bytes)) continue;  // a character split between prompt and continuation
    StreamDecoder stream(tok, TextPosition::kContinuation);
    std::string got;
    for (size_t i = k; i < ids.size(); ++i) got += stream.push(ids[i]);
    got += stream.flush();
    const std::string prompt_text = tok.decode(std::span<const int32_t>(ids.data(), k));
    std::string want;
    if (prompt_text.empty()) {
      for (size_t i = k; i < ids.size(); ++i) want += tok.token_to_piece(ids[i]);
    } else {
      EXPECT_EQ(whole.compare(0, prompt_text.size(), prompt_text), 0)
          << name << ": the prompt's text is not a prefix at split " << k;
      want = whole.substr(std::min(prompt_text.size(), whole.size()));
    }
    EXPECT_EQ(got, want) << name << ": '" << text << "' split after " << k << " tokens";
    if (!got.empty() && got[0] == ' ') ++spaced;
  }
  return spaced;
}

TEST(TokenizerContinuation, TextAfterAPromptIsExactForEveryTokenizerKind) {
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl.",
      " leading space,  double  spaces and \xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99 emoji",
      "hello , unaffable hello hello", "Tabs\tand\r\nnew lines\n\n end "};
  // Every kind must see continuations that begin with a space, or the test could not fail.
  auto check_all = [&](const Tokenizer& tok, const std::vector<std::string>& inputs,
                       const std::string& name) {
    size_t spaced = 0;
    for (const std::string& text : inputs) spaced += check_continuations(tok, text, name);
    EXPECT_GT(spaced, 0u) << name << ": no continuation began with a space";
  };
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "deepseek-llm"}) {
    const std::string file = std::string("vocab/ggml-vocab-") + name + ".gguf";
    std::vector<std::string> inputs = split_inputs(read_file(shared_path(file + ".inp")));
    inputs.insert(inputs.end(), texts.begin(), texts.end());
    check_all(load(file), inputs, name);
  }
  // WordPiece (a real vocabulary; [CLS] ... [SEP] around the text) and unigram.
  check_all(load("models/synth/synth-bert-d64-F16.gguf"), texts, "bert");
  const std::string w = "\xE2\x96\x81";
  GgufImage ugm;
  ugm.str("tokenizer.ggml.model", "t5")
      .strings("tokenizer.ggml.tokens", {"<pad>", "</s>", "<unk>", w + "hello", w + "he", "llo", w, "h", "e",
                                         "l", "o", w + "una", "ff", "able"})
      .i32s("tokenizer.ggml.token_type", {3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
      .f32s("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -2, -3, -5, -5, -5, -5, -2, -2, -2})
      .boolean("tokenizer.ggml.add_space_prefix", true);
  check_all(*ugm.tokenizer(), {"hello unaffable hello", "hello  hellohe", "unaffable"}, "t5");
}

// The empty prompt: BOS alone, then a generated "▁Once" reads " Once" after it, while decode() of the same
// ids (a whole text from its start) drops the space the encoder would have put there.
TEST(TokenizerContinuation, EmptyPromptKeepsTheGeneratedSpace) {
  const Tokenizer& tok = load("models/stories260K.gguf");
  const std::vector<int32_t> prompt = tok.encode("", true, false);
  ASSERT_EQ(prompt, std::vector<int32_t>{tok.bos_id()});
  const std::vector<int32_t> once = tok.encode("Once upon", false, false);
  StreamDecoder continuation(tok, TextPosition::kContinuation);
  StreamDecoder start(tok);
  std::string after, from_start;
  for (int32_t id : once) {
    after += continuation.push(id);
    from_start += start.push(id);
  }
  EXPECT_EQ(after + continuation.flush(), " Once upon");
  EXPECT_EQ(from_start + start.flush(), "Once upon");
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), once.begin(), once.end());
  EXPECT_EQ(tok.decode(all), "Once upon");
}

TEST(TokenizerCli, TokenizePrintsIdsAndJsonl) {
  const std::string tandem = TANDEM_BINARY;
  const std::string model = "'" + shared_path("models/stories260K.gguf") + "'";
  auto [ids, rc] = run_command(tandem + " tokenize -m " + model + " -p 'Once upon a time'");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ids, "1 403 407 261 378\n");
  std::tie(ids, rc) = run_command(tandem + " tokenize -m " + model + " -p 'Once upon a time' --no-bos");
  EXPECT_EQ(ids, "403 407 261 378\n");
  std::tie(ids, rc) = run_command("printf '\"Once upon a time\"\\n\"\"\\n' | " + tandem + " tokenize -m " +
                                  model + " --jsonl");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ids, "[1,403,407,261,378]\n[1]\n");
  std::tie(ids, rc) =
      run_command("printf '\"ok\"\\nnot json\\n' | " + tandem + " tokenize -m " + model + " --jsonl 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(ids.find("line 2"), std::string::npos) << ids;
}

// About `bytes` of English-like prose from a fixed seed: common words half of the time, otherwise words made
// of syllables drawn from 20000 with a Zipf-like law (so that, as in real text, many words are rare), with
// punctuation, numbers and paragraphs.
std::string english_text(size_t bytes) {
  static const char* const kCommon[] = {
      "the",        "of",      "and",      "to",        "in",        "a",          "is",       "that",
      "for",        "it",      "as",       "was",       "with",      "be",         "by",       "on",
      "not",        "he",      "I",        "this",      "are",       "or",         "his",      "from",
      "at",         "which",   "but",      "have",      "an",        "had",        "they",     "you",
      "were",       "their",   "one",      "all",       "we",        "can",        "her",      "has",
      "there",      "been",    "if",       "more",      "when",      "will",       "would",    "who",
      "so",         "no",      "people",   "time",      "world",     "government", "system",   "information",
      "between",    "through", "children", "important", "different", "following",  "question", "themselves",
      "understand", "don't",   "it's",     "we're",     "Mr.",       "U.S.",       "1999",     "2024",
      "3.14",       "42%"};
  static const char* const kSyllables[] = {"ba",   "con",  "de",   "ex",   "for",  "gen", "hu",  "in",
                                           "ject", "ka",   "lo",   "ment", "no",   "or",  "pre", "qui",
                                           "ro",   "sta",  "tion", "un",   "ver",  "wa",  "xi",  "yo",
                                           "zen",  "ther", "ing",  "ly",   "able", "ous"};
  const size_t n_common = sizeof(kCommon) / sizeof(kCommon[0]);
  const size_t n_syllables = sizeof(kSyllables) / sizeof(kSyllables[0]);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&](uint64_t mod) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % mod;
  };
  auto rare_word = [&] {
    // log-uniform rank in [1, 20000): frequency ~ 1/rank
    double u = static_cast<double>(next(1u << 30)) / (1u << 30);
    auto rank = static_cast<uint64_t>(std::exp(u * std::log(20000.0)));
    std::string w;
    for (uint64_t r = rank * 2654435761u; w.size() < 3 || r % 3 != 0; r /= n_syllables)
      w += kSyllables[r % n_syllables];
    return w;
  };
  std::string text;
  text.reserve(bytes + 256);
  size_t sentence = 0;
  while (text.size() < bytes) {
    size_t len = 5 + next(16);
    for (size_t w = 0; w < len; ++w) {
      std::string word = next(2) ? std::string(kCommon[next(n_common)]) : rare_word();
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      text += word;
      text += (w + 1 == len) ? "" : (next(9) == 0 ? ", " : " ");
    }
    const char* ends[] = {". ", ". ", ". ", "? ", "! "};
    text += ends[next(5)];
    if (++sentence % 8 == 0) text += "\n\n";
  }
  return text;
}

TEST(TokenizerSpeed, OneMegabyteOfEnglishUnderHalfASecond) {
  const std::string text = english_text(1 << 20);
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm"}) {
    const Tokenizer& tok = load(std::string("vocab/ggml-vocab-") + name + ".gguf");
    double best = 1e9;
    size_t n_tokens = 0;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      n_tokens = tok.encode(text, false, false).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("[ speed    ] %-14s %.2f MB in %.3f s (%.1f MB/s, %zu tokens)\n", name,
                text.size() / 1048576.0, best, text.size() / 1048576.0 / best, n_tokens);
    EXPECT_LT(best, 0.5) << name << ": tokenizing 1 MB took " << best << " s";
  }
}

}  // namespace
}  // namespace tandem::tokenizer
