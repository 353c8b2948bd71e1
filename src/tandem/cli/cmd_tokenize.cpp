// tandem tokenize: text -> token ids with a GGUF file's tokenizer (vocabulary-only files work too).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/gguf/reader.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string prompt;
  std::string file;
  bool no_bos = false;
  bool no_parse_special = false;
  bool jsonl = false;
  bool has_prompt = false;  // -p given (possibly empty)
};

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_line(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
}

std::string ids_to_text(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

// One JSON string per line in, one JSON array of ids per line out. Blank lines are skipped.
void run_jsonl(const tokenizer::Tokenizer& tok, std::istream& in, const TokenizeOptions& o) {
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error("--jsonl input line " + std::to_string(line_no) + " is not valid JSON: " + e.what());
    }
    if (!value.is_string())
      throw Error("--jsonl input line " + std::to_string(line_no) + " is JSON but not a string (got " +
                  std::string(value.type_name()) + "); write each text as one JSON string per line");
    std::vector<int32_t> ids = tok.encode(value.get<std::string>(), !o.no_bos, !o.no_parse_special);
    write_line(nlohmann::json(ids).dump());
    std::fflush(stdout);
  }
}

void run_tokenize(const TokenizeOptions& o) {
  gguf::File file = gguf::File::open(o.model);
  std::unique_ptr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::from_gguf(file);

  std::ifstream file_in;
  if (!o.file.empty()) {
    file_in.open(o.file, std::ios::binary);
    if (!file_in) throw Error("cannot open input file '" + o.file + "'");
  }
  std::istream& in = o.file.empty() ? std::cin : static_cast<std::istream&>(file_in);

  if (o.jsonl) {
    run_jsonl(*tok, in, o);
    return;
  }
  std::string text = o.prompt;
  if (!o.has_prompt) {
    text = read_all(in);
    if (in.bad()) throw Error(o.file.empty() ? "cannot read standard input" : "cannot read '" + o.file + "'");
  }
  write_line(ids_to_text(tok->encode(text, !o.no_bos, !o.no_parse_special)));
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("tokenize", "Print the token ids of a text (works on vocabulary-only GGUF files)");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF file with tokenizer metadata")->required();
  auto* prompt = cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize");
  auto* file =
      cmd->add_option("-f,--file", o->file, "Read the text from this file (default: standard input)");
  prompt->excludes(file);
  cmd->add_flag("--no-bos", o->no_bos, "Add neither BOS nor EOS, whatever the model's metadata says");
  cmd->add_flag("--no-parse-special", o->no_parse_special,
                "Treat control-token texts such as <|im_end|> as plain text");
  auto* jsonl =
      cmd->add_flag("--jsonl", o->jsonl,
                    "Read one JSON string per line (standard input or -f) and write one JSON array of "
                    "ids per line");
  jsonl->excludes(prompt);
  cmd->callback([o, prompt] {
    o->has_prompt = prompt->count() > 0;
    run_tokenize(*o);
  });
}

}  // namespace tandem::cli
