// tandem embed: pooled embeddings of texts, one JSON array per input line, from encoders (bert) and from
// decoders (their post-final-norm hidden states).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/model/encoder.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

struct EmbedCliOptions {
  std::string model;
  std::string prompt;
  std::string file;
  bool jsonl = false;
  std::string pooling;  // empty: the model's
  bool no_normalize = false;
  int threads = 0;
  int64_t n_ctx = 0;
  int64_t batch = 2048;
  bool has_prompt = false;
};

// Inputs embedded per call: enough to fill the forwards of short sentences, few enough to stream output.
constexpr size_t kLinesPerCall = 256;

model::Pooling parse_pooling(const std::string& name) {
  if (name == "mean") return model::Pooling::kMean;
  if (name == "cls") return model::Pooling::kCls;
  if (name == "last") return model::Pooling::kLast;
  return model::Pooling::kNone;
}

// The shortest text that reads back as the same float (JSON null for a non-finite one).
void append_float(std::string& out, float x) {
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), x).ptr;
  out.append(buf, end);
}

class LineEmbedder {
 public:
  LineEmbedder(const tokenizer::Tokenizer& tok, model::Embedder& embedder, model::EmbedOptions options)
      : tok_(tok), embedder_(embedder), options_(options) {}

  void add(const std::string& text, size_t line_no) {
    std::vector<int32_t> ids = tok_.encode(text, true, false);
    if (ids.empty())
      throw Error("input line " + std::to_string(line_no) + " gives no tokens; give every line some text");
    if (static_cast<int64_t>(ids.size()) > embedder_.max_tokens())
      throw Error("input line " + std::to_string(line_no) + " has " + std::to_string(ids.size()) +
                  " tokens, more than the " + std::to_string(embedder_.max_tokens()) +
                  " the model takes; shorten it");
    pending_.push_back(std::move(ids));
    if (pending_.size() == kLinesPerCall) flush();
  }

  void flush() {
    if (pending_.empty()) return;
    const std::vector<std::span<const int32_t>> seqs(pending_.begin(), pending_.end());
    const auto D = static_cast<size_t>(embedder_.dim());
    out_.resize(seqs.size() * D);
    embedder_.embed(seqs, options_, out_.data());
    std::string line;
    for (size_t s = 0; s < seqs.size(); ++s) {
      line = "[";
      for (size_t d = 0; d < D; ++d) {
        if (d) line += ',';
        append_float(line, out_[s * D + d]);
      }
      line += "]\n";
      std::fwrite(line.data(), 1, line.size(), stdout);
    }
    std::fflush(stdout);
    pending_.clear();
  }

 private:
  const tokenizer::Tokenizer& tok_;
  model::Embedder& embedder_;
  model::EmbedOptions options_;
  std::vector<std::vector<int32_t>> pending_;
  std::vector<float> out_;
};

std::string parse_jsonl_line(const std::string& line, size_t line_no) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error("--jsonl input line " + std::to_string(line_no) + " is not valid JSON: " + e.what());
  }
  if (!value.is_string())
    throw Error("--jsonl input line " + std::to_string(line_no) + " is JSON but not a string (got " +
                std::string(value.type_name()) + "); write each text as one JSON string per line");
  return value.get<std::string>();
}

void run_embed(const EmbedCliOptions& o) {
  auto model = model::Model::load(o.model);
  std::unique_ptr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::from_gguf(model->file());
  const int threads = o.threads > 0 ? o.threads : ThreadPool::physical_cores();
  ThreadPool pool(threads);
  model::Embedder embedder(*model, pool, o.batch, o.n_ctx);
  LineEmbedder lines(*tok, embedder, {parse_pooling(o.pooling), !o.no_normalize});

  std::ifstream file_in;
  std::istringstream prompt_in(o.prompt);
  if (!o.file.empty()) {
    file_in.open(o.file, std::ios::binary);
    if (!file_in) throw Error("cannot open input file '" + o.file + "'");
  }
  std::istream& in = o.has_prompt     ? static_cast<std::istream&>(prompt_in)
                     : o.file.empty() ? std::cin
                                      : static_cast<std::istream&>(file_in);
  std::string line;
  if (o.has_prompt && o.prompt.empty()) lines.add("", 1);  // -p "": one empty input, not none
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    try {
      lines.add(o.jsonl ? parse_jsonl_line(line, line_no) : line, line_no);
    } catch (const Error&) {
      lines.flush();  // the lines before the bad one still get their embeddings
      throw;
    }
  }
  if (in.bad()) throw Error(o.file.empty() ? "cannot read standard input" : "cannot read '" + o.file + "'");
  lines.flush();
}

}  // namespace

void add_embed_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "embed",
      "Print pooled embeddings, one JSON array of floats per input line, in input order (bert encoders, and "
      "llama/qwen2/qwen3 decoders from their final hidden states)");
  auto o = std::make_shared<EmbedCliOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required();
  auto* prompt = cmd->add_option("-p,--prompt", o->prompt, "Text to embed (each line one input)");
  auto* file =
      cmd->add_option("-f,--file", o->file, "Read the inputs from this file (default: standard input)");
  prompt->excludes(file);
  auto* jsonl = cmd->add_flag("--jsonl", o->jsonl, "Read one JSON string per line (standard input or -f)");
  jsonl->excludes(prompt);
  cmd->add_option("--pooling", o->pooling,
                  "mean, cls or last (default: the model's pooling_type; decoders without one: last)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  cmd->add_flag("--no-normalize", o->no_normalize, "Print the pooled vectors without L2 normalisation");
  cmd->add_option("-t,--threads", o->threads, "Threads (default, or 0: physical cores)");
  cmd->add_option("-c,--ctx-size", o->n_ctx,
                  "Decoders: the longest input in tokens (default: the model's, "
                  "capped at 4096); encoders take their trained context");
  cmd->add_option("-b,--batch-size", o->batch,
                  "Tokens per forward; an encoder packs several inputs into one (default 2048)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o, prompt] {
    o->has_prompt = prompt->count() > 0;
    run_embed(*o);
  });
}

}  // namespace tandem::cli
