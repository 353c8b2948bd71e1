#include "tandem/tokenizer/tokenizer.h"

#include "tandem/tokenizer/pretokenizer.h"
#include "tandem/tokenizer/tokenizer_impl.h"
#include "tandem/util/error.h"

namespace tandem::tokenizer {
namespace {

// SentencePiece writes spaces as U+2581.
std::string escape_spaces(std::string_view text, bool prefix_space) {
  std::string out;
  out.reserve(text.size() + text.size() / 4 + 3);
  if (prefix_space) out += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ')
      out += "\xE2\x96\x81";
    else
      out += c;
  }
  return out;
}

}  // namespace

void Tokenizer::Impl::check_id(int32_t id) const {
  if (!vocab.valid(id))
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(vocab.n_vocab()) + " tokens)");
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) {
  auto impl = std::make_unique<Impl>();
  const VocabKind kind = parse_vocab_kind(file);
  PreTokenizerSpec spec;
  if (kind == VocabKind::kBpe) spec = pre_tokenizer_spec(file.get_string("tokenizer.ggml.pre").value_or(""));
  PreDefaults defaults = spec.defaults;
  defaults.add_sep = spec.add_sep;
  impl->vocab = load_vocab(file, defaults);
  const Vocab& v = impl->vocab;

  switch (kind) {
    case VocabKind::kSpm:
      impl->spm = std::make_unique<SpmModel>(v);
      impl->strip_leading_space = v.add_space_prefix;
      break;
    case VocabKind::kBpe: {
      auto merges = file.get_strings("tokenizer.ggml.merges");
      if (!file.find("tokenizer.ggml.merges"))
        throw Error(
            "'" + file.path() +
            "': byte-level BPE tokenizer without merges (metadata key tokenizer.ggml.merges is missing)");
      impl->bpe = std::make_unique<BpeModel>(v, merges, spec.regexes);
      break;
    }
    case VocabKind::kWpm:
      impl->wpm = std::make_unique<WpmModel>(v);
      impl->strip_leading_space = true;
      break;
    case VocabKind::kUgm:
      impl->ugm = std::make_unique<UgmModel>(v, file);
      impl->strip_leading_space = v.add_space_prefix;
      break;
  }
  impl->specials = std::make_unique<SpecialTokenSplitter>(v);
  impl->build_pieces();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& m = *impl_;
  const Vocab& v = m.vocab;
  if (text.size() >= (size_t{1} << 32))
    throw Error("text of " + std::to_string(text.size()) +
                " bytes is too long to tokenize at once (4 GiB max)");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<Fragment> fragments;
  m.specials->split(text, parse_special, fragments);

  if (add_special && v.add_bos) out.push_back(v.bos);
  bool after_special = true;  // SentencePiece: a space goes in front of the text and after each special token
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    std::string_view piece = text.substr(f.offset, f.length);
    if (m.spm) {
      m.spm->encode(escape_spaces(piece, v.add_space_prefix && after_special), out);
    } else if (m.bpe) {
      m.bpe->encode(piece, out);
    } else if (m.wpm) {
      m.wpm->encode(piece, out);
    } else {
      m.ugm->encode(piece, out);
    }
    after_special = false;
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  if (add_special && m.wpm && v.add_sep) out.push_back(v.sep);
  return out;
}

int32_t Tokenizer::n_vocab() const {
  return impl_->vocab.n_vocab();
}
int32_t Tokenizer::bos_id() const {
  return impl_->vocab.bos;
}
int32_t Tokenizer::eos_id() const {
  return impl_->vocab.eos;
}
int32_t Tokenizer::eot_id() const {
  return impl_->vocab.eot;
}
bool Tokenizer::add_bos() const {
  return impl_->vocab.add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->vocab.add_eos;
}
bool Tokenizer::is_eog(int32_t id) const {
  return impl_->vocab.is_eog(id);
}

bool Tokenizer::is_control(int32_t id) const {
  return impl_->vocab.valid(id) && impl_->vocab.has_attr(id, kAttrControl | kAttrUnknown);
}

std::string_view Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->vocab.text(id);
}

int32_t Tokenizer::token_id(std::string_view text) const {
  return impl_->vocab.find(text);
}
std::string_view Tokenizer::model_name() const {
  return impl_->vocab.model;
}
std::string_view Tokenizer::pre_name() const {
  return impl_->vocab.pre;
}

}  // namespace tandem::tokenizer
