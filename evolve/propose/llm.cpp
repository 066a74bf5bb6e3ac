// The LLM proposer (llm.h): the prompt, the reply parser, and one HTTP request through libcurl.
#include "evolve/propose/llm.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#if KC_WITH_CURL
#include <curl/curl.h>
#endif

#include "runtime/ops.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

// The rules a kernel must follow, per backend; the same things the static check and the gauntlet
// enforce, said up front so that fewer proposals are wasted.
const char* kCudaRules =
    "Write CUDA device code compiled by NVRTC (no host code, no #include of CUDA runtime headers, no "
    "printf, no mutable __device__ globals, no atomics on global state that survives between launches). "
    "Entry points are extern \"C\" __global__ functions. Results must match PyTorch in fp32 to within a "
    "few ulp (no fast-math intrinsics, no lower precision accumulation). Handle every element: sizes "
    "need not be multiples of the block size.";
const char* kCpuRules =
    "Write C++ compiled as a shared object with the host compiler; kc_cpu.h is prepended and defines "
    "struct kc_cpu_ctx {int64_t grid[3]; int64_t block[3]; int64_t begin; int64_t end;} and "
    "KC_ARG(T, args, i). Entry points are extern \"C\" void entry(const kc_cpu_ctx* ctx, void* const* args) "
    "and process the linear block indices [ctx->begin, ctx->end) (blocks run in parallel). No static or "
    "global mutable state, no I/O, no threads. Results must match PyTorch in fp32 to within a few ulp.";
const char* kLaunchFormat =
    "The launch spec is JSON: {\"version\": 1, \"launches\": [{\"entry\": NAME, \"grid\": [x, y, z], "
    "\"block\": [x, y, z], \"smem\": EXPR, \"args\": [...]}], \"scratch\": [{\"name\": N, \"bytes\": EXPR}]}. "
    "grid/block/smem/bytes are integers or expressions over numel(t), size(t,i), stride(t,i), dim(t), "
    "ceil_div(a,b), min, max, + - * / %. args: \"ptr:<tensor or scratch name>\" (inputs by schema name, "
    "outputs out0, out1, ...), \"i32:<expr>\", \"i64:<expr>\", \"f32:<scalar name or literal>\", "
    "\"f64:...\". Several launches run in order on one stream. Outputs are contiguous and allocated for you.";

std::string strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

json llm_messages(const OpCall& c, const LlmContext& ctx) {
  const bool cuda = c.backend == BackendKind::kCuda;
  std::string system = std::string("You write fast, exactly correct ") + (cuda ? "CUDA" : "CPU") +
                       " kernels for one PyTorch operator call. " + (cuda ? kCudaRules : kCpuRules) + " " +
                       kLaunchFormat +
                       " Reply with one JSON object and nothing else: {\"source\": \"...\", \"launch\": {...}}.";
  // Bytes every kernel must at least move (each input read once, each output written once): with a
  // time this is the achieved bandwidth, a hint at how far from the memory roof a kernel is.
  double bytes = 0;
  for (const auto* list : {&c.inputs, &c.outputs})
    for (const TensorMeta& t : *list)
      if (t.defined) bytes += static_cast<double>(t.numel()) * dtype_size(t.dtype);
  auto speed = [&](double ms) {
    char b[96];
    std::snprintf(b, sizeof b, "%.2f us (%.1f GB/s over the %.0f bytes in and out)", ms * 1e3, bytes / (ms * 1e-3) / 1e9, bytes);
    return std::string(b);
  };
  std::string task = std::string("Operator: ") + op_info(c.op).aten + " (" + op_info(c.op).name + "), backend " +
                     backend_name(c.backend) + ", target " + c.target + ", precision policy " + c.policy + ".\n" +
                     "The call (inputs, outputs, scalars): " + to_json(c).dump() + "\n";
  if (ctx.eager_ms > 0) task += "PyTorch's own kernel takes " + speed(ctx.eager_ms) + ".\n";
  for (size_t i = 0; i < ctx.best.size(); ++i) {
    const LlmKernel& k = ctx.best[i];
    task += (i == 0 ? "The fastest verified kernel so far (" : "Verified kernel #" + std::to_string(i + 1) + " (") +
            k.id + ") takes " + speed(k.ms) + ".";
    if (!k.resources.is_null() && !k.resources.empty()) task += " Resources: " + k.resources.dump() + ".";
    task += "\nSource:\n" + k.source + "\nLaunch spec: " + k.launch.dump() + "\n";
  }
  if (!ctx.failures.empty()) {
    task += "Recent rejected kernels and why:\n";
    for (const auto& f : ctx.failures) task += "- " + f + "\n";
  }
  if (!ctx.last_rejection.empty()) task += "Your previous kernel was rejected: " + ctx.last_rejection + "\n";
  task += std::string("Propose one kernel that is correct for this exact call and faster than ") +
          (ctx.best.empty() ? "PyTorch's." : "all of these.");
  return json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", task}}});
}

