// `tandem chat` driven through a pseudo-terminal, as a person types at it: a message gets a streamed reply
// and the turn's figures; the next turn reuses the cache; /clear, /save and /load; Ctrl-C in the middle of a
// reply stops it and the session goes on; Ctrl-C at the prompt and Ctrl-D leave. And the same commands from
// a pipe (stdin not a terminal), with multi-line input.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// A child process on the far side of a pseudo-terminal (its stdin, stdout and stderr).
class PtyProcess {
 public:
  explicit PtyProcess(const std::vector<std::string>& argv) {
    pid_ = forkpty(&master_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~PtyProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) close(master_);
  }
  bool started() const { return pid_ > 0; }

  void send(const std::string& text) {
    ASSERT_EQ(write(master_, text.data(), text.size()), ssize_t(text.size()));
  }

  // Reads until `pattern` appears after position `from` of everything read (default: after the last match),
  // or the timeout; returns whether it appeared. The output is kept in output().
  bool expect(const std::string& pattern, double seconds = 60) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      const size_t at = output_.find(pattern, mark_);
      if (at != std::string::npos) {
        mark_ = at + pattern.size();
        return true;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || !read_some(static_cast<int>(left))) return false;
    }
  }
  // Reads until at least n more bytes than `since` arrived.
  bool expect_bytes(size_t since, size_t n, double seconds = 60) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (output_.size() < since + n) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || !read_some(static_cast<int>(left))) return false;
    }
    return true;
  }
  // Waits for the child to exit; its status, or -1 on timeout.
  int wait_exit(double seconds = 30) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      read_some(50);
    }
    return -1;
  }
  const std::string& output() const { return output_; }
  size_t mark() const { return mark_; }

 private:
  bool read_some(int timeout_ms) {
    pollfd p{master_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(master_, buf, sizeof buf);
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int master_ = -1;
  bool exited_ = false;
  std::string output_;
  size_t mark_ = 0;
};

std::vector<std::string> chat_args(const std::string& model, std::vector<std::string> more) {
  std::vector<std::string> a = {TANDEM_BINARY, "chat", "-t", "1", "-m", testing::shared_path(model)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

// (new prompt tokens, reused tokens) from the last figures line at or before the reader's mark.
std::pair<long, long> prompt_figures(const PtyProcess& p) {
  static const std::regex re(R"(prompt (\d+) new tokens, (\d+) reused)");
  const std::string text = p.output().substr(0, p.mark());
  std::pair<long, long> out{-1, -1};
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    out = {std::stol((*it)[1]), std::stol((*it)[2])};
  return out;
}

TEST(ChatCli, TurnsReuseTheCacheAndSaveLoadRestoresTheHistory) {
  testing::TempDir dir("chat_cli");
  PtyProcess p(chat_args("models/stories260K.gguf", {"--temp", "0", "-n", "40"}));
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.expect("> ")) << p.output();

  p.send("Hello, who are you?\n");
  ASSERT_TRUE(p.expect("Hello, who are you?\r\n")) << p.output();  // the terminal's echo
  const size_t reply_at = p.mark();
  ASSERT_TRUE(p.expect("tok/s; prompt")) << p.output();
  const std::string reply = p.output().substr(reply_at, p.mark() - reply_at);
  EXPECT_GT(reply.size(), 20u) << "no reply streamed before the figures: " << reply;
  ASSERT_TRUE(p.expect("> "));
  const auto first = prompt_figures(p);
  EXPECT_EQ(first.second, 0) << "nothing is cached before the first turn";

  p.send("Tell me more.\n");
  ASSERT_TRUE(p.expect("tok/s; prompt")) << p.output();
  ASSERT_TRUE(p.expect("> "));
  const auto second = prompt_figures(p);
  // The first turn (prompt and reply but its last token) stays cached: only the new turn is evaluated.
  EXPECT_GE(second.second, first.first + 40 - 1) << p.output();
  EXPECT_LT(second.first, 30)
      << p.output();  // "\nUser: Tell me more.\nAssistant:" and the reply's last token

  const std::string saved = dir.file("chat.json");
  p.send("/save " + saved + "\n");
  ASSERT_TRUE(p.expect("4 messages saved")) << p.output();
  const nlohmann::json history = read_json(saved);
  ASSERT_EQ(history.size(), 4u);
  EXPECT_EQ(history[0]["role"], "user");
  EXPECT_EQ(history[0]["content"], "Hello, who are you?");
  EXPECT_EQ(history[1]["role"], "assistant");
  EXPECT_FALSE(history[1]["content"].get<std::string>().empty());

  p.send("/clear\n");
  ASSERT_TRUE(p.expect("conversation cleared")) << p.output();
  p.send("/save " + dir.file("empty.json") + "\n");
  ASSERT_TRUE(p.expect("0 messages saved")) << p.output();

  // /load brings the four messages back: the next turn's prompt starts with them, which the cache still
  // holds, so it is reused rather than evaluated again.
  p.send("/load " + saved + "\n");
  ASSERT_TRUE(p.expect("4 messages loaded")) << p.output();
  p.send("And then?\n");
  ASSERT_TRUE(p.expect("tok/s; prompt")) << p.output();
  ASSERT_TRUE(p.expect("> "));
  EXPECT_GT(prompt_figures(p).second, second.first + second.second) << p.output();
  p.send("/save " + dir.file("after.json") + "\n");
  ASSERT_TRUE(p.expect("6 messages saved")) << p.output();
  const nlohmann::json after = read_json(dir.file("after.json"));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(after[i], history[i]) << i;
  EXPECT_EQ(after[4]["content"], "And then?");

  p.send("/load " + dir.file("missing.json") + "\n");
  ASSERT_TRUE(p.expect("error: ")) << p.output();
  ASSERT_TRUE(p.expect("missing.json")) << p.output();
  p.send("/frobnicate\n");
  ASSERT_TRUE(p.expect("unknown command /frobnicate")) << p.output();

  p.send("\x04");  // Ctrl-D at the prompt
  EXPECT_EQ(p.wait_exit(), 0) << p.output();
}

// A random-weight model whose greedy reply runs to -n without an end token, so Ctrl-C always lands mid-reply.
TEST(ChatCli, CtrlCStopsAReplyAndTheSessionGoesOn) {
  PtyProcess p(
      chat_args("models/synth/synth-llama-d256-Q8_0.gguf", {"--temp", "0", "-c", "4096", "-n", "3000"}));
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.expect("> ")) << p.output();
  p.send("Hi\n");
  ASSERT_TRUE(p.expect("Hi\r\n")) << p.output();
  ASSERT_TRUE(p.expect_bytes(p.mark(), 32)) << "no reply began streaming: " << p.output();
  p.send("\x03");
  ASSERT_TRUE(p.expect("; stopped]")) << p.output();
  static const std::regex tokens_re(R"(\[(\d+) tokens in)");
  std::smatch m;
  const std::string tail = p.output().substr(0, p.mark());
  ASSERT_TRUE(std::regex_search(tail, m, tokens_re));
  EXPECT_LT(std::stol(m[1]), 3000) << "the reply ran to its end: Ctrl-C did not stop it";
  ASSERT_TRUE(p.expect("> ")) << p.output();

  // Still alive: commands and another turn work.
  p.send("/help\n");
  ASSERT_TRUE(p.expect("/save FILE")) << p.output();
  ASSERT_TRUE(p.expect("> "));
  p.send("Again\n");
  ASSERT_TRUE(p.expect("Again\r\n")) << p.output();
  ASSERT_TRUE(p.expect_bytes(p.mark(), 32)) << p.output();
  p.send("\x03");
  ASSERT_TRUE(p.expect("; stopped]")) << p.output();
  ASSERT_TRUE(p.expect("> ")) << p.output();

  p.send("\x03");  // at the prompt: leaves
  EXPECT_EQ(p.wait_exit(), 0) << p.output();
}

TEST(ChatCli, ReadsLinesFromAPipe) {
  testing::TempDir dir("chat_pipe");
  const std::string saved = dir.file("pipe.json");
  std::ofstream(dir.file("input.txt")) << "first line \\\nsecond line\n"
                                       << "\"\"\"\nblock one\n\nblock three\n\"\"\"\n"
                                       << "/system Be kind.\n"
                                       << "//slash\n"
                                       << "/save " << saved << "\n";
  const auto [out, status] = testing::run_command(std::string(TANDEM_BINARY) + " chat -t 1 -m " +
                                                  testing::shared_path("models/stories260K.gguf") +
                                                  " --temp 0 -n 20 < " + dir.file("input.txt") + " 2>&1");
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("> "), std::string::npos) << "no prompt is written when stdin is not a terminal";
  const nlohmann::json history = read_json(saved);
  ASSERT_EQ(history.size(), 7u) << history.dump();
  EXPECT_EQ(history[0]["role"], "system");
  EXPECT_EQ(history[0]["content"], "Be kind.");
  EXPECT_EQ(history[1]["content"], "first line \nsecond line");
  EXPECT_EQ(history[3]["content"], "block one\n\nblock three");
  EXPECT_EQ(history[5]["content"], "/slash");
  EXPECT_EQ(history[6]["role"], "assistant");
}

// Three turns, each prefilling only its new tokens (the target's cache and the draft model's both reused):
// greedy replies with a draft model or n-gram lookup are the plain replies.
TEST(ChatCli, SpeculativeTurnsEqualPlainTurns) {
  testing::TempDir dir("chat_spec");
  std::ofstream(dir.file("input.txt")) << "Hello\nTell me more.\nAnd then?\n";
  auto chat = [&](const std::string& flags) {
    return testing::run_command(std::string(TANDEM_BINARY) + " chat -t 1 -m " +
                                testing::shared_path("models/stories260K.gguf") + " --temp 0 -n 60 " + flags +
                                " < " + dir.file("input.txt") + " 2>/dev/null");
  };
  const auto plain = chat("");
  ASSERT_EQ(plain.second, 0);
  ASSERT_GT(plain.first.size(), 100u);
  EXPECT_EQ(chat("--draft ngram --no-gate --draft-max 4").first, plain.first);
  EXPECT_EQ(
      chat("--no-gate --draft-max 4 --draft-model " + testing::shared_path("models/llama2xs-tok512.gguf"))
          .first,
      plain.first);
}

}  // namespace
}  // namespace tandem
