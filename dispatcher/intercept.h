// The interception kernel of every operator, derived from the C++ signature of the ATen function
// it falls back to: no operator has hand-written wrapper code. The argument names come from the
// operator's schema (set_arg_names, at registration) and the key binds them in one fixed order,
// part of the key contract (kernel_cache/key.h): every tensor argument in schema order, then every
// scalar argument in schema order.
#pragma once
#include <array>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>

#include "dispatcher/call.h"
#include "dispatcher/running_stats.h"

namespace kc::dispatch {

// The schema's argument names of `op`, set once at registration before its kernel is installed.
const char* const* arg_names(OpId op);
// Reads `op`'s schema from the dispatcher; false (with a log line) if it has not `arity` arguments.
bool set_arg_names(OpId op, size_t arity);

namespace detail {

template <class T> constexpr bool kTensorArg =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::optional<at::Tensor>>;

template <class T> constexpr bool kOptionalScalar =
    std::is_same_v<T, std::optional<at::ScalarType>> || std::is_same_v<T, std::optional<double>> ||
    std::is_same_v<T, std::optional<int64_t>> || std::is_same_v<T, std::optional<at::Scalar>> ||
    std::is_same_v<T, std::optional<c10::string_view>>;

template <class T> void bind_tensor(Call& c, const char* name, const T& v) {
  if constexpr (kTensorArg<T>) c.t(name, v);
}

template <class T> void bind_scalar(Call& c, const char* name, const T& v) {
  if constexpr (kTensorArg<T>) {
    return;
  } else if constexpr (std::is_same_v<T, bool>) {
    c.b(name, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    c.i(name, v);
  } else if constexpr (std::is_same_v<T, double>) {
    c.d(name, v);
  } else if constexpr (std::is_same_v<T, c10::string_view>) {
    c.s(name, std::string_view(v.data(), v.size()));
  } else if constexpr (std::is_same_v<T, at::IntArrayRef>) {
    c.list(name, v);
  } else if constexpr (std::is_same_v<T, at::ScalarType>) {
    c.s(name, dtype_name(to_dtype(v)));
  } else if constexpr (std::is_same_v<T, at::Scalar>) {
    if (v.isFloatingPoint()) c.d(name, v.toDouble());
    else c.i(name, v.toLong());
  } else if constexpr (std::is_same_v<T, at::OptionalIntArrayRef>) {
    if (v.has_value()) c.list(name, *v);
    else c.s(name, "none");
  } else if constexpr (kOptionalScalar<T>) {
    // An absent optional scalar is the string "none" (key.h); present, it is bound as its type.
    if (v.has_value()) bind_scalar(c, name, *v);
    else c.s(name, "none");
  } else if constexpr (std::is_same_v<T, std::array<bool, std::tuple_size_v<T>>>) {
    std::array<int64_t, std::tuple_size_v<T>> ints{};
    for (size_t k = 0; k < ints.size(); ++k) ints[k] = v[k];
    c.list(name, at::IntArrayRef(ints.data(), ints.size()));
  } else {
    static_assert(sizeof(T) == 0, "an argument type the key cannot hold: add it here and to kernel_cache/key.h");
  }
}

template <class... A, size_t... I>
void bind_all(Call& c, const char* const* names, std::index_sequence<I...>, const A&... a) {
  (bind_tensor(c, names[I], a), ...);
  (bind_scalar(c, names[I], a), ...);
}

inline const at::Tensor& lead_tensor() {
  static const at::Tensor undefined;
  return undefined;
}
template <class T, class... R> const at::Tensor& lead_tensor(const T& t, const R&... r) {
  if constexpr (std::is_same_v<T, at::Tensor>) return t;
  else return lead_tensor(r...);
}

}  // namespace detail

// Intercept<op, dev, &at::<backend>::<function>>::call has the function's signature: it binds the
// arguments into a Call and serves a kernel or runs the function (never redispatching).
template <OpId Op, Dev D, auto Fn> struct Intercept;
template <OpId Op, Dev D, class R, class... A, R (*Fn)(A...)>
struct Intercept<Op, D, Fn> {
  static constexpr size_t kArity = sizeof...(A);
  static_assert((detail::kTensorArg<std::decay_t<A>> || ...), "an intercepted op needs a tensor argument");
  static R call(A... a) { return call_with([&] { return Fn(a...); }, a...); }

  // The same with another eager answer of the same outputs (cudnn_batch_norm's, running_stats.h).
  template <class Eager> static R call_with(Eager&& eager, A... a) {
    if constexpr (kUpdatesRunningStats<Op>) {
      if (running_stats_form(a...)) return with_running_stats(eager, a...);
    }
    if constexpr (kTrainingIgnoresRunningStats<Op>) return serve_without_running_stats(eager, a...);
    return serve(eager, a...);
  }

 private:
  // Binds `a` (the key) and serves a kernel for it, or answers with `eager`.
  template <class Eager> static R serve(Eager&& eager, const std::decay_t<A>&... a) {
    Call c(Op, D, detail::lead_tensor(a...));
    if (c.active()) detail::bind_all<std::decay_t<A>...>(c, arg_names(Op), std::index_sequence_for<A...>{}, a...);
    return c.run<R>(std::forward<Eager>(eager));
  }

  // Batch norm in training with running statistics (dispatcher/running_stats.h): keyed and served
  // as the same call without them (its outputs are the same), with the update done afterwards
  // when a kernel answered. When eager answers, it runs with the statistics and does the update
  // itself, exactly as without kernelcraft.
  template <class Eager> static R with_running_stats(Eager& eager_with_stats, A... a) {
    bool eager_ran = false;
    auto eager = [&] { eager_ran = true; return eager_with_stats(); };
    auto args = std::forward_as_tuple(a...);
    const std::optional<at::Tensor> none;
    R r = std::apply([&](const auto& x, const auto& w, const auto& b, const auto&, const auto&, const auto&... rest) {
      return serve(eager, x, w, b, none, none, rest...);
    }, args);
    if (!eager_ran)
      update_running_stats(std::get<0>(args), *std::get<3>(args), *std::get<4>(args), std::get<1>(r), std::get<2>(r),
                           std::get<6>(args), std::get<7>(args));
    return r;
  }

  template <class Eager> static R serve_without_running_stats(Eager& eager, A... a) {
    auto args = std::forward_as_tuple(a...);
    if (!std::get<7>(args)) return serve(eager, a...);   // eval reads them
    const std::optional<at::Tensor> none;
    return std::apply([&](const auto& gy, const auto& x, const auto& w, const auto&, const auto&, const auto&... rest) {
      return serve(eager, gy, x, w, none, none, rest...);
    }, args);
  }
};

}  // namespace kc::dispatch
