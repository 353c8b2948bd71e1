// The text of a continuation, checked against every public golden (../shared/golden/*.public.jsonl): the
// streaming decoder and the server's TextAssembler turn greedy_ids into greedy_text exactly (the leading
// space of a continuation included, after the empty prompt too), stop sequences and logprob offsets see that
// space, and `tandem run` prints greedy_text followed by one newline.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/engine/generate.h"
#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "tandem/server/text_assembler.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/thread_pool.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using tandem::server::TextAssembler;
using tandem::tokenizer::StreamDecoder;
using tandem::tokenizer::TextPosition;
using tandem::tokenizer::Tokenizer;

struct GoldenFile {
  std::string name;   // file stem, e.g. synth-llama-d256-Q4_0
  std::string model;  // path of the model file
  bool real;          // a trained model: its free-running greedy reproduces greedy_ids exactly
  std::vector<json> records;
};

// Every public golden with its model: a real model is ../shared/models/NAME.gguf or NAME-SUFFIX.gguf, a
// synthetic one ../shared/models/synth/NAME.gguf (FORMAT.md).
std::vector<GoldenFile> golden_files() {
  namespace fs = std::filesystem;
  std::vector<GoldenFile> files;
  const fs::path dir = tandem::testing::shared_path("golden");
  const fs::path models = tandem::testing::shared_path("models");
  const std::string suffix = ".public.jsonl";
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.size() <= suffix.size() || file.substr(file.size() - suffix.size()) != suffix) continue;
    GoldenFile g;
    g.name = file.substr(0, file.size() - suffix.size());
    g.real = g.name.rfind("synth-", 0) != 0;
    if (!g.real) {
      g.model = (models / "synth" / (g.name + ".gguf")).string();
    } else {
      for (const auto& m : fs::directory_iterator(models)) {
        const std::string stem = m.path().stem().string();
        if (m.path().extension() == ".gguf" && (stem == g.name || stem.rfind(g.name + "-", 0) == 0))
          g.model = m.path().string();
      }
    }
    EXPECT_FALSE(g.model.empty()) << "no model file for golden '" << g.name << "'";
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) g.records.push_back(json::parse(line));
    files.push_back(std::move(g));
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  EXPECT_GE(files.size(), 2u) << "no golden files found in " << dir.string();
  return files;
}

// greedy_ids less the end-of-generation token that may end them (greedy_text does not contain it).
std::vector<int32_t> continuation_ids(const Tokenizer& tok, const json& rec) {
  auto ids = rec["greedy_ids"].get<std::vector<int32_t>>();
  if (!ids.empty() && tok.is_eog(ids.back())) ids.pop_back();
  return ids;
}

std::string continuation_text(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder decoder(tok, TextPosition::kContinuation);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  return text + decoder.flush();
}

TEST(ContinuationText, GreedyIdsDecodeToGreedyText) {
  size_t spaced = 0, records = 0;
  for (const GoldenFile& g : golden_files()) {
    const auto tok = Tokenizer::from_gguf(tandem::gguf::File::open(g.model));
    for (const json& rec : g.records) {
      const auto prompt = rec["prompt_ids"].get<std::vector<int32_t>>();
      const auto ids = continuation_ids(*tok, rec);
      const std::string want = rec["greedy_text"].get<std::string>();
      EXPECT_EQ(continuation_text(*tok, ids), want)
          << g.name << ": '" << rec["prompt"].get<std::string>() << "'";
      // decode(prompt + continuation) minus decode(prompt), wherever the prompt has text.
      const std::string prompt_text = tok->decode(prompt);
      if (!prompt_text.empty()) {
        std::vector<int32_t> all = prompt;
        all.insert(all.end(), ids.begin(), ids.end());
        EXPECT_EQ(tok->decode(all), prompt_text + want)
            << g.name << ": '" << rec["prompt"].get<std::string>();
      }
      spaced += !want.empty() && want[0] == ' ';
      ++records;
    }
  }
  EXPECT_GT(spaced, 10u) << "too few goldens begin with a space to test it (" << records << " records)";
}

