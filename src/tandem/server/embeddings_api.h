// POST /v1/embeddings as plain data: parsing and validation of the request body, fitting its inputs to the
// model's context, the requested width, and the response's JSON. No I/O and no model here (see openai_api.h).
//
// The body follows OpenAI's: `input` is a string, an array of strings, an array of token ids (one input) or
// an array of arrays of token ids; `encoding_format` "float" (default) or "base64" (each embedding's
// little-endian float32 bytes, base64-encoded); `dimensions` a width the model allows; `user` a string. One
// extension: "truncate": true keeps the first tokens of an input longer than the model takes, instead of
// refusing it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/server/openai_api.h"

namespace tandem::server {

struct EmbeddingRequest {
  std::string model;
  // The inputs, as texts (to be tokenized) or as token ids: one of the two is non-empty.
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> token_ids;
  bool base64 = false;
  std::optional<int64_t> dimensions;  // absent: the model's full width
  bool truncate = false;
  std::string user;
};

struct EmbeddingLimits {
  ApiLimits api;    // model name, vocabulary and the JSON shape limits
  int64_t dim = 0;  // the model's embedding width
  // Widths below dim that `dimensions` may ask for: those a Matryoshka-trained model keeps meaning when cut
  // (the first k values, renormalised). Empty: only dim itself.
  std::vector<int64_t> truncatable_dims;
  size_t max_inputs = 2048;  // inputs per request, as OpenAI allows
};

// Parses and validates a request body. Throws ApiError: 400 for malformed JSON, a body past the JSON limits,
// a missing or mistyped field, an empty input list, an empty string or token list, a token id outside the
// vocabulary, more than max_inputs inputs, an unknown encoding_format or a width the model does not allow
// (each message names the field, as "input[3]"); 404 for another model's name.
EmbeddingRequest parse_embedding_request(const std::string& body, const EmbeddingLimits& limits);

// Inputs longer than max_tokens: cut to their first max_tokens tokens with `truncate`, else a 400 (code
// context_length_exceeded) naming the input and the limit.
void fit_to_context(std::vector<std::vector<int32_t>>& inputs, int64_t max_tokens, bool truncate);

// Cuts each of n embeddings of width dim (rows of `embeddings`, L2-normalised) to their first `width` values
// and renormalises them, in place; the result holds n rows of `width`. width == dim leaves them as they are.
void truncate_embeddings(std::vector<float>& embeddings, int64_t n, int64_t dim, int64_t width);

// RFC 4648 base64 of `bytes`.
std::string base64_encode(const void* bytes, size_t n);

// The response body: n embeddings of `width` floats (floats as the shortest text that reads back as the same
// float32, or base64 of their little-endian bytes) and the usage.
std::string embedding_response(const std::string& model, const std::vector<float>& embeddings, int64_t n,
                               int64_t width, bool base64, int64_t prompt_tokens);

}  // namespace tandem::server
