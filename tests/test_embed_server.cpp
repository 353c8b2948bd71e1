// /v1/embeddings without a server: the request's parsing and validation (every bad input a 400 naming its
// field), fitting inputs to the context, truncated widths, the response's JSON and base64, and the
// EmbeddingBatcher, whose batches of concurrent requests must give each request what it gets alone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tandem/engine/embed_batcher.h"
#include "tandem/model/encoder.h"
#include "tandem/server/embeddings_api.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using tandem::server::ApiError;
using tandem::server::EmbeddingLimits;
using tandem::server::EmbeddingRequest;
using tandem::server::parse_embedding_request;

EmbeddingLimits limits() {
  EmbeddingLimits l;
  l.api.model_name = std::string(1, 'm');  // GCC 12 misreads a literal assignment here (-Wrestrict)
  l.api.n_vocab = 100;
  l.dim = 8;
  l.truncatable_dims = {4};
  l.max_inputs = 5;
  return l;
}

EmbeddingRequest parse(const json& body) {
  return parse_embedding_request(body.dump(), limits());
}

// The ApiError a body gets; fails the test when it parses.
ApiError refusal(const std::string& body) {
  try {
    parse_embedding_request(body, limits());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

TEST(EmbeddingRequest, TakesEveryInputForm) {
  EmbeddingRequest r = parse({{"model", "m"}, {"input", "hello"}});
  EXPECT_EQ(r.texts, std::vector<std::string>{"hello"});
  EXPECT_TRUE(r.token_ids.empty());
  EXPECT_FALSE(r.base64);
  EXPECT_FALSE(r.dimensions);
  EXPECT_FALSE(r.truncate);

  r = parse({{"model", "m"}, {"input", {"a", "b c"}}, {"encoding_format", "base64"}});
  EXPECT_EQ(r.texts, (std::vector<std::string>{"a", "b c"}));
  EXPECT_TRUE(r.base64);

  r = parse({{"model", "m"}, {"input", {5, 6, 99}}, {"encoding_format", "float"}});
  ASSERT_EQ(r.token_ids.size(), 1u);
  EXPECT_EQ(r.token_ids[0], (std::vector<int32_t>{5, 6, 99}));
  EXPECT_TRUE(r.texts.empty());

  r = parse({{"model", "m"}, {"input", {{1}, {2, 3}}}, {"dimensions", 4}, {"truncate", true}, {"user", "u"}});
  EXPECT_EQ(r.token_ids, (std::vector<std::vector<int32_t>>{{1}, {2, 3}}));
  EXPECT_EQ(r.dimensions, 4);
  EXPECT_TRUE(r.truncate);
  EXPECT_EQ(parse({{"model", "m"}, {"input", "x"}, {"dimensions", 8}}).dimensions, 8);  // the full width
}

TEST(EmbeddingRequest, RefusesBadInputsNamingTheField) {
  struct Case {
    const char* body;
    int status;
    const char* param;
    const char* says;  // part of the message
  };
  const Case cases[] = {
      {R"({"model":"m"})", 400, "input", "required"},
      {R"({"model":"m","input":[]})", 400, "input", "empty list"},
      {R"({"model":"m","input":""})", 400, "input", "empty string"},
      {R"({"model":"m","input":["a",""]})", 400, "input[1]", "empty string"},
      {R"({"model":"m","input":["a",3]})", 400, "input[1]", "a string"},
      {R"({"model":"m","input":[[1],"a"]})", 400, "input[1]", "array of token ids"},
      {R"({"model":"m","input":[[1],[]]})", 400, "input[1]", "empty list of token ids"},
      {R"({"model":"m","input":[1,"a"]})", 400, "input[1]", "token id"},
      {R"({"model":"m","input":[1,2.5]})", 400, "input[1]", "token id"},
      {R"({"model":"m","input":[[1,100]]})", 400, "input[0][1]", "outside the vocabulary (0..99)"},
      {R"({"model":"m","input":[-1]})", 400, "input[0]", "outside the vocabulary"},
      {R"({"model":"m","input":{"text":"a"}})", 400, "input", "must be a string"},
      {R"({"model":"m","input":[{"a":1}]})", 400, "input[0]", "must be"},
      {R"({"model":"m","input":[true]})", 400, "input[0]", "must be"},
      {R"({"model":"m","input":["a","b","c","d","e","f"]})", 400, "input", "at most 5"},
      {R"({"model":"m","input":"a","encoding_format":"int8"})", 400, "encoding_format", "\"base64\""},
      {R"({"model":"m","input":"a","encoding_format":1})", 400, "encoding_format", "not a number"},
      {R"({"model":"m","input":"a","dimensions":5})", 400, "dimensions", "only the widths 8, 4"},
      {R"({"model":"m","input":"a","dimensions":0})", 400, "dimensions", "8 values"},
      {R"({"model":"m","input":"a","dimensions":-4})", 400, "dimensions", "8 values"},
      {R"({"model":"m","input":"a","dimensions":"4"})", 400, "dimensions", "an integer"},
      {R"({"model":"m","input":"a","truncate":"yes"})", 400, "truncate", "a boolean"},
      {R"({"model":"m","input":"a","user":7})", 400, "user", "a string"},
      {R"({"input":"a"})", 400, "model", "required"},
      {R"({"model":"other","input":"a"})", 404, "model", "this server serves 'm'"},
      {R"([1])", 400, "", "JSON object"},
      {R"({"model":"m","input":"a")", 400, "", ""},
  };
  for (const Case& c : cases) {
    const ApiError e = refusal(c.body);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << ": " << e.what();
    const json j = e.to_json();
    EXPECT_TRUE(j["error"]["message"].is_string()) << c.body;
  }
}

TEST(EmbeddingRequest, NoOtherWidthWithoutTruncatableDims) {
  EmbeddingLimits l = limits();
  l.truncatable_dims.clear();
  try {
    parse_embedding_request(R"({"model":"m","input":"a","dimensions":4})", l);
    FAIL() << "accepted a width the model does not allow";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("no other width"), std::string::npos) << e.what();
  }
}

TEST(EmbeddingRequest, FitsInputsToTheContext) {
  std::vector<std::vector<int32_t>> inputs = {{1, 2, 3}, {1, 2, 3, 4, 5}};
  try {
    tandem::server::fit_to_context(inputs, 4, false);
    FAIL() << "an input longer than the context was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "input[1]");
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("maximum context length is 4 tokens"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("has 5 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"truncate\": true"), std::string::npos) << e.what();
  }
  tandem::server::fit_to_context(inputs, 4, true);
  EXPECT_EQ(inputs, (std::vector<std::vector<int32_t>>{{1, 2, 3}, {1, 2, 3, 4}}));
  tandem::server::fit_to_context(inputs, 4, false);  // now they fit
}

TEST(EmbeddingResponse, TruncatedWidthsAreRenormalisedPrefixes) {
  // Two unit vectors of width 4, cut to 2.
  std::vector<float> e = {0.5f, 0.5f, 0.5f, 0.5f, 0.0f, 0.6f, 0.8f, 0.0f};
  tandem::server::truncate_embeddings(e, 2, 4, 2);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_NEAR(e[0], std::sqrt(0.5), 1e-6);
  EXPECT_NEAR(e[1], std::sqrt(0.5), 1e-6);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_NEAR(e[3], 1.0, 1e-6);
}

TEST(EmbeddingResponse, Base64IsRfc4648) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [in, out] : vectors)
    EXPECT_EQ(tandem::server::base64_encode(in, std::strlen(in)), out) << in;
  const unsigned char high[] = {0xff, 0xfe, 0x00};
  EXPECT_EQ(tandem::server::base64_encode(high, 3), "//4A");
}