// TextAssembler on the completions path: the text, the logprob entries (one per token, offsets into the text
// sent, the space counted) and stop sequences that the leading space takes part in.
TEST(ContinuationText, AssemblerSendsGreedyTextWithStopsAndLogprobs) {
  for (const GoldenFile& g : golden_files()) {
    const auto tok = Tokenizer::from_gguf(tandem::gguf::File::open(g.model));
    for (const json& rec : g.records) {
      SCOPED_TRACE(g.name + ": '" + rec["prompt"].get<std::string>() + "'");
      const auto ids = continuation_ids(*tok, rec);
      const std::string want = rec["greedy_text"].get<std::string>();
      auto assemble = [&](std::vector<std::string> stops, std::vector<tandem::server::Choice::Logprob>& lps,
                          bool& stopped) {
        TextAssembler a(*tok, TextPosition::kContinuation, std::move(stops), true);
        std::string sent;
        for (int32_t id : ids) {
          sent += a.push({id, -1.0, {}}, lps);
          if (a.stopped()) break;
        }
        stopped = a.stopped();
        return sent + a.finish();
      };
      std::vector<tandem::server::Choice::Logprob> lps;
      bool stopped = false;
      EXPECT_EQ(assemble({}, lps, stopped), want);
      EXPECT_FALSE(stopped);
      ASSERT_EQ(lps.size(), ids.size());
      int64_t offset = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(lps[i].token, tok->token_to_piece(ids[i]));
        EXPECT_GE(lps[i].text_offset, offset);
        offset = lps[i].text_offset;
      }
      if (!g.real) continue;  // the real models' text is ASCII: offsets are the pieces' running length
      std::string pieces;
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(lps[i].text_offset, static_cast<int64_t>(pieces.size())) << "token " << i;
        pieces += tok->token_to_piece(ids[i]);
      }
      EXPECT_EQ(pieces, want);
      // A stop sequence at the leading space sends nothing; one inside the text cuts before it.
      const size_t second_word = want.find(' ', 1);
      ASSERT_NE(second_word, std::string::npos);
      const std::string stop = want.substr(second_word, 4);
      for (const std::string& s : {std::string(" "), stop}) {
        std::vector<tandem::server::Choice::Logprob> cut_lps;
        const std::string got = assemble({s}, cut_lps, stopped);
        EXPECT_EQ(got, want.substr(0, want.find(s))) << "stop '" << s << "'";
        EXPECT_TRUE(stopped) << "stop '" << s << "'";
        EXPECT_LE(cut_lps.size(), ids.size());
      }
    }
  }
}

// The engine's own greedy continuation of each record's prompt, as `run` computes it (the same session
// options and thread count), less a final end-of-generation token.
std::vector<std::vector<int32_t>> engine_greedy(const GoldenFile& g, const Tokenizer& tok) {
  auto model = tandem::model::Model::load(g.model);
  tandem::ThreadPool pool(1);
  std::vector<std::vector<int32_t>> out;
  for (const json& rec : g.records) {
    tandem::model::Session session(*model, pool, tandem::model::SessionOptions{});
    tandem::engine::GenerateOptions go;
    go.max_tokens = static_cast<int64_t>(rec["greedy_ids"].size());
    go.sampling.temperature = 0;
    std::vector<int32_t> ids;
    tandem::engine::generate(
        session, tok.encode(rec["prompt"].get<std::string>(), true, true), go,
        [&](int32_t id) { return ids.push_back(id), true; }, [&](int32_t id) { return tok.is_eog(id); });
    if (!ids.empty() && tok.is_eog(ids.back())) ids.pop_back();
    out.push_back(std::move(ids));
  }
  return out;
}

// `tandem run` prints the continuation and one newline. The real models reproduce greedy_ids, so their
// output is greedy_text; a synthetic model (random weights, chaotic) may take another path where its top
// tokens nearly tie, so its output is checked against greedy_text where the engine's greedy ids equal the
// golden's, and otherwise against the text of the ids the engine chose.
TEST(ContinuationText, RunPrintsGreedyText) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem-continuation-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path prompt_file = dir / "prompt.txt";
  size_t exact = 0, records = 0;
  for (const GoldenFile& g : golden_files()) {
    const auto tok = Tokenizer::from_gguf(tandem::gguf::File::open(g.model));
    // Computed before any `run` starts, so that this process's threads never compete with the command's.
    const std::vector<std::vector<int32_t>> own =
        g.real ? std::vector<std::vector<int32_t>>{} : engine_greedy(g, *tok);
    for (size_t r = 0; r < g.records.size(); ++r) {
      const json& rec = g.records[r];
      const std::string prompt = rec["prompt"].get<std::string>();
      SCOPED_TRACE(g.name + ": '" + prompt + "'");
      std::ofstream(prompt_file, std::ios::binary) << prompt;
      auto [out, rc] = tandem::testing::run_command(
          std::string(TANDEM_BINARY) + " run -m '" + g.model + "' -f '" + prompt_file.string() + "' -n " +
          std::to_string(rec["greedy_ids"].size()) + " --temp 0 -t 1 2>/dev/null");
      ASSERT_EQ(rc, 0);
      ASSERT_FALSE(out.empty());
      ASSERT_EQ(out.back(), '\n');
      out.pop_back();
      const std::string greedy_text = rec["greedy_text"].get<std::string>();
      const bool same_path = g.real || own[r] == continuation_ids(*tok, rec);
      EXPECT_EQ(out, same_path ? greedy_text : continuation_text(*tok, own[r]));
      exact += out == greedy_text;
      ++records;
    }
  }
  fs::remove_all(dir);
  std::printf("[ run      ] %zu of %zu golden records printed greedy_text exactly\n", exact, records);
  EXPECT_GE(records, 16u);
}

// An empty prompt starts from BOS; a model that adds none (byte-level BPE here) is refused with a message
// that says what to do, never a crash.
TEST(ContinuationText, RunRefusesAnEmptyPromptWithoutBos) {
  const std::string model = tandem::testing::shared_path("models/synth/synth-qwen2-d64-Q8_0.gguf");
  auto [out, rc] =
      tandem::testing::run_command(std::string(TANDEM_BINARY) + " run -m '" + model + "' -p '' -n 4 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("starts from BOS only"), std::string::npos) << out;
  EXPECT_NE(out.find("give a non-empty prompt"), std::string::npos) << out;
}

}  // namespace
