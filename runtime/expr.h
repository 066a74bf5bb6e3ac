// Integer expressions of launch specs: "ceil_div(numel(self), 256)", "size(self,-1) * 4", ...
// Grammar: + - * / % (C semantics on int64), unary -, parentheses, integer literals, scalar names
// (int or bool scalars of the binding), and the functions numel(t), size(t,i), stride(t,i), dim(t),
// ceil_div(a,b), min(a,b), max(a,b), where t names a tensor of the binding and i may be negative.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/status.h"
#include "runtime/tensor_meta.h"

namespace kc {

// Evaluates `text` against `b`. Division or modulo by zero, unknown names, bad syntax and indices
// out of range are kInvalid with the position in the message.
Result<int64_t> eval_int_expr(const std::string& text, const Binding& b);

// Checks only the syntax (and literal overflow) of `text`, without a binding: names and
// functions are accepted as long as they are well-formed. Used when a spec is parsed.
Status check_int_expr(const std::string& text);

}  // namespace kc