std::vector<uint8_t> base64_decode(const std::string& s) {
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : s) {
    if (c == '=') break;
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    acc = (acc << 6) | static_cast<uint32_t>(std::strchr(alphabet, c) - alphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  return out;
}

TEST(EmbeddingResponse, FloatsAndBase64CarryTheSameBits) {
  const std::vector<float> e = {0.1f, -1e-30f, 3.4028235e38f, 1.0f / 3.0f, -0.0f, 7.0f};
  const json floats = json::parse(tandem::server::embedding_response("m\"x", e, 2, 3, false, 11));
  const json b64 = json::parse(tandem::server::embedding_response("m\"x", e, 2, 3, true, 11));
  for (const json* j : {&floats, &b64}) {
    EXPECT_EQ((*j)["object"], "list");
    EXPECT_EQ((*j)["model"], "m\"x");
    EXPECT_EQ((*j)["usage"]["prompt_tokens"], 11);
    EXPECT_EQ((*j)["usage"]["total_tokens"], 11);
    ASSERT_EQ((*j)["data"].size(), 2u);
  }
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(floats["data"][s]["object"], "embedding");
    EXPECT_EQ(floats["data"][s]["index"], s);
    const auto values = floats["data"][s]["embedding"].get<std::vector<double>>();
    const std::vector<uint8_t> bytes = base64_decode(b64["data"][s]["embedding"].get<std::string>());
    ASSERT_EQ(values.size(), 3u);
    ASSERT_EQ(bytes.size(), 3 * sizeof(float));
    for (size_t i = 0; i < 3; ++i) {
      float from_bytes;
      std::memcpy(&from_bytes, bytes.data() + i * sizeof(float), sizeof(float));
      const float want = e[s * 3 + i];
      EXPECT_EQ(std::memcmp(&from_bytes, &want, sizeof(float)), 0) << s << "," << i;
      EXPECT_EQ(static_cast<float>(values[i]), want) << s << "," << i;  // the text reads back exactly
    }
  }
}

