// The OpenAI-compatible HTTP server: a thin adapter from HTTP (cpp-httplib) to the scheduler.
//
// Routes: POST /v1/completions, POST /v1/chat/completions (streamed as server-sent events with
// "stream": true), POST /v1/embeddings, GET /v1/models, GET /health, GET /metrics. A server without a
// scheduler (an encoder-only model) answers the generation routes with 400; one without an embedding batcher
// answers /v1/embeddings with 400. /health is what a load balancer polls: 200
// "ok" when ready, else 503 with Retry-After and the reason ("starting" until ready(), "draining" after
// begin_drain(), "busy" while a new request would get queue-full). Every response names the replica in
// X-Tandem-Replica. Every error is an OpenAI-style error object
// with the matching status: 400 bad input, 401 missing or wrong API key, 404 unknown route or model, 405
// wrong method, 408 request not received in time, 413 body too large, 431 headers too large or too many, 503
// queue full (with Retry-After), connections full (with Retry-After) or draining. Each request is logged to
// stderr as one line; every error response closes its connection.
//
// Each connection is served by a thread of its own (LimitedServer, up to ServerOptions::connections'
// max_connections); a streaming request's thread waits on its stream and cancels it when the client goes
// away (the scheduler then frees the sequence within one iteration).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tandem/engine/embed_batcher.h"
#include "tandem/engine/scheduler.h"
#include "tandem/server/chat_reply.h"
#include "tandem/server/chat_template.h"
#include "tandem/server/connection_limits.h"
#include "tandem/server/metrics.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see HttpServer::port())
  std::string model_name;
  std::string api_key;          // empty: no authentication
  std::string replica_name;     // X-Tandem-Replica; empty: "HOSTNAME:PORT" once bound
  int retry_after_seconds = 1;  // sent with 503 when the queue or the connections are full
  // Connections, request heads and bodies, and timeouts (see connection_limits.h). max_connections must
  // leave room beyond the scheduler's running and queued requests, each of which holds a connection.
  ConnectionLimits connections;
  int max_json_depth = 64;              // request bodies nested deeper get 400
  size_t max_json_elements = 1u << 18;  // request bodies with more JSON values get 400
  // /v1/embeddings: widths below the model's that `dimensions` may ask for (Matryoshka-trained models).
  std::vector<int64_t> truncatable_dims;
  // Said in the 400 a generation request gets from a server without a scheduler ("an encoder (bert)").
  std::string model_kind;
  // Whether chat replies' <think> blocks go to reasoning_content (a request's reasoning_format overrides).
  ReasoningFormat reasoning_format = ReasoningFormat::kDeepSeek;
};

class HttpServer {
 public:
  // scheduler (null: no generation), embeddings (null: no /v1/embeddings), tokenizer, chat template and
  // metrics must outlive the server. At least one of scheduler and embeddings is given.
  HttpServer(engine::Scheduler* scheduler, engine::EmbeddingBatcher* embeddings,
             const tokenizer::Tokenizer& tokenizer, const ChatTemplate& chat, Metrics& metrics,
             ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; throws tandem::Error when it cannot. Returns the bound port.
  int bind();
  // Serves connections until stop(); call after bind().
  void serve();
  // /health answers "starting" until this is called (the model is loaded and has run a forward).
  // Generation requests are served before it all the same.
  void ready();
  // New generation requests get 503 from now on; running ones continue.
  void begin_drain();
  // Stops listening; serve() returns once the connections in progress are done. Safe from any thread.
  void stop();
  int port() const;
  const std::string& replica_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server
