// Configuration: defaults, the KERNELCRAFT_CONFIG JSON file, then KERNELCRAFT_* environment variables.
#include "runtime/config.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/log.h"
#include "runtime/ops.h"

namespace kc {

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> f = {
      {"enabled", "KERNELCRAFT_DISABLE", "global switch; KERNELCRAFT_DISABLE=1 turns interception off"},
      {"ops", "KERNELCRAFT_OPS", "intercepted ops: default | all | none | list, e.g. \"-gelu\" or \"relu,softmax\""},
      {"cache_dir", "KERNELCRAFT_CACHE_DIR", "cache directory (default ~/.cache/kernelcraft)"},
      {"cache_readonly", "KERNELCRAFT_CACHE_READONLY", "serve a shipped cache without ever writing it"},
      {"miss_log", "KERNELCRAFT_MISS_LOG", "file to which each newly missed key is appended (pre-warming)"},
      {"cxx", "KERNELCRAFT_CXX", "host C++ compiler for CPU kernels"},
      {"nvrtc", "KERNELCRAFT_NVRTC", "path of libnvrtc to load before the usual search"},
      {"precision", "KERNELCRAFT_PRECISION", "precision policy: fp32 | tf32 | bf16 (part of the key)"},
      {"catch_up_ms", "KERNELCRAFT_CATCH_UP_MS", "ms between looks for kernels written by others (0: never)"},
      {"log_level", "KERNELCRAFT_LOG_LEVEL", "debug | info | warn | error | off"},
  };
  return f;
}

namespace {

std::vector<std::string> default_ops() {
  std::vector<std::string> v;
  for (const auto& o : all_ops())
    if (o.default_on) v.push_back(o.name);
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
  }
  return out;
}

bool valid_policy(const std::string& p) { return p == "fp32" || p == "tf32" || p == "bf16"; }
bool valid_level(const std::string& l) {
  return l == "debug" || l == "info" || l == "warn" || l == "error" || l == "off";
}

}  // namespace

Result<std::vector<std::string>> parse_op_list(const std::string& text) {
  std::vector<std::string> items = split(text, ',');
  std::vector<std::string> out;
  if (items.empty()) return Status::error(Code::kInvalid, "empty op list");
  bool relative = items[0][0] == '+' || items[0][0] == '-';
  if (relative) out = default_ops();
  for (const auto& it : items) {
    if (it == "default") { out = default_ops(); continue; }
    if (it == "none") { out.clear(); continue; }
    if (it == "all") {
      out.clear();
      for (const auto& o : all_ops()) out.push_back(o.name);
      continue;
    }
    bool remove = it[0] == '-';
    std::string name = (it[0] == '-' || it[0] == '+') ? it.substr(1) : it;
    auto id = op_by_name(name);
    if (!id) return Status::error(Code::kInvalid, "unknown op '" + name + "' (see `kernelcraft ops`)");
    std::string canon = op_info(*id).name;
    auto pos = std::find(out.begin(), out.end(), canon);
    if (remove) {
      if (pos != out.end()) out.erase(pos);
    } else if (pos == out.end()) {
      out.push_back(canon);
    }
  }
  return out;
}

Status apply_json(Config& c, const nlohmann::json& j) {
  if (!j.is_object()) return Status::error(Code::kInvalid, "config must be a JSON object");
  Config n = c;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      const auto& v = it.value();
      if (k == "enabled") n.enabled = v.get<bool>();
      else if (k == "ops") {
        std::string text;
        if (v.is_string()) text = v.get<std::string>();
        else {
          for (const auto& e : v) text += (text.empty() ? "" : ",") + e.get<std::string>();
          if (text.empty()) text = "none";
        }
        auto ops = parse_op_list(text);
        if (!ops) return ops.status();
        n.ops = ops.value();
      } else if (k == "cache_dir") n.cache_dir = v.get<std::string>();
      else if (k == "cache_readonly") n.cache_readonly = v.get<bool>();
      else if (k == "miss_log") n.miss_log = v.get<std::string>();
      else if (k == "cxx") n.cxx = v.get<std::string>();
      else if (k == "nvrtc") n.nvrtc_path = v.get<std::string>();
      else if (k == "precision") {
        n.policy = v.get<std::string>();
        if (!valid_policy(n.policy)) return Status::error(Code::kInvalid, "precision must be fp32, tf32 or bf16");
      } else if (k == "catch_up_ms") n.catch_up_ms = v.get<int>();
      else if (k == "log_level") {
        n.log_level = v.get<std::string>();
        if (!valid_level(n.log_level)) return Status::error(Code::kInvalid, "bad log_level '" + n.log_level + "'");
      } else return Status::error(Code::kInvalid, "unknown config key '" + k + "'");
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kInvalid, std::string("config: wrong type: ") + e.what());
  }
  c = std::move(n);
  return Status::ok();
}

nlohmann::json to_json(const Config& c) {
  return {{"enabled", c.enabled}, {"ops", c.ops}, {"cache_dir", c.cache_dir},
          {"cache_readonly", c.cache_readonly}, {"miss_log", c.miss_log}, {"cxx", c.cxx},
          {"nvrtc", c.nvrtc_path}, {"precision", c.policy}, {"catch_up_ms", c.catch_up_ms},
          {"log_level", c.log_level}};
}

Config load_config() {
  Config c;
  c.ops = default_ops();
  if (const char* path = std::getenv("KERNELCRAFT_CONFIG")) {
    std::ifstream f(path);
    if (!f) {
      log_once(LogLevel::kWarn, "config-open", std::string("cannot read KERNELCRAFT_CONFIG file ") + path + "; ignoring it");
    } else {
      nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      Status s = j.is_discarded() ? Status::error(Code::kInvalid, "not valid JSON") : apply_json(c, j);
      if (!s) log_once(LogLevel::kWarn, "config-parse", std::string("KERNELCRAFT_CONFIG ") + path + ": " + s.to_string() + "; ignoring it");
    }
  }
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
  };
  auto truthy = [](const char* v) { return std::string(v) == "1" || std::string(v) == "true" || std::string(v) == "yes"; };
  if (const char* v = env("KERNELCRAFT_DISABLE")) c.enabled = !truthy(v);
  if (const char* v = env("KERNELCRAFT_OPS")) {
    auto ops = parse_op_list(v);
    if (ops) c.ops = ops.value();
    else log_once(LogLevel::kWarn, "config-ops", "KERNELCRAFT_OPS: " + ops.status().message() + "; using the default list");
  }
  if (const char* v = env("KERNELCRAFT_CACHE_DIR")) c.cache_dir = v;
  if (const char* v = env("KERNELCRAFT_CACHE_READONLY")) c.cache_readonly = truthy(v);
  if (const char* v = env("KERNELCRAFT_MISS_LOG")) c.miss_log = v;
  if (const char* v = env("KERNELCRAFT_CXX")) c.cxx = v;
  if (const char* v = env("KERNELCRAFT_NVRTC")) c.nvrtc_path = v;
  if (const char* v = env("KERNELCRAFT_PRECISION")) {
    if (valid_policy(v)) c.policy = v;
    else log_once(LogLevel::kWarn, "config-prec", std::string("KERNELCRAFT_PRECISION=") + v + " is not fp32|tf32|bf16; using " + c.policy);
  }
  if (const char* v = env("KERNELCRAFT_CATCH_UP_MS")) c.catch_up_ms = std::atoi(v);
  if (const char* v = env("KERNELCRAFT_LOG_LEVEL")) {
    if (valid_level(v)) c.log_level = v;
  }
  return c;
}

}  // namespace kc