json llm_request(const LlmOptions& o, const OpCall& c, const LlmContext& ctx) {
  json m = llm_messages(c, ctx);
  json req;
  if (o.api == "anthropic") {
    req = {{"system", m[0]["content"]}, {"messages", json::array({m[1]})}, {"max_tokens", 8192}};
  } else {
    req = {{"messages", m}};
  }
  req["temperature"] = 0.7;
  if (!o.model.empty()) req["model"] = o.model;
  return req;
}

Result<LlmProposal> parse_llm_reply(const std::string& body, const std::string& api) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::error(Code::kInvalid, "the response is not JSON");
  if (j.contains("error")) return Status::error(Code::kInvalid, "the endpoint answered with an error: " + j["error"].dump());
  std::string text;
  if (api == "anthropic") {
    auto content = j.find("content");
    if (content == j.end() || !content->is_array()) return Status::error(Code::kInvalid, "the response has no content");
    for (const auto& block : *content)
      if (block.value("type", "") == "text" && block.contains("text") && block["text"].is_string())
        text += block["text"].get<std::string>();
    if (text.empty()) return Status::error(Code::kInvalid, "the response has no text content");
  } else {
    auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array() || choices->empty())
      return Status::error(Code::kInvalid, "the response has no choices");
    const json& msg = (*choices)[0].value("message", json::object());
    if (!msg.contains("content") || !msg["content"].is_string())
      return Status::error(Code::kInvalid, "the first choice has no text content");
    text = msg["content"].get<std::string>();
  }
  text = strip(text);
  // A fenced block, if any: the object is inside it.
  if (size_t f = text.find("```"); f != std::string::npos) {
    size_t start = text.find('\n', f);
    size_t end = start == std::string::npos ? std::string::npos : text.find("```", start);
    if (end != std::string::npos) text = strip(text.substr(start + 1, end - start - 1));
  }
  size_t a = text.find('{'), b = text.rfind('}');
  if (a == std::string::npos || b == std::string::npos || b < a)
    return Status::error(Code::kInvalid, "the reply holds no JSON object");
  json p = json::parse(text.substr(a, b - a + 1), nullptr, false);
  if (p.is_discarded() || !p.is_object()) return Status::error(Code::kInvalid, "the reply's object does not parse");
  if (!p.contains("source") || !p["source"].is_string() || p["source"].get<std::string>().empty())
    return Status::error(Code::kInvalid, "the reply has no \"source\" string");
  if (!p.contains("launch") || !p["launch"].is_object())
    return Status::error(Code::kInvalid, "the reply has no \"launch\" object");
  return LlmProposal{p["source"].get<std::string>(), p["launch"]};
}

#if KC_WITH_CURL
namespace {

constexpr size_t kMaxResponseBytes = 4 << 20;

size_t append(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > kMaxResponseBytes) return 0;   // makes curl fail the transfer
  out->append(data, size * n);
  return size * n;
}

}  // namespace

Result<LlmProposal> ask_llm(const LlmOptions& o, const OpCall& c, const LlmContext& ctx) {
  if (!o.enabled()) return Status::error(Code::kUnsupported, "no llm_url configured");
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (o.api != "openai" && o.api != "anthropic")
    return Status::error(Code::kInvalid, "llm_api must be openai or anthropic, not '" + o.api + "'");
  const std::string body = llm_request(o, c, ctx).dump(-1, ' ', false, json::error_handler_t::replace);

  CURL* h = curl_easy_init();
  if (!h) return Status::error(Code::kIOError, "curl_easy_init failed");
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  const char* key = o.key_env.empty() ? nullptr : std::getenv(o.key_env.c_str());
  if (o.api == "anthropic") {
    headers = curl_slist_append(headers, "anthropic-version: 2023-06-01");
    if (key && *key) headers = curl_slist_append(headers, ("x-api-key: " + std::string(key)).c_str());
  } else if (key && *key) {
    headers = curl_slist_append(headers, ("Authorization: Bearer " + std::string(key)).c_str());
  }
  std::string response;
  char err[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, o.url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(o.timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);   // no SIGALRM in a threaded worker
  CURLcode rc = curl_easy_perform(h);
  long http = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK)
    return Status::error(Code::kIOError, std::string("request to ") + o.url + " failed: " +
                                             (err[0] ? err : curl_easy_strerror(rc)));
  if (http < 200 || http >= 300)
    return Status::error(Code::kIOError, "HTTP " + std::to_string(http) + " from " + o.url + ": " +
                                             response.substr(0, 300));
  return parse_llm_reply(response, o.api);
}
#else
Result<LlmProposal> ask_llm(const LlmOptions&, const OpCall&, const LlmContext&) {
  return Status::error(Code::kUnsupported, "this build has no libcurl; the LLM proposer is unavailable");
}
#endif

Result<FreeformKernel> LlmProposer::propose(const OpCall& c, const FreeformContext& ctx) const {
  auto p = ask_llm(o_, c, ctx);
  if (!p) return p.status();
  FreeformKernel k{p.value().source, p.value().launch, {}};
  for (const ShownKernel& s : ctx.best) k.parents.push_back(s.id);
  return k;
}

}  // namespace kc::evolve
