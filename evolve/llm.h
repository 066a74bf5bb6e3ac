// The LLM proposer: asks a chat-completions endpoint (OpenAI-compatible, over libcurl) for one
// kernel for a call, showing it the fastest verified kernel so far and why its last proposal was
// rejected. Its kernels are untrusted like any other: they go through the same static check and
// gauntlet. Off unless llm_url is configured; the API key is read from the environment variable
// named by llm_key_env and is never written anywhere.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "evolve/op_call.h"
#include "runtime/status.h"

namespace kc::evolve {

struct LlmOptions {
  std::string url;                             // e.g. https://api.openai.com/v1/chat/completions
  std::string model;                           // sent as "model" when set
  std::string key_env = "KERNELCRAFT_LLM_KEY"; // environment variable holding the bearer token
  double timeout_s = 120;                      // whole request
  bool enabled() const { return !url.empty(); }
};

// What the model is shown besides the call itself.
struct LlmContext {
  double eager_ms = 0;
  std::string best_source;                     // fastest verified kernel so far ("" if none)
  nlohmann::json best_launch;
  double best_ms = 0;
  std::string last_rejection;                  // its previous proposal's stage and evidence ("" if none)
};

struct LlmProposal {
  std::string source;
  nlohmann::json launch;
};

// The chat messages for `c` (system rules for its backend, then the task).
nlohmann::json llm_messages(const OpCall& c, const LlmContext& ctx);
// Extracts {"source": str, "launch": object} from a chat-completions response body; the model may
// wrap the object in a ```json fence. kInvalid with the reason otherwise.
Result<LlmProposal> parse_llm_reply(const std::string& body);
// One request. kUnsupported when built without libcurl; kIOError for network and HTTP failures.
Result<LlmProposal> ask_llm(const LlmOptions& o, const OpCall& c, const LlmContext& ctx);

}  // namespace kc::evolve