// Eight threads embed at once while the worker is held: the waiting requests share batches, and every
// request gets the same bits as embedding its sequences alone.
TEST(EmbeddingBatcher, BatchesConcurrentRequestsWithoutChangingThem) {
  auto model =
      tandem::model::Model::load(tandem::testing::shared_path("models/synth/synth-bert-d64-F16.gguf"));
  tandem::ThreadPool pool(2);
  constexpr int kClients = 8;
  std::vector<std::vector<std::vector<int32_t>>> requests(kClients);
  for (int c = 0; c < kClients; ++c)
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> ids;
      for (int t = 0; t < 2 + (c * 3 + s) % 7; ++t) ids.push_back((c * 31 + s * 7 + t * 13) % 200 + 1);
      requests[static_cast<size_t>(c)].push_back(ids);
    }
  const int64_t D = model->config().n_embd;

  std::atomic<int> started{0};
  tandem::engine::EmbeddingBatcher batcher(
      [&] {
        // Holds the first round until every client has called embed() and had time to queue behind it.
        while (started.load() < kClients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return std::make_unique<tandem::model::Embedder>(*model, pool);
      },
      D, model->config().n_ctx_train, {});

  std::vector<std::vector<float>> got(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      started.fetch_add(1);
      const auto admit = batcher.embed(requests[static_cast<size_t>(c)], got[static_cast<size_t>(c)]);
      EXPECT_EQ(admit, tandem::engine::EmbeddingBatcher::Admit::kOk);
    });
  for (auto& t : clients) t.join();

  const tandem::engine::EmbeddingStats stats = batcher.stats();
  EXPECT_EQ(stats.requests, static_cast<uint64_t>(kClients));
  EXPECT_EQ(stats.inputs, static_cast<uint64_t>(kClients * 3));
  EXPECT_LT(stats.rounds, static_cast<uint64_t>(kClients)) << "no two requests shared a batch";

  batcher.stop();  // the embedder below has the pool to itself from here
  tandem::model::Embedder alone(*model, pool);
  for (int c = 0; c < kClients; ++c) {
    const auto& seqs = requests[static_cast<size_t>(c)];
    ASSERT_EQ(got[static_cast<size_t>(c)].size(), seqs.size() * static_cast<size_t>(D));
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<float> want(static_cast<size_t>(D));
      const std::span<const int32_t> one[] = {seqs[s]};
      alone.embed(one, {}, want.data());
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(got[static_cast<size_t>(c)][s * static_cast<size_t>(D) + static_cast<size_t>(d)],
                  want[static_cast<size_t>(d)])
            << "client " << c << " input " << s << " dim " << d;
    }
  }
}

