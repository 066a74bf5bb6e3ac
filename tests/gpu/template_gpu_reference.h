// Host-side data for the CUDA template tests (kc_template_gpu_tests): fp16/bf16 rounding, host
// tensors, fp64 references of the 16 default ops with a per-element error scale, and the inputs
// that exercise each family (specials, offset rows, -inf, huge rows).
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "evolve/ops/op_call.h"

namespace kc::evolve::gpu_ref {

using Vec = std::vector<double>;

uint16_t to_bf16(float f);
float from_bf16(uint16_t h);
uint16_t to_f16(float f);
float from_f16(uint16_t h);

// A host tensor: its values as the device type rounds them, and the bytes to upload.
struct Host {
  DType dt = DType::kF32;
  Vec v;
  std::string bytes() const {
    std::string b(v.size() * dtype_size(dt), '\0');
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kI64) {   // indices (max pooling backward)
        const int64_t q = static_cast<int64_t>(v[i]);
        std::memcpy(&b[i * 8], &q, 8);
      } else if (dt == DType::kF32) {
        float f = static_cast<float>(v[i]);
        std::memcpy(&b[i * 4], &f, 4);
      } else if (dt == DType::kI32) {   // embedding indices
        const int32_t q = static_cast<int32_t>(v[i]);
        std::memcpy(&b[i * 4], &q, 4);
      } else {
        uint16_t h = dt == DType::kF16 ? to_f16(static_cast<float>(v[i])) : to_bf16(static_cast<float>(v[i]));
        std::memcpy(&b[i * 2], &h, 2);
      }
    }
    return b;
  }
  static double round(DType dt, double x) {
    if (dt == DType::kI64 || dt == DType::kI32) return x;
    float f = static_cast<float>(x);
    if (dt == DType::kF16) return from_f16(to_f16(f));
    if (dt == DType::kBF16) return from_bf16(to_bf16(f));
    return f;
  }
  static Vec decode(DType dt, const std::string& b) {
    Vec v(b.size() / dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kI64) {   // indices (max pooling)
        int64_t q;
        std::memcpy(&q, &b[i * 8], 8);
        v[i] = static_cast<double>(q);
      } else if (dt == DType::kF32) {
        float f;
        std::memcpy(&f, &b[i * 4], 4);
        v[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, &b[i * 2], 2);
        v[i] = dt == DType::kF16 ? from_f16(h) : from_bf16(h);
      }
    }
    return v;
  }
};

// An expected output with a per-element error scale: |out - ref| <= rtol * scale + atol.
struct Expect {
  Vec ref, scale;
};

// Inputs by name (schema order) -> expected outputs (out0, out1, ...; empty for absent ones).
std::vector<Expect> reference(const OpCall& c, const std::map<std::string, Vec>& in);
// The activations and their backward (template_gpu_reference_unary.cpp).
std::vector<Expect> unary(const OpCall& c, const std::map<std::string, Vec>& in);
std::vector<Expect> unary_backward(const OpCall& c, const std::map<std::string, Vec>& in);
// Pooling backward (template_gpu_reference_pool.cpp): grad_input by the scatter of the definition.
std::vector<Expect> pool_backward(const OpCall& c, const std::map<std::string, Vec>& in);
// Max pooling backward's indices: the forward's argmax of in["self"], as training saves them.
Vec argmax_indices(const OpCall& c, const std::map<std::string, Vec>& in);
// Values for one input of `c`, rounded to its dtype.
Vec make_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
// Layer norm forward and backward (template_gpu_layer_norm.cpp).
std::vector<Expect> layer_norm(const OpCall& c, const std::map<std::string, Vec>& in);
// Batch norm backward (template_gpu_batch_norm_backward.cpp), from the given saved or running
// statistics (the formula holds for any; the drawn save_invstd is positive).
std::vector<Expect> batch_norm_backward(const OpCall& c, const std::map<std::string, Vec>& in);
// Group norm backward (template_gpu_group_norm_backward.cpp), from the given mean and rstd (the
// formula holds for any): its references, and one input's values (before rounding).
std::vector<Expect> group_norm_backward(const OpCall& c, const std::map<std::string, Vec>& in);
Vec group_norm_backward_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
// Embedding backward (template_gpu_embedding_backward.cpp): one input's values (indices with hot
// rows and padding_idx) and the reference.
Vec embedding_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
std::vector<Expect> embedding_backward(const OpCall& c, const std::map<std::string, Vec>& in);
// The loss families (template_gpu_loss.cpp): one input's values (before rounding), references.
Vec loss_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
std::vector<Expect> loss(const OpCall& c, const std::map<std::string, Vec>& in);
std::vector<Expect> loss_backward(const OpCall& c, const std::map<std::string, Vec>& in);
// nll backward's total_weight input, as the forward computes it from the other inputs.
double nll_total_weight(const OpCall& c, const std::map<std::string, Vec>& in);
// Cross-entropy (template_gpu_cross_entropy.cpp): one input's values (rounded), the references,
// and the backward's lse input as the forward computes it (fp32) from self.
Vec ce_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
std::vector<Expect> cross_entropy(const OpCall& c, const std::map<std::string, Vec>& in);
std::vector<Expect> cross_entropy_backward(const OpCall& c, const std::map<std::string, Vec>& in);
Vec ce_lse(const OpCall& c, const std::map<std::string, Vec>& in);
// RMSNorm (template_gpu_rms_norm.cpp): one input's values (rounded), the references, and the
// backward's rstd input as the forward computes it (fp32) from the input.
Vec rms_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
std::vector<Expect> rms_norm(const OpCall& c, const std::map<std::string, Vec>& in);
std::vector<Expect> rms_norm_backward(const OpCall& c, const std::map<std::string, Vec>& in);
Vec rms_rstd(const OpCall& c, const std::map<std::string, Vec>& in);
// KL divergence (template_gpu_kl_div.cpp): one input's values (rounded) and the references.
Vec kl_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng);
std::vector<Expect> kl_div(const OpCall& c, const std::map<std::string, Vec>& in);
std::vector<Expect> kl_div_backward(const OpCall& c, const std::map<std::string, Vec>& in);

}  // namespace kc::evolve::gpu_ref
