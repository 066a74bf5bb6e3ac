// The LLM proposer: asks a model (an OpenAI-compatible chat-completions endpoint or Anthropic's
// Messages API, over libcurl) for one kernel for a call, showing it the fastest verified kernels so
// far with their times, achieved bandwidth and resource use, and recent failures with evidence. Its kernels are untrusted like any other: they go through the same static check and
// gauntlet. Off unless llm_url is configured; the API key is read from the environment variable
// named by llm_key_env and is never written anywhere.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"
#include "evolve/propose/proposer.h"
#include "runtime/status.h"

namespace kc::evolve {

struct LlmOptions {
  std::string api = "openai";                  // "openai" (chat completions) | "anthropic" (messages)
  std::string url;                             // e.g. https://api.openai.com/v1/chat/completions
  std::string model;                           // sent as "model" when set
  std::string key_env = "KERNELCRAFT_LLM_KEY"; // environment variable holding the bearer token
  double timeout_s = 120;                      // whole request
  bool enabled() const { return !url.empty(); }
};

// What the model is shown besides the call itself (proposer.h).
using LlmKernel = ShownKernel;
using LlmContext = FreeformContext;

struct LlmProposal {
  std::string source;
  nlohmann::json launch;
};

// The chat messages for `c` (system rules for its backend, then the task).
nlohmann::json llm_messages(const OpCall& c, const LlmContext& ctx);
// The request body for `api` (the system rules separate for Anthropic, a message for OpenAI).
nlohmann::json llm_request(const LlmOptions& o, const OpCall& c, const LlmContext& ctx);
// Extracts {"source": str, "launch": object} from a response body of `api`; the model may wrap the
// object in a ```json fence. kInvalid with the reason otherwise.
Result<LlmProposal> parse_llm_reply(const std::string& body, const std::string& api = "openai");
// One request. kUnsupported when built without libcurl; kIOError for network and HTTP failures.
Result<LlmProposal> ask_llm(const LlmOptions& o, const OpCall& c, const LlmContext& ctx);

// The LLM as a free-form proposer (proposer.h), family "llm".
class LlmProposer final : public FreeformProposer {
 public:
  explicit LlmProposer(LlmOptions o) : o_(std::move(o)) {}
  const char* name() const override { return "llm"; }
  Result<FreeformKernel> propose(const OpCall& c, const FreeformContext& ctx) const override;

 private:
  LlmOptions o_;
};

}  // namespace kc::evolve
