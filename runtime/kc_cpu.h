/* kc_cpu.h: prepended to every CPU kernel source. Keep it C-compatible and tiny. */
#pragma once
#include <stdint.h>
#include <math.h>
#include <stddef.h>
struct kc_cpu_ctx {
  int64_t grid[3];   /* grid dimensions from the launch spec */
  int64_t block[3];  /* block dimensions (a hint on the CPU: e.g. vector width) */
  int64_t begin;     /* first linear block index this call covers */
  int64_t end;       /* one past the last */
};
#define KC_ARG(T, args, i) (*(T*)((args)[i]))