TEST(EmbeddingBatcher, RefusesAfterDrainAndReportsEmbedderFailures) {
  auto model =
      tandem::model::Model::load(tandem::testing::shared_path("models/synth/synth-bert-d64-F16.gguf"));
  tandem::ThreadPool pool(1);
  const int64_t D = model->config().n_embd;
  {
    tandem::engine::EmbeddingBatcher failing(
        []() -> std::unique_ptr<tandem::model::Embedder> { throw tandem::Error("no embedder today"); }, D, 8,
        {});
    std::vector<float> out;
    EXPECT_THROW(
        {
          try {
            failing.embed({{1, 2}}, out);
          } catch (const tandem::Error& e) {
            EXPECT_NE(std::string(e.what()).find("no embedder today"), std::string::npos);
            throw;
          }
        },
        tandem::Error);
  }
  tandem::engine::EmbeddingBatcher batcher(
      [&] { return std::make_unique<tandem::model::Embedder>(*model, pool); }, D, model->config().n_ctx_train,
      {});
  std::vector<float> out;
  EXPECT_EQ(batcher.embed({{1, 2, 3}}, out), tandem::engine::EmbeddingBatcher::Admit::kOk);
  EXPECT_EQ(out.size(), static_cast<size_t>(D));
  batcher.drain();
  out.clear();
  EXPECT_EQ(batcher.embed({{1, 2, 3}}, out), tandem::engine::EmbeddingBatcher::Admit::kDraining);
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(batcher.idle());
}

// saturated() turns true exactly when the queue holds max_waiting requests, so an embed() then answers
// kQueueFull (what /health reports as busy); the round being embedded holds no queue place.
TEST(EmbeddingBatcher, SaturatedWhenTheQueueIsAtItsBound) {
  auto model =
      tandem::model::Model::load(tandem::testing::shared_path("models/synth/synth-bert-d64-F16.gguf"));
  tandem::ThreadPool pool(1);
  const int64_t D = model->config().n_embd;
  std::atomic<bool> building{false}, release{false};
  tandem::engine::EmbeddingBatcherOptions options;
  options.max_rows = 4;  // one request per round
  options.max_waiting = 2;
  tandem::engine::EmbeddingBatcher batcher(
      [&] {
        // Holds the first round until the test has filled the queue behind it.
        building.store(true);
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return std::make_unique<tandem::model::Embedder>(*model, pool);
      },
      D, model->config().n_ctx_train, options);
  EXPECT_EQ(batcher.options().max_waiting, 2);
  const auto wait_for = [&](auto done) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!done()) {
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<std::vector<float>> out(3);
  std::vector<std::thread> clients;
  const auto client = [&](size_t i) {
    clients.emplace_back([&, i] {
      EXPECT_EQ(batcher.embed({{1, 2, 3, static_cast<int32_t>(i + 4)}}, out[i]),
                tandem::engine::EmbeddingBatcher::Admit::kOk);
    });
  };
  client(0);
  wait_for([&] { return building.load(); });  // the first request left the queue for its round
  EXPECT_FALSE(batcher.saturated());
  client(1);
  wait_for([&] { return batcher.stats().waiting == 1; });
  EXPECT_FALSE(batcher.saturated());
  client(2);
  wait_for([&] { return batcher.stats().waiting == 2; });
  EXPECT_TRUE(batcher.saturated());
  std::vector<float> refused;
  EXPECT_EQ(batcher.embed({{5, 6}}, refused), tandem::engine::EmbeddingBatcher::Admit::kQueueFull);
  EXPECT_TRUE(refused.empty());
  release.store(true);
  for (auto& t : clients) t.join();
  EXPECT_FALSE(batcher.saturated());
  for (const auto& o : out) EXPECT_EQ(o.size(), static_cast<size_t>(D));
}

}  // namespace
