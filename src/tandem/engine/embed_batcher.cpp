#include "tandem/engine/embed_batcher.h"

#include <algorithm>
#include <exception>

#include "tandem/util/error.h"

namespace tandem::engine {

struct EmbeddingBatcher::Job {
  std::vector<std::vector<int32_t>> seqs;
  int64_t rows = 0;
  std::vector<float>* out = nullptr;
  bool finished = false;
  Admit admit = Admit::kOk;
  std::string error;  // non-empty: the embedder failed
};

EmbeddingBatcher::EmbeddingBatcher(EmbedderFactory factory, int64_t dim, int64_t max_tokens,
                                   const EmbeddingBatcherOptions& options)
    : factory_(std::move(factory)), dim_(dim), max_tokens_(max_tokens), options_(options) {
  TANDEM_CHECK(dim_ > 0 && max_tokens_ > 0 && options_.max_rows > 0, "embedding batcher sizes");
  thread_ = std::thread([this] { loop(); });
}

EmbeddingBatcher::~EmbeddingBatcher() {
  stop();
}

EmbeddingBatcher::Admit EmbeddingBatcher::embed(std::vector<std::vector<int32_t>> seqs,
                                                std::vector<float>& out) {
  Job job;
  for (const auto& s : seqs) job.rows += static_cast<int64_t>(s.size());
  job.seqs = std::move(seqs);
  job.out = &out;
  std::unique_lock lock(mutex_);
  if (draining_) return Admit::kDraining;
  if (static_cast<int64_t>(queue_.size()) >= options_.max_waiting) return Admit::kQueueFull;
  queue_.push_back(&job);
  wake_.notify_one();
  done_.wait(lock, [&] { return job.finished; });
  if (!job.error.empty()) throw Error(job.error);
  return job.admit;
}

void EmbeddingBatcher::drain() {
  std::lock_guard lock(mutex_);
  draining_ = true;
  for (Job* job : queue_) {
    job->admit = Admit::kDraining;
    job->finished = true;
  }
  queue_.clear();
  done_.notify_all();
}

bool EmbeddingBatcher::idle() const {
  std::lock_guard lock(mutex_);
  return queue_.empty() && !busy_;
}

bool EmbeddingBatcher::saturated() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(queue_.size()) >= options_.max_waiting;
}

void EmbeddingBatcher::stop() {
  drain();
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

EmbeddingStats EmbeddingBatcher::stats() const {
  std::lock_guard lock(mutex_);
  EmbeddingStats s = stats_;
  s.waiting = static_cast<int64_t>(queue_.size());
  return s;
}

void EmbeddingBatcher::loop() {
  std::vector<Job*> round;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      // Every request waiting, in arrival order, up to the row budget; the first one whatever its size.
      int64_t rows = 0;
      round.clear();
      while (!queue_.empty() && (round.empty() || rows + queue_.front()->rows <= options_.max_rows)) {
        rows += queue_.front()->rows;
        round.push_back(queue_.front());
        queue_.pop_front();
      }
      busy_ = true;
    }
    run_round(round);
    std::lock_guard lock(mutex_);
    busy_ = false;
    for (Job* job : round) job->finished = true;  // the callers may return (and free their jobs) from here
    done_.notify_all();
  }
}

void EmbeddingBatcher::run_round(std::vector<Job*>& round) {
  size_t n_seqs = 0;
  uint64_t tokens = 0;
  spans_.clear();
  for (Job* job : round) {
    for (const auto& s : job->seqs) spans_.emplace_back(s);
    n_seqs += job->seqs.size();
    tokens += static_cast<uint64_t>(job->rows);
  }
  std::string error;
  try {
    if (!embedder_) {
      embedder_ = factory_();
      TANDEM_CHECK(embedder_->dim() == dim_ && embedder_->max_tokens() >= max_tokens_,
                   "the embedder's width or context differs from the batcher's");
    }
    out_.resize(n_seqs * static_cast<size_t>(dim_));
    embedder_->embed(spans_, model::EmbedOptions{}, out_.data());
  } catch (const std::exception& e) {
    error = e.what();
  }
  size_t first = 0;
  for (Job* job : round) {
    const size_t n = job->seqs.size() * static_cast<size_t>(dim_);
    if (error.empty())
      job->out->assign(out_.begin() + static_cast<std::ptrdiff_t>(first),
                       out_.begin() + static_cast<std::ptrdiff_t>(first + n));
    else
      job->error = error;
    first += n;
  }
  std::lock_guard lock(mutex_);
  if (error.empty()) {
    stats_.requests += round.size();
    stats_.inputs += n_seqs;
    stats_.tokens += tokens;
  }
  ++stats_.rounds;
}

}  // namespace tandem::engine
